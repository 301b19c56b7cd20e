// pstrain_coordinator: the job coordinator daemon.
//
// Serves the Coordinator service (proto/coordinator.proto) on --bind:--port,
// keeps its job table in --job_file (reloaded at start-up, so a restarted
// coordinator still knows its jobs) and, once a second, fails jobs whose
// tasks are silent for longer than --heartbeat_timeout_s. Exits on SIGINT or
// SIGTERM.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/grpc_server.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_table.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, bind, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 7070, "Port to listen on (0: any free port).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here once listening.");
ABSL_FLAG(std::string, job_file, "",
          "Where the job table is kept and reloaded from (empty: memory "
          "only).");
ABSL_FLAG(int, heartbeat_timeout_s, 60,
          "Seconds of silence after which a task is lost and its job fails.");
ABSL_FLAG(int, max_wait_s, 600,
          "Longest a blocking call (layout, key wait) may wait, seconds.");

namespace {

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

constexpr char kProgram[] = "pstrain_coordinator";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The pstrain job coordinator.");
  absl::ParseCommandLine(argc, argv);
  const int timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
  if (timeout_s < 1) {
    pstrain::PrintError(
        kProgram,
        absl::StrCat("--heartbeat_timeout_s=", timeout_s, ": expected >= 1"));
    return 2;
  }
  const std::string job_file = absl::GetFlag(FLAGS_job_file);
  std::unique_ptr<pstrain::JobTable> table;
  if (!job_file.empty()) {
    absl::StatusOr<std::unique_ptr<pstrain::JobTable>> loaded =
        pstrain::JobTable::Load(job_file);
    if (loaded.ok()) {
      table = *std::move(loaded);
    } else if (absl::IsNotFound(loaded.status())) {
      table = std::make_unique<pstrain::JobTable>(job_file);
    } else {
      pstrain::PrintError(kProgram, absl::StrCat("--job_file=", job_file, ": ",
                                                 loaded.status().message()));
      return 2;
    }
  } else {
    table = std::make_unique<pstrain::JobTable>();
  }
  pstrain::CoordinatorService service(
      table.get(), absl::Seconds(absl::GetFlag(FLAGS_max_wait_s)));
  absl::StatusOr<pstrain::ListeningServer> listening = pstrain::StartGrpcServer(
      absl::StrCat(absl::GetFlag(FLAGS_bind), ":", absl::GetFlag(FLAGS_port)),
      &service, absl::GetFlag(FLAGS_port_file));
  if (!listening.ok()) {
    pstrain::PrintError(kProgram, listening.status().message());
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(listening->server);
  const int bound_port = listening->port;
  std::printf("coordinator listening on %s:%d (job file %s, %zu jobs)\n",
              absl::GetFlag(FLAGS_bind).c_str(), bound_port,
              job_file.empty() ? "none" : job_file.c_str(),
              table->List().size());
  std::fflush(stdout);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (g_signal == 0) {
    absl::SleepFor(absl::Seconds(1));
    for (const std::string& id :
         table->CheckHeartbeats(absl::Now(), absl::Seconds(timeout_s))) {
      absl::StatusOr<pstrain::JobInfo> job = table->Get(id);
      std::printf("%s FAILED: %s\n", id.c_str(),
                  job.ok() ? job->message().c_str() : "");
      std::fflush(stdout);
    }
  }
  std::printf("signal %d; coordinator exiting\n", static_cast<int>(g_signal));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
