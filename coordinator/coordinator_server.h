// A running coordinator: the job table (reloaded from its job file when one
// exists), the Coordinator gRPC service on one address, and a thread that
// fails jobs with silent tasks once per `check_interval`. The daemon
// (coordinator/pstrain_coordinator, coordinator_main.cc) and `pstrain run`
// (in-process, on 127.0.0.1) both run this.
//
// Thread-safety: table() is thread-safe (see job_table.h); the callback runs
// on the checking thread.
#ifndef PSTRAIN_COORDINATOR_COORDINATOR_SERVER_H_
#define PSTRAIN_COORDINATOR_COORDINATOR_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_table.h"
#include "grpcpp/grpcpp.h"

namespace pstrain {

// ServerLimits' defaults with max_receive_message_bytes 4 MiB.
inline ServerLimits CoordinatorServerLimits() {
  ServerLimits limits;
  limits.max_receive_message_bytes = 4 << 20;
  return limits;
}

struct CoordinatorServerOptions {
  // host:port to listen on; port 0: any free port (see port()).
  std::string address = "0.0.0.0:7070";
  // Where the job table is kept ("" for memory only). A missing file starts
  // an empty table, written there at once (its missing folders created,
  // mode 0700); one that is empty, a folder, unreadable, does not parse or
  // is inconsistent is an error (see JobTable::Load).
  std::string job_file;
  // How many ended jobs are kept and the key-value store's limits.
  JobTableLimits table_limits;
  // The server's resource bounds. Coordinator calls are small (a spec, a
  // heartbeat's log lines), so it receives at most 4 MiB a message, gRPC's
  // own default, rather than a PS's 256 MiB.
  ServerLimits server_limits = CoordinatorServerLimits();
  // Without a job file: appended to every job id ("job-3-<suffix>",
  // JobTable::SetIdSuffix) when not empty. pstrain_coordinator without
  // --job_file sets a random one, so that ids do not repeat across its
  // restarts. Ignored with a job file (its ids never repeat).
  std::string job_id_suffix;
  // If set, the bound port is written here once listening.
  std::string port_file;
  // "host:port": also serve grpc.health.v1.Health alone, in plaintext,
  // there (common/grpc_server.h, HealthOptions); empty: none. Health is
  // SERVING from the start (the job table is loaded before the server
  // listens) and NOT_SERVING once SetServing(false) or shutting down.
  std::string health_address;
  // The server's TLS (common/tls.h); null: plaintext. With TLS every call
  // is authorized (common/authz.h).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // A registered task silent this long is lost and its job FAILED; a task
  // not registered this long after submission fails its job too.
  absl::Duration heartbeat_timeout = absl::Seconds(60);
  // Longest a blocking call (layout, key wait) waits. One whose caller
  // cancels it, or goes away, ends within about 100 ms
  // (JobTable::kCancelledCheckInterval), and stopping the server ends them
  // all at once.
  absl::Duration max_wait = absl::Seconds(600);
  // Blocking calls one caller may have in flight (see
  // coordinator_service.h).
  int max_long_polls_per_caller = CoordinatorService::kMaxLongPollsPerCaller;
  // How often silent tasks are looked for and key-value writes are
  // written to the job file (the most of them a crash can lose).
  absl::Duration check_interval = absl::Seconds(1);
  // Called for each job a heartbeat check failed.
  std::function<void(const JobInfo&)> on_job_failed;
  // Every `waiting_report_interval`, called with WaitingReport() of each
  // job still waiting for tasks to register (a queued launch can take
  // minutes; this says which tasks have not come).
  absl::Duration waiting_report_interval = absl::Seconds(60);
  std::function<void(const std::string&)> on_waiting;
};

// "job-1: 2/4 tasks registered after 120 s; waiting for ps 0 on
// 10.0.0.2:7000, worker 1 (registration timeout 600 s)" for a PENDING job
// with tasks not yet registered at `now`; "" otherwise.
std::string WaitingReport(const JobInfo& job, absl::Time now);

class CoordinatorServer {
 public:
  // Errors: the job file's (JobTable::Load's, or the error of creating its
  // folder or writing a new one), each naming it; INVALID_ARGUMENT for
  // table_limits or max_long_polls_per_caller out of range;
  // UNAVAILABLE when the address cannot be bound (see grpc_server.h).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorServerOptions options);
  // Ends the long polls in flight (WaitForLayout, KvWait: UNAVAILABLE
  // "coordinator shutting down", JobTable::StopWaits), stops the checks,
  // writes key-value changes not yet written, stops the server (2 s grace
  // for calls in flight), then writes those made during the grace. Takes
  // about the grace at most, whatever max_wait is.
  ~CoordinatorServer();

  JobTable& table() { return *table_; }
  int port() const { return listening_.port; }
  // The plaintext health port (options' health_address); 0: none.
  int health_port() const { return listening_.health_port; }
  // The health status of the coordinator (grpc.health.v1.Health's "" and
  // "pstrain.Coordinator"), e.g. false when it starts to drain.
  void SetServing(bool serving) { listening_.SetServing(serving); }

 private:
  CoordinatorServer() = default;
  void CheckLoop();

  CoordinatorServerOptions options_;
  std::unique_ptr<JobTable> table_;
  std::unique_ptr<CoordinatorService> service_;
  ListeningServer listening_;
  absl::Notification stop_;
  std::thread checker_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_COORDINATOR_SERVER_H_
