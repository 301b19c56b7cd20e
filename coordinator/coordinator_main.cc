// pstrain_coordinator: the job coordinator daemon.
//
// Serves the Coordinator service (proto/coordinator.proto) on --bind:--port,
// keeps its job table in --job_file (reloaded at start-up, so a restarted
// coordinator still knows its jobs) and, once a second, fails jobs whose
// tasks are silent for longer than --heartbeat_timeout_s (or have not
// registered within their spec's registration_timeout_s), printing once a
// minute the tasks each pending job still waits for. Exits on SIGINT or
// SIGTERM. Also serves gRPC's health, reflection and channelz
// (common/grpc_server.h): health SERVING until a signal; --health_port
// serves health alone in plaintext on --bind.
//
// Bounded: it keeps the newest --keep_finished_jobs ended jobs (running
// ones always), caps each job's key-value store (--max_kv_key_bytes,
// --max_kv_value_bytes, --max_kv_keys_per_job), and serves within
// CoordinatorServerLimits() (coordinator/coordinator_server.h), with the
// text, key-value and job-file budgets of JobTableLimits
// (coordinator/job_table.h). A missing --job_file is created with its
// missing folders (mode 0700); one that is empty, a folder, unreadable,
// corrupt or inconsistent, or that cannot be created, is a one-line error
// naming it and exit 2, before the coordinator listens.
#include <csignal>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_spec.h"

ABSL_FLAG(std::string, bind, "127.0.0.1",
          "Address to listen on (another host's tasks need this host's "
          "address, or 0.0.0.0).");
ABSL_FLAG(int, port, 7070, "Port to listen on (0: any free port).");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here once listening.");
ABSL_FLAG(int, health_port, 0,
          "If set, also serve grpc.health.v1.Health alone, in plaintext, on "
          "--bind at this port, for probes without a certificate (0: none; "
          "docs/SECURITY.md).");
ABSL_FLAG(std::string, job_file, "",
          "Where the job table is kept and reloaded from (empty: memory "
          "only).");
ABSL_FLAG(int, keep_finished_jobs, 100,
          "Ended jobs (succeeded, failed, cancelled) kept in the table, the "
          "oldest-ended pruned first; running jobs are always kept "
          "(0..1000000).");
ABSL_FLAG(int64_t, max_kv_key_bytes, 256,
          "Longest key of a job's key-value store, bytes (1..65536).");
ABSL_FLAG(int64_t, max_kv_value_bytes, 64 << 10,
          "Largest value of a job's key-value store, bytes (0..1048576).");
ABSL_FLAG(int64_t, max_kv_keys_per_job, 1024,
          "Most keys in one job's key-value store (1..1000000).");
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
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "pstrain_coordinator --help");
  const int timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
  pstrain::ExitOnFlagError(
      kProgram,
      pstrain::FirstError(
          {pstrain::CheckFlagRange("heartbeat_timeout_s", timeout_s, 1,
                                   pstrain::kMaxHeartbeatTimeoutS, "seconds"),
           pstrain::CheckFlagRange("port", absl::GetFlag(FLAGS_port), 0, 65535),
           pstrain::CheckFlagRange("health_port",
                                   absl::GetFlag(FLAGS_health_port), 0, 65535),
           pstrain::CheckFlagRange("max_wait_s",
                                   absl::GetFlag(FLAGS_max_wait_s), 1, 86400,
                                   "seconds")}));
  const std::string job_file = absl::GetFlag(FLAGS_job_file);
  pstrain::CoordinatorServerOptions options;
  options.address =
      absl::StrCat(absl::GetFlag(FLAGS_bind), ":", absl::GetFlag(FLAGS_port));
  options.job_file = job_file;
  options.port_file = absl::GetFlag(FLAGS_port_file);
  if (absl::GetFlag(FLAGS_health_port) > 0) {
    options.health_address = absl::StrCat(absl::GetFlag(FLAGS_bind), ":",
                                          absl::GetFlag(FLAGS_health_port));
  }
  if (job_file.empty()) {
    // No job file: the table starts again at job-1 after a restart, so the
    // ids carry this process's random suffix ("job-1-3f9a0c2e") and never
    // repeat one that certificates of an earlier run name.
    std::random_device entropy;
    options.job_id_suffix = absl::StrFormat("%08x", entropy());
  }
  options.heartbeat_timeout = absl::Seconds(timeout_s);
  options.max_wait = absl::Seconds(absl::GetFlag(FLAGS_max_wait_s));
  options.table_limits.keep_finished_jobs =
      absl::GetFlag(FLAGS_keep_finished_jobs);
  options.table_limits.max_kv_key_bytes = absl::GetFlag(FLAGS_max_kv_key_bytes);
  options.table_limits.max_kv_value_bytes =
      absl::GetFlag(FLAGS_max_kv_value_bytes);
  options.table_limits.max_kv_keys_per_job =
      absl::GetFlag(FLAGS_max_kv_keys_per_job);
  // The store lives in the job file and in memory: bounded even when
  // raised. A value travels in one message of at most 4 MiB.
  pstrain::ExitOnFlagError(
      kProgram,
      pstrain::FirstError(
          {pstrain::CheckFlagRange("keep_finished_jobs",
                                   options.table_limits.keep_finished_jobs, 0,
                                   1000000, "jobs"),
           pstrain::CheckFlagRange("max_kv_key_bytes",
                                   options.table_limits.max_kv_key_bytes, 1,
                                   64 << 10, "bytes"),
           pstrain::CheckFlagRange("max_kv_value_bytes",
                                   options.table_limits.max_kv_value_bytes, 0,
                                   1 << 20, "bytes"),
           pstrain::CheckFlagRange("max_kv_keys_per_job",
                                   options.table_limits.max_kv_keys_per_job, 1,
                                   1000000, "keys")}));
  // TLS as the coordinator, every call authorized (common/authz.h); or
  // --insecure, refused on a non-loopback address unless allowed.
  absl::StatusOr<pstrain::TlsOptions> tls =
      pstrain::TlsOptionsFromFlags(kProgram, absl::GetFlag(FLAGS_bind));
  if (!tls.ok()) {
    pstrain::PrintError(kProgram, tls.status().message());
    return 2;
  }
  if (!tls->insecure) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        pstrain::ServerCredentials(*tls,
                                   {pstrain::TlsRole::kCoordinator, 0, "*"});
    if (!credentials.ok()) {
      pstrain::PrintError(kProgram, credentials.status().message());
      return 2;
    }
    options.credentials = *credentials;
  }
  options.on_job_failed = [](const pstrain::JobInfo& job) {
    std::printf("%s FAILED: %s\n", job.id().c_str(), job.message().c_str());
    std::fflush(stdout);
  };
  // Once a minute, the jobs whose tasks have not all registered.
  options.on_waiting = [](const std::string& report) {
    std::printf("%s\n", report.c_str());
    std::fflush(stdout);
  };
  absl::StatusOr<std::unique_ptr<pstrain::CoordinatorServer>> server =
      pstrain::CoordinatorServer::Start(options);
  if (!server.ok()) {
    // UNAVAILABLE: the address; anything else: the job file (its errors
    // name it: "job file /var/lib/pstrain/jobs.pb: is a folder, ...").
    const bool file_error = !absl::IsUnavailable(server.status());
    pstrain::PrintError(kProgram, server.status().message());
    return file_error ? 2 : 1;
  }
  std::printf("coordinator listening on %s:%d (job file %s, %zu jobs)\n",
              absl::GetFlag(FLAGS_bind).c_str(), (*server)->port(),
              job_file.empty() ? "none" : job_file.c_str(),
              (*server)->table().List().size());
  if ((*server)->health_port() > 0) {
    std::printf("health (plaintext, grpc.health.v1 only) on %s:%d\n",
                absl::GetFlag(FLAGS_bind).c_str(), (*server)->health_port());
  }
  std::fflush(stdout);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (g_signal == 0) absl::SleepFor(absl::Milliseconds(200));
  std::printf("signal %d; coordinator exiting\n", static_cast<int>(g_signal));
  (*server)->SetServing(false);  // draining
  server->reset();
  return 0;
}
