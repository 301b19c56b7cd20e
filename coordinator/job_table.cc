#include "coordinator/job_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "coordinator/job_membership.h"
#include "google/protobuf/stubs/logging.h"

namespace pstrain {
namespace {

int64_t Ms(absl::Time t) { return absl::ToUnixMillis(t); }

// The host:port the spec gives a task, or "an unassigned host".
std::string PlannedAddress(const JobSpec& spec, TaskRole role, int index) {
  const auto& hosts = role == ROLE_PS ? spec.ps_hosts() : spec.worker_hosts();
  if (index >= hosts.size()) return "an unassigned host";
  return absl::StrCat(hosts[index].host(), ":", hosts[index].port());
}

// The bytes of job file `path`; errors name it ("job file <path>: ...").
absl::Status ReadJobFile(const std::string& path, int64_t max_bytes,
                         std::string* bytes) {
  const std::string name = absl::StrCat("job file ", path);
  // O_NONBLOCK: a FIFO in the file's place is refused below, not waited on
  // (regular files ignore the flag).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoToStatus(errno, name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoToStatus(error, name);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": is ", S_ISDIR(st.st_mode) ? "a folder" : "not a regular file",
        ", not a job file"));
  }
  bytes->clear();
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoToStatus(error, name);
    }
    if (n == 0) break;
    if (static_cast<int64_t>(bytes->size()) + n > max_bytes) {
      close(fd);
      return absl::DataLossError(
          absl::StrCat(name, ": larger than ", max_bytes,
                       " bytes; not a pstrain job table"));
    }
    bytes->append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return absl::OkStatus();
}

// INVALID_ARGUMENT if a request of `ref` (`what`: "heartbeat", "report")
// carries more than JobTable::kMaxLogLinesPerRequest log lines, or more
// log_times_ms than log lines (a line without one is timed on arrival).
absl::Status CheckLogLineCounts(const TaskRef& ref, const char* what, int lines,
                                int times) {
  const std::string task = absl::StrCat(
      ref.job_id(), ": ", TaskName(ref.role(), ref.index()), "'s ", what);
  if (lines > JobTable::kMaxLogLinesPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat(task, " carries ", lines, " log_lines; the limit is ",
                     JobTable::kMaxLogLinesPerRequest, " per request"));
  }
  if (times > lines) {
    return absl::InvalidArgumentError(
        absl::StrCat(task, " carries ", times, " log_times_ms for ", lines,
                     " log_lines; expected at most one per line"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CutText(const std::string& text, int64_t max_bytes,
                    const std::string& what, int64_t* kept_bytes) {
  if (static_cast<int64_t>(text.size()) <= max_bytes) {
    if (kept_bytes != nullptr) *kept_bytes = text.size();
    return text;
  }
  // The marker's own length depends on N; take the longest N can be.
  const std::string longest =
      absl::StrCat("\u2026[cut: ", text.size(), " bytes over the ", what, "]");
  int64_t keep =
      std::max<int64_t>(0, max_bytes - static_cast<int64_t>(longest.size()));
  keep = std::min<int64_t>(keep, text.size());
  // Back to the start of a UTF-8 character (not a continuation byte).
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) {
    --keep;
  }
  if (kept_bytes != nullptr) *kept_bytes = keep;
  return absl::StrCat(text.substr(0, keep), "\u2026[cut: ", text.size() - keep,
                      " bytes over the ", what, "]");
}

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

JobTable::JobTable(std::string job_file, JobTableLimits limits)
    : job_file_(std::move(job_file)), limits_(limits) {
  table_.set_next_id(1);
}

JobTable::~JobTable() { FlushIfDirty().IgnoreError(); }

absl::StatusOr<std::unique_ptr<JobTable>> JobTable::Load(
    const std::string& job_file, absl::Time now, JobTableLimits limits) {
  std::string bytes;
  RETURN_IF_ERROR(ReadJobFile(job_file, limits.max_job_file_bytes, &bytes));
  const std::string name = absl::StrCat("job file ", job_file);
  if (bytes.empty()) {
    return absl::DataLossError(absl::StrCat(
        name, ": is empty (a job table always holds its next job id)"));
  }
  auto table = std::make_unique<JobTable>(job_file, limits);
  absl::MutexLock lock(&table->mu_);
  bool parsed;
  {
    // A string field with invalid UTF-8 makes protobuf log an ERROR of its
    // own; the one-line error below says it all.
    google::protobuf::LogSilencer silence;
    parsed = table->table_.ParseFromString(bytes);
  }
  if (!parsed) {
    return absl::DataLossError(absl::StrCat(name, ": not a pstrain job table (",
                                            bytes.size(),
                                            " bytes that do not parse)"));
  }
  absl::Status consistent = ValidateJobTableFile(table->table_);
  if (!consistent.ok()) {
    return absl::DataLossError(absl::StrCat(
        name, ": not a consistent job table: ", consistent.message()));
  }
  table->Prune();
  table->loaded_ms_ = Ms(now);
  for (JobInfo& job : *table->table_.mutable_jobs()) {
    int64_t log_bytes = 0;
    for (const LogLine& line : job.log()) log_bytes += line.text().size();
    job.set_log_bytes(log_bytes);
    if (JobEnded(job.state())) continue;
    for (TaskInfo& t : *job.mutable_tasks()) {
      // A registered standby's silence counts from here too.
      if (RegisteredAndBeating(t)) t.set_last_heartbeat_ms(Ms(now));
    }
  }
  return table;
}

absl::Status JobTable::Persist() {
  Prune();
  RETURN_IF_ERROR(FitJobFile());
  if (job_file_.empty()) {
    dirty_ = false;
    return absl::OkStatus();
  }
  std::string bytes;
  // Never an empty or partial file in place of the last good one.
  if (!table_.SerializeToString(&bytes) || bytes.empty() ||
      static_cast<int64_t>(bytes.size()) > limits_.max_job_file_bytes) {
    return absl::InternalError(absl::StrCat(
        "job file ", job_file_, ": the table did not serialize (", bytes.size(),
        " bytes; the limit is ", limits_.max_job_file_bytes,
        "); the file keeps the last table written"));
  }
  RETURN_IF_ERROR(WriteFileAtomically(job_file_, bytes));
  dirty_ = false;
  return absl::OkStatus();
}

absl::Status JobTable::FitJobFile() {
  const int64_t limit = limits_.max_job_file_bytes;
  int64_t size = static_cast<int64_t>(table_.ByteSizeLong());
  if (size <= limit) return absl::OkStatus();
  // Ended jobs, oldest-ended first: their logs, then their stores.
  std::vector<JobInfo*> ended;
  std::vector<JobInfo*> running;
  for (JobInfo& job : *table_.mutable_jobs()) {
    (JobEnded(job.state()) ? ended : running).push_back(&job);
  }
  std::stable_sort(ended.begin(), ended.end(), [](JobInfo* a, JobInfo* b) {
    return a->end_ms() < b->end_ms();
  });
  auto shed = [&](JobInfo* job, auto drop) {
    const int64_t before = static_cast<int64_t>(job->ByteSizeLong());
    drop(job);
    size -= before - static_cast<int64_t>(job->ByteSizeLong());
  };
  auto drop_log = [](JobInfo* job) {
    job->clear_log();
    job->set_log_bytes(0);
  };
  for (JobInfo* job : ended) {
    if (size <= limit) return absl::OkStatus();
    shed(job, drop_log);
  }
  for (JobInfo* job : ended) {
    if (size <= limit) return absl::OkStatus();
    shed(job, [](JobInfo* j) { j->clear_kv(); });
  }
  // Running jobs: the oldest half of each one's log, until it fits.
  bool dropped = true;
  while (size > limit && dropped) {
    dropped = false;
    for (JobInfo* job : running) {
      if (job->log_size() == 0) continue;
      dropped = true;
      shed(job, [](JobInfo* j) {
        const int n = (j->log_size() + 1) / 2;
        for (int i = 0; i < n; ++i) {
          j->set_log_bytes(j->log_bytes() - j->log(i).text().size());
        }
        j->mutable_log()->DeleteSubrange(0, n);
      });
      if (size <= limit) break;
    }
  }
  size = static_cast<int64_t>(table_.ByteSizeLong());
  if (size <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the job table needs ", size, " bytes without logs; the ",
                   "job file's limit is ", limit, " bytes"));
}

absl::Status JobTable::Flush() {
  absl::MutexLock lock(&mu_);
  return Persist();
}

absl::Status JobTable::FlushIfDirty() {
  absl::MutexLock lock(&mu_);
  if (!dirty_) return absl::OkStatus();
  return Persist();
}

void JobTable::Prune() {
  std::vector<int> ended;
  for (int i = 0; i < table_.jobs_size(); ++i) {
    if (JobEnded(table_.jobs(i).state())) ended.push_back(i);
  }
  const int excess =
      static_cast<int>(ended.size()) - limits_.keep_finished_jobs;
  if (excess <= 0) return;
  // Oldest ended first; a tie keeps the table's (submission) order.
  const auto& all = table_.jobs();
  std::stable_sort(ended.begin(), ended.end(), [&all](int a, int b) {
    return all[a].end_ms() < all[b].end_ms();
  });
  std::vector<bool> drop(table_.jobs_size(), false);
  for (int k = 0; k < excess; ++k) drop[ended[k]] = true;
  auto* jobs = table_.mutable_jobs();
  int kept = 0;
  for (int i = 0; i < jobs->size(); ++i) {
    if (drop[i]) continue;
    if (kept != i) jobs->SwapElements(kept, i);
    ++kept;
  }
  jobs->DeleteSubrange(kept, jobs->size() - kept);
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
      role == ROLE_PS ? PsTaskCount(job->spec()) : WorkerTaskCount(job->spec());
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        job->id(), ": ", TaskName(role, index), " is outside the job's ", count,
        " ", role == ROLE_PS ? "ps" : "worker", " tasks"));
  }
  const int offset = role == ROLE_PS ? 0 : PsTaskCount(job->spec());
  return job->mutable_tasks(offset + index);
}

void JobTable::End(JobInfo* job, JobState state, const std::string& message,
                   absl::Time now) {
  job->set_state(state);
  job->set_message(message);
  job->set_end_ms(Ms(now));
  if (state == JOB_SUCCEEDED) return;
  for (TaskInfo& t : *job->mutable_tasks()) {
    if (t.state() == TASK_WAITING || t.state() == TASK_REGISTERED) {
      t.set_state(TASK_STOPPED);
    }
  }
}

absl::Status JobTable::SetIdSuffix(const std::string& suffix) {
  if (!job_file_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ids of a table kept in ", job_file_,
                     " never repeat; they take no suffix"));
  }
  const bool ok = !suffix.empty() && suffix.size() <= 16 &&
                  std::all_of(suffix.begin(), suffix.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
                  });
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id suffix \"", absl::CHexEscape(suffix.substr(0, 20)),
                     "\": expected 1 to 16 lowercase letters and digits"));
  }
  absl::MutexLock lock(&mu_);
  id_suffix_ = suffix;
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobTable::Submit(const JobSpec& spec,
                                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  JobInfo* job = table_.add_jobs();
  job->set_id(id_suffix_.empty()
                  ? absl::StrCat("job-", table_.next_id())
                  : absl::StrCat("job-", table_.next_id(), "-", id_suffix_));
  table_.set_next_id(table_.next_id() + 1);
  *job->mutable_spec() = spec;
  job->set_state(JOB_PENDING);
  job->set_submit_ms(Ms(now));
  for (const auto& [role, count] :
       {std::pair<TaskRole, int>{ROLE_PS, PsTaskCount(spec)},
        {ROLE_WORKER, WorkerTaskCount(spec)}}) {
    for (int i = 0; i < count; ++i) {
      TaskInfo* task = job->add_tasks();
      task->set_role(role);
      task->set_index(i);
      task->set_state(TASK_WAITING);
    }
  }
  InitMembership(job);
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
  if (static_cast<int64_t>(address.size()) > kMaxAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        id, ": ", TaskName(role, index), "'s address is ", address.size(),
        " bytes; expected at most ", kMaxAddressBytes));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  absl::StatusOr<TaskInfo*> task = FindTask(job, role, index);
  if (!task.ok()) return task.status();
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if ((*task)->state() == TASK_IDLE || (*task)->state() == TASK_REMOVED) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, ": ", TaskName(role, index), " is not a member of the job (",
        TaskState_Name((*task)->state()), "); `pstrain scale` adds ",
        role == ROLE_PS ? "shards" : "workers"));
  }
  if ((*task)->state() == TASK_STANDBY) {
    // A standby registers once and stays one until a Scale adds it.
    if (!(*task)->address().empty() && (*task)->address() != address) {
      return absl::AlreadyExistsError(absl::StrCat(
          id, ": standby ", TaskName(role, index), " already registered from ",
          (*task)->address(), "; refusing ", address));
    }
    (*task)->set_address(address);
    (*task)->set_last_heartbeat_ms(Ms(now));
    return Persist();
  }
  if ((*task)->state() != TASK_WAITING) {
    if ((*task)->address() == address) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat(
        id, ": ", TaskName(role, index), " already registered from ",
        (*task)->address(), "; refusing ", address));
  }
  (*task)->set_state(TASK_REGISTERED);
  (*task)->set_restart_requested(false);
  (*task)->set_prepared(false);
  (*task)->set_address(address);
  (*task)->set_last_heartbeat_ms(Ms(now));
  bool all = true;
  for (const TaskInfo& t : job->tasks()) all &= t.state() != TASK_WAITING;
  if (all) job->set_state(JOB_RUNNING);
  UpdateReady(job);
  return Persist();
}

void JobTable::AppendLog(
    JobInfo* job, TaskInfo* task, TaskRole role, int index,
    const google::protobuf::RepeatedPtrField<std::string>& lines,
    absl::Time now, const google::protobuf::RepeatedField<int64_t>& times_ms) {
  const std::string item_limit =
      absl::StrCat("per-line limit of ", limits_.max_text_item_bytes, " bytes");
  for (int i = 0; i < lines.size(); ++i) {
    const std::string& sent = lines[i];
    int64_t kept = 0;
    std::string text =
        CutText(sent, limits_.max_text_item_bytes, item_limit, &kept);
    if (task != nullptr) {
      const int64_t task_left =
          limits_.max_text_bytes_per_task - task->text_bytes();
      const int64_t job_left =
          limits_.max_text_bytes_per_job - job->text_bytes();
      // Each line costs kLogLineCostBytes besides its text, empty or not.
      const int64_t left = std::min(task_left, job_left) - kLogLineCostBytes;
      const std::string budget =
          task_left <= job_left
              ? absl::StrCat("per-task budget of ",
                             limits_.max_text_bytes_per_task, " bytes")
              : absl::StrCat("per-job budget of ",
                             limits_.max_text_bytes_per_job, " bytes");
      // Nothing of it fits the budget (not even an empty line's cost).
      bool spent = left < 0;
      if (spent) {
        kept = 0;
      } else if (kept > left) {
        text = CutText(sent, left, budget, &kept);
        spent = kept == 0;
      }
      if (!spent) {
        task->set_text_bytes(task->text_bytes() + kept + kLogLineCostBytes);
        job->set_text_bytes(job->text_bytes() + kept + kLogLineCostBytes);
      }
      task->set_text_bytes_cut(task->text_bytes_cut() + sent.size() - kept);
      if (spent) {
        // Once, a line saying so; after that the task's lines are only
        // counted.
        if (task->text_budget_spent()) continue;
        task->set_text_budget_spent(true);
        text = absl::StrCat(
            "\u2026[cut: ", sent.size(), " bytes over the ", budget,
            " (each line also costs ", kLogLineCostBytes, " bytes); ",
            TaskName(role, index), "'s later lines are only counted]");
      }
    }
    LogLine* line = job->add_log();
    line->set_seq(job->next_log_seq());
    job->set_next_log_seq(job->next_log_seq() + 1);
    line->set_time_ms(i < times_ms.size() && times_ms[i] > 0
                          ? std::min(times_ms[i], Ms(now))
                          : Ms(now));
    line->set_role(role);
    line->set_index(index);
    job->set_log_bytes(job->log_bytes() + text.size());
    line->set_text(std::move(text));
  }
  int excess = 0;
  int64_t bytes = job->log_bytes();
  while (excess < job->log_size() && (job->log_size() - excess > kMaxLogLines ||
                                      bytes > limits_.max_log_bytes_per_job)) {
    bytes -= job->log(excess).text().size();
    ++excess;
  }
  if (excess > 0) {
    job->mutable_log()->DeleteSubrange(0, excess);
    job->set_log_bytes(bytes);
  }
}

void JobTable::KeepResult(JobInfo* job, TaskInfo* task,
                          const RunResult& result) {
  const int64_t size = static_cast<int64_t>(result.ByteSizeLong());
  if (size > limits_.max_result_bytes) {
    task->set_text_bytes_cut(task->text_bytes_cut() + size);
    return;
  }
  *job->mutable_result() = result;
}

absl::StatusOr<JobState> JobTable::Heartbeat(const HeartbeatRequest& request,
                                             absl::Time now, bool* restart,
                                             HeartbeatResponse* answer) {
  if (restart != nullptr) *restart = false;
  const TaskRef& ref = request.task();
  // Before the lock: a request too large to keep holds up no other call.
  RETURN_IF_ERROR(CheckLogLineCounts(ref, "heartbeat", request.log_lines_size(),
                                     request.log_times_ms_size()));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(ref.job_id()));
  absl::StatusOr<TaskInfo*> task = FindTask(job, ref.role(), ref.index());
  if (!task.ok()) return task.status();
  if ((*task)->state() == TASK_DONE || (*task)->state() == TASK_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        ref.job_id(), ": ", TaskName(ref.role(), ref.index()), " has ended (",
        TaskState_Name((*task)->state()), "); refusing its heartbeat"));
  }
  if (restart != nullptr) *restart = (*task)->restart_requested();
  if (JobEnded(job->state())) {
    // An ended job accepts nothing: the task only learns the end.
    if (answer != nullptr) {
      FillHeartbeatMembership(*job, ref.role(), ref.index(), answer);
    }
    return job->state();
  }
  if (RegisteredAndBeating(**task)) (*task)->set_last_heartbeat_ms(Ms(now));
  if (ref.role() == ROLE_WORKER && request.steps() > 0) {
    (*task)->set_steps(request.steps());
    (*task)->set_samples_per_sec(request.samples_per_sec());
  }
  if (ref.role() == ROLE_WORKER && ref.index() == 0 && request.has_result()) {
    KeepResult(job, *task, request.result());
  }
  AppendLog(job, *task, ref.role(), ref.index(), request.log_lines(), now,
            request.log_times_ms());
  if (ref.role() == ROLE_WORKER && request.prepared() &&
      RegisteredAndBeating(**task) && !(*task)->prepared()) {
    (*task)->set_prepared(true);
    if (UpdateReady(job)) dirty_ = true;
  }
  if (ref.role() == ROLE_WORKER && ref.index() == 0 &&
      request.has_membership_applied()) {
    std::optional<std::string> line =
        ApplyMembership(job, request.membership_applied());
    // Written within a second (FlushIfDirty), as a Set().
    if (line.has_value()) {
      LogLineOf(job, ROLE_WORKER, 0, *line, now);
      dirty_ = true;
    }
  }
  if (answer != nullptr) {
    FillHeartbeatMembership(*job, ref.role(), ref.index(), answer);
  }
  // Not persisted: Load() restarts every task's timeout.
  return job->state();
}

absl::Status JobTable::TaskFinished(const TaskFinishedRequest& request,
                                    absl::Time now) {
  const TaskRef& ref = request.task();
  RETURN_IF_ERROR(CheckLogLineCounts(ref, "report", request.log_lines_size(),
                                     request.log_times_ms_size()));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(ref.job_id()));
  absl::StatusOr<TaskInfo*> task = FindTask(job, ref.role(), ref.index());
  if (!task.ok()) return task.status();
  // A removed worker's later reports change nothing.
  if ((*task)->state() == TASK_REMOVED) return absl::OkStatus();
  if ((*task)->state() == TASK_DONE || (*task)->state() == TASK_FAILED) {
    // A retry of the report that landed is OK; the other outcome is not.
    if (((*task)->state() == TASK_DONE) == request.ok()) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        ref.job_id(), ": ", TaskName(ref.role(), ref.index()),
        " has already ended (", TaskState_Name((*task)->state()),
        "); refusing a report of ", request.ok() ? "success" : "failure"));
  }
  const std::string message =
      CutText(request.message(), limits_.max_text_item_bytes,
              absl::StrCat("per-message limit of ", limits_.max_text_item_bytes,
                           " bytes"));
  if (JobEnded(job->state())) {
    // An ended job accepts nothing (the task is answered OK and exits as it
    // meant to), but for the one final report of a task that its success
    // did not stop: a shard, which exits once every worker is done, its
    // report usually landing just after the last worker's ended the job,
    // or with backup workers a straggler. Its lines and outcome are kept,
    // not its progress or result; a later report is a retry.
    if (job->state() != JOB_SUCCEEDED || (*task)->state() != TASK_REGISTERED) {
      return absl::OkStatus();
    }
    AppendLog(job, *task, ref.role(), ref.index(), request.log_lines(), now,
              request.log_times_ms());
    (*task)->set_state(request.ok() ? TASK_DONE : TASK_FAILED);
    (*task)->set_message(message);
    return Persist();
  }
  AppendLog(job, *task, ref.role(), ref.index(), request.log_lines(), now,
            request.log_times_ms());
  if (ref.role() == ROLE_WORKER && request.steps() > 0) {
    (*task)->set_steps(request.steps());
    (*task)->set_samples_per_sec(request.samples_per_sec());
  }
  if (ref.role() == ROLE_WORKER && ref.index() == 0 && request.has_result()) {
    KeepResult(job, *task, request.result());
  }
  // Elastic jobs: a removed worker's end, or (min_workers) the death of
  // one whose restart budget is spent, neither fails the job nor is waited
  // for.
  if (ref.role() == ROLE_WORKER ? LeavingJob(*job, ref.index())
                                : ShardRemoved(*job, ref.index())) {
    (*task)->set_state(TASK_REMOVED);
    (*task)->set_message(message);
    return Persist();
  }
  if (ref.role() == ROLE_WORKER && !request.ok() &&
      JobRestarts(*job) >= job->spec().max_restarts()) {
    if (std::optional<std::string> line = RemoveFailedWorker(
            job, ref.index(), "its restart budget is spent")) {
      (*task)->set_message(message);
      LogLineOf(job, ROLE_WORKER, ref.index(), *line, now);
      if (EveryMemberDone(*job)) End(job, JOB_SUCCEEDED, "", now);
      return Persist();
    }
  }
  (*task)->set_state(request.ok() ? TASK_DONE : TASK_FAILED);
  (*task)->set_message(message);
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
                     " failed: ", message),
        now);
  } else {
    // Every member of an elastic job's applied membership.
    const bool all_workers = EveryMemberDone(*job);
    // With backup workers the model is complete when worker 0 is: it ends
    // after the last step's update is decided on every shard, and no other
    // worker's later pushes can be admitted. A straggler still on its way
    // (slow or stopped) is not waited for; it leaves at the job's end.
    const bool chief_done_with_backups = job->spec().backup_workers() > 0 &&
                                         ref.role() == ROLE_WORKER &&
                                         ref.index() == 0;
    if (all_workers || chief_done_with_backups) {
      End(job, JOB_SUCCEEDED, "", now);
    }
  }
  return Persist();
}

namespace {

// Drops the job's rendezvous keys (Gloo's and NCCL's, every generation's),
// keeping the workers' own `worker-<i>/...` keys.
void DropRendezvousKeys(JobInfo* job) {
  std::vector<std::string> drop;
  for (const auto& [key, value] : job->kv()) {
    if (!absl::StartsWith(key, "worker-")) drop.push_back(key);
  }
  for (const std::string& key : drop) job->mutable_kv()->erase(key);
}

}  // namespace

int JobRestarts(const JobInfo& job) {
  int restarts = 0;
  for (const TaskInfo& t : job.tasks()) restarts += t.restarts();
  return restarts;
}

absl::StatusOr<int> JobTable::TaskRestarting(const std::string& id,
                                             TaskRole role, int index,
                                             const std::string& why_sent,
                                             absl::Time now) {
  const std::string why =
      CutText(why_sent, limits_.max_text_item_bytes,
              absl::StrCat("per-message limit of ", limits_.max_text_item_bytes,
                           " bytes"));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  ASSIGN_OR_RETURN(TaskInfo * task, FindTask(job, role, index));
  if (JobEnded(job->state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " has ended: ", job->message()));
  }
  if (role == ROLE_WORKER &&
      (task->state() == TASK_REMOVED || LeavingJob(*job, index))) {
    task->set_state(TASK_REMOVED);
    RETURN_IF_ERROR(Persist());
    return absl::FailedPreconditionError(
        absl::StrCat(id, ": ", TaskName(role, index),
                     " is not a member of the job's newest membership; not "
                     "restarting it"));
  }
  if (role == ROLE_PS &&
      (task->state() == TASK_REMOVED || ShardRemoved(*job, index))) {
    task->set_state(TASK_REMOVED);
    RETURN_IF_ERROR(Persist());
    return absl::FailedPreconditionError(absl::StrCat(
        id, ": ", TaskName(role, index),
        " is outside the job's layout (a membership removed it); not "
        "restarting it"));
  }
  const int restarts = JobRestarts(*job);
  if (restarts >= job->spec().max_restarts() && role == ROLE_WORKER) {
    // min_workers: the job goes on without it (FAILED_PRECONDITION: it is
    // not restarted).
    if (std::optional<std::string> line =
            RemoveFailedWorker(job, index, "its restart budget is spent")) {
      task->set_message(why);
      LogLineOf(job, role, index, *line, now);
      if (EveryMemberDone(*job)) End(job, JOB_SUCCEEDED, "", now);
      RETURN_IF_ERROR(Persist());
      return absl::FailedPreconditionError(absl::StrCat(id, ": ", *line));
    }
  }
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
  // Allreduce: the death broke the survivors' collective, so every worker
  // restarts under the next generation's prefix (older keys are dropped).
  const bool every_worker = ModeOf(job->spec()) == MODE_ALLREDUCE;
  if (every_worker) {
    for (TaskInfo& t : *job->mutable_tasks()) {
      // An elastic job's idle and removed workers are not running, and
      // its standbys are in no world.
      if (&t == task || t.state() == TASK_WAITING || t.state() == TASK_IDLE ||
          t.state() == TASK_REMOVED || t.state() == TASK_STANDBY) {
        continue;
      }
      t.set_state(TASK_WAITING);
      t.set_restart_requested(true);
      t.set_address("");
      t.set_message(absl::StrCat(
          "restarted with every worker: ", TaskName(role, index), " ", why));
      t.set_waiting_since_ms(Ms(now));
    }
    DropRendezvousKeys(job);
  }
  google::protobuf::RepeatedPtrField<std::string> line;
  line.Add(absl::StrCat(
      TaskName(role, index), " ", why,
      every_worker ? "; restarting every worker from the newest "
                     "checkpoint ("
                   : "; restarting it (",
      "restart ", restarts + 1, " of ", job->spec().max_restarts(), ")"));
  AppendLog(job, /*task=*/nullptr, role, index, line, now);
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
  bool changed = false;
  const int64_t limit = absl::ToInt64Milliseconds(timeout);
  for (JobInfo& job : *table_.mutable_jobs()) {
    if (JobEnded(job.state())) continue;
    std::vector<std::string> problems;
    for (TaskInfo& t : *job.mutable_tasks()) {
      if (t.state() == TASK_STANDBY) {
        changed |= CheckStandby(&job, &t, now, limit);
        continue;
      }
      const bool silent = t.state() == TASK_REGISTERED &&
                          Ms(now) - t.last_heartbeat_ms() > limit;
      if (silent && t.role() == ROLE_WORKER &&
          RemoveSilentWorker(&job, &t, now)) {
        changed = true;
      } else if (silent) {
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
  if (changed || !failed.empty()) Persist().IgnoreError();
  return failed;
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

absl::StatusOr<Membership> JobTable::Scale(const std::string& id,
                                           int num_workers, int64_t at_step,
                                           absl::Time now) {
  ScaleTarget target;
  target.num_workers = num_workers;
  target.at_step = at_step;
  return Scale(id, target, now);
}

absl::StatusOr<Membership> JobTable::Scale(const std::string& id,
                                           const ScaleTarget& target,
                                           absl::Time now) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobInfo * job, FindJob(id));
  const int64_t before = job->membership().epoch();
  ASSIGN_OR_RETURN(Membership next, ScaleMembership(job, target, Ms(now)));
  if (next.epoch() == before) return next;
  const std::string shards =
      next.num_ps() > 0 ? absl::StrCat(", shards 0 to ", next.num_ps() - 1)
                        : "";
  LogLineOf(job, ROLE_WORKER, 0,
            absl::StrCat(next.reason(), " requested: membership ", next.epoch(),
                         " (workers ", absl::StrJoin(next.workers(), ", "),
                         shards, ") at step ", next.at_step(), " or the next"),
            now);
  RETURN_IF_ERROR(Persist());
  return next;
}

bool JobTable::CheckStandby(JobInfo* job, TaskInfo* task, absl::Time now,
                            int64_t limit_ms) {
  std::string why;
  if (!task->address().empty()) {
    const int64_t silent_ms = Ms(now) - task->last_heartbeat_ms();
    if (silent_ms <= limit_ms) return false;
    why = absl::StrCat("no heartbeat for ", silent_ms / 1000, " s");
  } else {
    const int64_t since =
        std::max({job->submit_ms(), loaded_ms_, task->waiting_since_ms()});
    if (Ms(now) - since <= RegistrationLimitMs(*job, *task, limit_ms)) {
      return false;
    }
    why = absl::StrCat("not registered after ", (Ms(now) - since) / 1000, " s");
  }
  task->set_state(TASK_REMOVED);
  task->set_message(why);
  LogLineOf(job, ROLE_WORKER, task->index(),
            absl::StrCat("standby worker ", task->index(), " removed: ", why,
                         " (a scale starts it again)"),
            now);
  return true;
}

bool JobTable::RemoveSilentWorker(JobInfo* job, TaskInfo* task,
                                  absl::Time now) {
  if (LeavingJob(*job, task->index())) {
    task->set_state(TASK_REMOVED);
    return true;
  }
  std::optional<std::string> line = RemoveFailedWorker(
      job, task->index(),
      absl::StrCat("no heartbeat for ",
                   (Ms(now) - task->last_heartbeat_ms()) / 1000, " s"));
  if (!line.has_value()) return false;
  LogLineOf(job, ROLE_WORKER, task->index(), *line, now);
  return true;
}

void JobTable::LogLineOf(JobInfo* job, TaskRole role, int index,
                         std::string text, absl::Time now) {
  google::protobuf::RepeatedPtrField<std::string> line;
  line.Add(std::move(text));
  AppendLog(job, /*task=*/nullptr, role, index, line, now);
}

std::vector<JobInfo> JobTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobInfo> jobs(table_.jobs().begin(), table_.jobs().end());
  for (JobInfo& job : jobs) job.clear_log();
  return jobs;
}

}  // namespace pstrain
