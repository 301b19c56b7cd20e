// Non-finite gradients (issue 22) in real multi-process jobs: `pstrain run`
// with 2 shards and 2 workers (or 2 allreduce workers), a NaN injected into
// worker 1's gradient of the first layer (PSTRAIN_INJECT_NONFINITE, the
// workers' test aid; the first layer's gradient is the last backward makes, so
// the later layers' chunks have reached the shards, and been applied, before
// the NaN is found). One such step is skipped on every shard, logged, and the
// job ends as accurate as a clean run; a NaN at every step fails the job after
// --max_nonfinite_steps skips with the message naming worker, step and
// parameter.
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::HaveFashionMnist;
using pstrain::testing::RunCommand;

std::string RunLine(const std::string& inject, const std::string& mode,
                    const std::string& extra = "") {
  return absl::StrCat(
      inject.empty() ? "" : "PSTRAIN_INJECT_NONFINITE=" + inject + " ",
      "cli/pstrain run --model=lenet5 --num_workers=2 ",
      mode == "allreduce" ? "" : "--num_ps=2 ",
      "--epochs=1 --max_steps_per_epoch=300 --log_every_steps=100 --mode=",
      mode, " ", extra, " 2>&1");
}

// The last "test accuracy: X" of a run's output; -1 if none.
double TestAccuracy(const std::string& output) {
  const std::string key = "test accuracy: ";
  const size_t at = output.rfind(key);
  if (at == std::string::npos) return -1;
  double accuracy = -1;
  const std::string rest = output.substr(at + key.size(), 6);
  if (!absl::SimpleAtod(rest, &accuracy)) return -1;
  return accuracy;
}

class NonFiniteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "no Fashion-MNIST";
  }
};

// A clean run of `mode` and one with a NaN in worker 1's gradient at step
// 150: the skip is logged once, by that worker, naming step and parameter
// and where it was skipped (`skipped_on`: "shard" or "worker"), and the
// run ends within 0.5 point of the clean run's accuracy.
void ExpectOneNanStepSkipped(const std::string& mode,
                             const std::string& skipped_on) {
  const auto clean = RunCommand(RunLine("", mode));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const auto skipped = RunCommand(RunLine("1:150", mode));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find(
                "worker 1: step 150: worker 1's element 0 of the gradient of "),
            std::string::npos)
      << skipped.output;
  EXPECT_NE(skipped.output.find("is nan; the step is skipped on every " +
                                skipped_on + " (1 in a row; at most 10)"),
            std::string::npos)
      << skipped.output;
  const double a = TestAccuracy(clean.output);
  ASSERT_GT(a, 0.5) << clean.output;
  EXPECT_NEAR(TestAccuracy(skipped.output), a, 0.005) << skipped.output;
}

TEST_F(NonFiniteTest, OneNanStepIsSkippedEverywhereAndTrainingGoesOn) {
  ExpectOneNanStepSkipped("sync", "shard");
}

TEST_F(NonFiniteTest, NanAtEveryStepFailsTheJobAfterTheLimit) {
  const auto r =
      RunCommand(RunLine("1:all", "sync", "--max_nonfinite_steps=3"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("4 consecutive steps skipped for non-finite values "
                          "(--max_nonfinite_steps=3); the last: step 3: "
                          "worker 1's element 0 of the gradient of "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("SUCCEEDED"), std::string::npos) << r.output;
}

TEST_F(NonFiniteTest, AsyncDropsTheNanPushesAndTrains) {
  const auto r = RunCommand(RunLine("0:40,41", "async"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("worker 0: step 40: worker 0's element 0 of the "
                          "gradient of "),
            std::string::npos)
      << r.output;
  EXPECT_GT(TestAccuracy(r.output), 0.5) << r.output;
}

// Allreduce: every worker sees the same averaged gradients, so every worker
// skips the step (the buckets applied before the NaN's are put back) and
// the job ends as accurate as a clean allreduce run.
TEST_F(NonFiniteTest, AllreduceSkipsTheStepOnEveryWorker) {
  ExpectOneNanStepSkipped("allreduce", "worker");
  const auto every =
      RunCommand(RunLine("0:all", "allreduce", "--max_nonfinite_steps=2"));
  EXPECT_EQ(every.exit_code, 1) << every.output;
  EXPECT_NE(every.output.find("3 consecutive steps skipped for non-finite "
                              "values (--max_nonfinite_steps=2)"),
            std::string::npos)
      << every.output;
}

}  // namespace
