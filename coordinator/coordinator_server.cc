#include "coordinator/coordinator_server.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// Creates the folders of `path` that are missing, mode 0700 (an existing
// one is left as it is). Errors name the folder.
absl::Status MakeFolders(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("folder ", path, ": is not a folder"));
  }
  if (const int error = errno; error != ENOENT) {
    return ErrnoToStatus(error, absl::StrCat("folder ", path));
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(MakeFolders(path.substr(0, slash)));
  }
  if (mkdir(path.c_str(), 0700) != 0) {
    const int error = errno;
    if (error != EEXIST) {
      return ErrnoToStatus(error, absl::StrCat("creating folder ", path));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  RETURN_IF_ERROR(ValidateJobTableLimits(options.table_limits));
  if (options.max_long_polls_per_caller < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_long_polls_per_caller ",
                     options.max_long_polls_per_caller, ": expected >= 1"));
  }
  if (!options.job_file.empty()) {
    absl::StatusOr<std::unique_ptr<JobTable>> loaded =
        JobTable::Load(options.job_file, absl::Now(), options.table_limits);
    if (loaded.ok()) {
      server->table_ = *std::move(loaded);
    } else if (absl::IsNotFound(loaded.status())) {
      // A new table; its folder made and the table written now, so that a
      // folder that cannot be made or written is found before the first
      // job is submitted.
      const size_t slash = options.job_file.find_last_of('/');
      absl::Status written =
          slash == std::string::npos || slash == 0
              ? absl::OkStatus()
              : MakeFolders(options.job_file.substr(0, slash));
      server->table_ =
          std::make_unique<JobTable>(options.job_file, options.table_limits);
      if (written.ok()) written = server->table_->Flush();
      if (!written.ok()) {
        return absl::Status(
            written.code(),
            absl::StrCat("job file ", options.job_file,
                         ": cannot be written: ", written.message()));
      }
    } else {
      return loaded.status();
    }
  } else {
    server->table_ = std::make_unique<JobTable>("", options.table_limits);
    if (!options.job_id_suffix.empty()) {
      RETURN_IF_ERROR(server->table_->SetIdSuffix(options.job_id_suffix));
    }
  }
  server->service_ = std::make_unique<CoordinatorService>(
      server->table_.get(), options.max_wait,
      /*authorize=*/options.credentials != nullptr,
      options.max_long_polls_per_caller);
  HealthOptions health;
  health.service_name = "pstrain.Coordinator";
  health.plaintext_address = options.health_address;
  absl::StatusOr<ListeningServer> listening = StartGrpcServer(
      options.address, server->service_.get(), options.port_file,
      options.credentials, options.server_limits, health);
  if (!listening.ok()) return listening.status();
  server->listening_ = *std::move(listening);
  server->options_ = std::move(options);
  server->checker_ = std::thread([s = server.get()] { s->CheckLoop(); });
  return server;
}

CoordinatorServer::~CoordinatorServer() {
  // gRPC's Shutdown waits for every call to return: the long polls (up to
  // max_wait) end first, UNAVAILABLE.
  if (table_ != nullptr) table_->StopWaits();
  stop_.Notify();
  if (checker_.joinable()) checker_.join();
  // Written before the grace too, so that a SIGKILL during it loses none
  // of the key-value writes; and after it, for those made during it.
  if (table_ != nullptr) table_->FlushIfDirty().IgnoreError();
  listening_.Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  if (table_ != nullptr) table_->FlushIfDirty().IgnoreError();
}

std::string WaitingReport(const JobInfo& job, absl::Time now) {
  if (job.state() != JOB_PENDING) return "";
  std::vector<std::string> missing;
  for (const TaskInfo& t : job.tasks()) {
    if (t.state() != TASK_WAITING) continue;
    const auto& hosts =
        t.role() == ROLE_PS ? job.spec().ps_hosts() : job.spec().worker_hosts();
    std::string name = TaskName(t.role(), t.index());
    if (t.index() < hosts.size()) {
      const HostPort& h = hosts[t.index()];
      absl::StrAppend(&name, " on ", h.host(),
                      h.port() > 0 ? absl::StrCat(":", h.port()) : "");
    }
    missing.push_back(name);
  }
  if (missing.empty()) return "";
  const int64_t waited_s = (absl::ToUnixMillis(now) - job.submit_ms()) / 1000;
  return absl::StrCat(job.id(), ": ", job.tasks_size() - missing.size(), "/",
                      job.tasks_size(), " tasks registered after ", waited_s,
                      " s; waiting for ", absl::StrJoin(missing, ", "),
                      " (registration timeout ",
                      job.spec().registration_timeout_s(), " s)");
}

void CoordinatorServer::CheckLoop() {
  absl::Time next_report = absl::Now() + options_.waiting_report_interval;
  while (!stop_.WaitForNotificationWithTimeout(options_.check_interval)) {
    // Key-value writes since the last write; a failure is retried at the
    // next tick (and reported by the next state change that fails too).
    table_->FlushIfDirty().IgnoreError();
    for (const std::string& id :
         table_->CheckHeartbeats(absl::Now(), options_.heartbeat_timeout)) {
      absl::StatusOr<JobInfo> job = table_->Get(id);
      if (job.ok() && options_.on_job_failed) options_.on_job_failed(*job);
    }
    const absl::Time now = absl::Now();
    if (now < next_report) continue;
    next_report = now + options_.waiting_report_interval;
    if (!options_.on_waiting) continue;
    for (const JobInfo& job : table_->List()) {
      const std::string report = WaitingReport(job, now);
      if (!report.empty()) options_.on_waiting(report);
    }
  }
}

}  // namespace pstrain
