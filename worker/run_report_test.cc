#include "worker/run_report.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

TEST(RunReportTest, WorkerCountKeepsTheWindowAcrossARecovery) {
  RunReport::Options options;
  options.count_on_worker = true;
  options.samples_per_step = 128;  // 2 workers x 64
  RunReport report(options, kStart, /*counter=*/0);
  for (int i = 0; i < 10; ++i) report.StepTrained();
  // A recovery that rolled the job back: the counter it reads means
  // nothing here, and the redone steps are trained samples.
  report.Recovered(At(1), /*counter=*/0);
  for (int i = 0; i < 10; ++i) report.StepTrained();
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(2), 0), 20 * 128 / 2.0);
  EXPECT_EQ(report.samples(0), 20 * 128);
}

// An elastic job: each step counts its own membership's samples.
TEST(RunReportTest, EachStepCountsItsMembersSamples) {
  RunReport::Options options;
  options.samples_per_step = 128;  // 2 workers x 64 at the start
  RunReport report(options, kStart, /*counter=*/0);
  for (int i = 0; i < 10; ++i) report.StepTrained(2 * 64);
  for (int i = 0; i < 10; ++i) report.StepTrained(4 * 64);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(2), 0),
                   (10 * 128 + 10 * 256) / 2.0);
  report.StepTrained(3 * 64);
  EXPECT_EQ(report.samples(0), 10 * 128 + 10 * 256 + 192);
}

TEST(RunReportTest, ShardCounterThatRestartsNeverGivesANegativeRate) {
  RunReport::Options options;
  options.count_on_worker = false;
  RunReport report(options, kStart, /*counter=*/5000);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(1), 6000), 1000);
  // Shard 0 restarted and was restored: its counter starts again.
  report.Recovered(At(2), /*counter=*/0);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(3), 300), 300);
  // A counter below the window's start, unseen by a recovery: no rate (no
  // sample counted), and the window goes on from it.
  EXPECT_EQ(report.TakeWindowSamplesPerSec(At(4), 100), std::nullopt);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(5), 600), 250);
  EXPECT_EQ(report.samples(700), 1000 + 300 + 500 + 100);
}

// Backup workers: worker 0 may reach a Step line (left behind, it jumps to
// the others' version right after a recovery) before shard 0 admitted any
// end since the window's start. No rate then, not 0: the window stays
// open and the next line's rate covers it.
TEST(RunReportTest, AWindowShardZeroCountedNothingInHasNoRateYet) {
  RunReport::Options options;
  options.count_on_worker = false;
  RunReport report(options, kStart, 0);
  report.Recovered(At(1), 1000);
  report.StepTrained(3 * 64);
  EXPECT_EQ(report.TakeWindowSamplesPerSec(At(1.5), 1000), std::nullopt);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(3), 1400), 200);
  EXPECT_EQ(report.samples(1400), 400);
}

TEST(RunReportTest, EpochSecondsAddUpToTheRuntimeAcrossRollbacks) {
  RunReport report({}, kStart, 0);
  // Epoch 0 runs 2 s, is rolled back (the recovery and the redone steps
  // are its time), ends at 6.5 s; evaluation 1 s; epoch 1 ends at 9.5 s.
  const double epoch0 = report.TakeEpochSeconds(At(6.5));
  report.Pause(At(6.5));
  EXPECT_DOUBLE_EQ(report.training_seconds(At(7)), 6.5);
  report.Resume(At(7.5), 0);
  const double epoch1 = report.TakeEpochSeconds(At(9.5));
  EXPECT_DOUBLE_EQ(epoch0, 6.5);
  EXPECT_DOUBLE_EQ(epoch1, 2);
  EXPECT_DOUBLE_EQ(epoch0 + epoch1, report.training_seconds(At(9.5)));
}

TEST(RunReportTest, EvaluationIsNotInTheWindow) {
  RunReport::Options options;
  options.count_on_worker = false;
  RunReport report(options, kStart, 0);
  report.Pause(At(1));
  // Other workers' pushes during the evaluation count in the run's samples
  // but not in the next window's rate.
  report.Resume(At(3), 400);
  EXPECT_DOUBLE_EQ(*report.TakeWindowSamplesPerSec(At(4), 1400), 1000);
  EXPECT_EQ(report.samples(1400), 1400);
}

TEST(RunReportTest, CheckpointsCountThoseOfAPreviousWorker0) {
  RunReport::Options options;
  options.checkpoints_before = 4;
  RunReport report(options, kStart, 0);
  EXPECT_EQ(report.checkpoints(14), 18);
}

}  // namespace
}  // namespace pstrain
