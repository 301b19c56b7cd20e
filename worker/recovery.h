// What a worker of a parameter-server job does when a step breaks because
// a task died (issue 36: a part of RunWorker, worker/trainer.h; see
// TrainerOptions::max_restarts and docs/ARCHITECTURE.md, "Recovery").
//
// Recover(cause): a step (or worker 0's evaluation) failed with `cause`.
// A failure a task's death explains (UNAVAILABLE, ABORTED, CANCELLED) is
// recovered from, at most 2 x max_restarts + 2 times in a run:
//   1. worker 0 waits for its checkpoint in flight (abandoned if it lost a
//      shard: it never becomes `latest`);
//   2. worker 0 reads the state to restore the shards to: the newest
//      checkpoint in checkpoint_dir, or the job's initial weights before
//      the first;
//   3. reconnect: GradientExchange::Recover with fresh addresses
//      (ps_addresses_fn), attempts of at most 5 s each with a growing pause
//      between them, until init_timeout has passed (a worker may see a
//      death before the coordinator does and hold a stale address);
//   4. worker 0 says what the shards went on from ("Reopened the shards at
//      their own state, version N (no rollback)" or "Restored the shards to
//      DIR/step-N (why not reopened)");
//   5. the pulled weights go into the model, and the step to go on from is
//      that of the smallest version pulled: sync, the version; async, the
//      version / num_workers (each worker's share of the pushes).
// A failed reconnect is a new cause (a recoverable one starts the next
// recovery). Anything else, recovery off (max_restarts 0), or too many
// recoveries ends the run with the cause ("gave up after N recoveries: ..."
// for the last).
//
// Rejoin(): a restarted task joins the running job the same way (steps 2
// to 4 with GradientExchange::Rejoin) instead of starting the shards.
//
// Thread-compatible: the training thread's.
#ifndef PSTRAIN_WORKER_RECOVERY_H_
#define PSTRAIN_WORKER_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/shard_checkpoint.h"
#include "worker/checkpoint.h"
#include "worker/gradient_exchange.h"

namespace pstrain {

struct RecoveryOptions {
  int worker_id = 0;
  int num_workers = 1;
  // Sync mode: a version pulled after a restore is the step to go on from;
  // async: version / num_workers.
  bool sync = true;
  // 0: no recovery (the first error ends the run; allreduce jobs).
  int max_restarts = 0;
  // An elastic job (worker/elastic.h): recovery is on whatever
  // max_restarts says (a membership change fails the other workers' step
  // in flight), and a recovery into a newer membership is not counted.
  bool elastic = false;
  absl::Duration init_timeout = absl::Seconds(120);
  // The shards' addresses again; null: unchanged.
  std::function<absl::StatusOr<std::vector<std::string>>()> ps_addresses_fn;
  // Worker 0: its checkpoints ("" none) and the model's PS tensors, to
  // load the newest as.
  std::string checkpoint_dir;
  std::vector<std::string> tensor_names;
  std::vector<std::vector<int64_t>> tensor_shapes;
  int num_buffers = 0;
};

class Recovery {
 public:
  using LoadWeightsFn = std::function<absl::Status()>;
  using LineFn = std::function<void(const std::string&)>;

  // `exchange` (not owned) outlives this. `initial_state`: worker 0's
  // state to restore the shards to before the first checkpoint (the job's
  // initial weights). `load_weights` copies the weights pulled into the
  // exchange's spans into the model; `say` prints a console line.
  Recovery(RecoveryOptions options, GradientExchange* exchange,
           ModelState initial_state, LoadWeightsFn load_weights, LineFn say);

  // Worker 0's checkpoint writer (not owned; null: none), whose
  // checkpoint in flight a recovery waits for first.
  void set_checkpoint_writer(CheckpointWriter* writer) { writer_ = writer; }

  // After `cause` (a failed step), the step to go on from, or the error
  // that ends the run (above). Not `counted`: the failure does not count
  // against the recoveries allowed (the second exchange of a step whose
  // gradients a recovery kept, StepLoop::RetryKeptStep, which fails where
  // the generation recovered into could not last: a dead worker's removal
  // came after it; the step is then computed anew, and a failure of that
  // counts).
  absl::StatusOr<int64_t> Recover(absl::Status cause, bool counted = true);

  // A restarted task: joins the running job, the exchange keeping
  // `weights` as Start() does; the step to start at. The weights are not
  // yet in the model (the caller loads them as after Start()).
  absl::StatusOr<int64_t> Rejoin(const std::vector<absl::Span<float>>& weights);

  bool enabled() const { return options_.max_restarts > 0 || options_.elastic; }
  // Recoveries begun so far, and the most a run may begin.
  int recoveries() const { return recoveries_; }
  int max_recoveries() const { return 2 * options_.max_restarts + 2; }
  // The step every worker goes on from after the shards came back at
  // `version`: sync, the version; async, version / num_workers (each
  // worker's share of the pushes).
  int64_t StepOfVersion(int64_t version) const;

 private:
  bool chief() const { return options_.worker_id == 0; }
  // Worker 0: the newest checkpoint's state, or the initial one; sets
  // restore_source_.
  absl::StatusOr<ModelState> RestoreState();
  // Recover (`rejoin_weights` null) or Rejoin, attempt after attempt; the
  // smallest version pulled.
  absl::StatusOr<int64_t> Reconnect(
      const ModelState* restore,
      const std::vector<absl::Span<float>>* rejoin_weights);
  void SayHowRestored(int64_t version);

  const RecoveryOptions options_;
  GradientExchange* const exchange_;
  const ModelState initial_state_;
  const LoadWeightsFn load_weights_;
  const LineFn say_;
  CheckpointWriter* writer_ = nullptr;
  std::string restore_source_;
  int recoveries_ = 0;
  int64_t membership_epoch_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_RECOVERY_H_
