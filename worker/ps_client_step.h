// Internal to //worker:ps_client: the state one PsClient step shares
// between its caller (BeginStep, PushReady, FinishStep, in ps_client.cc)
// and its lanes' pusher and reader threads (ps_client_push.cc and
// PushPullLane). Fields marked ABSL_GUARDED_BY(mu) are read and written
// under `mu` by every thread; the per-lane vectors at the end are written
// only by that lane's threads and read after they are joined.
#ifndef PSTRAIN_WORKER_PS_CLIENT_STEP_H_
#define PSTRAIN_WORKER_PS_CLIENT_STEP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/ps_client.h"

namespace pstrain {

struct PsClient::StepState {
  int64_t step = 0;
  std::vector<absl::Span<const float>> gradients;
  std::vector<absl::Span<float>> weights;
  // The row-sparse tables' rows the step began with (SetStepRows()).
  std::shared_ptr<const StepRows> rows;
  // The pull request, sent by each lane's pusher (PullOf()).
  PushPullRequest pull;
  bool pull_first = false;

  absl::Mutex mu;
  // Per lane: chunks let go and not yet pushed (indices into
  // shard_chunks_[shard]), each with the fence to pass first.
  std::vector<std::deque<std::pair<int, std::shared_ptr<CopyFence>>>> ready
      ABSL_GUARDED_BY(mu);
  std::vector<bool> released ABSL_GUARDED_BY(mu);  // per tensor
  bool all_released ABSL_GUARDED_BY(mu) = false;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  // Per lane: its pusher is to stop (its call ended or is given up).
  std::vector<bool> stopped ABSL_GUARDED_BY(mu);

  // Sync steps with pushes: each shard's first lane's pusher ends with a
  // StepEnd, once every lane's pusher has pushed all (so that it reports
  // the whole step); the other lanes' with a PushesSent.
  bool send_step_end = false;
  // Clipping: this worker sends the norm of norm_step() (after its end,
  // or for a pull without pushes, PullDecided(), after its pull).
  bool answer_norm = false;
  // The pull comes in fp32 whatever the wire, and whole (no delta against
  // the weights' base): PullDecided()'s last.
  bool full_precision = false;
  int pushers_done ABSL_GUARDED_BY(mu) = 0;
  // The first non-finite value found in this step (null: none yet).
  std::unique_ptr<NonFiniteValue> nonfinite ABSL_GUARDED_BY(mu);
  // Backup workers: shard 0's answer to this step's end (-1: none yet,
  // 0: late, 1: admitted), which the other shards' ends carry.
  int admission ABSL_GUARDED_BY(mu) = -1;
  // Clipping: each shard's partial sum of squares of the step the pull
  // decides (norm_step(): this step, or with staleness s the step s
  // before), and how many have arrived; a shard's pull that ended without
  // one (its step decided long ago: another worker's sum decided it).
  std::vector<double> norm_partials ABSL_GUARDED_BY(mu);
  int norm_partials_in ABSL_GUARDED_BY(mu) = 0;
  bool norm_missing ABSL_GUARDED_BY(mu) = false;
  int64_t norm_step() const { return pull.pull().min_version() - 1; }
  // The newest checkpoint step shard 0's pull announced (-1: none).
  int64_t checkpoint_step ABSL_GUARDED_BY(mu) = -1;
  // Forward before the pull ends (AwaitDecision(), AwaitTensor()): per
  // tensor, its chunks not pulled yet; per chunk of the plan, pulled once
  // (a skipped step's second sending is not counted); a shard announced
  // the step decided and not skipped; the lanes whose pusher finished, and
  // whose thread ended.
  std::vector<int> tensor_missing ABSL_GUARDED_BY(mu);
  std::vector<bool> chunk_pulled ABSL_GUARDED_BY(mu);
  bool decided ABSL_GUARDED_BY(mu) = false;
  // Verdicts (sends_verdicts()): AwaitDecision() found every value of the
  // step finite; each shard's first lane's pusher says so before its next
  // write (StepVerdict), once.
  bool say_finite ABSL_GUARDED_BY(mu) = false;
  // Chunks a pusher has taken from `ready` and not yet checked for
  // non-finite values (PushChunk()): AwaitDecision()'s scan waits for
  // them, and checks the chunks still in `ready` itself.
  int unchecked_taken ABSL_GUARDED_BY(mu) = 0;
  // Per lane: the generation its shard took at the decision this pull
  // waited for (PushPullResponse.generation; -1: none); and whether a
  // shard announced one with its decision (AwaitDecision() then leaves
  // the pull to FinishStep(), which takes the generation).
  std::vector<int64_t> switched_to ABSL_GUARDED_BY(mu);
  bool switch_announced ABSL_GUARDED_BY(mu) = false;
  int pushers_finished ABSL_GUARDED_BY(mu) = 0;
  int lanes_ended ABSL_GUARDED_BY(mu) = 0;

  // One per lane: its reader (which runs its pusher).
  std::vector<std::thread> threads;
  std::vector<absl::Status> statuses;
  std::vector<int64_t> versions;
  // Per lane: the largest version pulled (backup workers: a pull may
  // straddle a decision taken without this worker).
  std::vector<int64_t> largest;
  // Per lane: the step's skip decision (step -1: not skipped).
  std::vector<SkippedStepInfo> skipped;
  // Per lane, written by its own threads, read after they are joined
  // (PsStepTimes): the first push write's start and the last one's end
  // (system clock, us; -1: no push), bytes pushed, and each pulled chunk's
  // arrival and bytes.
  std::vector<int64_t> first_push_us, last_push_us, bytes_pushed;
  std::vector<std::vector<int64_t>> pull_arrivals_us;
  std::vector<int64_t> bytes_pulled;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PS_CLIENT_STEP_H_
