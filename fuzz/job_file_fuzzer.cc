// Fuzzes the coordinator's persisted job file (JobTableFile, binary
// protobuf; coordinator/job_table.h): JobTable::Load, then what a restarted
// coordinator does with what it loaded: list and get every job, take
// registrations, heartbeats, restarts, finishes and cancels for its tasks,
// check heartbeats, submit a new job. Nothing may crash or CHECK-fail,
// whatever the file holds.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "fuzz/fuzz_util.h"
#include "proto/coordinator.pb.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pstrain::fuzz::ScratchDir() + "/jobs.pb";
  pstrain::fuzz::WriteFileOrDie(
      path, absl::string_view(reinterpret_cast<const char*>(data), size));
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  absl::StatusOr<std::unique_ptr<pstrain::JobTable>> table =
      pstrain::JobTable::Load(path, now);
  if (!table.ok()) return 0;
  pstrain::JobTable& t = **table;
  const std::vector<pstrain::JobInfo> jobs = t.List();
  for (const pstrain::JobInfo& job : jobs) {
    (void)t.Get(job.id()).ok();
    (void)t.Get(job.id(), 1).ok();
    for (const pstrain::TaskInfo& task : job.tasks()) {
      (void)t.Register(job.id(), task.role(), task.index(), "127.0.0.1:1", now);
      pstrain::HeartbeatRequest beat;
      beat.mutable_task()->set_job_id(job.id());
      beat.mutable_task()->set_role(task.role());
      beat.mutable_task()->set_index(task.index());
      beat.add_log_lines("fuzz");
      beat.set_steps(1);
      (void)t.Heartbeat(beat, now).ok();
    }
    (void)t.Set(job.id(), "k", "v");
    (void)t.WaitForLayout(job.id(), now).ok();
    if (!job.tasks().empty()) {
      const pstrain::TaskInfo& task = job.tasks(0);
      (void)t.TaskRestarting(job.id(), task.role(), task.index(), "fuzz", now)
          .ok();
      pstrain::TaskFinishedRequest done;
      *done.mutable_task() = pstrain::TaskRef();
      done.mutable_task()->set_job_id(job.id());
      done.mutable_task()->set_role(task.role());
      done.mutable_task()->set_index(task.index());
      done.set_ok(true);
      (void)t.TaskFinished(done, now);
    }
  }
  (void)t.CheckHeartbeats(now + absl::Hours(1), absl::Seconds(60));
  for (const pstrain::JobInfo& job : jobs) (void)t.Cancel(job.id(), now);
  absl::StatusOr<pstrain::JobSpec> spec = pstrain::ParseJobSpec(
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1", "fuzz");
  FUZZ_CHECK(spec.ok());
  (void)t.Submit(*spec, now).ok();
  return 0;
}
