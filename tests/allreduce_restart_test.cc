// An allreduce job that survives a worker's death (issue 36), as torchrun's
// elastic agent does: `pstrain run --mode=allreduce` with checkpoints, one
// of whose workers is killed with SIGKILL at a random step after the first
// checkpoint. The supervisor counts one restart (--max_restarts), the
// coordinator stops the surviving worker, and every worker starts again
// under a new rendezvous, resuming from the newest checkpoint. The job ends
// with exit 0 and the accuracy of the run nobody killed; without restarts
// left it fails naming the death.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::HaveFashionMnist;
using pstrain::testing::JoinArgv;
using pstrain::testing::KillChild;
using pstrain::testing::Process;
using pstrain::testing::ReadLatest;
using pstrain::testing::ReadTextFile;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using pstrain::testing::WaitFor;

// 2 workers, LeNet-5 on Fashion-MNIST: 400 steps, a checkpoint every 50.
std::vector<std::string> RunArgv(const std::string& dir,
                                 const std::string& extra = "") {
  std::vector<std::string> argv = {"cli/pstrain",
                                   "run",
                                   "--mode=allreduce",
                                   "--model=lenet5",
                                   "--num_workers=2",
                                   "--epochs=1",
                                   "--max_steps_per_epoch=400",
                                   "--log_every_steps=50",
                                   "--checkpoint_every_steps=50",
                                   "--checkpoint_dir=" + dir,
                                   "--heartbeat_timeout_s=30"};
  if (!extra.empty()) argv.push_back(extra);
  return argv;
}  // The final test accuracy of a run's table, or -1.
double Accuracy(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(
          output, m,
          std::regex(R"(\| [0-9.]+ s \| [0-9.]+ \| (0\.[0-9]{4}) \|)"))) {
    return -1;
  }
  return std::stod(m[1].str());
}

TEST(AllreduceRestartTest, KilledWorkerRestartsEveryWorkerFromCheckpoint) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
  const auto clean = RunCommand(JoinArgv(RunArgv(TempDir() + "/clean")));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const double clean_accuracy = Accuracy(clean.output);
  ASSERT_GT(clean_accuracy, 0.6) << clean.output;

  // The victim and the moment: either worker, 0 to 1.5 s after the first
  // checkpoint is durable (printed, to reproduce a failure).
  const unsigned seed = std::random_device()();
  std::mt19937 random(seed);
  const int victim = static_cast<int>(random() % 2);
  const int delay_ms = static_cast<int>(random() % 1500);
  std::printf("seed %u: killing worker %d %d ms after the first checkpoint\n",
              seed, victim, delay_ms);
  const std::string dir = TempDir() + "/faulted";
  const std::string log = TempDir() + "/faulted.log";
  Process run(RunArgv(dir), log);
  ASSERT_TRUE(
      WaitFor([&] { return !ReadLatest(dir).empty(); }, absl::Minutes(1)))
      << ReadTextFile(log);
  absl::SleepFor(absl::Milliseconds(delay_ms));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(KillChild(run.pid(), absl::StrCat("pstrain_worker .*--task_",
                                                "index=", victim, " ")))
      << ReadTextFile(log);
  const int exit_code = run.Wait(120);
  const absl::Duration run_after_kill = absl::Now() - killed;
  const std::string output = ReadTextFile(log);
  ASSERT_EQ(exit_code, 0) << output;

  // The supervisor reports the death and the one restart it counts, and
  // the survivor is stopped and started again, not counted.
  EXPECT_NE(output.find(absl::StrCat(
                "pstrain: worker ", victim,
                " died (signal 9); restarting every worker from the newest "
                "checkpoint (restart 1 of 3)")),
            std::string::npos)
      << output;
  EXPECT_NE(output.find(absl::StrCat("pstrain: worker ", 1 - victim,
                                     " stopped for the job's restart; "
                                     "starting it again")),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("restart 2 of"), std::string::npos) << output;
  // Worker 0 (restarted either way) resumes from a checkpoint step.
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(
      output, resumed,
      std::regex(R"(\[worker0\] Resuming from .*/step-([0-9]+) \(step )")))
      << output;
  EXPECT_EQ(std::stoi(resumed[1].str()) % 50, 0) << resumed[0].str();
  EXPECT_GE(std::stoi(resumed[1].str()), 50) << resumed[0].str();
  std::printf("resumed from step %s; %.1f s from the kill to the end\n",
              resumed[1].str().c_str(), absl::ToDoubleSeconds(run_after_kill));

  // Within a point of the run nobody killed; in fact the same model, bit
  // for bit (the restore is exact and a step's batch a function of it).
  const double accuracy = Accuracy(output);
  EXPECT_NEAR(accuracy, clean_accuracy, 0.01) << output;
  EXPECT_EQ(ReadTextFile(dir + "/model.safetensors"),
            ReadTextFile(TempDir() + "/clean/model.safetensors"));
}

TEST(AllreduceRestartTest, WithoutRestartsLeftTheJobFailsNamingTheDeath) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
  // No checkpoint folder: restarts are refused before anything starts.
  const auto refused = RunCommand(
      "cli/pstrain run --mode=allreduce --num_workers=2 --max_restarts=2 "
      "2>&1");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("max_restarts: 2; an allreduce job restarts "
                                "every worker from the newest checkpoint and "
                                "needs checkpoint_dir"),
            std::string::npos)
      << refused.output;

  const std::string dir = TempDir() + "/no_budget";
  const std::string log = TempDir() + "/no_budget.log";
  Process run(RunArgv(dir, "--max_restarts=0"), log);
  ASSERT_TRUE(
      WaitFor([&] { return !ReadLatest(dir).empty(); }, absl::Minutes(1)))
      << ReadTextFile(log);
  ASSERT_TRUE(KillChild(run.pid(), "pstrain_worker .*--task_index=1 "))
      << ReadTextFile(log);
  const int exit_code = run.Wait(60);
  const std::string output = ReadTextFile(log);
  EXPECT_EQ(exit_code, 1) << output;
  // One line naming the death (the survivor's broken allreduce waits for
  // it to be reported).
  EXPECT_TRUE(std::regex_search(
      output, std::regex(R"(\npstrain: error: job-[^ ]+ FAILED: worker 1 )"
                         R"([^\n]*exited with signal 9)")))
      << output;
  EXPECT_EQ(output.find("restarting"), std::string::npos) << output;
}

}  // namespace
