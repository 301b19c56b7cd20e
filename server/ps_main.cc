// pstrain_ps: one parameter-server shard process.
//
// Listens on --bind:--port (port 0: the OS picks one, written to
// --port_file), serves the ParameterServer service for one shard of one job,
// and exits when every worker has said WorkerDone, on SIGTERM/SIGINT, or
// after --idle_timeout_s without any request.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/grpc_server.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"

ABSL_FLAG(std::string, bind, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 0, "TCP port to listen on; 0: chosen by the OS.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written to this file once serving.");
ABSL_FLAG(std::string, job_id, "local", "Job id every request must carry.");
ABSL_FLAG(int, shard_index, 0, "This shard's index in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of PS shards in the job.");
ABSL_FLAG(int, num_workers, 1, "Number of workers in the job.");
ABSL_FLAG(std::string, mode, "sync", "sync (barrier per step) or async.");
ABSL_FLAG(double, lr, 1e-3, "Adam learning rate.");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2.");
ABSL_FLAG(double, epsilon, 1e-8, "Adam epsilon.");
ABSL_FLAG(double, weight_decay, 0.0,
          "Decoupled weight decay (AdamW); 0 gives Adam.");
ABSL_FLAG(int, pull_timeout_s, 600,
          "Seconds a pull may wait for the slowest worker (sync mode) or for "
          "initialisation before failing with DEADLINE_EXCEEDED.");
ABSL_FLAG(int, idle_timeout_s, 900,
          "Exit after this many seconds without any request.");

namespace {

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("One pstrain parameter-server shard.");
  absl::ParseCommandLine(argc, argv);
  const std::string program = "pstrain_ps";

  pstrain::ShardOptions options;
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.shard_index = absl::GetFlag(FLAGS_shard_index);
  options.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "sync") {
    options.mode = pstrain::SyncMode::kSync;
  } else if (mode == "async") {
    options.mode = pstrain::SyncMode::kAsync;
  } else {
    pstrain::PrintError(
        program, absl::StrCat("--mode=", mode, ": expected sync or async"));
    return 2;
  }
  if (options.num_shards <= 0 || options.shard_index < 0 ||
      options.shard_index >= options.num_shards) {
    pstrain::PrintError(
        program, absl::StrCat("--shard_index=", options.shard_index,
                              ": expected 0 <= shard_index < --num_shards=",
                              options.num_shards));
    return 2;
  }
  if (options.num_workers <= 0) {
    pstrain::PrintError(
        program,
        absl::StrCat("--num_workers=", options.num_workers, ": expected > 0"));
    return 2;
  }
  options.adam.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.adam.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  options.adam.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  options.adam.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  options.adam.weight_decay =
      static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  if (!(options.adam.lr > 0) ||
      !(options.adam.beta1 >= 0 && options.adam.beta1 < 1) ||
      !(options.adam.beta2 >= 0 && options.adam.beta2 < 1) ||
      !(options.adam.epsilon > 0) || !(options.adam.weight_decay >= 0)) {
    pstrain::PrintError(program,
                        "Adam flags: expected lr > 0, 0 <= beta1, beta2 < 1, "
                        "epsilon > 0, weight_decay >= 0");
    return 2;
  }

  pstrain::ParameterShard shard(options);
  pstrain::PsService service(
      &shard, absl::Seconds(absl::GetFlag(FLAGS_pull_timeout_s)));
  absl::StatusOr<pstrain::ListeningServer> listening = pstrain::StartGrpcServer(
      absl::StrCat(absl::GetFlag(FLAGS_bind), ":", absl::GetFlag(FLAGS_port)),
      &service, absl::GetFlag(FLAGS_port_file));
  if (!listening.ok()) {
    pstrain::PrintError(program, listening.status().message());
    return 1;
  }
  std::unique_ptr<grpc::Server> server = std::move(listening->server);
  const int bound_port = listening->port;
  std::printf("shard %d/%d of job %s listening on %s:%d (%s, %d workers)\n",
              options.shard_index, options.num_shards, options.job_id.c_str(),
              absl::GetFlag(FLAGS_bind).c_str(), bound_port, mode.c_str(),
              options.num_workers);
  std::fflush(stdout);

  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  const absl::Duration idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_s));
  int exit_code = 0;
  while (true) {
    if (service.all_workers_done().WaitForNotificationWithTimeout(
            absl::Milliseconds(100))) {
      std::printf("all workers done; shard %d exiting\n", options.shard_index);
      break;
    }
    if (g_signal != 0) {
      std::printf("signal %d; shard %d exiting\n", static_cast<int>(g_signal),
                  options.shard_index);
      exit_code = 128 + g_signal;
      break;
    }
    if (absl::Now() - service.last_request_time() > idle_timeout) {
      pstrain::PrintError(
          program,
          absl::StrCat("no request for ", absl::GetFlag(FLAGS_idle_timeout_s),
                       " s (--idle_timeout_s); exiting"));
      exit_code = 1;
      break;
    }
  }
  std::fflush(stdout);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return exit_code;
}
