#include "worker/data_position.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(DataPositionsTest, AStepIsABatchOfAnEpoch) {
  const DataPositions positions(/*steps_per_epoch=*/5, /*epochs=*/3,
                                /*seed=*/7, /*batch_size=*/32,
                                /*num_workers=*/2);
  EXPECT_EQ(positions.total_steps(), 15);
  EXPECT_EQ(positions.EpochOf(0), 0);
  EXPECT_EQ(positions.EpochOf(4), 0);
  EXPECT_EQ(positions.EpochOf(5), 1);
  EXPECT_EQ(positions.EpochOf(15), 3);  // the run's end
  EXPECT_EQ(positions.StepInEpoch(12), 2);
  EXPECT_EQ(positions.FirstStep(2), 10);

  const DataPosition p = positions.At(12);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_EQ(p.step_in_epoch, 2);
  EXPECT_EQ(p.steps_per_epoch, 5);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.batch_size, 32);
  EXPECT_EQ(p.num_workers, 2);
}

TEST(DataPositionsTest, ASavedPositionIsTheStepItWasTakenAt) {
  const DataPositions positions(5, 3, 7, 32, 2);
  for (int64_t step : {0, 4, 5, 13}) {
    absl::StatusOr<int64_t> back = positions.StepOf(positions.At(step), "d");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, step);
  }
}

TEST(DataPositionsTest, AnotherJobsPositionIsRefusedNamingBoth) {
  const DataPositions positions(5, 3, 7, 32, 2);
  DataPosition saved = positions.At(6);
  saved.batch_size = 64;
  absl::StatusOr<int64_t> step = positions.StepOf(saved, "ckpt/step-6");
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step.status().message(),
            "ckpt/step-6: saved with batch size 64, 2 workers, 5 steps per "
            "epoch and seed 7; this job has 32, 2, 5 and 7: its data "
            "position cannot be restored");
  for (auto change : {+[](DataPosition& p) { p.num_workers = 3; },
                      +[](DataPosition& p) { p.steps_per_epoch = 6; },
                      +[](DataPosition& p) { p.seed = 8; }}) {
    DataPosition other = positions.At(6);
    change(other);
    EXPECT_FALSE(positions.StepOf(other, "d").ok());
  }
}

TEST(DataPositionsTest, AJumpSkipsTheBatchesUpToTheEpochsEnd) {
  const DataPositions positions(5, 3, 7, 32, 2);
  // After index 1, 2 steps jumped: indices 2 and 3 are skipped; the next
  // step trains index 4.
  EXPECT_EQ(positions.SkipInEpoch(1, 2), 2);
  // After index 2, 4 jumped (to index 2 of the next epoch): indices 3 and 4
  // here; the next epoch skips its first 2 when it begins at index 2.
  EXPECT_EQ(positions.SkipInEpoch(2, 4), 2);
  EXPECT_EQ(positions.SkipInEpoch(4, 3), 0);
}

}  // namespace
}  // namespace pstrain
