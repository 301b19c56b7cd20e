// The supervisor of one node's tasks of a job, the one that both `pstrain
// run` (an in-process coordinator, one node with every task) and `pstrain
// node` (a remote coordinator, this node's tasks) run. It starts the tasks
// as child processes (cli/local_cluster: their output prefixed "[worker1]
// ...", none left behind), and while the job runs:
//  - a task that dies (a non-zero exit, a signal) is restarted only if the
//    job's coordinator says so: the supervisor asks RestartTask as that
//    task (its own key from the TLS folder), and the job table counts the
//    job's restarts against its spec's max_restarts over every node
//    (JobTable::TaskRestarting), failing the job if they are spent. A
//    restarted worker gets --rejoin (TrainerOptions.rejoin, worker/trainer.h).
//  - a death is reported instead (TaskFinished, not ok, which fails the
//    job) when the spec allows no restarts, or when the job's restarts as
//    the coordinator last said (GetJob, JobRestarts) are already
//    max_restarts: the report says "exited with signal 9 (the restart
//    budget, --max_restarts=3, is spent; deaths: ps 1 (signal 9), ...;
//    last checkpoint: DIR): LAST ERROR LINE", naming the deaths this
//    supervisor saw. The supervisor keeps no count of its own: two nodes
//    that race for the last restart are decided by the table, whose refusal
//    fails the job in its own words.
//  - an elastic job's worker that the coordinator removed instead of
//    failing the job (min_workers; its task TASK_REMOVED), or a shard an
//    applied membership left out (max_ps) that exited non-zero, is left
//    out: "PROGRAM: NAME removed from the job (WHY); the job goes on with N
//    workers" ("... with M shards"), and the others run on. A removed task
//    that exits 0 is no failure anyway.
//  - a task that exits with kRestartExitCode (the coordinator stopped it
//    for the restart of every worker in allreduce; counted for the death
//    that caused it) is started again with --rejoin, uncounted.
// Once the job has ended, or a task failed without a restart, the tasks
// still running get `end_grace` to exit by themselves, then SIGTERM (and
// SIGKILL 3 s later). A nonzero *stop_signal (SIGINT/SIGTERM) stops every
// task at once.
//
// Lines printed on stdout, the same for both commands but for PROGRAM and
// NAME (TaskNames): "PROGRAM: NAME died (signal 9); restarting it (restart
// 1 of 3)" (allreduce: "restarting every worker from the newest
// checkpoint"; the counts are the coordinator's answer), "PROGRAM: NAME
// stopped for the job's restart; starting it again", and on stderr
// "PROGRAM: error: not restarting NAME: WHY" when the coordinator refused
// or could not be asked. What else a command prints about failures it
// prints from the callbacks and the result.
//
// Errors of the coordinator are not returned: a GetJob that fails leaves
// the job's state as last read, a restart that cannot be asked is a
// failure of the task.
//
// Thread-safety: one NodeSupervisor is driven by one thread (Start, then
// Run once); the callbacks run on it.
#ifndef PSTRAIN_CLI_NODE_SUPERVISOR_H_
#define PSTRAIN_CLI_NODE_SUPERVISOR_H_

#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/local_cluster.h"
#include "common/tls.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace pstrain {

// One task of the job to run on this node.
struct SupervisedTask {
  TaskRole role = ROLE_WORKER;
  int index = 0;
  std::vector<std::string> argv;  // argv[0]: the binary's path
  std::vector<std::string> env;   // extra "K=V"

  // Its name as its output prefix and ChildExit.role: "ps0", "worker1".
  std::string key() const;
};

// How the supervisor's lines name a task: as the job's log does ("worker
// 1", `pstrain run`) or as its output prefix ("worker1", `pstrain node`).
enum class TaskNames { kJobLog, kOutputPrefix };

struct SupervisorOptions {
  // The first word of every line it prints: "pstrain", "pstrain node".
  std::string program = "pstrain";
  TaskNames names = TaskNames::kJobLog;
  // The job's coordinator, host:port, reached as each task (mutual TLS
  // with the tasks' keys in tls.dir, or plaintext with tls.insecure).
  std::string coordinator;
  std::string job_id;
  TlsOptions tls;
  // The job's spec (its mode, max_restarts and checkpoint_dir are read).
  JobSpec spec;
  // After the job ended or a task failed without a restart: how long the
  // tasks may take to exit by themselves before SIGTERM.
  absl::Duration end_grace = absl::Seconds(10);
  // How long one wait for a child's exit lasts, and so how often the job's
  // state is read (GetJob) while the children run.
  absl::Duration poll = absl::Milliseconds(200);
  // Set by a signal handler (may be null): nonzero stops every task.
  const volatile std::sig_atomic_t* stop_signal = nullptr;
  // Each may be empty. Once a signal was seen, before the tasks are
  // stopped (`pstrain run` cancels its job).
  std::function<void()> on_signal;
  // The first task that exited non-zero and was not started again, with
  // its exit, once its death was reported.
  std::function<void(const SupervisedTask&, const ChildExit&)> on_failure;
  // When `end_grace` has passed: the job's state as last read and the
  // tasks still running, before they are stopped.
  std::function<void(JobState, const std::vector<SupervisedTask>&)>
      on_grace_over;
  // Called once per `poll` while the job runs: tasks to start now; one
  // whose key() is already running is skipped (`pstrain run` starts the
  // workers and shards a Scale added, issue 40). A task started so is
  // supervised as the others.
  std::function<std::vector<SupervisedTask>()> more_tasks;
};

struct SupervisorResult {
  // 0 when no task exited non-zero without being started again (those
  // stopped after the grace do not count); else the first such exit's
  // code, or 128 + its signal. 128 + `signal` when a signal stopped the
  // tasks.
  int exit_code = 0;
  int signal = 0;
  // The first task that exited non-zero and was not started again
  // (role "" if none).
  ChildExit first_failure;
};

// A stub to the coordinator at `address` as `self` (mutual TLS from `tls`,
// or plaintext with tls.insecure) that receives any answer the coordinator
// sends (coordinator/task_agent.h CoordinatorChannelArguments).
absl::StatusOr<std::unique_ptr<Coordinator::Stub>> CoordinatorStubAs(
    const std::string& address, const TlsOptions& tls, const TlsIdentity& self);

class NodeSupervisor {
 public:
  explicit NodeSupervisor(SupervisorOptions options);
  ~NodeSupervisor();  // stops whatever still runs
  NodeSupervisor(const NodeSupervisor&) = delete;
  NodeSupervisor& operator=(const NodeSupervisor&) = delete;

  // Starts `tasks` in order. INTERNAL naming the task that did not start
  // ("cannot start worker1: ..."); the ones started are stopped.
  absl::Status Start(const std::vector<SupervisedTask>& tasks);

  // Supervises the tasks until none runs (see above); returns how they
  // ended.
  SupervisorResult Run();

  // Whether the task of `key` ("worker1", "ps2") is running (a
  // more_tasks callback, on the supervisor's thread, may ask).
  bool Running(const std::string& key) const { return cluster_.Running(key); }

 private:
  // The task's name in the supervisor's lines (TaskNames).
  std::string Name(const SupervisedTask& task) const;
  // A stub to the coordinator as `task` (its own identity in the TLS
  // folder), or as any task of the job with `task` null; cached.
  absl::StatusOr<Coordinator::Stub*> Stub(const SupervisedTask* task);
  // Reads the job (GetJob) into job_, and starts the grace once it has
  // ended; false if the coordinator cannot say.
  bool ReadJob();
  // ReadJob at most once per `poll` until the job has ended.
  void PollJob();
  // Handles one exit: true if the task was started again.
  bool OnExit(const ChildExit& exit);
  // Asks the coordinator to restart `task` (RestartTask as the task).
  absl::StatusOr<RestartTaskResponse> AskRestart(const SupervisedTask& task,
                                                 const std::string& why);
  // A dead task: asks RestartTask, or reports its death. True if restarted.
  bool RestartOrReport(const SupervisedTask& task, const ChildExit& exit,
                       const std::string& status);
  // Reports the task's death (TaskFinished, not ok); the table ignores it
  // when the task reported its own failure or the job has ended. Bytes of
  // `message` that are not UTF-8 (the task's last line) are sent as `\xNN`.
  void ReportDeath(const SupervisedTask& task, const std::string& message);
  // Starts `task` again, with --rejoin when `rejoin`.
  bool StartAgain(const SupervisedTask& task, bool rejoin);
  // The task's exit, not started again: the first one is the result.
  void RecordFailure(const SupervisedTask& task, const ChildExit& exit);
  // Stops what runs once the grace has passed.
  void StopAfterGrace();
  // Whether the coordinator removed `task` from its running job (reads
  // the job again); prints the line saying so.
  bool Removed(const SupervisedTask& task);
  // Starts options_.more_tasks()'s tasks that are not running.
  void StartMore();

  SupervisorOptions options_;
  LocalCluster cluster_;
  std::map<std::string, SupervisedTask> tasks_;  // by key() ("worker1")
  std::map<std::string, std::unique_ptr<Coordinator::Stub>> stubs_;
  std::vector<std::string> deaths_;  // "worker 1 (signal 9)"
  JobInfo job_;                      // as last read, without its log
  absl::Time last_read_ = absl::InfinitePast();
  absl::Time stop_at_ = absl::InfiniteFuture();
  SupervisorResult result_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CLI_NODE_SUPERVISOR_H_
