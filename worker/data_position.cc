#include "worker/data_position.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pstrain {

DataPositions::DataPositions(int64_t steps_per_epoch, int epochs,
                             uint64_t seed, int64_t batch_size,
                             int64_t num_workers)
    : steps_per_epoch_(steps_per_epoch),
      epochs_(epochs),
      seed_(seed),
      batch_size_(batch_size),
      num_workers_(num_workers) {}

DataPosition DataPositions::At(int64_t step) const {
  DataPosition position;
  position.epoch = step / steps_per_epoch_;
  position.step_in_epoch = step % steps_per_epoch_;
  position.steps_per_epoch = steps_per_epoch_;
  position.seed = seed_;
  position.batch_size = batch_size_;
  position.num_workers = num_workers_;
  return position;
}

absl::StatusOr<int64_t> DataPositions::StepOf(const DataPosition& saved,
                                              const std::string& where) const {
  if (saved.batch_size != batch_size_ || saved.num_workers != num_workers_ ||
      saved.steps_per_epoch != steps_per_epoch_ || saved.seed != seed_) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": saved with batch size ", saved.batch_size, ", ",
        saved.num_workers, " workers, ", saved.steps_per_epoch,
        " steps per epoch and seed ", saved.seed, "; this job has ",
        batch_size_, ", ", num_workers_, ", ", steps_per_epoch_, " and ",
        seed_, ": its data position cannot be restored"));
  }
  return saved.epoch * steps_per_epoch_ + saved.step_in_epoch;
}

int64_t DataPositions::SkipInEpoch(int64_t index, int64_t jumped) const {
  return std::max<int64_t>(
      0, std::min(jumped, steps_per_epoch_ - 1 - index));
}

}  // namespace pstrain
