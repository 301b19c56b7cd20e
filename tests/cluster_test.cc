// A job on a pstrain_coordinator process with its tasks started by hand, as
// a launcher would: `pstrain submit`, then pstrain_ps and pstrain_worker
// processes with --coordinator --job and their index (flag or a launcher's
// rank variable), then `pstrain wait`, `pstrain logs` and `pstrain status`.
// Also: a worker killed with SIGKILL mid-training fails the job within the
// heartbeat timeout, naming it, and every other task exits; a PS that
// cannot bind its port fails the job naming host and port.
// (tests/netns_cluster_test.sh runs the same on separate network
// namespaces.)
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::CoordinatorProcess;
using pstrain::testing::CountProcesses;
using pstrain::testing::HaveFashionMnist;
using pstrain::testing::Process;
using pstrain::testing::ReadTextFile;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using pstrain::testing::WriteTextFile;

std::unique_ptr<Process> StartTask(const std::string& role, int index,
                                   const CoordinatorProcess& coordinator,
                                   const std::string& job,
                                   std::vector<std::string> extra = {},
                                   std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {
      role == "ps" ? "server/pstrain_ps" : "worker/pstrain_worker",
      "--coordinator=" + coordinator.address(), "--job=" + job,
      "--advertise=127.0.0.1", "--heartbeat_interval_s=0.5"};
  if (role == "ps") argv.push_back("--bind=127.0.0.1");
  if (index >= 0) argv.push_back("--task_index=" + std::to_string(index));
  for (std::string& a : extra) argv.push_back(std::move(a));
  env.push_back("OMP_NUM_THREADS=1");
  return std::make_unique<Process>(
      argv, TempDir() + "/" + role + std::to_string(index) + ".log", env);
}

TEST(ClusterTest, SubmittedJobRunsOnTasksStartedByHand) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  CoordinatorProcess coordinator(TempDir() + "/jobs1.pb", 30);
  ASSERT_TRUE(coordinator.up());
  const std::string spec = TempDir() + "/job.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\" num_ps: 2 num_workers: 2 batch_size: 64 "
                "epochs: 1 max_steps_per_epoch: 30 log_every_steps: 10\n");
  auto r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r.output, "job-1\n");
  // Tasks in any order; worker 1 takes its index from Slurm's variable.
  std::vector<std::unique_ptr<Process>> tasks;
  tasks.push_back(StartTask("worker", 0, coordinator, "job-1"));
  tasks.push_back(StartTask("ps", 1, coordinator, "job-1"));
  tasks.push_back(
      StartTask("worker", -1, coordinator, "job-1", {}, {"SLURM_PROCID=1"}));
  tasks.push_back(StartTask("ps", 0, coordinator, "job-1"));

  r = RunCommand("cli/pstrain wait job-1 --wait_poll_ms=200" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[worker0\] Step10: [0-9]+\.[0-9]{2} data/sec)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[worker0\] Epoch 0 in [0-9.]+ sec, test time )"
                           R"([0-9.]+ sec, test accuracy: 0\.[0-9]{4})")))
      << r.output;
  EXPECT_NE(r.output.find("job-1 SUCCEEDED lenet5 2 ps 2 workers (4/4 "
                          "registered)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\| 2 \| 2 \| sync \| lenet5 \| 64 \| 1 \| 30 \| )")))
      << r.output;
  for (auto& task : tasks) EXPECT_EQ(task->Wait(20), 0);

  r = RunCommand("cli/pstrain logs job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\[ps1\] shard 1/2 of job-1 listening on 127\.0\.0\.1:)"
                 R"([0-9]+, advertised as 127\.0\.0\.1:[0-9]+)")))
      << r.output;
  EXPECT_NE(r.output.find("[ps0] all workers done; shard 0 exiting"),
            std::string::npos);
  r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(\n  epoch 0: [0-9.]+ s, test accuracy 0\.[0-9]{4}\n)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(worker 1 +DONE +127\.0\.0\.1 +30 steps, )"
                           R"([0-9.]+ samples/sec)")))
      << r.output;
}

TEST(ClusterTest, KilledWorkerFailsTheJobNamingItAndEveryTaskExits) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  constexpr int kHeartbeatTimeoutS = 3;
  CoordinatorProcess coordinator(TempDir() + "/jobs2.pb", kHeartbeatTimeoutS);
  ASSERT_TRUE(coordinator.up());
  const std::string spec = TempDir() + "/long.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\" num_ps: 1 num_workers: 2 batch_size: 64 "
                "epochs: 20\n");
  auto r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.output, "job-1\n");
  std::vector<std::unique_ptr<Process>> tasks;
  tasks.push_back(StartTask("ps", 0, coordinator, "job-1"));
  tasks.push_back(StartTask("worker", 0, coordinator, "job-1"));
  tasks.push_back(StartTask("worker", 1, coordinator, "job-1"));
  // Wait until worker 1 reports steps: it is training.
  bool training = false;
  for (int i = 0; i < 300 && !training; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
    training = std::regex_search(
        r.output, std::regex(R"(worker 1 +REGISTERED .* [1-9][0-9]* steps)"));
  }
  ASSERT_TRUE(training) << r.output;
  const auto killed_at = std::chrono::steady_clock::now();
  tasks[2]->Kill(SIGKILL);
  EXPECT_EQ(tasks[2]->Wait(5), -SIGKILL);

  r = RunCommand("cli/pstrain wait job-1 --wait_poll_ms=100" +
                 coordinator.flag());
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - killed_at)
                             .count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Named either by the heartbeats it stopped sending or, sooner, by the
  // shard whose barrier its broken stream broke (worker 0's failure).
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(job-1 FAILED lenet5 1 ps 2 workers \(3/3 )"
                 R"(registered\): (lost worker 1 on 127\.0\.0\.1: no )"
                 R"(heartbeat for [0-9]+ s|worker 0 on 127\.0\.0\.1 failed: )"
                 R"(ABORTED: .*worker 1 on 127\.0\.0\.1:[0-9]+: its push/pull )"
                 R"(stream to shard 0 broke mid-step .*)\n)")))
      << r.output;
  // Within the heartbeat timeout (plus the coordinator's 1 s check and the
  // wait's polls).
  EXPECT_LT(seconds, kHeartbeatTimeoutS + 3.0);
  // The PS and worker 0 learn it from their next heartbeat and exit 1.
  EXPECT_EQ(tasks[0]->Wait(10), 1);
  EXPECT_EQ(tasks[1]->Wait(10), 1);
  EXPECT_EQ(CountProcesses("pstrain_ps"), 0);
  EXPECT_EQ(CountProcesses("pstrain_worker"), 0);
}

// The coordinator crashes (SIGKILL) while the job trains and comes back on
// the same port from its job file: the tasks keep training, retry their
// heartbeats, and the job still SUCCEEDS; a `pstrain wait` started before
// the crash rides it out (issue 37) and exits 0 with the results.
TEST(ClusterTest, JobSurvivesACoordinatorCrashAndRestart) {
  if (!HaveFashionMnist())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string job_file = TempDir() + "/jobs4.pb";
  const int port = pstrain::testing::FreePort();
  auto coordinator = std::make_unique<CoordinatorProcess>(job_file, 30, port);
  ASSERT_TRUE(coordinator->up());
  const std::string spec = TempDir() + "/restart.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\" num_ps: 1 num_workers: 2 batch_size: 64 "
                "epochs: 2 max_steps_per_epoch: 150 log_every_steps: 50\n");
  auto r = RunCommand("cli/pstrain submit " + spec + coordinator->flag());
  ASSERT_EQ(r.output, "job-1\n");
  std::vector<std::unique_ptr<Process>> tasks;
  tasks.push_back(StartTask("ps", 0, *coordinator, "job-1"));
  tasks.push_back(StartTask("worker", 0, *coordinator, "job-1"));
  tasks.push_back(StartTask("worker", 1, *coordinator, "job-1"));
  bool training = false;
  for (int i = 0; i < 300 && !training; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r = RunCommand("cli/pstrain status job-1" + coordinator->flag());
    training = r.output.find("RUNNING") != std::string::npos;
  }
  ASSERT_TRUE(training) << r.output;
  const std::string wait_log = TempDir() + "/wait4.log";
  Process wait({"cli/pstrain", "wait", "job-1", "--wait_poll_ms=200",
                "--coordinator_timeout_s=60", "--rpc_timeout_s=5",
                "--coordinator=" + coordinator->address()},
               wait_log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  coordinator->Crash();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  coordinator = std::make_unique<CoordinatorProcess>(job_file, 30, port);
  ASSERT_TRUE(coordinator->up());
  EXPECT_EQ(wait.Wait(120), 0) << ReadTextFile(wait_log);
  const std::string output = ReadTextFile(wait_log);
  EXPECT_NE(output.find("pstrain: coordinator " + coordinator->address() +
                        " unreachable ("),
            std::string::npos)
      << output;
  EXPECT_NE(
      output.find("; retrying for up to 60 s (--coordinator_timeout_s)\n"),
      std::string::npos)
      << output;
  EXPECT_NE(output.find("pstrain: coordinator " + coordinator->address() +
                        " answers again\n"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("job-1 SUCCEEDED"), std::string::npos) << output;
  EXPECT_TRUE(std::regex_search(
      output,
      std::regex(R"(\| 1 \| 2 \| sync \| lenet5 \| 64 \| 2 \| 300 \| )")))
      << output;
  for (auto& task : tasks) EXPECT_EQ(task->Wait(20), 0);
}

TEST(ClusterTest, BadTaskFlagsGetOneLineErrors) {
  CoordinatorProcess coordinator(TempDir() + "/jobs5.pb", 30);
  ASSERT_TRUE(coordinator.up());
  struct Case {
    std::string command;
    int exit_code;
    std::string output;
  };
  const std::vector<Case> cases = {
      {"worker/pstrain_worker --job=job-1 --task_index=0", 2,
       "pstrain_worker: error: --coordinator is not set; expected host:port "
       "of the coordinator\n"},
      {"worker/pstrain_worker --role=ps --job=job-1 --task_index=0" +
           coordinator.flag(),
       2,
       "pstrain_worker: error: --role=ps: this binary runs worker tasks; "
       "expected worker\n"},
      {"env -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK -u PMI_RANK "
       "server/pstrain_ps --job=job-1" +
           coordinator.flag(),
       2,
       "pstrain_ps: error: --task_index is not set and none of SLURM_PROCID, "
       "OMPI_COMM_WORLD_RANK, PMI_RANK, JOB_COMPLETION_INDEX is in the "
       "environment; expected the task's index\n"},
      {"SLURM_PROCID=x server/pstrain_ps --job=job-1" + coordinator.flag(), 2,
       "pstrain_ps: error: SLURM_PROCID=x: expected a non-negative task "
       "index\n"},
      {"server/pstrain_ps --job=job-9 --task_index=0" + coordinator.flag(), 1,
       "pstrain_ps: error: ps 0 of job-9: coordinator " +
           coordinator.address() + ": unknown job job-9\n"},
  };
  for (const Case& c : cases) {
    const auto r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.command;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
  // An index outside the job fails the job, naming the index.
  const std::string spec = TempDir() + "/small.pbtxt";
  WriteTextFile(spec, "num_ps: 1 num_workers: 1 batch_size: 64 epochs: 1\n");
  auto r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.output, "job-1\n");
  r = RunCommand("server/pstrain_ps --job=job-1 --task_index=3" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "pstrain_ps: error: ps 3 of job-1: task index 3 is outside the "
            "job's 1 ps tasks\n");
}

TEST(ClusterTest, PsThatCannotBindFailsTheJobNamingHostAndPort) {
  // Hold a port, then give it to ps 0 in the spec.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  CoordinatorProcess coordinator(TempDir() + "/jobs3.pb", 30);
  ASSERT_TRUE(coordinator.up());
  const std::string spec = TempDir() + "/bind.pbtxt";
  WriteTextFile(spec,
                "num_ps: 1 num_workers: 1 batch_size: 64 epochs: 1 "
                "ps_hosts { host: \"127.0.0.1\" port: " +
                    port + " }\n");
  auto r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.output, "job-1\n");
  Process ps({"server/pstrain_ps", "--coordinator=" + coordinator.address(),
              "--job=job-1", "--task_index=0", "--bind=0.0.0.0"},
             TempDir() + "/bind_ps.log");
  EXPECT_EQ(ps.Wait(20), 1);
  close(fd);
  r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
  EXPECT_NE(r.output.find("job-1 FAILED lenet5 1 ps 1 workers (0/2 "
                          "registered): ps 0 on 127.0.0.1:" +
                          port + " failed: cannot listen on 0.0.0.0:" + port +
                          " (advertised as 127.0.0.1:" + port +
                          "): in use, or not an address of this host"),
            std::string::npos)
      << r.output;
}

}  // namespace
