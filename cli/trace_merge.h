// `pstrain trace`'s merge: every task's Chrome trace (common/trace.h) of a
// job, DIR/trace/psK.json and DIR/trace/workerJ.json, into one trace on the
// coordinator's clock.
//
// Each task file's pstrain_clock offset_us (coordinator clock minus the
// task's, measured by the task at its start from the min-RTT sample of
// several heartbeats; coordinator/task_agent.h MeasureClockOffset) is added
// to its events' ts; then every ts is shifted by the same origin (the
// earliest shifted ts) so the merged file starts at 0. Its otherData keeps
// origin_unix_us (the coordinator's clock at ts 0) and, per task, the
// offset and the round trip it came from: events of two tasks are ordered
// on the merged clock within (rtt_a + rtt_b) / 2 plus the clocks' drift
// since the measurement.
//
// Thread-compatible (plain functions).
#ifndef PSTRAIN_CLI_TRACE_MERGE_H_
#define PSTRAIN_CLI_TRACE_MERGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

struct TraceMergeSummary {
  std::vector<std::string> files;  // the task files merged, in name order
  int64_t events = 0;              // complete ("X") events written
  int64_t max_rtt_us = 0;          // largest round trip of an offset
};

// Merges the task traces in `trace_dir` (every *.json but `out`) into
// `out` (the Trace Event Format's object form: traceEvents, otherData). A
// task file without its closing "]" (a task still running, or killed) is
// read up to its last complete event. NOT_FOUND when the folder has no task
// trace; INVALID_ARGUMENT naming a file that is not one (not a JSON array
// of events).
absl::StatusOr<TraceMergeSummary> MergeTraces(const std::string& trace_dir,
                                              const std::string& out);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_TRACE_MERGE_H_
