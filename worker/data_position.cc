#include "worker/data_position.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pstrain {

DataPositions::DataPositions(int64_t samples_per_epoch,
                             int64_t max_steps_per_epoch, int epochs,
                             uint64_t seed, int64_t batch_size, int num_workers,
                             int rank)
    : samples_per_epoch_(samples_per_epoch),
      max_steps_per_epoch_(max_steps_per_epoch),
      epochs_(epochs),
      seed_(seed),
      batch_size_(batch_size) {
  Segment first;
  first.members = num_workers;
  first.rank = rank;
  segments_.push_back(first);
  ComputeTotal();
}

int64_t DataPositions::StepsFrom(int64_t offset, int64_t steps_done,
                                 int members) const {
  int64_t steps = std::numeric_limits<int64_t>::max() / 4;
  if (samples_per_epoch_ > 0) {
    const int64_t per_step = int64_t{members} * batch_size_;
    steps = std::max<int64_t>(0, samples_per_epoch_ - offset) / per_step;
  }
  if (max_steps_per_epoch_ > 0) {
    steps = std::min(steps,
                     std::max<int64_t>(0, max_steps_per_epoch_ - steps_done));
  }
  return steps;
}

DataPositions::Place DataPositions::LocateIn(const Segment& segment,
                                             int64_t step) const {
  Place place = segment.place;
  int64_t at = segment.step;  // where `place` is
  int64_t left = StepsFrom(place.offset, place.step_in_epoch, segment.members);
  step = std::max(step, at);
  while (place.epoch < epochs_) {
    if (step < at + left) {
      const int64_t k = step - at;
      place.offset += k * segment.members * batch_size_;
      place.step_in_epoch += k;
      place.epoch_end = at + left;
      return place;
    }
    // The next epoch, from its start.
    at += left;
    ++place.epoch;
    place.offset = 0;
    place.step_in_epoch = 0;
    left = StepsFrom(0, 0, segment.members);
    if (left == 0) break;  // fewer samples than one step: no more epochs
  }
  place.epoch = epochs_;
  place.offset = 0;
  place.step_in_epoch = step - at;
  place.epoch_end = at;
  return place;
}

const DataPositions::Segment& DataPositions::SegmentOf(int64_t step) const {
  size_t i = segments_.size() - 1;
  while (i > 0 && segments_[i].step > step) --i;
  return segments_[i];
}

DataPositions::Split DataPositions::SplitAt(int64_t step) const {
  const Segment& segment = SegmentOf(step);
  Split split;
  split.members = segment.members;
  split.rank = segment.rank;
  split.next_rebase = std::numeric_limits<int64_t>::max() / 4;
  for (const Segment& s : segments_) {
    if (s.step > segment.step) {
      split.next_rebase = s.step;
      break;
    }
  }
  return split;
}

int64_t DataPositions::SegmentStart(int64_t step) const {
  return SegmentOf(step).step;
}

DataPositions::Place DataPositions::Locate(int64_t step) const {
  return LocateIn(SegmentOf(step), step);
}

void DataPositions::ComputeTotal() {
  const Segment& last = segments_.back();
  total_steps_ =
      LocateIn(last, std::numeric_limits<int64_t>::max() / 2).epoch_end;
}

void DataPositions::Rebase(int64_t step, int epoch, int64_t offset,
                           int64_t step_in_epoch, int members, int rank) {
  while (!segments_.empty() && segments_.back().step >= step) {
    segments_.pop_back();
  }
  Segment segment;
  segment.step = step;
  segment.place.epoch = epoch;
  segment.place.offset = offset;
  segment.place.step_in_epoch = step_in_epoch;
  segment.members = members;
  segment.rank = rank;
  segments_.push_back(segment);
  ComputeTotal();
}

DataPosition DataPositions::At(int64_t step) const {
  const Segment& segment = SegmentOf(step);
  const Place place = LocateIn(segment, step);
  DataPosition position;
  position.epoch = place.epoch;
  position.step_in_epoch = place.step_in_epoch;
  position.steps_per_epoch =
      place.step_in_epoch +
      StepsFrom(place.offset, place.step_in_epoch, segment.members);
  position.offset = place.offset;
  position.seed = seed_;
  position.batch_size = batch_size_;
  position.num_workers = segment.members;
  return position;
}

absl::Status DataPositions::Resume(int64_t step, const DataPosition& saved,
                                   const std::string& where) {
  if (saved.batch_size != batch_size_ || saved.seed != seed_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": saved with batch size ", saved.batch_size,
                     " and seed ", saved.seed, "; this job has ", batch_size_,
                     " and ", seed_, ": its data position cannot be restored"));
  }
  const int64_t offset =
      saved.offset >= 0
          ? saved.offset
          : saved.step_in_epoch * saved.num_workers * saved.batch_size;
  if (samples_per_epoch_ > 0 && offset > samples_per_epoch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": its data position is sample ", offset, " of epoch ",
        saved.epoch, "; this job's epochs have ", samples_per_epoch_));
  }
  if (saved.epoch < 0 || saved.epoch > epochs_ || saved.step_in_epoch < 0 ||
      saved.step_in_epoch > step) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data position epoch ", saved.epoch, ", step ",
                     saved.step_in_epoch, " of it, does not fit step ", step));
  }
  const int members = this->members();
  const int rank = this->rank();
  segments_.clear();
  if (offset == saved.step_in_epoch * members * batch_size_) {
    // The epoch so far as this membership would have trained it: one
    // segment from the epoch's first step (worker/step_loop.h begins the
    // epoch there and skips, as a run that never stopped).
    Rebase(step - saved.step_in_epoch, static_cast<int>(saved.epoch), 0, 0,
           members, rank);
  } else {
    Rebase(step, static_cast<int>(saved.epoch), offset, saved.step_in_epoch,
           members, rank);
  }
  return absl::OkStatus();
}

int64_t DataPositions::SkipInEpoch(int64_t step, int64_t jumped) const {
  const Place place = Locate(step);
  return std::max<int64_t>(0, std::min(jumped, place.epoch_end - 1 - step));
}

}  // namespace pstrain
