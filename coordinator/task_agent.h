// TaskAgent: a pstrain_ps or pstrain_worker task's side of the coordinator
// protocol (proto/coordinator.proto). A task
//   1. fetches its job's spec (FetchSpec),
//   2. registers the host:port it can be reached at (Register),
//   3. sends a heartbeat every `heartbeat_interval` (StartHeartbeats), which
//      carries the lines it printed (Log) and, for workers, its progress
//      (SetProgress), and learns from the answer when the job has ended,
//   4. workers wait for every task's address (WaitForLayout),
//   5. reports its end, with worker 0's results (Finish).
//
// A task restarted by a supervisor outside pstrain (Kubernetes'
// restartPolicy OnFailure: same pod, same index and DNS name), which tells
// the coordinator nothing, reports its own restart (`self_restart`): its
// Register first finds its slot still held by its dead predecessor and calls
// RestartTask for itself, as pstrain's own supervisors do for the tasks they
// restart (cli/local_cluster.h, cli/node_agent.h); the job table keeps
// the budget (max_restarts) either way.
//
// Every string field of every request is made UTF-8 before it is sent
// (EscapeNonUtf8Fields: a byte that is not becomes `\xNN`), since the
// coordinator cannot parse a proto3 string that is not and would answer
// INTERNAL, which ends the task.
//
// Every call has a deadline (`rpc_timeout`) and waits for the coordinator's
// channel to connect (gRPC wait_for_ready), so tasks may start before the
// coordinator. A coordinator that cannot be reached for `coordinator_timeout`
// ends the task: no task waits forever.
//
// Elastic jobs (issue 40; coordinator/job_membership.h): each heartbeat's
// answer carries the job's newest membership and whether this worker was
// removed; membership(), removed() and WaitForMembership read them, and
// worker 0 reports what it applied with SetMembershipApplied.
//
// Thread-safety: Log, SetProgress, SetResult, membership, removed,
// WaitForMembership and SetMembershipApplied may be called from any
// thread; the other methods from one thread. The callbacks run on the
// heartbeat thread and must not call Finish.
#ifndef PSTRAIN_COORDINATOR_TASK_AGENT_H_
#define PSTRAIN_COORDINATOR_TASK_AGENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "coordinator/job_table.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/coordinator.grpc.pb.h"

namespace pstrain {

struct TaskAgentOptions {
  // host:port of the coordinator.
  std::string coordinator;
  std::string job_id;
  TaskRole role = ROLE_WORKER;
  int index = 0;
  absl::Duration rpc_timeout = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration coordinator_timeout = absl::Seconds(120);
  // TLS to the coordinator as this task (common/tls.h); insecure: none.
  TlsOptions tls = InsecureTlsOptions();
  // Whether a supervisor outside pstrain restarts this task when it dies
  // (kSelfRestartVariable=1 in its environment, which the Kubernetes
  // manifests set with max_restarts > 0): Register then reports the restart
  // of a process that replaces a dead one (see Register).
  bool self_restart = false;
};

// The environment variable that sets TaskAgentOptions::self_restart ("1").
inline constexpr char kSelfRestartVariable[] = "PSTRAIN_SELF_RESTART";

// This task's clock against the coordinator's (common/trace.h merges
// timelines with it): offset_us = coordinator time - this host's time, us,
// from the sample of smallest round trip rtt_us; the true offset lies
// within +-rtt_us / 2 of it.
struct ClockOffset {
  int64_t offset_us = 0;
  int64_t rtt_us = 0;
};

// How a call to the coordinator rides out its absence, for the tasks and
// for pstrain's client commands (cli/job_commands.cc) alike: runs `call`
// with a fresh context (deadline `rpc_timeout` or what is left of `budget`,
// at least 1 s; wait_for_ready) again every kCoordinatorRetryInterval while
// it fails with UNAVAILABLE or DEADLINE_EXCEEDED, for at most `budget`, and
// returns the last status. `on_retry(status)` (if set) is called before
// each wait, with the failure that caused it.
inline constexpr absl::Duration kCoordinatorRetryInterval = absl::Seconds(1);
grpc::Status CallCoordinatorWithRetry(
    absl::Duration rpc_timeout, absl::Duration budget,
    const std::function<grpc::Status(grpc::ClientContext*)>& call,
    const std::function<void(const grpc::Status&)>& on_retry = nullptr);

// Whether CallCoordinatorWithRetry retries a call that ended with `status`.
bool RetryableCoordinatorStatus(const grpc::Status& status);

// The largest answer the coordinator sends, bytes, and so what every client
// of it (TaskAgent, the node supervisors and agents, the CLI) receives: 1 GiB.
// Each answer is a copy of part of the job table: GetJob one job (its spec,
// tasks, key-value store, result and the log lines asked for), ListJobs
// every job without its log, store, result or membership history (its spec
// and tasks), KvWait one value, WaitForLayout the tasks'
// addresses; the others are smaller still. The table keeps itself within its
// job file's cap (JobTableLimits::max_job_file_bytes, at most
// JobTable::kMaxJobFileBytes) at each change it writes, dropping ended jobs'
// logs and stores, then running jobs' oldest log lines, and refusing a
// Submit that still does not fit (coordinator/job_table.h). No sum of the
// per-job caps is a smaller bound: one job holds up to 4 MiB of log lines
// (with up to 10000 lines' framing), 4 MiB of keys and values, a 1 MiB
// result, its spec (the up to 4 MiB one Submit carries) and up to 5120
// tasks (kMaxNumPs + kMaxNumWorkers) of a 1 KiB address and a 4 KiB message
// each (25 MiB); ListJobs carries every running job and the newest 100
// ended ones. gRPC's default, 4 MiB, refused a job's full log, and a job
// whose store neared its cap to every caller.
inline constexpr int kMaxCoordinatorAnswerBytes =
    static_cast<int>(JobTable::kMaxJobFileBytes);
static_assert(kMaxCoordinatorAnswerBytes == JobTable::kMaxJobFileBytes);

// The arguments of every client channel to the coordinator: its TLS server
// name (common/tls.h SetPeerServerName; ignored in plaintext) and a
// receive limit of kMaxCoordinatorAnswerBytes.
grpc::ChannelArguments CoordinatorChannelArguments();

class TaskAgent {
 public:
  explicit TaskAgent(TaskAgentOptions options);
  ~TaskAgent();  // stops the heartbeats

  const TaskAgentOptions& options() const { return options_; }
  // "worker 1 of job-3".
  std::string name() const;

  // The job's spec. NOT_FOUND: the coordinator has no such job;
  // FAILED_PRECONDITION: the job has ended ("job-3 has ended (CANCELLED):
  // ..."); UNAVAILABLE: the coordinator was not reachable within
  // coordinator_timeout.
  absl::StatusOr<JobSpec> FetchSpec();

  // Registers `address` (host:port) for this task; the coordinator's error
  // otherwise (ALREADY_EXISTS: another process registered this task).
  //
  // With options().self_restart, the first call first reads this task's
  // slot: one that a process registered before this one (a container
  // restarted after its predecessor died, whose slot the coordinator still
  // holds) is reported as a restart (RestartTask, why: "died; restarted by
  // its container's restart policy (PSTRAIN_SELF_RESTART=1)") before
  // registering again. Past the job's max_restarts the coordinator fails
  // the job and this returns FAILED_PRECONDITION with its reason ("job-3:
  // worker 1 died; ...; the job's restart budget (2) is spent").
  absl::Status Register(const std::string& address);

  // Whether this process replaces one of this task that ran before, as
  // found by a self_restart Register: it reported the restart, or the slot
  // was waiting after a restart (its own, or the allreduce restart of every
  // worker). A worker then joins the running job as --rejoin does.
  bool rejoining() const { return rejoining_; }

  // Blocks until every task of the job has registered and returns their
  // addresses; FAILED_PRECONDITION when the job ends first (the coordinator
  // fails jobs whose tasks do not register within its heartbeat timeout).
  absl::StatusOr<ClusterLayout> WaitForLayout();

  // Starts the heartbeat thread. `on_end(state, message)` is called once,
  // on that thread, when the coordinator reports that the job has ended, or
  // with JOB_FAILED when it was unreachable for coordinator_timeout; the
  // heartbeats then stop. `on_restart(why)` (if set) is called instead,
  // once, when the coordinator tells the task to restart (it should exit
  // with kRestartExitCode, coordinator/job_table.h); without it that answer
  // is ignored.
  // `on_removed()` (if set) is called once, on that thread, when an
  // answer says this worker is no longer a member (an elastic job's worker
  // 0 applied a membership without it): the worker should stop training,
  // Finish(true, ...) and exit 0. The heartbeats go on until Finish.
  void StartHeartbeats(
      std::function<void(JobState state, const std::string& message)> on_end,
      std::function<void(const std::string& why)> on_restart = nullptr,
      std::function<void()> on_removed = nullptr);

  // Heartbeats every `interval` (> 0) from the next wait on, instead of
  // TaskAgentOptions::heartbeat_interval: worker 0 of an elastic job hears
  // of a scale request sooner (worker/worker_main.cc). Any thread.
  void set_heartbeat_interval(absl::Duration interval);

  // Elastic jobs, workers: the newest membership a heartbeat's answer
  // carried (nullopt before the first answer, and in a job that is not
  // elastic). The coordinator's intent: worker 0 applies it once
  // `ready` at a step boundary >= at_step.
  std::optional<Membership> membership() const;
  // The newest membership worker 0 had applied when that answer was
  // given (HeartbeatResponse.applied_membership).
  std::optional<Membership> applied_membership() const;
  // An answer said this worker is no longer a member (see on_removed).
  bool removed() const;
  // Elastic jobs, shards: the workers the last answer named as removed
  // after their death (HeartbeatResponse.removed_workers), ascending.
  std::vector<int> removed_workers() const;
  // Blocks until an answer carried a membership of epoch >= `min_epoch`
  // and returns it. DEADLINE_EXCEEDED at `deadline` (naming the epoch);
  // CANCELLED once the heartbeats stopped (the job ended, the coordinator
  // was unreachable, Finish) without one. Without StartHeartbeats nothing
  // arrives: it waits for the deadline.
  absl::StatusOr<Membership> WaitForMembership(int64_t min_epoch,
                                               absl::Time deadline);
  // Worker 0: `applied` (the epoch it applied at a step boundary, the
  // first step the new members trained, the time it took, the counts)
  // is sent with each heartbeat until one is answered; a newer call
  // replaces one not yet sent. The coordinator ignores an epoch it has
  // already recorded, so a repeat is harmless.
  void SetMembershipApplied(const MembershipApplied& applied);
  // An elastic job's worker but 0, once its model and input pipeline are
  // built: every heartbeat from now on says it is prepared
  // (HeartbeatRequest.prepared), the first at once. A membership that
  // adds it is ready only then, so the others train meanwhile.
  void SetPrepared();

  // Prints `line` (no newline) on stdout and sends it with the next
  // heartbeat (at most JobTable::kMaxLogLinesPerRequest lines, 10000, are
  // queued, older ones dropped, and each call sends the whole queue, so no
  // request carries more than the coordinator accepts). Bytes that are not
  // UTF-8 are sent as `\xNN` (common/utf8.h EscapeNonUtf8).
  void Log(const std::string& line);

  // Sends `samples` heartbeats (carrying nothing) back to back, each
  // timed on this host's system clock around the call (t0, t1), and
  // returns the offset of the one with the smallest round trip:
  // server_time_us - (t0 + t1) / 2 (Cristian's algorithm). Errors: the
  // coordinator's (each call has rpc_timeout); UNIMPLEMENTED when the
  // coordinator does not send its time.
  absl::StatusOr<ClockOffset> MeasureClockOffset(int samples = 8);

  // Workers: steps done and samples/sec, sent with the next heartbeat.
  void SetProgress(int64_t steps, double samples_per_sec);

  // Worker 0: the results so far, sent with the next heartbeat.
  void SetResult(const RunResult& result);

  // The job's key-value store (rendezvous of the allreduce workers):
  // KvSet retried while the coordinator is unreachable (at most
  // rpc_timeout); KvWait blocks until `key` is set, at most `timeout`,
  // asking again while the coordinator is unreachable or stopping
  // (DEADLINE_EXCEEDED naming the key; FAILED_PRECONDITION if the job
  // ended).
  absl::Status KvSet(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KvWait(const std::string& key,
                                     absl::Duration timeout);

  // Stops the heartbeats and reports the task's end with the lines not yet
  // sent; `result` (worker 0) becomes the job's result. Retried while the
  // coordinator is unreachable, for at most rpc_timeout.
  absl::Status Finish(bool ok, const std::string& message,
                      const RunResult* result = nullptr);

 private:
  TaskRef Ref() const;
  // Register's self_restart check: reads this task's slot and reports the
  // restart of a process whose slot is held (sets rejoining_).
  absl::Status ReportOwnRestart();
  // CallCoordinatorWithRetry with options_.rpc_timeout; the last status,
  // or WhyUnreachable()'s.
  grpc::Status CallWithRetry(
      absl::Duration budget,
      const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // `status` of a call that never reached the coordinator, or UNAVAILABLE
  // with the one-line reason its TLS handshake fails (common/tls.h
  // CheckTlsPeer: "certificate of coordinator.pstrain at ... not trusted
  // by .../ca.pem (...)").
  grpc::Status WhyUnreachable(const grpc::Status& status) const;
  // Moves the queued lines and the progress into a HeartbeatRequest or a
  // TaskFinishedRequest.
  template <typename Request>
  void TakePending(Request* request);
  void HeartbeatLoop(std::function<void(JobState, const std::string&)> on_end,
                     std::function<void(const std::string&)> on_restart,
                     std::function<void()> on_removed);
  // Keeps an answer's membership and removed flag; true when this worker
  // was just found removed.
  bool NoteMembership(const HeartbeatResponse& response);
  void StopHeartbeats();

  const TaskAgentOptions options_;
  std::unique_ptr<Coordinator::Stub> stub_;
  absl::Notification stop_;
  std::thread heartbeats_;
  // Set by Register (one thread, before the heartbeats start).
  bool self_restart_checked_ = false;
  bool rejoining_ = false;

  mutable absl::Mutex mu_;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> pending_lines_ ABSL_GUARDED_BY(mu_);
  // When each of pending_lines_ was logged, Unix ms (same length).
  std::deque<int64_t> pending_times_ms_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  double samples_per_sec_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<RunResult> result_ ABSL_GUARDED_BY(mu_);
  // Elastic jobs (membership()).
  std::optional<Membership> membership_ ABSL_GUARDED_BY(mu_);
  std::optional<Membership> applied_membership_ ABSL_GUARDED_BY(mu_);
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> removed_workers_ ABSL_GUARDED_BY(mu_);
  // The heartbeats stopped (WaitForMembership returns).
  bool heartbeats_over_ ABSL_GUARDED_BY(mu_) = false;
  // Worker 0's report not yet answered.
  std::optional<MembershipApplied> applied_ ABSL_GUARDED_BY(mu_);
  // Wakes the heartbeat loop before its interval (a membership applied,
  // the stop).
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_TASK_AGENT_H_
