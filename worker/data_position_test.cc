#include "worker/data_position.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// 5 steps an epoch: 80 samples, 2 workers of batch 8 (16 a step).
TEST(DataPositionsTest, AStepIsABatchOfAnEpoch) {
  const DataPositions positions(/*samples_per_epoch=*/80,
                                /*max_steps_per_epoch=*/0, /*epochs=*/3,
                                /*seed=*/7, /*batch_size=*/8,
                                /*num_workers=*/2);
  EXPECT_EQ(positions.steps_per_epoch(), 5);
  EXPECT_EQ(positions.total_steps(), 15);
  EXPECT_EQ(positions.EpochOf(0), 0);
  EXPECT_EQ(positions.EpochOf(4), 0);
  EXPECT_EQ(positions.EpochOf(5), 1);
  EXPECT_EQ(positions.EpochOf(15), 3);  // the run's end
  const DataPositions::Place place = positions.Locate(12);
  EXPECT_EQ(place.epoch, 2);
  EXPECT_EQ(place.step_in_epoch, 2);
  EXPECT_EQ(place.offset, 32);
  EXPECT_EQ(place.epoch_end, 15);

  const DataPosition p = positions.At(12);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_EQ(p.step_in_epoch, 2);
  EXPECT_EQ(p.steps_per_epoch, 5);
  EXPECT_EQ(p.offset, 32);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.batch_size, 8);
  EXPECT_EQ(p.num_workers, 2);
}

TEST(DataPositionsTest, MaxStepsPerEpochCapsAnEpoch) {
  const DataPositions capped(80, 3, 2, 7, 8, 2);
  EXPECT_EQ(capped.steps_per_epoch(), 3);
  EXPECT_EQ(capped.total_steps(), 6);
  const DataPositions synthetic(0, 4, 2, 7, 8, 2);  // no dataset
  EXPECT_EQ(synthetic.total_steps(), 8);
  EXPECT_EQ(synthetic.Locate(5).step_in_epoch, 1);
}

TEST(DataPositionsTest, AResumedPositionGoesOnAtItsStep) {
  const DataPositions saved_by(80, 0, 3, 7, 8, 2);
  for (int64_t step : {0, 4, 5, 13}) {
    DataPositions positions(80, 0, 3, 7, 8, 2);
    ASSERT_TRUE(positions.Resume(step, saved_by.At(step), "d").ok());
    EXPECT_EQ(positions.Locate(step).offset, saved_by.Locate(step).offset);
    EXPECT_EQ(positions.total_steps(), 15);
    // One membership since the epoch began: one segment from its start.
    EXPECT_LE(positions.SegmentStart(step),
              step - saved_by.Locate(step).step_in_epoch);
  }
}

TEST(DataPositionsTest, AnOldCheckpointsPositionHasItsOffsetComputed) {
  DataPosition old;  // written before offsets were recorded
  old.epoch = 1;
  old.step_in_epoch = 2;
  old.steps_per_epoch = 5;
  old.seed = 7;
  old.batch_size = 8;
  old.num_workers = 2;
  DataPositions positions(80, 0, 3, 7, 8, 2);
  ASSERT_TRUE(positions.Resume(7, old, "d").ok());
  EXPECT_EQ(positions.Locate(7).offset, 32);
  EXPECT_EQ(positions.Locate(7).epoch, 1);
}

TEST(DataPositionsTest, AnotherJobsPositionIsRefusedNamingBoth) {
  const DataPositions saved_by(80, 0, 3, 7, 8, 2);
  DataPositions positions(80, 0, 3, 7, 8, 2);
  DataPosition saved = saved_by.At(6);
  saved.batch_size = 16;
  absl::Status status = positions.Resume(6, saved, "ckpt/step-6");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "ckpt/step-6: saved with batch size 16 and seed 7; this job has 8 "
            "and 7: its data position cannot be restored");
  saved = saved_by.At(6);
  saved.seed = 8;
  EXPECT_FALSE(positions.Resume(6, saved, "d").ok());
  saved = saved_by.At(6);
  saved.offset = 81;  // past the epoch
  EXPECT_FALSE(positions.Resume(6, saved, "d").ok());
}

// Resuming onto another number of workers re-splits the epoch where it is.
TEST(DataPositionsTest, AResumeWithOtherWorkersReSplitsTheEpoch) {
  const DataPositions two(80, 0, 2, 7, 8, 2);
  DataPositions four(80, 0, 2, 7, 8, 4);  // 32 samples a step
  ASSERT_TRUE(four.Resume(3, two.At(3), "d").ok());  // sample 48 of epoch 0
  EXPECT_EQ(four.Locate(3).offset, 48);
  EXPECT_EQ(four.Locate(3).epoch_end, 4);  // (80 - 48) / 32 = 1 step left
  EXPECT_EQ(four.Locate(4).epoch, 1);
  EXPECT_EQ(four.total_steps(), 4 + 2);    // then 2 steps of 32
}

// The samples each step's members train, from a membership history: every
// position of each epoch at most once, all but the tail of fewer than one
// step's samples (DistributedSampler's drop_last).
std::vector<std::multiset<int64_t>> TrainedPositions(
    DataPositions& positions,
    const std::vector<std::pair<int64_t, int>>& changes) {
  std::vector<std::multiset<int64_t>> trained(positions.epochs());
  size_t next = 0;
  for (int64_t step = 0; step < positions.total_steps(); ++step) {
    if (next < changes.size() && changes[next].first == step) {
      const DataPositions::Place at = positions.Locate(step);
      positions.Rebase(step, at.epoch, at.offset, at.step_in_epoch,
                       changes[next].second, 0);
      ++next;
    }
    const DataPositions::Place place = positions.Locate(step);
    const int w = positions.members();
    for (int rank = 0; rank < w; ++rank) {
      for (int k = 0; k < positions.batch_size(); ++k) {
        trained[place.epoch].insert(place.offset + rank + int64_t{k} * w);
      }
    }
  }
  return trained;
}

TEST(DataPositionsTest, EveryPositionOnceAcrossMembershipChanges) {
  // 600 samples, batch 5: 2 workers (10 a step), 4 from step 20 (20), 3
  // from step 40 (15), 2 again from step 70.
  DataPositions positions(600, 0, 3, 7, 5, 2);
  const std::vector<std::multiset<int64_t>> trained =
      TrainedPositions(positions, {{20, 4}, {40, 3}, {70, 2}});
  for (size_t e = 0; e < trained.size(); ++e) {
    std::set<int64_t> unique(trained[e].begin(), trained[e].end());
    EXPECT_EQ(unique.size(), trained[e].size()) << "epoch " << e;
    ASSERT_FALSE(unique.empty());
    EXPECT_EQ(*unique.begin(), 0);
    // Contiguous from 0: no position skipped.
    EXPECT_EQ(*unique.rbegin(), static_cast<int64_t>(unique.size()) - 1);
    EXPECT_GT(static_cast<int64_t>(unique.size()), 600 - 20);
  }
  // Epoch 0: 20 steps of 10 then 20 of 20, every sample; epoch 1 (from
  // step 40): 30 steps of 15, then 15 of 10.
  EXPECT_EQ(trained[0].size(), 600u);
  EXPECT_EQ(trained[1].size(), 600u);
}

TEST(DataPositionsTest, ARebaseIsForgottenWhenARestoreGoesBeforeIt) {
  DataPositions positions(600, 0, 2, 7, 5, 2);
  positions.Rebase(20, 0, 200, 20, 4, 1);
  EXPECT_EQ(positions.Locate(25).offset, 300);
  EXPECT_EQ(positions.At(10).num_workers, 2);  // before the change
  EXPECT_EQ(positions.At(10).offset, 100);
  // A restore to step 10 with the new members: re-split from there.
  const DataPositions::Place at = positions.Locate(10);
  positions.Rebase(10, at.epoch, at.offset, at.step_in_epoch, 4, 1);
  EXPECT_EQ(positions.Locate(15).offset, 200);
  EXPECT_EQ(positions.rank(), 1);
}

// An async worker behind worker 0 at a membership change trains the old
// split up to the rebase: each step's split is its segment's, and the
// slice before the rebase ends there.
TEST(DataPositionsTest, EachStepHasItsSegmentsSplit) {
  DataPositions positions(600, 0, 2, 7, 5, 2, /*rank=*/1);
  positions.Rebase(20, 0, 200, 20, 3, 2);
  const DataPositions::Split before = positions.SplitAt(12);
  EXPECT_EQ(before.members, 2);
  EXPECT_EQ(before.rank, 1);
  EXPECT_EQ(before.next_rebase, 20);
  const DataPositions::Split after = positions.SplitAt(20);
  EXPECT_EQ(after.members, 3);
  EXPECT_EQ(after.rank, 2);
  EXPECT_GT(after.next_rebase, positions.total_steps());
  EXPECT_EQ(positions.rank(), 2);
  EXPECT_EQ(positions.Locate(12).offset, 120);
}

TEST(DataPositionsTest, AJumpSkipsTheBatchesUpToTheEpochsEnd) {
  const DataPositions positions(80, 0, 3, 7, 8, 2);
  // After step 1, 2 steps jumped: steps 2 and 3 are skipped.
  EXPECT_EQ(positions.SkipInEpoch(1, 2), 2);
  // After step 2, 4 jumped (to step 7 of the next epoch): steps 3 and 4
  // here.
  EXPECT_EQ(positions.SkipInEpoch(2, 4), 2);
  EXPECT_EQ(positions.SkipInEpoch(4, 3), 0);
}

}  // namespace
}  // namespace pstrain
