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
// Every change is written to the job file (when one is set) before the call
// returns, atomically, so Load() after a crash sees the last completed
// change. Times are passed in (absl::Time) so tests control the clock.
//
// Bounded (JobTableLimits): the table keeps every PENDING or RUNNING job and
// the newest `keep_finished_jobs` ended ones (the oldest-ended are pruned
// first, with their logs and key-value stores); each job's key-value store
// holds at most `max_kv_keys_per_job` keys of at most `max_kv_key_bytes`
// bytes with values of at most `max_kv_value_bytes` bytes; each job keeps
// its last kMaxLogLines log lines.
//
// Thread-safety: all methods may be called concurrently; WaitForLayout and
// WaitForKey block without holding up other callers.
#ifndef PSTRAIN_COORDINATOR_JOB_TABLE_H_
#define PSTRAIN_COORDINATOR_JOB_TABLE_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
};

// INVALID_ARGUMENT naming the first limit out of its range (see above).
absl::Status ValidateJobTableLimits(const JobTableLimits& limits);

class JobTable {
 public:
  static constexpr int kMaxLogLines = 10000;
  // A `log_since` for Get() that returns no log lines.
  static constexpr int64_t kNoLog = std::numeric_limits<int64_t>::max();

  // `job_file`: where the table is kept ("" for none). `limits` must be
  // valid (ValidateJobTableLimits).
  explicit JobTable(std::string job_file = "",
                    JobTableLimits limits = JobTableLimits());

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

  // Largest job file Load() reads, bytes (1 GiB; protobuf refuses more
  // than 2 GiB in one message anyway).
  static constexpr int64_t kMaxJobFileBytes = int64_t{1} << 30;

  // Writes the table to its job file now (a new file at start-up, so that
  // a job file that cannot be written is found before the first job).
  absl::Status Flush();

  // Adds a PENDING job (the spec must be valid, see job_spec.h); returns its
  // id, "job-1", "job-2", ...
  absl::StatusOr<std::string> Submit(const JobSpec& spec, absl::Time now);

  // Task (role, index) of job `id` is up at `address`. Registering again
  // from the same address is a no-op (a retried call); from another address
  // ALREADY_EXISTS naming both. NOT_FOUND for an unknown job;
  // INVALID_ARGUMENT for an index outside the job's task count;
  // FAILED_PRECONDITION when the job has ended.
  absl::Status Register(const std::string& id, TaskRole role, int index,
                        const std::string& address, absl::Time now);

  // Blocks until every task of job `id` is registered (again, after a
  // restart), then returns the addresses of the PS tasks, then the
  // workers, by index.
  // DEADLINE_EXCEEDED naming the tasks still missing; FAILED_PRECONDITION
  // if the job ended first (with its message).
  absl::StatusOr<std::vector<std::string>> WaitForLayout(const std::string& id,
                                                         absl::Time deadline);

  // Records a heartbeat of `request.task()`, appends its log lines to the
  // job's log (the last kMaxLogLines are kept) and, for workers, its
  // progress; returns the job's state (RUNNING: go on; an ended state:
  // stop). Heartbeats and log lines are written to the job file with the
  // next state change, not on their own.
  absl::StatusOr<JobState> Heartbeat(const HeartbeatRequest& request,
                                     absl::Time now);

  // `request.task()` finished: `ok` false fails the job with its message
  // ("worker 1 on 10.0.0.5:7001 failed: ..."); a task may report a failure
  // before it registered (a PS that cannot bind its port). The job
  // succeeds when every worker is done. Worker 0's `result` becomes the
  // job's. Reports after the job ended only add their log lines.
  absl::Status TaskFinished(const TaskFinishedRequest& request, absl::Time now);

  // The supervisor restarts task (role, index) of job `id`, which died
  // (`why`: its exit status): the task waits for its registration again
  // (from any address), the job stays RUNNING, and the log records it.
  // Returns the job's restarts so far, this one included.
  // FAILED_PRECONDITION when the job has ended, or when its spec's
  // max_restarts are spent: then the job FAILS naming the task, `why` and
  // the budget.
  absl::StatusOr<int> TaskRestarting(const std::string& id, TaskRole role,
                                     int index, const std::string& why,
                                     absl::Time now);

  // Ends a PENDING or RUNNING job as CANCELLED; FAILED_PRECONDITION if it
  // has already ended.
  absl::Status Cancel(const std::string& id, absl::Time now);

  // Fails jobs with tasks lost or never registered (see above); returns the
  // ids of the jobs it failed.
  std::vector<std::string> CheckHeartbeats(absl::Time now,
                                           absl::Duration timeout);

  // The job's key-value store. INVALID_ARGUMENT for an empty key;
  // RESOURCE_EXHAUSTED, naming the size or count and the limit, for a key
  // or value over its limit or a new key past the job's key count (setting
  // a key again is always allowed); the store is then unchanged.
  absl::Status Set(const std::string& id, const std::string& key,
                   const std::string& value);
  // Blocks until `key` is set or `deadline` passes (DEADLINE_EXCEEDED
  // naming the key). A key that Set() would refuse is refused at once, as
  // there.
  absl::StatusOr<std::string> WaitForKey(const std::string& id,
                                         const std::string& key,
                                         absl::Time deadline);

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
  // it; no later than `now`), or `now` where there is none.
  void AppendLog(JobInfo* job, TaskRole role, int index,
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
};

// OK if `table` is a job table this JobTable could have written: next_id
// >= 1; every job's id "job-<n>" with 1 <= n < next_id, and unique; a known
// state; num_ps >= 0 and num_workers >= 1; its tasks the num_ps PS tasks
// then the num_workers workers, each with its role and index and a known
// state; log lines in increasing seq below next_log_seq. Otherwise
// DATA_LOSS naming the first inconsistency ("job-3: 2 tasks for 2 ps and 2
// workers").
absl::Status ValidateJobTableFile(const JobTableFile& table);

// "ps 0", "worker 3".
std::string TaskName(TaskRole role, int index);
// "RUNNING", "FAILED", ... (JobState_Name without its "JOB_" prefix).
std::string JobStateName(JobState state);
bool JobEnded(JobState state);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_TABLE_H_
