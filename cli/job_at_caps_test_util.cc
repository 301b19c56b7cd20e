#include "cli/job_at_caps_test_util.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<std::string> FillJobToItsCaps(JobTable& table,
                                             const std::string& id) {
  const JobTableLimits limits;
  constexpr int kKeysPerWorker = 4;
  for (int w = 0; w < kWorkersToFillTheStore; ++w) {
    for (int k = 0; k < kKeysPerWorker; ++k) {
      const std::string key = absl::StrCat("worker-", w, "/k", k);
      const std::string value(
          limits.max_kv_bytes_per_task / kKeysPerWorker - key.size(), 'v');
      RETURN_IF_ERROR(table.Set(id, key, value));
    }
  }
  const absl::Time now = absl::Now();
  HeartbeatRequest result;
  result.mutable_task()->set_job_id(id);
  result.mutable_task()->set_role(ROLE_WORKER);
  result.mutable_task()->set_index(0);
  result.mutable_result()->set_dataset(
      std::string(limits.max_result_bytes - 64, 'r'));
  RETURN_IF_ERROR(table.Heartbeat(result, now).status());

  const int64_t line_bytes = limits.max_text_item_bytes;
  const int sent = kLogLinesAtTheCap + 76;
  HeartbeatRequest log;
  *log.mutable_task() = result.task();
  log.mutable_task()->set_index(1);
  std::string last;
  for (int i = 0; i < sent; ++i) {
    last = absl::StrCat("line ", i, " ");
    std::string line = last;
    line.resize(line_bytes, 'x');
    log.add_log_lines(std::move(line));
  }
  RETURN_IF_ERROR(table.Heartbeat(log, now).status());
  // Checked here, so that a change of the caps shows at once.
  ASSIGN_OR_RETURN(JobInfo job, table.Get(id));
  if (job.log_size() != kLogLinesAtTheCap ||
      job.log_bytes() != limits.max_log_bytes_per_job ||
      job.result().dataset().empty()) {
    return absl::InternalError(absl::StrCat(
        id, ": not at its caps: ", job.log_size(), " lines, ", job.log_bytes(),
        " bytes of log, a result of ", job.result().ByteSizeLong(), " bytes"));
  }
  return last;
}

}  // namespace pstrain
