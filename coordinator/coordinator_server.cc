#include "coordinator/coordinator_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  if (!options.job_file.empty()) {
    absl::StatusOr<std::unique_ptr<JobTable>> loaded =
        JobTable::Load(options.job_file, absl::Now());
    if (loaded.ok()) {
      server->table_ = *std::move(loaded);
    } else if (absl::IsNotFound(loaded.status())) {
      server->table_ = std::make_unique<JobTable>(options.job_file);
    } else {
      return loaded.status();
    }
  } else {
    server->table_ = std::make_unique<JobTable>();
  }
  server->service_ = std::make_unique<CoordinatorService>(server->table_.get(),
                                                          options.max_wait);
  absl::StatusOr<ListeningServer> listening = StartGrpcServer(
      options.address, server->service_.get(), options.port_file);
  if (!listening.ok()) return listening.status();
  server->server_ = std::move(listening->server);
  server->port_ = listening->port;
  server->options_ = std::move(options);
  server->checker_ = std::thread([s = server.get()] { s->CheckLoop(); });
  return server;
}

CoordinatorServer::~CoordinatorServer() {
  stop_.Notify();
  if (checker_.joinable()) checker_.join();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  }
}

void CoordinatorServer::CheckLoop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.check_interval)) {
    for (const std::string& id :
         table_->CheckHeartbeats(absl::Now(), options_.heartbeat_timeout)) {
      absl::StatusOr<JobInfo> job = table_->Get(id);
      if (job.ok() && options_.on_job_failed) options_.on_job_failed(*job);
    }
  }
}

}  // namespace pstrain
