// Test support: a job of an in-process coordinator filled to its caps
// (coordinator/job_table.h, JobTableLimits' defaults), so that each answer
// about it is larger than gRPC's default receive limit of 4 MiB.
#ifndef PSTRAIN_CLI_JOB_AT_CAPS_TEST_UTIL_H_
#define PSTRAIN_CLI_JOB_AT_CAPS_TEST_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/job_table.h"

namespace pstrain {

// The workers a job needs for FillJobToItsCaps: the key-value store's cap
// (max_kv_bytes_per_job) is this many workers' own caps
// (max_kv_bytes_per_task).
inline constexpr int kWorkersToFillTheStore = 16;

// Fills job `id` of `table` (JobTableLimits' defaults; at least
// kWorkersToFillTheStore workers): its key-value store to its 4 MiB (each
// of those workers its 256 KiB, as 4 keys), worker 0's result to nearly
// 1 MiB, and its log to its 4 MiB (1024 lines of 4 KiB that worker 1
// printed, after 76 more that the log dropped). GetJob's answer is then
// about 9.5 MB with the log and 5.2 MB without, as is ListJobs'. Returns
// the last log line's beginning ("line 1099 "; the rest is 'x').
absl::StatusOr<std::string> FillJobToItsCaps(JobTable& table,
                                             const std::string& id);

// The log lines FillJobToItsCaps leaves.
inline constexpr int kLogLinesAtTheCap = 1024;

}  // namespace pstrain

#endif  // PSTRAIN_CLI_JOB_AT_CAPS_TEST_UTIL_H_
