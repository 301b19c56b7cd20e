// JobTable: the coordinator's state, without gRPC. Jobs move
//   PENDING (submitted; tasks registering) -> RUNNING (all registered)
//   -> SUCCEEDED (every worker reported done) | FAILED | CANCELLED.
// A job fails when a task reports a failure, when a registered task is
// silent for longer than the heartbeat timeout ("lost worker 1 on
// 10.0.0.4:7001: no heartbeat for 62 s"), or when a task has not registered
// within the spec's registration_timeout_s of submission ("waiting for
// worker 1 on 10.0.0.4:7001 for 602 s"; a restarted task: within the
// heartbeat timeout of its restart). Heartbeats answer with the job's state, so
// tasks learn when to stop.
//
// State changes (Submit, Register, TaskFinished, TaskRestarting, Cancel, a
// job failed by CheckHeartbeats) are written to the job file (when one is
// set) before the call returns, atomically, so Load() after a crash sees the
// last completed change. Key-value writes (Set) are batched: marked dirty
// and written by the next state change or FlushIfDirty(), which the
// coordinator calls once per check_interval (1 s), so a crash loses at most
// the Set() calls of the last second (and, as before, heartbeats and log
// lines since the last write). Times are passed in (absl::Time) so tests
// control the clock.
//
// Bounded (JobTableLimits): the table keeps every PENDING or RUNNING job and
// the newest `keep_finished_jobs` ended ones (the oldest-ended are pruned
// first, with their logs and key-value stores); each job's key-value store
// holds at most `max_kv_keys_per_job` keys of at most `max_kv_key_bytes`
// bytes with values of at most `max_kv_value_bytes` bytes, and at most
// `max_kv_bytes_per_task` / `max_kv_bytes_per_job` bytes of keys and values
// in all (a task's keys are those KvKeyOwner gives it). Text a task sends
// is cut, never refused: a log line, TaskFinished.message and
// RestartTask.why to `max_text_item_bytes` each; log lines also to what is
// left of the task's and the job's text budgets (`max_text_bytes_per_task`,
// `max_text_bytes_per_job`, bytes over the job's life, each line costing
// its text plus kLogLineCostBytes, so empty lines count too), each cut
// ending in a marker ("…[cut: 120 bytes over the per-line limit of 4096
// bytes]"); a task whose budget is spent gets one line saying so and its
// later lines are only counted (TaskInfo.text_bytes_cut). What is refused
// is a request of more than kMaxLogLinesPerRequest log lines, or with more
// log_times_ms than log lines (INVALID_ARGUMENT, before the table is
// locked). Each job keeps its last kMaxLogLines log lines and at most
// `max_log_bytes_per_job` bytes of them.
//
// An ended job (SUCCEEDED, FAILED, CANCELLED) accepts nothing: its tasks'
// heartbeats are answered (so that they learn the end) but change nothing
// (no log lines, progress, result, membership_applied or prepared), a
// TaskFinished is OK and changes nothing, and Register, TaskRestarting and
// Set are FAILED_PRECONDITION. The one exception is the final report of a
// task a success left running (TASK_REGISTERED: the shards, which exit
// once every worker is done, and with backup workers a straggler): its log
// lines, outcome and message are kept, once; never a result or progress.
// The table never writes a job file larger than `max_job_file_bytes`,
// which is also the most Load() reads: past it, the logs then the
// key-value stores of ended jobs (oldest-ended first), then the oldest log
// lines of running jobs are dropped; a Submit that still does not fit is
// RESOURCE_EXHAUSTED.
//
// Elastic jobs (max_workers, min_workers, max_ps;
// coordinator/job_membership.h): the job has max_workers worker tasks and
// max_ps PS tasks, those not members or outside the layout TASK_IDLE; it
// runs once every shard of the layout and every member has registered. Scale
// changes the membership; heartbeats carry it to the workers and worker 0's
// reports that it applied one. The end of a worker outside the newest
// membership (TASK_REMOVED; LeavingJob) never fails the job, and the job
// succeeds when the applied membership's workers are done. With min_workers, a
// worker other than 0 that dies with the restart budget spent (TaskRestarting,
// TaskFinished not ok) or goes silent is removed instead of failing the job
// while at least min_workers remain. A shard outside every membership from
// the applied one on (ShardRemoved) is TASK_REMOVED: its end is no failure
// and it is not restarted.
//
// Thread-safety: all methods may be called concurrently; WaitForLayout and
// WaitForKey block without holding up other callers, and StopWaits() ends
// them (a coordinator shutting down).
#ifndef PSTRAIN_COORDINATOR_JOB_TABLE_H_
#define PSTRAIN_COORDINATOR_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/job_membership.h"
#include "proto/coordinator.pb.h"

namespace pstrain {

// The limits of a JobTable; the defaults are pstrain_coordinator's.
struct JobTableLimits {
  // Ended (SUCCEEDED, FAILED, CANCELLED) jobs kept, count; >= 0. PENDING
  // and RUNNING jobs are never pruned.
  int keep_finished_jobs = 100;
  // Key-value store of each job: the longest key, bytes (>= 1; an empty
  // key is INVALID_ARGUMENT), the largest value, bytes (>= 0), and the
  // most keys, count (>= 1). Rendezvous values (a Gloo address, an NCCL
  // unique id of 128 bytes) are far smaller.
  int64_t max_kv_key_bytes = 256;
  int64_t max_kv_value_bytes = 64 << 10;
  int64_t max_kv_keys_per_job = 1024;
  // Bytes of keys and values in one job's store, in all (>= 1) and of the
  // keys one task owns (KvKeyOwner; >= 1); past them Set() is
  // RESOURCE_EXHAUSTED (a value cut short would be a wrong value).
  int64_t max_kv_bytes_per_job = 4 << 20;
  int64_t max_kv_bytes_per_task = 256 << 10;
  // Text a task sends: bytes kept of one log line, message or `why`
  // (>= 64), and of all of a task's or a job's log lines over the job's
  // life (>= max_text_item_bytes); the rest is cut with a marker.
  int64_t max_text_item_bytes = 4 << 10;
  int64_t max_text_bytes_per_task = 8 << 20;
  int64_t max_text_bytes_per_job = 64 << 20;
  // Bytes of log lines a job keeps (the oldest dropped first), >= 1.
  int64_t max_log_bytes_per_job = 4 << 20;
  // Worker 0's results (RunResult) larger than this, bytes (>= 1), are not
  // kept (the previous stay; counted in text_bytes_cut).
  int64_t max_result_bytes = 1 << 20;
  // Largest job file written or read, bytes (1 KiB .. kMaxJobFileBytes).
  int64_t max_job_file_bytes = int64_t{1} << 30;
};

// The worker whose keys `key` is in a job's key-value store, or -1 for a
// key no worker may set. A worker sets only its own keys:
//   worker-<i>/...              anything of worker i;
//   <prefix>/<i>, <prefix>/rank_<i>
//                               Gloo's full-mesh rendezvous of rank i
//                               (its pair addresses and its host name);
//   <prefix>/nccl_id            NCCL's unique id, made by rank 0;
//   <prefix>/world              an elastic allreduce job's world worker 0
//                               chose (worker/world_announcement.h).
// <i> is a decimal without sign or leading zeros. Everyone may read every
// key (KvWait).
int KvKeyOwner(const std::string& key);

// The job's restarts so far (TaskInfo.restarts over its tasks): its
// generation (ClusterLayout.generation).
int JobRestarts(const JobInfo& job);

// The exit status of a task that the coordinator told to restart although
// it did not fail (HeartbeatResponse.restart: an allreduce job restarts
// every worker after one died; see TaskRestarting). Its supervisor starts
// it again (as a replacement, --rejoin) without counting a restart: the
// death that caused it was counted. 75 is sysexits.h's EX_TEMPFAIL.
inline constexpr int kRestartExitCode = 75;

// INVALID_ARGUMENT naming the first limit out of its range (see above).
absl::Status ValidateJobTableLimits(const JobTableLimits& limits);

class JobTable {
 public:
  static constexpr int kMaxLogLines = 10000;
  // Most log lines (and log_times_ms) in one HeartbeatRequest or
  // TaskFinishedRequest: what a TaskAgent queues at most (it sends its
  // whole queue with each call, coordinator/task_agent.cc).
  static constexpr int kMaxLogLinesPerRequest = 10000;
  // What each log line a task sends costs against the text budgets besides
  // its text, bytes: about what a kept line costs the table besides its
  // text (its LogLine, string and fields), so that empty lines are counted.
  static constexpr int64_t kLogLineCostBytes = 64;
  // Longest address a task registers, bytes.
  static constexpr int64_t kMaxAddressBytes = 1024;
  // A `log_since` for Get() that returns no log lines.
  static constexpr int64_t kNoLog = std::numeric_limits<int64_t>::max();
  // How often WaitForLayout and WaitForKey ask whether their caller
  // cancelled: about the longest a cancelled wait lasts.
  static constexpr absl::Duration kCancelledCheckInterval =
      absl::Milliseconds(100);

  // `job_file`: where the table is kept ("" for none). `limits` must be
  // valid (ValidateJobTableLimits).
  explicit JobTable(std::string job_file = "",
                    JobTableLimits limits = JobTableLimits());
  // Writes key-value changes not yet written (FlushIfDirty).
  ~JobTable();

  // A table from `job_file`, writing its changes back there, loaded at
  // `now`: the heartbeat timeouts of the jobs still PENDING or RUNNING
  // start again from `now` (the tasks could not reach a coordinator that
  // was down). Ended jobs beyond `limits` are pruned at once.
  // Errors, each one line starting with "job file <job_file>: ":
  // NOT_FOUND if it does not exist; FAILED_PRECONDITION if it is a folder
  // or not a regular file; the read's error (PERMISSION_DENIED, ...) if it
  // cannot be read; DATA_LOSS if it is empty, larger than kMaxJobFileBytes,
  // does not parse as a job table, or parses but is inconsistent (what
  // ValidateJobTableFile finds).
  static absl::StatusOr<std::unique_ptr<JobTable>> Load(
      const std::string& job_file, absl::Time now,
      JobTableLimits limits = JobTableLimits());

  // The largest max_job_file_bytes, bytes (1 GiB; protobuf refuses more
  // than 2 GiB in one message anyway).
  static constexpr int64_t kMaxJobFileBytes = int64_t{1} << 30;

  // Writes the table to its job file now (a new file at start-up, so that
  // a job file that cannot be written is found before the first job).
  absl::Status Flush();
  // Writes the table if a Set() since the last write left it dirty.
  absl::Status FlushIfDirty();

  // Adds a PENDING job (the spec must be valid, see job_spec.h); returns its
  // id, "job-1", "job-2", ...
  absl::StatusOr<std::string> Submit(const JobSpec& spec, absl::Time now);

  // Job ids become "job-<n>-<suffix>" from the next Submit() on. For a
  // table without a job file (one that starts again at job-1 after a
  // restart): a random suffix per process keeps a restarted coordinator
  // from handing out an id that certificates of an earlier run name.
  // `suffix`: 1 to 16 lowercase letters and digits (INVALID_ARGUMENT
  // otherwise); refused (FAILED_PRECONDITION) for a table with a job file,
  // whose ids never repeat.
  absl::Status SetIdSuffix(const std::string& suffix);

  // Task (role, index) of job `id` is up at `address`. Registering again
  // from the same address is a no-op (a retried call); from another address
  // ALREADY_EXISTS naming both. NOT_FOUND for an unknown job;
  // INVALID_ARGUMENT for an index outside the job's task count or an
  // address longer than kMaxAddressBytes;
  // FAILED_PRECONDITION when the job has ended.
  absl::Status Register(const std::string& id, TaskRole role, int index,
                        const std::string& address, absl::Time now);

  // Blocks until every task of job `id` is registered (again, after a
  // restart), then returns the addresses of the PS tasks of the layout,
  // then the workers, by index (an elastic job's idle and removed workers:
  // ""). The layout's PS tasks are the spec's num_ps, or with max_ps the
  // applied membership's shards 0 to num_ps - 1 (so the PS part is the
  // answer's size less WorkerTaskCount).
  // DEADLINE_EXCEEDED naming the tasks still missing; FAILED_PRECONDITION
  // if the job ended first (with its message); UNAVAILABLE instead of
  // waiting (on) once StopWaits() was called. `cancelled` (if set) is asked
  // every kCancelledCheckInterval of the wait, without the table locked;
  // once it answers true the wait ends CANCELLED (a caller gone frees its
  // thread).
  absl::StatusOr<std::vector<std::string>> WaitForLayout(
      const std::string& id, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr);

  // Records a heartbeat of `request.task()`, appends its log lines to the
  // job's log (cut as above) and, for workers, its progress; returns the
  // job's state (RUNNING: go on; an ended state: stop). Heartbeats and log
  // lines are written to the job file with the next write, not on their
  // own. INVALID_ARGUMENT, before the table is locked, for more than
  // kMaxLogLinesPerRequest log lines or more log_times_ms than log lines.
  // FAILED_PRECONDITION, keeping nothing, for a task that has itself
  // ended (DONE or FAILED). Once the job has ended a task (stopped or
  // lost by the end, or still running) is answered, so that it learns the
  // job's state (and `restart`, `answer` as below), and nothing of its
  // request is kept.
  // `restart` (if not null) is set to whether the task is to exit and be
  // started again (TaskInfo.restart_requested; see TaskRestarting).
  // `answer` (if not null), for a worker of an elastic job: its membership
  // and `removed`; for a shard of a job with max_ps: `removed` (outside the
  // applied layout, ShardRemoved; job_membership.h). Worker 0's
  // membership_applied is kept (ApplyMembership: membership_history, a line in
  // the job's log; written within a second, as a Set()).
  absl::StatusOr<JobState> Heartbeat(const HeartbeatRequest& request,
                                     absl::Time now, bool* restart = nullptr,
                                     HeartbeatResponse* answer = nullptr);

  // `request.task()` finished: `ok` false fails the job with its message
  // ("worker 1 on 10.0.0.5:7001 failed: ..."); a task may report a failure
  // before it registered (a PS that cannot bind its port). The job
  // succeeds when every worker is done. Worker 0's `result` becomes the
  // job's; the report's log lines, progress and result are kept before the
  // job ends on it. A report after the job ended is OK and keeps nothing
  // (the task's state stays what the end made it), but for a task still
  // TASK_REGISTERED in a SUCCEEDED job (see the class comment), whose log
  // lines, outcome (DONE or FAILED) and message are kept. A report repeated (a
  // retry: the task is already DONE, or FAILED, as `ok` says) is OK and
  // keeps nothing; the other outcome is FAILED_PRECONDITION. Log lines
  // are checked as Heartbeat's (INVALID_ARGUMENT).
  absl::Status TaskFinished(const TaskFinishedRequest& request, absl::Time now);

  // The supervisor restarts task (role, index) of job `id`, which died
  // (`why`: its exit status): the task waits for its registration again
  // (from any address), the job stays RUNNING, and the log records it.
  // In mode allreduce every other worker is restarted with it, counted as
  // this one restart: each goes back to waiting for its registration with
  // restart_requested set (its heartbeats tell it to exit), and the job's
  // rendezvous keys are dropped (the next generation meets under a new
  // prefix; the workers' own `worker-<i>/...` keys stay).
  // Returns the job's restarts so far, this one included.
  // FAILED_PRECONDITION when the job has ended, or when its spec's
  // max_restarts are spent: then the job FAILS naming the task, `why` and
  // the budget.
  absl::StatusOr<int> TaskRestarting(const std::string& id, TaskRole role,
                                     int index, const std::string& why,
                                     absl::Time now);

  // Elastic jobs (coordinator/job_membership.h ScaleMembership): the job's
  // newest membership with `target`'s workers and shards from its at_step
  // on, a new epoch (unless it has those counts already), logged and
  // written. Errors as ScaleMembership's; NOT_FOUND for an unknown job.
  absl::StatusOr<Membership> Scale(const std::string& id,
                                   const ScaleTarget& target, absl::Time now);
  // The same for the workers only.
  absl::StatusOr<Membership> Scale(const std::string& id, int num_workers,
                                   int64_t at_step, absl::Time now);

  // Ends a PENDING or RUNNING job as CANCELLED; FAILED_PRECONDITION if it
  // has already ended.
  absl::Status Cancel(const std::string& id, absl::Time now);

  // Fails jobs with tasks lost or never registered (see above); returns the
  // ids of the jobs it failed.
  std::vector<std::string> CheckHeartbeats(absl::Time now,
                                           absl::Duration timeout);

  // The job's key-value store. INVALID_ARGUMENT for an empty key;
  // RESOURCE_EXHAUSTED, naming the size or count and the limit, for a key
  // or value over its limit, a new key past the job's key count, or a store
  // past its job's or the key owner's byte budget; FAILED_PRECONDITION,
  // naming the job and its state, once the job has ended; the store is
  // then unchanged. Written to the job file within a second (see above).
  absl::Status Set(const std::string& id, const std::string& key,
                   const std::string& value);
  // Blocks until `key` is set or `deadline` passes (DEADLINE_EXCEEDED
  // naming the key). A key that Set() would refuse is refused at once, as
  // there. UNAVAILABLE instead of waiting (on) once StopWaits() was called;
  // `cancelled` as WaitForLayout's.
  absl::StatusOr<std::string> WaitForKey(
      const std::string& id, const std::string& key, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr);

  // Ends the WaitForLayout and WaitForKey calls in flight, and those to
  // come, with what is there now: the answer if it is ready (the layout,
  // the key's value, the job's end), else UNAVAILABLE "coordinator shutting
  // down" at once instead of a wait. For a coordinator about to stop,
  // whose gRPC server waits for every call to return. Everything else goes
  // on as before; calling it again changes nothing.
  void StopWaits();

  // A copy of job `id` (NOT_FOUND if unknown) with the log lines whose seq
  // is >= `log_since`, and of every job without their logs.
  absl::StatusOr<JobInfo> Get(const std::string& id,
                              int64_t log_since = 0) const;
  std::vector<JobInfo> List() const;

 private:
  // nullptr if there is no such job.
  JobInfo* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // As Find; NOT_FOUND "unknown job ID" if there is none.
  absl::StatusOr<JobInfo*> FindJob(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<TaskInfo*> FindTask(JobInfo* job, TaskRole role, int index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each line's time_ms is its entry in `times_ms` (when the task printed
  // it; no later than `now`), or `now` where there is none. `task` (null
  // for the coordinator's own lines) is charged for the text and its lines
  // cut (see above).
  void AppendLog(JobInfo* job, TaskInfo* task, TaskRole role, int index,
                 const google::protobuf::RepeatedPtrField<std::string>& lines,
                 absl::Time now,
                 const google::protobuf::RepeatedField<int64_t>& times_ms = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Also marks the tasks still WAITING or REGISTERED as STOPPED when the
  // job did not succeed (they were told to stop, or never came).
  void End(JobInfo* job, JobState state, const std::string& message,
           absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prunes the oldest-ended jobs beyond limits_.keep_finished_jobs, then
  // writes the job file.
  absl::Status Persist() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops what the class comment says until the table serializes to at
  // most limits_.max_job_file_bytes; RESOURCE_EXHAUSTED if it still does
  // not (the table's specs and tasks alone are too large).
  absl::Status FitJobFile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker 0's result, unless it is over limits_.max_result_bytes.
  void KeepResult(JobInfo* job, TaskInfo* task, const RunResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A line of the coordinator's own in the job's log, as task (role,
  // index)'s.
  void LogLineOf(JobInfo* job, TaskRole role, int index, std::string text,
                 absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckHeartbeats' part for a TASK_STANDBY worker: one silent for
  // `limit_ms` (registered) or not registered within its registration
  // limit goes TASK_REMOVED, with a line in the job's log (the job goes
  // on). True if it changed.
  bool CheckStandby(JobInfo* job, TaskInfo* task, absl::Time now,
                    int64_t limit_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckHeartbeats' part for a silent worker of an elastic job: true if
  // it was removed (already, or now with min_workers) instead of lost.
  bool RemoveSilentWorker(JobInfo* job, TaskInfo* task, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `ready` holds or `deadline` passes, as
  // mu_.AwaitWithDeadline; with `cancelled`, in slices of
  // kCancelledCheckInterval, asking it between them with mu_ released.
  // True if it answered true (the wait was given up).
  bool AwaitUnlessCancelled(const absl::Condition& ready, absl::Time deadline,
                            const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The key checks of Set() and WaitForKey().
  absl::Status CheckKey(const std::string& key) const;

  const std::string job_file_;
  const JobTableLimits limits_;
  // When Load() read the table (Unix ms; 0 for a new table): tasks still
  // waiting to register are timed from here or their job's submission,
  // whichever is later.
  int64_t loaded_ms_ = 0;
  mutable absl::Mutex mu_;
  JobTableFile table_ ABSL_GUARDED_BY(mu_);
  // A Set() changed the table since it was last written.
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  // SetIdSuffix(); "" for plain "job-<n>".
  std::string id_suffix_ ABSL_GUARDED_BY(mu_);
  // StopWaits() was called.
  bool waits_stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// OK if `table` is a job table this JobTable could have written: next_id
// >= 1; every job's id "job-<n>" with 1 <= n < next_id, and unique; a known
// state; num_ps >= 0 and num_workers >= 1; its tasks the PsTaskCount PS tasks
// then the num_workers workers, each with its role and index and a known
// state; log lines in increasing seq below next_log_seq. Otherwise
// DATA_LOSS naming the first inconsistency ("job-3: 2 tasks for 2 ps and 2
// workers").
absl::Status ValidateJobTableFile(const JobTableFile& table);

// `text` if it fits in `max_bytes`; else its first bytes, cut on a UTF-8
// character boundary, and "…[cut: N bytes over the <what>]", the two within
// max_bytes when it leaves room for the marker (else the marker alone).
// `kept_bytes` (if not null): how many bytes of `text` were kept.
std::string CutText(const std::string& text, int64_t max_bytes,
                    const std::string& what, int64_t* kept_bytes = nullptr);

// "ps 0", "worker 3".
std::string TaskName(TaskRole role, int index);
// "RUNNING", "FAILED", ... (JobState_Name without its "JOB_" prefix).
std::string JobStateName(JobState state);
bool JobEnded(JobState state);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_TABLE_H_
