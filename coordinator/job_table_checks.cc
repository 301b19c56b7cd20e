// ValidateJobTableLimits and ValidateJobTableFile (coordinator/job_table.h):
// the checks of a JobTable's limits and of a job file Load reads.
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_table.h"

namespace pstrain {

absl::Status ValidateJobTableLimits(const JobTableLimits& limits) {
  if (limits.keep_finished_jobs < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keep_finished_jobs ", limits.keep_finished_jobs, ": expected >= 0"));
  }
  if (limits.max_kv_key_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_kv_key_bytes ", limits.max_kv_key_bytes, ": expected >= 1"));
  }
  if (limits.max_kv_value_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_kv_value_bytes ", limits.max_kv_value_bytes, ": expected >= 0"));
  }
  if (limits.max_kv_keys_per_job < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_kv_keys_per_job ", limits.max_kv_keys_per_job, ": expected >= 1"));
  }
  const struct {
    const char* name;
    int64_t value;
    int64_t lo;
    int64_t hi;
  } ranges[] = {
      {"max_kv_bytes_per_job", limits.max_kv_bytes_per_job, 1, INT64_MAX},
      {"max_kv_bytes_per_task", limits.max_kv_bytes_per_task, 1, INT64_MAX},
      {"max_text_item_bytes", limits.max_text_item_bytes, 64, INT64_MAX},
      {"max_text_bytes_per_task", limits.max_text_bytes_per_task,
       limits.max_text_item_bytes, INT64_MAX},
      {"max_text_bytes_per_job", limits.max_text_bytes_per_job,
       limits.max_text_item_bytes, INT64_MAX},
      {"max_log_bytes_per_job", limits.max_log_bytes_per_job, 1, INT64_MAX},
      {"max_result_bytes", limits.max_result_bytes, 1, INT64_MAX},
      {"max_job_file_bytes", limits.max_job_file_bytes, 1024,
       JobTable::kMaxJobFileBytes},
  };
  for (const auto& r : ranges) {
    if (r.value < r.lo || r.value > r.hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.name, " ", r.value, ": expected ", r.lo, " to ",
                       r.hi == INT64_MAX ? "any larger" : absl::StrCat(r.hi)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJobTableFile(const JobTableFile& table) {
  // At most 2^53: the next Submit adds 1 (INT64_MAX would overflow).
  if (table.next_id() < 1 || table.next_id() > (int64_t{1} << 53)) {
    return absl::DataLossError(absl::StrCat(
        "next job id ", table.next_id(), ": expected 1 to 9007199254740992"));
  }
  absl::flat_hash_set<std::string> ids;
  for (int j = 0; j < table.jobs_size(); ++j) {
    const JobInfo& job = table.jobs(j);
    const std::string where =
        job.id().empty() ? absl::StrCat("job #", j) : job.id();
    int64_t n = 0;
    if (job.id().rfind("job-", 0) != 0 ||
        !absl::SimpleAtoi(job.id().substr(4), &n) || n < 1 ||
        n >= table.next_id() || absl::StrCat("job-", n) != job.id()) {
      return absl::DataLossError(
          absl::StrCat(where, ": not an id this table gives (job-1 .. job-",
                       table.next_id() - 1, ")"));
    }
    if (!ids.insert(job.id()).second) {
      return absl::DataLossError(absl::StrCat(where, ": listed twice"));
    }
    if (!JobState_IsValid(job.state()) ||
        job.state() == JOB_STATE_UNSPECIFIED) {
      return absl::DataLossError(
          absl::StrCat(where, ": unknown job state ", job.state()));
    }
    // The spec's text fields are bytes on the wire; Submit stores only
    // UTF-8, so other bytes mean a damaged file.
    if (absl::Status s = CheckUtf8Fields(job.spec()); !s.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": spec.", s.message()));
    }
    const int64_t num_ps = job.spec().num_ps();
    const int64_t num_workers = job.spec().num_workers();
    if (num_ps < 0 || num_workers < 1) {
      return absl::DataLossError(absl::StrCat(where, ": ", num_ps, " ps and ",
                                              num_workers, " workers"));
    }
    // An elastic-shard job has max_ps PS tasks.
    const int64_t ps_tasks = PsTaskCount(job.spec());
    // An elastic job has max_workers worker tasks.
    const int64_t worker_tasks = WorkerTaskCount(job.spec());
    if (job.tasks_size() != ps_tasks + worker_tasks) {
      return absl::DataLossError(
          absl::StrCat(where, ": ", job.tasks_size(), " tasks for ", ps_tasks,
                       " ps and ", worker_tasks, " workers"));
    }
    for (int i = 0; i < job.tasks_size(); ++i) {
      const TaskInfo& t = job.tasks(i);
      const TaskRole role = i < ps_tasks ? ROLE_PS : ROLE_WORKER;
      const int index = i < ps_tasks ? i : static_cast<int>(i - ps_tasks);
      if (t.role() != role || t.index() != index) {
        return absl::DataLossError(absl::StrCat(
            where, ": task #", i, " is ", TaskName(t.role(), t.index()),
            "; expected ", TaskName(role, index)));
      }
      if (!TaskState_IsValid(t.state()) ||
          t.state() == TASK_STATE_UNSPECIFIED) {
        return absl::DataLossError(
            absl::StrCat(where, ": ", TaskName(role, index),
                         " has unknown state ", t.state()));
      }
    }
    if (absl::Status s = ValidateMembership(job, where); !s.ok()) return s;
    int64_t previous = -1;
    for (const LogLine& line : job.log()) {
      if (line.seq() <= previous || line.seq() >= job.next_log_seq()) {
        return absl::DataLossError(absl::StrCat(
            where, ": log line ", line.seq(), " out of order (after ", previous,
            ", next ", job.next_log_seq(), ")"));
      }
      previous = line.seq();
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
