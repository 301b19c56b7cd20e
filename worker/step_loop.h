// The worker's training loop over a run's steps (issue 36: the heart of
// RunWorker, worker/trainer.h, over parts with their own tests).
//
// Run(start) trains global steps start, ... up to the run's last step
// (DataPositions::total_steps), epoch by epoch. Each step:
//   1. compute (StepCompute::Step) on the step's batch, the gradients
//      announced to the exchange as they become final (GradientsReady); a
//      non-finite loss is reported to the exchange (MarkStepNonFinite);
//   2. exchange (GradientExchange::Step): the next weights, loaded into
//      the model (StepCompute::LoadWeights);
//   3. skip handling: a step the exchange skipped for a non-finite value
//      is reported by the worker that found it, its loss left out; more
//      than max_nonfinite_steps skipped in a row is FAILED_PRECONDITION
//      naming the last; with fp16's loss scaler, the skip (or not)
//      updates the scale of the next step;
//   4. the next step, GradientExchange::NextStep(step): step + 1, or with
//      backup workers the shards' version, when this worker was left
//      behind: the batches between are skipped (DataPositions::
//      SkipInEpoch), so that a step's batch stays a function of the step;
//   5. worker 0's checkpoint, if due (CheckpointSchedule::AfterStep with
//      the step trained and the next);
//   6. reporting (Reporter: the step's times and loss, rows and lines).
// An error of a step (of any of 1 to 6) goes to Recovery::Recover: its
// error ends the run; otherwise the loop goes on from the step it returns,
// the same one (the shards reopened) or an earlier one (a rollback to a
// checkpoint), at its epoch (the epoch's batches begin again and skip to
// the step). After each epoch's last step the epoch's training time is
// taken (Reporter::EpochEnded) and `end_epoch` runs (worker 0's
// evaluation); its error is recovered from as a step's.
//
// Thread-compatible: the training thread's.
#ifndef PSTRAIN_WORKER_STEP_LOOP_H_
#define PSTRAIN_WORKER_STEP_LOOP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/model.h"
#include "optim/loss_scaler.h"
#include "worker/checkpoint_schedule.h"
#include "worker/data_position.h"
#include "worker/elastic.h"
#include "worker/gradient_exchange.h"
#include "worker/metrics.h"
#include "worker/recovery.h"
#include "worker/reporter.h"

namespace pstrain {

// The batches of one epoch a worker trains from a step on, as
// worker/data_position.h places them: `steps` batches of the member of rank
// `rank` of `members`, from position `offset` of the epoch's permutation.
struct EpochSlice {
  int epoch = 0;
  int64_t offset = 0;
  int rank = 0;
  int members = 1;
  int64_t steps = 0;
};

// What a step computes: this worker's batches, forward and backward (the
// model, or a stand-in for one; worker/trainer.cc's workloads).
class StepCompute {
 public:
  virtual ~StepCompute() = default;
  // The gradients (PS tensors) the exchange gets each step.
  virtual const std::vector<absl::Span<const float>>& gradients() = 0;
  // The batches of `slice` begin (an epoch from its start, or from where a
  // resume, recovery or membership change put it).
  virtual void BeginEpoch(const EpochSlice& slice) = 0;
  // Skips the next `n` batches of the epoch.
  virtual void SkipBatches(int64_t n) = 0;
  // One step's compute on the next batch; the training loss. Calls
  // `on_ready` for every PS tensor as its gradient becomes final.
  virtual absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) = 0;
  // The training samples of the last Step()'s batch (a test aid; empty
  // where there are none, as synthetic compute).
  virtual std::vector<uint32_t> LastBatchSamples() const { return {}; }
  // The last Step()'s forward and backward times, where measured.
  virtual StepPhases LastPhases() const { return {}; }
  // Copies the exchange's weights into whatever computes with them.
  virtual absl::Status LoadWeights() = 0;
  // fp16 precision: the loss scale of the next Step()s (Model::
  // set_loss_scale: the gradients are unscaled before they are announced).
  virtual void SetLossScale(float scale) {}
  // Row-sparse tables (issue 41): per PS tensor, the rows (ascending,
  // unique) the batch `ahead` batches after the next Step()'s reads (0:
  // the next Step()'s own), empty for a dense tensor. False where the
  // epoch's batches (BeginEpoch) hold no such batch, or the compute has no
  // row-sparse tables.
  virtual bool BatchRows(int64_t ahead,
                         std::vector<std::vector<uint32_t>>* rows) {
    return false;
  }
};

// The test aid PSTRAIN_INJECT_NONFINITE="W:all" or "W:S1,S2,...": worker
// W's gradient of parameter 0 gets a NaN at every step or at global steps
// S1, S2, ...
struct NonFiniteInjection {
  int worker = -1;  // -1: none
  bool every_step = false;
  std::vector<int64_t> steps;
  bool At(int worker_id, int64_t step) const;
};
// `text`: the variable's value; null or empty: none. INVALID_ARGUMENT
// naming the expected form otherwise.
absl::StatusOr<NonFiniteInjection> ParseNonFiniteInjection(const char* text);

class StepLoop {
 public:
  struct Options {
    int worker_id = 0;
    // This worker's samples per step.
    int batch_size = 64;
    // How a skipped step reads: async, this worker's pushes from the
    // value on were dropped (the step named is this worker's own, not the
    // shards' version); allreduce, skipped on every worker; otherwise on
    // every shard.
    bool async = false;
    bool allreduce = false;
    int max_nonfinite_steps = 10;
    // Whether the compute's loss is reported (false: synthetic compute,
    // which has none).
    bool report_loss = true;
    // The straggler test aid: worker `straggler_worker` sleeps
    // straggler_delay_ms before each step's compute.
    int straggler_worker = -1;
    int64_t straggler_delay_ms = 0;
    // A test aid (PSTRAIN_RECORD_SAMPLES=DIR): each step that counted
    // appends a line "epoch step sample..." of its batch to
    // DIR/samples-<worker>.txt, so a test counts every sample trained.
    std::string record_samples_dir;
    // Backup workers: a step may be applied without this worker's push.
    bool backup_workers = false;
    // The PS tensors' names, for skipped steps' lines.
    std::vector<std::string> tensor_names;
    NonFiniteInjection inject_nonfinite;
    // Row-sparse tables (issue 41; PS modes): before each step's compute,
    // the exchange gets the rows its batch touches and the rows the next
    // step's batch reads (GradientExchange::SetStepRows), or a whole pull
    // where the next batch is not this epoch's (its last step: worker 0
    // evaluates and the run's final model is written with every row). With
    // backup workers a worker left behind jumps to a later batch: its
    // exchange then pulls again, whole (PsExchange::Step).
    bool sparse_rows = false;
  };
  // After an epoch's last step: the epoch, the step to train next, the
  // epoch's training seconds and its mean training loss (skipped steps
  // count as 0). Its error is recovered from.
  using EndEpochFn = std::function<absl::Status(
      int epoch, int64_t step, double train_seconds, double train_loss)>;
  // Not owned; each outlives the loop. `checkpoints` (null: none, not
  // worker 0) and `end_epoch` (null: nothing) may be absent.
  struct Parts {
    StepCompute* compute = nullptr;
    GradientExchange* exchange = nullptr;
    Recovery* recovery = nullptr;
    CheckpointSchedule* checkpoints = nullptr;
    Reporter* reporter = nullptr;
    EndEpochFn end_epoch;
    // An elastic job's membership (null: fixed): worker 0 applies a new
    // one at a step boundary, every worker follows the one of the
    // generation it recovers into (worker/elastic.h).
    ElasticMembership* elastic = nullptr;
    // fp16 precision's dynamic loss scaling (null: none): each step
    // computes at its scale, and a step the exchange skipped (an overflow
    // on any worker: every worker sees the same skips, so their scales
    // agree) backs it off; see optim/loss_scaler.h.
    LossScaler* loss_scaler = nullptr;
  };

  // `positions` is kept by reference.
  StepLoop(Options options, const DataPositions& positions, Parts parts);

  // Trains from `start_step` to the run's last step (above); the error
  // that ends the run.
  absl::Status Run(int64_t start_step);

  // The step to train next: after Run(), the run's steps.
  int64_t step() const { return step_; }
  // An elastic job's membership left this worker out: Run() returned OK
  // where it was.
  bool removed() const { return removed_; }

 private:
  // Epoch `epoch` from step_ on; whether a recovery interrupted it (step_
  // is then the step to go on from).
  absl::StatusOr<bool> TrainEpoch(int epoch);
  // An elastic allreduce job's recovery (ElasticMembership::RecoverWorld):
  // the survivors meet in the next membership's world at rank 0's step.
  absl::Status RecoverWorld(absl::Status cause);
  // Worker 0: the membership change last applied, to the reporter (the
  // console and metrics; Reporter::MembershipChanged) at step_.
  absl::Status ReportMembershipChanged();
  // The epoch's end (end_epoch); whether it failed and was recovered from.
  absl::StatusOr<bool> EndEpoch(int epoch);
  // A step whose gradients are computed and not yet exchanged: what its
  // exchange needs, and what its gradients were computed from.
  struct ComputedStep {
    int epoch = 0;
    int64_t index = 0;  // in the epoch
    int64_t step = 0;
    float loss = 0;
    // The loss scale the gradients carry (0: no loss scaler).
    float loss_scale = 0;
    // The batch: its place in the epoch and this worker's part of it.
    DataPositions::Place place;
    DataPositions::Split split;
    // Options::record_samples_dir: the batch's line.
    std::string samples_line;
    Reporter::StepTimes times;
  };
  // Step step_, of index `index` in `epoch`: ComputeStep() then
  // ExchangeStep(). Where the exchange fails, the computed step is kept
  // for RetryKeptStep().
  absl::Status TrainStep(int epoch, int64_t index);
  absl::StatusOr<ComputedStep> ComputeStep(int epoch, int64_t index);
  absl::Status ExchangeStep(const ComputedStep& computed);
  // After the recovery from a failed TrainStep(): where the recovery goes
  // on at that very step, with the same weights (the shards' version of
  // it: sync, not allreduce), the same batch (the same place, members and
  // rank) and loss scale, and it is not its epoch's last, the kept
  // gradients are exchanged again instead of being computed anew (a
  // change of shards, whose workers' step in flight fails with the old
  // layout's streams: docs/ARCHITECTURE.md, "Elastic shards"). An error of
  // that exchange is recovered from as any.
  absl::Status RetryKeptStep();
  // The step's skip, if any (step 3 above): its line and the run's end
  // after too many in a row.
  absl::Status HandleSkip(std::optional<SkippedStepInfo>& skipped);
  std::string DescribeSkip(const SkippedStepInfo& skip) const;
  // `cause` recovered from: step_ is the step to go on from.
  // Not `counted`: as Recovery::Recover().
  absl::Status Recover(absl::Status cause, bool counted = true);
  // The compute's batches from step_ to its epoch's end, or to the next
  // rebase if one lies ahead (an async worker that was behind worker 0 at
  // a membership change: DataPositions::SplitAt).
  void BeginSlice();
  // Options::sparse_rows: the rows of the step's batch and the next one's,
  // given to the exchange.
  absl::Status SetStepRows();
  // Options::record_samples_dir: the line of the step's samples, and
  // appending one to this worker's file.
  std::string SamplesLine(int epoch) const;
  void AppendSamplesLine(const std::string& line) const;
  // Removes this worker's lines of steps at or after `step`.
  void DropSamplesLinesFrom(int64_t step) const;
  void GradientsReady(absl::Span<const int> tensors,
                      std::shared_ptr<CopyFence> fence);

  const Options options_;
  const DataPositions& positions_;
  const Parts parts_;
  const GradientsReadyFn on_ready_;
  int64_t step_ = 0;
  // The steps the last step's NextStep jumped over.
  int64_t jumped_ = 0;
  // Where the slice BeginSlice() began ends for a rebase (see there).
  int64_t slice_until_rebase_ = 0;
  // The epoch's losses, and the steps skipped in a row.
  double loss_sum_ = 0;
  int consecutive_skips_ = 0;
  bool removed_ = false;
  // Options::record_samples_dir: the line of a step whose exchange failed,
  // with its step. A sync step (no backup workers) the recovery goes on
  // past counted this worker's push, so its line is written then.
  std::optional<std::pair<int64_t, std::string>> unrecorded_;
  // The step whose exchange failed last (TrainStep()), for RetryKeptStep().
  std::optional<ComputedStep> kept_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_STEP_LOOP_H_
