// Which batch each step of a run trains on (a part of RunWorker,
// worker/trainer.h), also when the job's workers change (issue 40).
//
// Each epoch is a permutation of the N training samples (dataset.h,
// ShardedSampler). A step of W member workers with batch size b trains the
// next W x b positions of its epoch's permutation, the member of rank r
// taking positions offset + r, offset + r + W, ... (PyTorch's
// DistributedSampler, so that step i of W workers is step i of one worker
// with batch W x b). An epoch ends when fewer than W x b positions are
// left (the rest is dropped, as DistributedSampler's drop_last) or after
// max_steps_per_epoch steps. With a fixed W, epoch e is steps
// [e x S, (e + 1) x S) with S = min(floor(N / (W x b)), max_steps_per_epoch).
//
// When the membership changes at step s (Rebase), the epoch goes on from
// the position step s would have trained under the old one: no sample of
// the epoch is skipped or trained twice. A step's batch is a function of
// the step and the rebase before it, so that a recovery that goes back to
// a step (worker/recovery.h), a resumed run and a backup worker that jumps
// steps all train the batch the step would have had.
//
// A checkpoint records the position of the step it resumes at
// (DataPosition, worker/checkpoint.h): the epoch, the steps of it before,
// the permutation's offset, and the seed and batch size, which must match
// to resume; the number of workers may differ (the epoch is re-split).
//
// Thread-compatible: the training thread's.
#ifndef PSTRAIN_WORKER_DATA_POSITION_H_
#define PSTRAIN_WORKER_DATA_POSITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/checkpoint.h"

namespace pstrain {

class DataPositions {
 public:
  // Where a step is: its epoch, the epoch's positions trained before it
  // (offset) and steps before it, and the epoch's end (the first step of
  // the next epoch) under the current membership.
  struct Place {
    int epoch = 0;
    int64_t offset = 0;
    int64_t step_in_epoch = 0;
    int64_t epoch_end = 0;
  };

  // `samples_per_epoch` N (0: no dataset, an epoch is max_steps_per_epoch
  // steps, as synthetic compute), `max_steps_per_epoch` (0: no cap; one of
  // the two > 0), `num_workers` members of which this worker has rank
  // `rank`, from step 0.
  DataPositions(int64_t samples_per_epoch, int64_t max_steps_per_epoch,
                int epochs, uint64_t seed, int64_t batch_size, int num_workers,
                int rank = 0);

  int epochs() const { return epochs_; }
  // The current (last) rebase's members and this worker's rank there.
  int members() const { return segments_.back().members; }
  int rank() const { return segments_.back().rank; }
  int64_t batch_size() const { return batch_size_; }
  // The step the run ends at (its last step + 1) under the current
  // membership.
  int64_t total_steps() const { return total_steps_; }
  // Steps of a whole epoch under the current membership.
  int64_t steps_per_epoch() const { return StepsFrom(0, 0, members()); }

  // Where `step` is (the run's end: epoch == epochs()), under the
  // membership of the last rebase at or before it. Steps before the first
  // rebase (a resumed run's start) are placed as that rebase.
  Place Locate(int64_t step) const;
  int EpochOf(int64_t step) const { return Locate(step).epoch; }
  // The step of the last rebase at or before `step` (the first: 0, or
  // the resume's step).
  int64_t SegmentStart(int64_t step) const;

  // From `step` on, `members` workers of which this one has rank `rank`,
  // `step` being at `epoch`, `offset` and `step_in_epoch` (a membership
  // change, a recovery onto a checkpoint, a resume). Rebases after `step`
  // are forgotten (a restore went back before them).
  void Rebase(int64_t step, int epoch, int64_t offset, int64_t step_in_epoch,
              int members, int rank);

  // The position a checkpoint of `step` records: training goes on at it.
  DataPosition At(int64_t step) const;

  // A checkpoint of `step` and its position, read back: rebases at it
  // (with the current members), or INVALID_ARGUMENT naming `where` (the
  // checkpoint's folder) when it was saved with another batch size or seed
  // (its batches would not be this run's), or its offset is past the
  // epoch. A position without an offset (written before elastic jobs) is
  // step_in_epoch x num_workers x batch_size into its epoch.
  absl::Status Resume(int64_t step, const DataPosition& saved,
                      const std::string& where);

  // A backup worker's jump (worker/gradient_exchange.h, NextStep): after
  // step `step`, `jumped` steps were taken without this worker. The
  // batches of this epoch to skip: those up to the epoch's end (the next
  // epoch begins at the step it goes on from).
  int64_t SkipInEpoch(int64_t step, int64_t jumped) const;

  // Who trains `step`: the members and this worker's rank of the rebase
  // at or before it, and where the next rebase begins (a large number if
  // none). Only an async worker that was behind worker 0 at a membership
  // change trains steps before the last rebase (its own blocks of the
  // old split, up to worker 0's step: ElasticMembership::Follow); in
  // every other case `step` is in the last one.
  struct Split {
    int members = 1;
    int rank = 0;
    int64_t next_rebase = 0;
  };
  Split SplitAt(int64_t step) const;

 private:
  // A rebase: from `step` on, `members` workers of which this one has
  // rank `rank`, `step` at `place`.
  struct Segment {
    int64_t step = 0;
    Place place;
    int members = 1;
    int rank = 0;
  };
  // Steps an epoch of `members` workers has left from `offset` after
  // `steps_done` of its steps.
  int64_t StepsFrom(int64_t offset, int64_t steps_done, int members) const;
  Place LocateIn(const Segment& segment, int64_t step) const;
  // The last rebase at or before `step` (the first for earlier steps).
  const Segment& SegmentOf(int64_t step) const;
  void ComputeTotal();

  const int64_t samples_per_epoch_;
  const int64_t max_steps_per_epoch_;
  const int epochs_;
  const uint64_t seed_;
  const int64_t batch_size_;
  // Every rebase, by step (the first at the run's start or resume).
  std::vector<Segment> segments_;
  int64_t total_steps_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_POSITION_H_
