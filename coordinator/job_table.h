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

class JobTable {
 public:
  static constexpr int kMaxLogLines = 10000;
  // A `log_since` for Get() that returns no log lines.
  static constexpr int64_t kNoLog = std::numeric_limits<int64_t>::max();

  // `job_file`: where the table is kept ("" for none).
  explicit JobTable(std::string job_file = "");

  // A table from `job_file` (NOT_FOUND if missing; DATA_LOSS if it does not
  // parse), writing its changes back there, loaded at `now`: the heartbeat
  // timeouts of the jobs still PENDING or RUNNING start again from `now`
  // (the tasks could not reach a coordinator that was down).
  static absl::StatusOr<std::unique_ptr<JobTable>> Load(
      const std::string& job_file, absl::Time now);

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

  // The job's key-value store.
  absl::Status Set(const std::string& id, const std::string& key,
                   const std::string& value);
  // Blocks until `key` is set or `deadline` passes (DEADLINE_EXCEEDED
  // naming the key).
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
  void AppendLog(JobInfo* job, TaskRole role, int index,
                 const google::protobuf::RepeatedPtrField<std::string>& lines,
                 absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(JobInfo* job, JobState state, const std::string& message,
           absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Persist() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_file_;
  // When Load() read the table (Unix ms; 0 for a new table): tasks still
  // waiting to register are timed from here or their job's submission,
  // whichever is later.
  int64_t loaded_ms_ = 0;
  mutable absl::Mutex mu_;
  JobTableFile table_ ABSL_GUARDED_BY(mu_);
};

// "ps 0", "worker 3".
std::string TaskName(TaskRole role, int index);
// "RUNNING", "FAILED", ... (JobState_Name without its "JOB_" prefix).
std::string JobStateName(JobState state);
bool JobEnded(JobState state);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_TABLE_H_
