// When worker 0 begins a checkpoint, and the data position it records
// (issue 36: a part of RunWorker, worker/trainer.h; the writing itself is
// CheckpointWriter's, worker/checkpoint.h).
//
// After every step, the step loop (worker/step_loop.h) reports the step it
// trained, `previous`, and the step it trains next, `step`: previous + 1,
// or more with backup workers, where a worker the shards left behind jumps
// to their version (GradientExchange::NextStep). A checkpoint is due
//   - by steps (every_steps > 0) when a multiple of every_steps lies in
//     (previous, step]: without a jump, when step is a multiple; a jump
//     over a multiple does not skip its checkpoint;
//   - by time (every_secs > 0) when every_secs seconds have passed since
//     the last checkpoint began (or since the schedule was made);
// and never at or past the run's last step (the run ends there and writes
// its final model instead). A due checkpoint is always of `step`, the
// next step to train (the weights just pulled, which are that step's),
// and records DataPositions::At(step), so that a run resumed from it
// trains the batch of `step` next.
//
// Thread-compatible.
#ifndef PSTRAIN_WORKER_CHECKPOINT_SCHEDULE_H_
#define PSTRAIN_WORKER_CHECKPOINT_SCHEDULE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/checkpoint.h"
#include "worker/data_position.h"

namespace pstrain {

class CheckpointSchedule {
 public:
  struct Options {
    // 0: not by steps / not by time.
    int64_t every_steps = 0;
    double every_secs = 0;
  };
  // Begins the checkpoint of `step` at `position` (CheckpointWriter::Begin
  // with the pulled weights); its error ends the step.
  using BeginFn =
      std::function<absl::Status(int64_t step, const DataPosition& position)>;

  // `positions` (kept by reference) gives the run's last step and each
  // step's position; time is counted from `now`.
  CheckpointSchedule(const Options& options, const DataPositions& positions,
                     BeginFn begin, absl::Time now);

  // Whether a multiple of every_steps (> 0) lies in (previous, step].
  static bool StepsDue(int64_t every_steps, int64_t previous, int64_t step);

  // After the step `previous`, whose next step is `step`: begins the
  // checkpoint of `step` if one is due at `now` (above). The error of
  // `begin`.
  absl::Status AfterStep(int64_t previous, int64_t step, absl::Time now);

 private:
  const Options options_;
  const DataPositions& positions_;
  const BeginFn begin_;
  absl::Time last_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CHECKPOINT_SCHEDULE_H_
