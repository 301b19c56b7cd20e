// How a job's tasks start, against a plaintext (--insecure)
// pstrain_coordinator process: a task flag out of range ends pstrain_ps or
// pstrain_worker at once with exit 2 and one line naming the flag and its
// range, before the coordinator hears of it (the job is left PENDING); and
// `pstrain node --insecure` starts its tasks with --insecure, so that they
// join the plaintext coordinator and the job succeeds (they asked for a TLS
// folder, and the job failed).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::CommandResult;
using pstrain::testing::Process;
using pstrain::testing::ReadTextFile;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using pstrain::testing::WaitFor;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A synthetic job (no dataset, no model): a few steps of one worker
// against one shard.
constexpr char kSpec[] =
    "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 1\nbatch_size: 8\n"
    "epochs: 1\ncompute: \"synthetic\"\ncompute_ms: 1\nmodel_bytes: 4096\n"
    "max_steps_per_epoch: 3\n";

// A pstrain_coordinator process in plaintext on 127.0.0.1, on a free port.
// No task or command of the test has a TLS folder to fall back on.
class InsecureCoordinator {
 public:
  explicit InsecureCoordinator(const std::string& name) {
    unsetenv("PSTRAIN_TLS_DIR");
    unsetenv("PSTRAIN_ADMIN_TLS_DIR");
    const std::string port_file = TempDir() + "/" + name + ".port";
    std::remove(port_file.c_str());
    process_ = std::make_unique<Process>(
        std::vector<std::string>{"coordinator/pstrain_coordinator",
                                 "--insecure", "--bind=127.0.0.1", "--port=0",
                                 "--port_file=" + port_file},
        TempDir() + "/" + name + ".log");
    WaitFor(
        [&] {
          std::ifstream f(port_file);
          std::getline(f, port_);
          return !port_.empty();
        },
        absl::Seconds(10), absl::Milliseconds(50));
  }

  bool up() const { return !port_.empty(); }
  std::string address() const { return "127.0.0.1:" + port_; }
  // The flags a command or task needs to reach it.
  std::string flags() const {
    return " --coordinator=" + address() + " --insecure";
  }

  // Submits `spec` (a file); the job's id, or "" (with the output in
  // `*output`).
  std::string Submit(const std::string& spec, std::string* output) const {
    const CommandResult r = RunCommand("cli/pstrain submit " + spec + flags());
    *output = r.output;
    if (r.exit_code != 0) return "";
    return WithoutWarning(r.output);
  }

  // `pstrain status JOB` without the --insecure warning.
  std::string Status(const std::string& job) const {
    return WithoutWarning(
        RunCommand("cli/pstrain status " + job + flags()).output);
  }

 private:
  // `output` without the warning line --insecure prints; its last newline
  // left out.
  static std::string WithoutWarning(const std::string& output) {
    std::string kept;
    for (absl::string_view line :
         absl::StrSplit(output, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "pstrain: warning: --insecure")) continue;
      if (!kept.empty()) kept += "\n";
      kept.append(line.data(), line.size());
    }
    return kept;
  }

  std::unique_ptr<Process> process_;
  std::string port_;
};

std::string WriteSpec(const std::string& name) {
  const std::string path = TempDir() + "/" + name + ".pbtxt";
  pstrain::testing::WriteTextFile(path, kSpec);
  return path;
}

// A typo in a task's flags ends that task (exit 2, one line naming the flag
// and its range) before it joins its job: the job stays PENDING instead of
// failing with the task's message.
TEST(TaskStartTest, AFlagOutOfRangeExitsTwoBeforeJoiningTheJob) {
  InsecureCoordinator coordinator("flags_coordinator");
  ASSERT_TRUE(coordinator.up());
  std::string output;
  const std::string job = coordinator.Submit(WriteSpec("flags"), &output);
  ASSERT_THAT(job, StartsWith("job-")) << output;
  const std::string task = coordinator.flags() + " --job=" + job +
                           " --task_index=0 --coordinator_timeout_s=5";
  struct Case {
    std::string command;
    std::string line;
  };
  const std::vector<Case> cases = {
      {"server/pstrain_ps" + task + " --port=70000",
       "pstrain_ps: error: --port=70000: expected 0 to 65535 (0: any free "
       "port; -1: the job spec's)\n"},
      {"server/pstrain_ps" + task + " --threads=-2",
       "pstrain_ps: error: --threads=-2: expected 1 to 1024 (0: automatic)\n"},
      {"server/pstrain_ps" + task + " --advertise=127.0.0.1:99999",
       "pstrain_ps: error: --advertise=127.0.0.1:99999: expected host or "
       "host:PORT, PORT 0 to 65535\n"},
      {"server/pstrain_ps" + task + " --bind=0.0.0.0",
       "pstrain_ps: error: --insecure with --bind=0.0.0.0: plaintext on a "
       "non-loopback address lets anyone on the network cancel jobs and read "
       "or change the model; add --insecure_allow_remote to do it anyway, or "
       "use --tls_dir\n"},
      {"worker/pstrain_worker" + task + " --threads=-3",
       "pstrain_worker: error: --threads=-3: expected 1 to 1024 (0: "
       "automatic)\n"},
      {"worker/pstrain_worker" + coordinator.flags() + " --job=" + job +
           " --task_index=-4",
       "pstrain_worker: error: --task_index=-4: expected 0 to 4095 (-1: from "
       "the launcher's environment)\n"},
      {"worker/pstrain_worker" + task + " --port=-7",
       "pstrain_worker: error: --port=-7: expected 0 to 65535 (0: any free "
       "port; -1: the job spec's)\n"},
  };
  for (const Case& c : cases) {
    const CommandResult r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.line) << c.command;
  }
  const std::string status = coordinator.Status(job);
  EXPECT_THAT(status, StartsWith(job + " PENDING ")) << status;
  EXPECT_THAT(status, Not(HasSubstr("FAILED"))) << status;
}

// `pstrain node --insecure` hands --insecure to the tasks it starts: they
// reach the plaintext coordinator and the job succeeds.
TEST(TaskStartTest, AnInsecureNodesTasksJoinAPlaintextCoordinator) {
  InsecureCoordinator coordinator("node_coordinator");
  ASSERT_TRUE(coordinator.up());
  std::string output;
  const std::string job = coordinator.Submit(WriteSpec("node"), &output);
  ASSERT_THAT(job, StartsWith("job-")) << output;
  const std::string log = TempDir() + "/node.log";
  Process node({"cli/pstrain", "node", "--coordinator=" + coordinator.address(),
                "--insecure", "--job=" + job, "--node_grace_s=5"},
               log);
  const int code = node.Wait(120);
  const std::string node_output = ReadTextFile(log);
  EXPECT_EQ(code, 0) << node_output;
  EXPECT_THAT(node_output, Not(HasSubstr("--tls_dir is not set")));
  EXPECT_THAT(node_output,
              HasSubstr("pstrain node: all 2 tasks of this node exited 0"));
  const std::string status = coordinator.Status(job);
  EXPECT_THAT(status, StartsWith(job + " SUCCEEDED ")) << status;
}

}  // namespace
