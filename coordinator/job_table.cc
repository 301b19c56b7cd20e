#include "coordinator/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flags_util.h"
#include "common/status.h"

namespace pstrain {
namespace {

int64_t Ms(absl::Time t) { return absl::ToUnixMillis(t); }

// The host:port the spec gives a task, or "an unassigned host".
std::string PlannedAddress(const JobSpec& spec, TaskRole role, int index) {
  const auto& hosts = role == ROLE_PS ? spec.ps_hosts() : spec.worker_hosts();
  if (index >= hosts.size()) return "an unassigned host";
  return absl::StrCat(hosts[index].host(), ":", hosts[index].port());
}

}  // namespace

std::string TaskName(TaskRole role, int index) {
  return absl::StrCat(role == ROLE_PS ? "ps " : "worker ", index);
}

std::string JobStateName(JobState state) {
  std::string name = JobState_Name(state);
  return name.rfind("JOB_", 0) == 0 ? name.substr(4) : name;
}

bool JobEnded(JobState state) {
  return state == JOB_SUCCEEDED || state == JOB_FAILED ||
         state == JOB_CANCELLED;
}

JobTable::JobTable(std::string job_file) : job_file_(std::move(job_file)) {
  table_.set_next_id(1);
}

absl::StatusOr<std::unique_ptr<JobTable>> JobTable::Load(
    const std::string& job_file, absl::Time now) {
  std::string bytes;
  absl::Status s = ReadFile(job_file, &bytes);
  if (!s.ok()) return s;
  auto table = std::make_unique<JobTable>(job_file);
  absl::MutexLock lock(&table->mu_);
  if (!table->table_.ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat(job_file, ": not a pstrain job table"));
  }
  table->loaded_ms_ = Ms(now);
  for (JobInfo& job : *table->table_.mutable_jobs()) {
    if (JobEnded(job.state())) continue;
    for (TaskInfo& t : *job.mutable_tasks()) {
      if (t.state() == TASK_REGISTERED) t.set_last_heartbeat_ms(Ms(now));
    }
  }
  return table;
}

absl::Status JobTable::Persist() {
  if (job_file_.empty()) return absl::OkStatus();
  return WriteFileAtomically(job_file_, table_.SerializeAsString());
}

JobInfo* JobTable::Find(const std::string& id) {
  for (JobInfo& job : *table_.mutable_jobs()) {
    if (job.id() == id) return &job;
  }
  return nullptr;
}

absl::StatusOr<JobInfo*> JobTable::FindJob(const std::string& id) {
  JobInfo* job = Find(id);
  if (job == nullptr) return absl::NotFoundError("unknown job " + id);
  return job;
}

absl::StatusOr<TaskInfo*> JobTable::FindTask(JobInfo* job, TaskRole role,
                                             int index) {
  if (role != ROLE_PS && role != ROLE_WORKER) {
    return absl::InvalidArgumentError("task role must be ps or worker");
  }
  const int count =
      role == ROLE_PS ? job->spec().num_ps() : job->spec().num_workers();
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        job->id(), ": ", TaskName(role, index), " is outside the job's ", count,
        " ", role == ROLE_PS ? "ps" : "worker", " tasks"));
  }
  const int offset = role == ROLE_PS ? 0 : job->spec().num_ps();
  return job->mutable_tasks(offset + index);
}

void JobTable::End(JobInfo* job, JobState state, const std::string& message,
                   absl::Time now) {
  job->set_state(state);
  job->set_message(message);
  job->set_end_ms(Ms(now));
}

absl::StatusOr<std::string> JobTable::Submit(const JobSpec& spec,
                                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  JobInfo* job = table_.add_jobs();
  job->set_id(absl::StrCat("job-", table_.next_id()));
  table_.set_next_id(table_.next_id() + 1);
  *job->mutable_spec() = spec;
  job->set_state(JOB_PENDING);
  job->set_submit_ms(Ms(now));
  for (const auto& [role, count] :
       {std::pair<TaskRole, int>{ROLE_PS, spec.num_ps()},
        {ROLE_WORKER, spec.num_workers()}}) {
    for (int i = 0; i < count; ++i) {
      TaskInfo* task = job->add_tasks();
      task->set_role(role);
      task->set_index(i);
      task->set_state(TASK_WAITING);
    }
  }
  const std::string id = job->id();
  absl::Status s = Persist();
  if (!s.ok()) {
    table_.mutable_jobs()->RemoveLast();
    return s;
  }
  return id;
}

absl::Status JobTable::Register(const std::string& id, TaskRole role, int index,
                                const std::string& address, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  absl::StatusOr<TaskInfo*> task = FindTask(job, role, index);
  if (!task.ok()) return task.status();
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if ((*task)->state() != TASK_WAITING) {
    if ((*task)->address() == address) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat(
        id, ": ", TaskName(role, index), " already registered from ",
        (*task)->address(), "; refusing ", address));
  }
  (*task)->set_state(TASK_REGISTERED);
  (*task)->set_address(address);
  (*task)->set_last_heartbeat_ms(Ms(now));
  bool all = true;
  for (const TaskInfo& t : job->tasks()) all &= t.state() != TASK_WAITING;
  if (all) job->set_state(JOB_RUNNING);
  return Persist();
}

absl::StatusOr<std::vector<std::string>> JobTable::WaitForLayout(
    const std::string& id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto all_registered = [](const JobInfo& job) {
    for (const TaskInfo& t : job.tasks()) {
      if (t.state() == TASK_WAITING) return false;
    }
    return true;
  };
  auto ready = [this, &id,
                &all_registered]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    JobInfo* job = Find(id);
    return job == nullptr || JobEnded(job->state()) ||
           (job->state() != JOB_PENDING && all_registered(*job));
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if (!all_registered(*job)) {
    std::vector<std::string> missing;
    for (const TaskInfo& t : job->tasks()) {
      if (t.state() == TASK_WAITING) {
        missing.push_back(TaskName(t.role(), t.index()));
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat(id, ": still waiting for ", absl::StrJoin(missing, ", ")));
  }
  std::vector<std::string> addresses;
  for (const TaskInfo& t : job->tasks()) addresses.push_back(t.address());
  return addresses;
}

void JobTable::AppendLog(
    JobInfo* job, TaskRole role, int index,
    const google::protobuf::RepeatedPtrField<std::string>& lines,
    absl::Time now) {
  for (const std::string& text : lines) {
    LogLine* line = job->add_log();
    line->set_seq(job->next_log_seq());
    job->set_next_log_seq(job->next_log_seq() + 1);
    line->set_time_ms(Ms(now));
    line->set_role(role);
    line->set_index(index);
    line->set_text(text);
  }
  const int excess = job->log_size() - kMaxLogLines;
  if (excess > 0) job->mutable_log()->DeleteSubrange(0, excess);
}

absl::StatusOr<JobState> JobTable::Heartbeat(const HeartbeatRequest& request,
                                             absl::Time now) {
  const TaskRef& ref = request.task();
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(ref.job_id()));
  absl::StatusOr<TaskInfo*> task = FindTask(job, ref.role(), ref.index());
  if (!task.ok()) return task.status();
  if ((*task)->state() == TASK_REGISTERED) {
    (*task)->set_last_heartbeat_ms(Ms(now));
  }
  if (ref.role() == ROLE_WORKER && request.steps() > 0) {
    (*task)->set_steps(request.steps());
    (*task)->set_samples_per_sec(request.samples_per_sec());
  }
  if (ref.role() == ROLE_WORKER && ref.index() == 0 && request.has_result()) {
    *job->mutable_result() = request.result();
  }
  AppendLog(job, ref.role(), ref.index(), request.log_lines(), now);
  // Not persisted: Load() restarts every task's timeout.
  return job->state();
}

absl::Status JobTable::TaskFinished(const TaskFinishedRequest& request,
                                    absl::Time now) {
  const TaskRef& ref = request.task();
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(ref.job_id()));
  absl::StatusOr<TaskInfo*> task = FindTask(job, ref.role(), ref.index());
  if (!task.ok()) return task.status();
  AppendLog(job, ref.role(), ref.index(), request.log_lines(), now);
  if (ref.role() == ROLE_WORKER && request.steps() > 0) {
    (*task)->set_steps(request.steps());
    (*task)->set_samples_per_sec(request.samples_per_sec());
  }
  if (ref.role() == ROLE_WORKER && ref.index() == 0 && request.has_result()) {
    *job->mutable_result() = request.result();
  }
  if (JobEnded(job->state())) return Persist();
  (*task)->set_state(request.ok() ? TASK_DONE : TASK_FAILED);
  (*task)->set_message(request.message());
  if (!request.ok()) {
    std::string where = absl::StrCat(" on ", (*task)->address());
    if ((*task)->address().empty()) {
      const auto& hosts = ref.role() == ROLE_PS ? job->spec().ps_hosts()
                                                : job->spec().worker_hosts();
      where = hosts.empty()
                  ? " (not registered)"
                  : absl::StrCat(" on ", PlannedAddress(job->spec(), ref.role(),
                                                        ref.index()));
    }
    End(job, JOB_FAILED,
        absl::StrCat(TaskName(ref.role(), ref.index()), where,
                     " failed: ", request.message()),
        now);
  } else {
    bool all_workers = true;
    for (const TaskInfo& t : job->tasks()) {
      if (t.role() == ROLE_WORKER) all_workers &= t.state() == TASK_DONE;
    }
    if (all_workers) End(job, JOB_SUCCEEDED, "", now);
  }
  return Persist();
}

absl::StatusOr<int> JobTable::TaskRestarting(const std::string& id,
                                             TaskRole role, int index,
                                             const std::string& why,
                                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  ASSIGN_OR_RETURN(TaskInfo * task, FindTask(job, role, index));
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  int restarts = 0;
  for (const TaskInfo& t : job->tasks()) restarts += t.restarts();
  if (restarts >= job->spec().max_restarts()) {
    const std::string message = absl::StrCat(
        TaskName(role, index), " ", why, "; the job's restart budget (",
        job->spec().max_restarts(), ") is spent");
    task->set_state(TASK_FAILED);
    task->set_message(why);
    End(job, JOB_FAILED, message, now);
    RETURN_IF_ERROR(Persist());
    return absl::FailedPreconditionError(absl::StrCat(id, ": ", message));
  }
  task->set_restarts(task->restarts() + 1);
  task->set_state(TASK_WAITING);
  task->set_address("");
  task->set_message(why);
  task->set_waiting_since_ms(Ms(now));
  google::protobuf::RepeatedPtrField<std::string> line;
  line.Add(absl::StrCat(TaskName(role, index), " ", why, "; restarting it (",
                        "restart ", restarts + 1, " of ",
                        job->spec().max_restarts(), ")"));
  AppendLog(job, role, index, line, now);
  RETURN_IF_ERROR(Persist());
  return restarts + 1;
}

absl::Status JobTable::Cancel(const std::string& id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, " has already ended (", JobState_Name(job->state()), ")"));
  }
  End(job, JOB_CANCELLED, "cancelled", now);
  return Persist();
}

namespace {

// How long task `t` of `job` may take to register: the spec's
// registration_timeout_s the first time (a queued job waits for its nodes);
// the heartbeat timeout `limit_ms` after a restart (or a spec without one).
int64_t RegistrationLimitMs(const JobInfo& job, const TaskInfo& t,
                            int64_t limit_ms) {
  const int64_t spec_s = job.spec().registration_timeout_s();
  return t.restarts() > 0 || spec_s <= 0 ? limit_ms : spec_s * 1000;
}

}  // namespace

std::vector<std::string> JobTable::CheckHeartbeats(absl::Time now,
                                                   absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> failed;
  const int64_t limit = absl::ToInt64Milliseconds(timeout);
  for (JobInfo& job : *table_.mutable_jobs()) {
    if (JobEnded(job.state())) continue;
    std::vector<std::string> problems;
    for (TaskInfo& t : *job.mutable_tasks()) {
      if (t.state() == TASK_REGISTERED &&
          Ms(now) - t.last_heartbeat_ms() > limit) {
        t.set_state(TASK_LOST);
        problems.push_back(
            absl::StrCat("lost ", TaskName(t.role(), t.index()), " on ",
                         t.address(), ": no heartbeat for ",
                         (Ms(now) - t.last_heartbeat_ms()) / 1000, " s"));
      } else if (t.state() == TASK_WAITING &&
                 Ms(now) - std::max({job.submit_ms(), loaded_ms_,
                                     t.waiting_since_ms()}) >
                     RegistrationLimitMs(job, t, limit)) {
        const int64_t since = std::max(job.submit_ms(), t.waiting_since_ms());
        problems.push_back(
            absl::StrCat("waiting for ", TaskName(t.role(), t.index()),
                         t.restarts() > 0 ? " (restarted)" : "", " on ",
                         PlannedAddress(job.spec(), t.role(), t.index()),
                         " for ", (Ms(now) - since) / 1000, " s"));
      }
    }
    if (problems.empty()) continue;
    End(&job, JOB_FAILED, absl::StrJoin(problems, "; "), now);
    failed.push_back(job.id());
  }
  if (!failed.empty()) Persist().IgnoreError();
  return failed;
}

absl::Status JobTable::Set(const std::string& id, const std::string& key,
                           const std::string& value) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  (*job->mutable_kv())[key] = value;
  return Persist();
}

absl::StatusOr<std::string> JobTable::WaitForKey(const std::string& id,
                                                 const std::string& key,
                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &id, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    JobInfo* job = Find(id);
    return job == nullptr || job->kv().contains(key) || JobEnded(job->state());
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  auto it = job->kv().find(key);
  if (it != job->kv().end()) return it->second;
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(id, ": key \"", key, "\" was not set in time"));
}

absl::StatusOr<JobInfo> JobTable::Get(const std::string& id,
                                      int64_t log_since) const {
  absl::MutexLock lock(&mu_);
  for (const JobInfo& job : table_.jobs()) {
    if (job.id() != id) continue;
    JobInfo copy = job;
    int keep_from = 0;
    while (keep_from < copy.log_size() &&
           copy.log(keep_from).seq() < log_since) {
      ++keep_from;
    }
    copy.mutable_log()->DeleteSubrange(0, keep_from);
    return copy;
  }
  return absl::NotFoundError("unknown job " + id);
}

std::vector<JobInfo> JobTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobInfo> jobs(table_.jobs().begin(), table_.jobs().end());
  for (JobInfo& job : jobs) job.clear_log();
  return jobs;
}

}  // namespace pstrain
