#include "tests/cli_test_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/tls.h"

namespace pstrain::testing {

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
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

std::string TempDir() { return std::getenv("TEST_TMPDIR"); }

void WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool HaveFashionMnist() {
  std::ifstream f(std::string(kFashionMnistDir) +
                  "/train-images-idx3-ubyte.gz");
  return f.good();
}

int CountProcesses(const std::string& name) {
  FILE* pipe = popen(("pgrep -c -x " + name).c_str(), "r");
  int count = 0;
  if (pipe != nullptr) {
    if (fscanf(pipe, "%d", &count) != 1) count = 0;
    pclose(pipe);
  }
  return count;
}

Process::Process(const std::vector<std::string>& argv,
                 const std::string& log_file,
                 const std::vector<std::string>& env) {
  pid_ = fork();
  if (pid_ != 0) return;
  const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Process::Kill(int signal) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

int Process::Wait(double timeout_s) {
  for (int i = 0; i < timeout_s * 100; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    usleep(10000);
  }
  return -1000;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

void UseTestCertificates() {
  const std::string dir = TempDir() + "/tls";
  std::vector<TlsIdentity> identities = {TlsIdentity{TlsRole::kCoordinator},
                                         TlsIdentity{TlsRole::kAdmin}};
  for (int i = 0; i < 8; ++i) {
    identities.push_back(TlsIdentity{TlsRole::kPs, i, "*"});
    identities.push_back(TlsIdentity{TlsRole::kWorker, i, "*"});
  }
  if (access((dir + "/admin.pem").c_str(), R_OK) != 0) {
    const absl::Status made = MakeCertificates(dir, identities);
    if (!made.ok()) {
      std::fprintf(stderr, "test certificates: %s\n", made.ToString().c_str());
      std::abort();
    }
  }
  setenv("PSTRAIN_TLS_DIR", dir.c_str(), 1);
}

CoordinatorProcess::CoordinatorProcess(const std::string& job_file,
                                       int heartbeat_timeout_s, int port) {
  UseTestCertificates();
  const std::string port_file = TempDir() + "/coordinator.port";
  std::remove(port_file.c_str());
  pid_ = fork();
  if (pid_ == 0) {
    const std::string timeout =
        "--heartbeat_timeout_s=" + std::to_string(heartbeat_timeout_s);
    const std::string port_flag = "--port=" + std::to_string(port);
    execl("coordinator/pstrain_coordinator", "pstrain_coordinator",
          port_flag.c_str(), "--bind=127.0.0.1",
          ("--port_file=" + port_file).c_str(),
          ("--job_file=" + job_file).c_str(), timeout.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 100 && port_.empty(); ++i) {
    usleep(50000);
    std::ifstream f(port_file);
    std::getline(f, port_);
  }
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
}

void CoordinatorProcess::Crash() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string JoinArgv(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& a : argv) command += a + " ";
  return command;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout,
             absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(poll);
  }
  return done();
}

std::vector<int> ChildPids(pid_t parent, const std::string& pattern) {
  const CommandResult r =
      RunCommand(absl::StrCat("pgrep -P ", parent, " -f '", pattern, "'"));
  std::vector<int> pids;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (!line.empty()) pids.push_back(std::atoi(std::string(line).c_str()));
  }
  return pids;
}

bool KillChild(pid_t parent, const std::string& pattern) {
  const std::vector<int> pids = ChildPids(parent, pattern);
  return !pids.empty() && pids[0] > 0 && kill(pids[0], SIGKILL) == 0;
}

std::string ReadLatest(const std::string& dir) {
  std::error_code error;
  if (!std::filesystem::exists(dir + "/latest", error)) return "";
  return ReadTextFile(dir + "/latest");
}

}  // namespace pstrain::testing
