#include "worker/checkpoint_schedule.h"

#include <utility>

namespace pstrain {

CheckpointSchedule::CheckpointSchedule(const Options& options,
                                       const DataPositions& positions,
                                       BeginFn begin, absl::Time now)
    : options_(options),
      positions_(positions),
      begin_(std::move(begin)),
      last_(now) {}

bool CheckpointSchedule::StepsDue(int64_t every_steps, int64_t previous,
                                  int64_t step) {
  // Steps are >= 0: the multiples up to s are floor(s / every_steps) + 1.
  return every_steps > 0 && step > previous &&
         step / every_steps > previous / every_steps;
}

absl::Status CheckpointSchedule::AfterStep(int64_t previous, int64_t step,
                                           absl::Time now) {
  const bool due =
      StepsDue(options_.every_steps, previous, step) ||
      (options_.every_secs > 0 &&
       now - last_ >= absl::Seconds(options_.every_secs));
  if (!due || step >= positions_.total_steps()) return absl::OkStatus();
  last_ = now;
  return begin_(step, positions_.At(step));
}

}  // namespace pstrain
