// Runs a job's ps and worker processes on this machine: fork/exec with each
// child's stdout and stderr streamed line by line with a role prefix
// ("[ps0] ...", "[worker1] ..."), and every child killed when the parent
// dies (PR_SET_PDEATHSIG), so no process is left behind.
//
// Thread-safety: one LocalCluster is driven by one thread; its output threads
// share a mutex for printing.
#ifndef PSTRAIN_CLI_LOCAL_CLUSTER_H_
#define PSTRAIN_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pstrain {

struct ChildExit {
  std::string role;
  // Exit code, or -signal when killed by a signal.
  int code = 0;
  std::string last_error_line;
};

class LocalCluster {
 public:
  LocalCluster() = default;
  ~LocalCluster();  // kills and reaps whatever is still running

  // Starts `argv` as `role` with extra environment `env` ("K=V").
  absl::Status Start(const std::string& role,
                     const std::vector<std::string>& argv,
                     const std::vector<std::string>& env = {});

  // Waits up to `timeout` for any child to exit; returns its exit, or
  // nullopt-like {role == ""} on timeout.
  ChildExit WaitAny(absl::Duration timeout);

  bool Running(const std::string& role) const;
  int num_running() const { return static_cast<int>(running_.size()); }

  // SIGTERM to every running child, SIGKILL after `grace`, then reaps all.
  void StopAll(absl::Duration grace);

 private:
  struct Child {
    std::string role;
    pid_t pid = -1;
    std::thread reader;
    std::shared_ptr<std::string> last_error_line;
  };
  std::map<pid_t, std::unique_ptr<Child>> running_;
  std::vector<std::unique_ptr<Child>> exited_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CLI_LOCAL_CLUSTER_H_
