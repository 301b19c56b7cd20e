// `pstrain submit | status | cancel | wait` against a real
// pstrain_coordinator process: what a user sees, exit codes, and that a
// restarted coordinator still knows the job (its job file).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace {

struct Result {
  int exit_code = -1;
  std::string output;
};

std::string TempDir() { return std::getenv("TEST_TMPDIR"); }

Result RunCommand(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A coordinator process on a free port, keeping its jobs in `job_file`.
class Coordinator {
 public:
  explicit Coordinator(const std::string& job_file) {
    const std::string port_file = TempDir() + "/coordinator.port";
    std::remove(port_file.c_str());
    pid_ = fork();
    if (pid_ == 0) {
      execl("tools/pstrain_coordinator", "pstrain_coordinator", "--port=0",
            "--bind=127.0.0.1", ("--port_file=" + port_file).c_str(),
            ("--job_file=" + job_file).c_str(), "--heartbeat_timeout_s=600",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 100 && port_.empty(); ++i) {
      usleep(50000);
      std::ifstream f(port_file);
      std::getline(f, port_);
    }
  }
  ~Coordinator() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  std::string flag() const { return " --coordinator=127.0.0.1:" + port_; }
  bool up() const { return !port_.empty(); }
  const std::string& port() const { return port_; }

 private:
  pid_t pid_ = -1;
  std::string port_;
};

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(JobCliTest, SubmitStatusCancelWaitAndRestart) {
  const std::string job_file = TempDir() + "/jobs.pb";
  const std::string spec = TempDir() + "/job.pbtxt";
  WriteFile(spec,
            "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 2\nbatch_size: 64\n"
            "epochs: 1\nworker_hosts { host: \"10.0.0.4\" port: 7001 }\n"
            "worker_hosts { host: \"10.0.0.5\" port: 7001 }\n");
  {
    Coordinator coordinator(job_file);
    ASSERT_TRUE(coordinator.up());
    Result r = RunCommand("tools/pstrain submit " + spec + coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "job-1\n");
    r = RunCommand("tools/pstrain status job-1" + coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output,
              "job-1 PENDING lenet5 1 ps 2 workers (0/3 registered)\n"
              "  ps 0       WAITING  -\n"
              "  worker 0   WAITING  -\n"
              "  worker 1   WAITING  -\n");
  }
  // A restarted coordinator still knows job-1.
  Coordinator coordinator(job_file);
  ASSERT_TRUE(coordinator.up());
  Result r = RunCommand("tools/pstrain status" + coordinator.flag());
  EXPECT_EQ(r.output, "job-1 PENDING lenet5 1 ps 2 workers (0/3 registered)\n");
  r = RunCommand("tools/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand("tools/pstrain wait job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "job-1 CANCELLED lenet5 1 ps 2 workers (0/3 registered): "
            "cancelled\n");
  r = RunCommand("tools/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "pstrain: error: coordinator 127.0.0.1:" + coordinator.port() +
                ": job-1 has already ended (JOB_CANCELLED)\n");
}

TEST(JobCliTest, BadSpecIsRefusedBeforeSubmitWithTheFieldNamed) {
  const std::string spec = TempDir() + "/bad.pbtxt";
  WriteFile(spec,
            "num_ps: 1\nnum_workers: 1\nbatch_size: 8\nepochs: 1\n"
            "ps_hosts { host: \"h\" port: 7000 }\n"
            "worker_hosts { host: \"h\" port: 7000 }\n");
  // No coordinator needed: the spec is checked first.
  Result r =
      RunCommand("tools/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: " + spec +
                          ": worker_hosts[0]: h:7000 is already the address "
                          "of ps_hosts[0]\n");
  r = RunCommand("tools/pstrain submit " + TempDir() + "/missing.pbtxt");
  EXPECT_EQ(r.exit_code, 2);
  r = RunCommand(
      "tools/pstrain status --coordinator=127.0.0.1:1 --rpc_timeout_s=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output.rfind("pstrain: error: coordinator 127.0.0.1:1: ", 0), 0u)
      << r.output;
}

}  // namespace
