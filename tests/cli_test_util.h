// Helpers for the tests that run pstrain's binaries as a user would: run a
// command and capture its output, start processes in the background, a
// pstrain_coordinator process on a free port.
//
// Paths are relative to the test's runfiles folder ("cli/pstrain").
// Thread-compatible.
#ifndef PSTRAIN_TESTS_CLI_TEST_UTIL_H_
#define PSTRAIN_TESTS_CLI_TEST_UTIL_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace pstrain::testing {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct CommandResult {
  int exit_code = -1;
  // stdout and stderr together.
  std::string output;
};

// Runs `command` through /bin/sh and waits for it.
CommandResult RunCommand(const std::string& command);

// $TEST_TMPDIR.
std::string TempDir();
void WriteTextFile(const std::string& path, const std::string& text);
std::string ReadTextFile(const std::string& path);
bool HaveFashionMnist();
// Makes a cluster's certificates (any job; coordinator, admin, 8 shards and
// 8 workers) under $TEST_TMPDIR/tls once, and points PSTRAIN_TLS_DIR at
// them, so that every pstrain process this test starts speaks mutual TLS.
void UseTestCertificates();
// A TCP port that was free a moment ago.
int FreePort();
// Processes whose name is exactly `name`.
int CountProcesses(const std::string& name);
// `argv` joined by spaces, for RunCommand.
std::string JoinArgv(const std::vector<std::string>& argv);
// Polls `done` every `poll` for at most `timeout`; its last answer.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout,
             absl::Duration poll = absl::Milliseconds(10));
// The pids of `parent`'s children whose command line matches `pattern`
// (pgrep -f), oldest first.
std::vector<int> ChildPids(pid_t parent, const std::string& pattern);
// Kills (SIGKILL) `parent`'s first child matching `pattern`; false if none.
bool KillChild(pid_t parent, const std::string& pattern);
// The text of checkpoint folder `dir`'s `latest` ("step-N"), or "" while
// there is none.
std::string ReadLatest(const std::string& dir);

// A background process with stdout and stderr sent to `log_file`, extra
// environment `env` ("K=V"). Killed (SIGKILL) and reaped on destruction if
// still running.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& log_file,
          const std::vector<std::string>& env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Kill(int signal);
  // Waits up to `timeout_s` for the exit; returns the exit code, -signal if
  // killed, or -1000 on timeout.
  int Wait(double timeout_s);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// A pstrain_coordinator process on 127.0.0.1, on `port` (0: a free one).
class CoordinatorProcess {
 public:
  CoordinatorProcess(const std::string& job_file, int heartbeat_timeout_s,
                     int port = 0);
  ~CoordinatorProcess();
  // SIGKILL, as a crash.
  void Crash();
  // " --coordinator=127.0.0.1:PORT".
  std::string flag() const { return " --coordinator=127.0.0.1:" + port_; }
  std::string address() const { return "127.0.0.1:" + port_; }
  bool up() const { return !port_.empty(); }
  const std::string& port() const { return port_; }

 private:
  pid_t pid_ = -1;
  std::string port_;
};

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_CLI_TEST_UTIL_H_
