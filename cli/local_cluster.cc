#include "cli/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

absl::Mutex g_print_mu;

// Copies `fd` to our stdout line by line, each line prefixed "[role] ".
// Remembers the last line that looks like an error.
void PumpLines(int fd, std::string role, std::shared_ptr<std::string> error) {
  FILE* in = fdopen(fd, "r");
  if (in == nullptr) {
    close(fd);
    return;
  }
  char* line = nullptr;
  size_t capacity = 0;
  ssize_t n;
  while ((n = getline(&line, &capacity, in)) > 0) {
    std::string text(line, n);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    {
      absl::MutexLock lock(&g_print_mu);
      std::printf("[%s] %s\n", role.c_str(), text.c_str());
      std::fflush(stdout);
      if (absl::StrContains(text, "error")) *error = text;
    }
  }
  std::free(line);
  std::fclose(in);
}

}  // namespace

LocalCluster::~LocalCluster() { StopAll(absl::Seconds(2)); }

absl::Status LocalCluster::Start(const std::string& role,
                                 const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return ErrnoToStatus(errno, "fork");
  }
  if (pid == 0) {
    // Child: die with the parent, even if it is SIGKILLed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", args[0],
                 std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  auto child = std::make_unique<Child>();
  child->role = role;
  child->pid = pid;
  child->last_error_line = std::make_shared<std::string>();
  child->reader =
      std::thread(PumpLines, pipe_fds[0], role, child->last_error_line);
  running_[pid] = std::move(child);
  return absl::OkStatus();
}

ChildExit LocalCluster::WaitAny(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!running_.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0 && running_.count(pid) > 0) {
      std::unique_ptr<Child> child = std::move(running_[pid]);
      running_.erase(pid);
      child->reader.join();  // the pipe closes when the child exits
      ChildExit exit;
      exit.role = child->role;
      exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      exit.last_error_line = *child->last_error_line;
      exited_.push_back(std::move(child));
      return exit;
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return ChildExit{};
}

bool LocalCluster::Running(const std::string& role) const {
  for (const auto& [pid, child] : running_) {
    if (child->role == role) return true;
  }
  return false;
}

void LocalCluster::StopAll(absl::Duration grace) {
  for (const auto& [pid, child] : running_) kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (!running_.empty() && absl::Now() < deadline) {
    WaitAny(absl::Milliseconds(50));
  }
  for (const auto& [pid, child] : running_) kill(pid, SIGKILL);
  while (!running_.empty()) WaitAny(absl::Seconds(1));
}

}  // namespace pstrain
