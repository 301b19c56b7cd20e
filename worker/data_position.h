// Which batch each step of a run trains on (issue 36: a part of RunWorker,
// worker/trainer.h).
//
// A run is `epochs` epochs of `steps_per_epoch` steps. Global step s trains
// batch s % steps_per_epoch of epoch s / steps_per_epoch: a step's batch is
// a function of the step alone, so that a recovery that goes back to a step
// (worker/recovery.h), a resumed run and a backup worker that jumps steps
// (GradientExchange::NextStep) all train the batch the step would have had.
// A checkpoint records the position of the step it resumes at
// (DataPosition, worker/checkpoint.h), with the job's batch size, workers,
// steps per epoch and seed, which must match to resume.
//
// Thread-compatible (immutable).
#ifndef PSTRAIN_WORKER_DATA_POSITION_H_
#define PSTRAIN_WORKER_DATA_POSITION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/checkpoint.h"

namespace pstrain {

class DataPositions {
 public:
  // steps_per_epoch > 0.
  DataPositions(int64_t steps_per_epoch, int epochs, uint64_t seed,
                int64_t batch_size, int64_t num_workers);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int epochs() const { return epochs_; }
  // epochs x steps_per_epoch: the step the run ends at.
  int64_t total_steps() const { return int64_t{epochs_} * steps_per_epoch_; }

  // The epoch of `step`, the step's index in it, and the epoch's first step.
  int EpochOf(int64_t step) const {
    return static_cast<int>(step / steps_per_epoch_);
  }
  int64_t StepInEpoch(int64_t step) const { return step % steps_per_epoch_; }
  int64_t FirstStep(int epoch) const {
    return int64_t{epoch} * steps_per_epoch_;
  }

  // The position a checkpoint of `step` records: training goes on at it.
  DataPosition At(int64_t step) const;

  // A checkpoint's position, read back: the global step it resumes at, or
  // INVALID_ARGUMENT naming `where` (the checkpoint's folder) when it was
  // saved with another batch size, number of workers, steps per epoch or
  // seed (its batches would not be this run's).
  absl::StatusOr<int64_t> StepOf(const DataPosition& saved,
                                 const std::string& where) const;

  // A backup worker's jump (worker/gradient_exchange.h, NextStep): after
  // the step of index `index` in its epoch, `jumped` steps were taken
  // without this worker. The batches of this epoch to skip: those up to
  // the epoch's end (the next epoch skips the rest when it begins at the
  // step's index in it).
  int64_t SkipInEpoch(int64_t index, int64_t jumped) const;

 private:
  const int64_t steps_per_epoch_;
  const int epochs_;
  const uint64_t seed_;
  const int64_t batch_size_;
  const int64_t num_workers_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_POSITION_H_
