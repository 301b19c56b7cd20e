#include "worker/checkpoint_schedule.h"

#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

struct Begun {
  int64_t step;
  DataPosition position;
};

class CheckpointScheduleTest : public ::testing::Test {
 protected:
  CheckpointSchedule Make(int64_t every_steps, double every_secs) {
    return CheckpointSchedule(
        {every_steps, every_secs}, positions_,
        [this](int64_t step, const DataPosition& position) {
          begun_.push_back({step, position});
          return absl::OkStatus();
        },
        kStart);
  }
  std::vector<int64_t> BegunSteps() const {
    std::vector<int64_t> steps;
    for (const Begun& b : begun_) steps.push_back(b.step);
    return steps;
  }

  // 4 steps per epoch, 3 epochs: steps 0 to 11, the run ends at 12.
  const DataPositions positions_{/*samples_per_epoch=*/0,
                                 /*max_steps_per_epoch=*/4,
                                 /*epochs=*/3,
                                 /*seed=*/1,
                                 /*batch_size=*/8,
                                 /*num_workers=*/2};
  std::vector<Begun> begun_;
};

TEST_F(CheckpointScheduleTest, EveryNStepsButNotAtTheRunsEnd) {
  CheckpointSchedule schedule = Make(3, 0);
  for (int64_t step = 0; step < 12; ++step) {
    ASSERT_TRUE(schedule.AfterStep(step, step + 1, At(step)).ok());
  }
  EXPECT_EQ(BegunSteps(), (std::vector<int64_t>{3, 6, 9}));
  // Step 12 is a multiple, but the run ends there.
}

TEST_F(CheckpointScheduleTest, AJumpOverAMultipleCheckpointsTheNewStep) {
  CheckpointSchedule schedule = Make(4, 0);
  // A backup worker left behind at step 2 goes on at the shards' step 6:
  // multiple 4 lies in (2, 6], so the checkpoint is of step 6.
  ASSERT_TRUE(schedule.AfterStep(2, 6, At(1)).ok());
  ASSERT_EQ(begun_.size(), 1u);
  EXPECT_EQ(begun_[0].step, 6);
  EXPECT_EQ(begun_[0].position.epoch, 1);
  EXPECT_EQ(begun_[0].position.step_in_epoch, 2);
  EXPECT_EQ(begun_[0].position.steps_per_epoch, 4);
  EXPECT_EQ(begun_[0].position.batch_size, 8);
  EXPECT_EQ(begun_[0].position.num_workers, 2);
  // A jump that lands on a multiple, and one that crosses none.
  ASSERT_TRUE(schedule.AfterStep(6, 8, At(2)).ok());
  ASSERT_TRUE(schedule.AfterStep(8, 11, At(3)).ok());
  EXPECT_EQ(BegunSteps(), (std::vector<int64_t>{6, 8}));
  // A jump to the run's end over multiple 12: no checkpoint there.
  ASSERT_TRUE(schedule.AfterStep(11, 12, At(4)).ok());
  EXPECT_EQ(BegunSteps(), (std::vector<int64_t>{6, 8}));
}

TEST_F(CheckpointScheduleTest, StepsDueIsAMultipleInTheHalfOpenRange) {
  EXPECT_TRUE(CheckpointSchedule::StepsDue(5, 4, 5));
  EXPECT_TRUE(CheckpointSchedule::StepsDue(5, 3, 12));   // 5 and 10
  EXPECT_FALSE(CheckpointSchedule::StepsDue(5, 5, 9));   // 5 is not in it
  EXPECT_TRUE(CheckpointSchedule::StepsDue(5, 9, 10));
  EXPECT_FALSE(CheckpointSchedule::StepsDue(5, 0, 4));
  EXPECT_FALSE(CheckpointSchedule::StepsDue(0, 0, 100));  // off
  EXPECT_FALSE(CheckpointSchedule::StepsDue(5, 10, 10));
}

TEST_F(CheckpointScheduleTest, EveryNSecondsSinceTheLastBegan) {
  CheckpointSchedule schedule = Make(0, 10);
  ASSERT_TRUE(schedule.AfterStep(0, 1, At(9)).ok());
  ASSERT_TRUE(schedule.AfterStep(1, 2, At(10)).ok());  // 10 s: due
  ASSERT_TRUE(schedule.AfterStep(2, 3, At(19)).ok());
  ASSERT_TRUE(schedule.AfterStep(3, 4, At(20.5)).ok());  // 10.5 s since
  EXPECT_EQ(BegunSteps(), (std::vector<int64_t>{2, 4}));
}

TEST_F(CheckpointScheduleTest, BothRulesAndTheWritersError) {
  int calls = 0;
  CheckpointSchedule schedule(
      {/*every_steps=*/4, /*every_secs=*/10}, positions_,
      [&calls](int64_t, const DataPosition&) {
        ++calls;
        return absl::UnavailableError("shard 1 is gone");
      },
      kStart);
  EXPECT_TRUE(schedule.AfterStep(0, 1, At(1)).ok());
  EXPECT_EQ(calls, 0);
  const absl::Status s = schedule.AfterStep(3, 4, At(2));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(calls, 1);
  // By time: 10 s after the checkpoint of step 4 began (at 2 s), not 9.
  EXPECT_TRUE(schedule.AfterStep(4, 5, At(11)).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(schedule.AfterStep(5, 6, At(12)).ok());
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace pstrain
