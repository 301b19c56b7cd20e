// pstrain_ps: one parameter-server shard task of a job on a coordinator.
//
//   pstrain_ps --coordinator=HOST:PORT --job=ID --task_index=N [--bind=ADDR]
//              [--port=P] [--advertise=HOST] [--threads=N]
//
// Fetches the job's spec from the coordinator (mode, number of shards and
// workers, Adam's hyperparameters), listens on --bind:--port (see
// coordinator/task_flags.h), registers its advertised address, sends
// heartbeats, and serves the ParameterServer service for shard N. It exits
// 2 at once, contacting nothing, for a flag out of range (the job is left
// alone); 0 once every worker has said WorkerDone; 1 when the job ends
// otherwise (a lost or failed task, a cancel: the coordinator's message is
// printed), when the port cannot be bound (the job fails naming host and port),
// or after --idle_timeout_s without any request; 128+signal on SIGTERM/SIGINT.
// With the job's metrics_dir, writes the shard's metrics rows (every second
// while busy, and at exit; server/shard_metrics.h); with its trace, a
// Chrome trace to metrics_dir/trace/psN.json (common/trace.h), with the
// clock offset measured against the coordinator at start.
// Beside ParameterServer it serves gRPC's health, reflection and channelz
// (common/grpc_server.h): health is NOT_SERVING until worker 0 initialised
// the shard and while it restores one, SERVING while training, and
// NOT_SERVING again once draining (every worker done, or a signal);
// --health_port serves health alone in plaintext on --bind.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/grpc_server.h"
#include "common/malloc_tuning.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "common/trace.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "coordinator/task_agent.h"
#include "coordinator/task_flags.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "server/shard_metrics.h"

ABSL_FLAG(int, pull_timeout_s, 600,
          "Seconds a pull may wait for the slowest worker (sync mode) or for "
          "initialisation before failing with DEADLINE_EXCEEDED.");
ABSL_FLAG(int, idle_timeout_s, 900,
          "Exit after this many seconds without any request.");
ABSL_FLAG(int, health_port, 0,
          "If set, also serve grpc.health.v1.Health alone, in plaintext, on "
          "--bind at this port, for probes without a certificate (0: none; "
          "docs/SECURITY.md).");

namespace {

constexpr char kProgram[] = "pstrain_ps";
volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

// The job's end as a heartbeat reported it.
struct JobEnd {
  void Record(pstrain::JobState end_state, const std::string& end_message) {
    absl::MutexLock lock(&mu);
    ended = true;
    state = end_state;
    message = end_message;
  }

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
  pstrain::JobState state ABSL_GUARDED_BY(mu) = pstrain::JOB_STATE_UNSPECIFIED;
  std::string message ABSL_GUARDED_BY(mu);
};

// The shard's options from the job's resolved config
// (coordinator/job_spec.h ResolveJobSpec).
pstrain::ShardOptions ShardOptionsOf(const pstrain::JobConfig& config,
                                     const std::string& job_id, int index) {
  const pstrain::JobSpec& spec = config.spec;
  pstrain::ShardOptions options;
  options.job_id = job_id;
  options.shard_index = index;
  options.num_shards = spec.num_ps();
  // An elastic job: worker ids up to max_workers, the first num_workers
  // members at the start (issue 40).
  options.num_workers = std::max(spec.num_workers(), spec.max_workers());
  options.initial_workers = spec.num_workers();
  options.linear_lr_scaling = spec.linear_lr_scaling();
  options.mode = config.mode == pstrain::MODE_ASYNC ? pstrain::SyncMode::kAsync
                                                    : pstrain::SyncMode::kSync;
  options.adam = pstrain::OptimizerOptionsOf(config);
  options.staleness = spec.staleness();
  options.replicas_to_aggregate =
      spec.backup_workers() > 0 ? spec.num_workers() - spec.backup_workers()
                                : 0;
  options.clip_grad_norm = spec.clip_grad_norm();
  // Checkpoint files go only under the job's own checkpoint_dir, never a
  // path a request names (server/shard_checkpoint.h).
  options.checkpoint_dir = spec.checkpoint_dir();
  options.keep_checkpoints = spec.keep_checkpoints();
  return options;
}

// The shard's metrics rows (spec.metrics_dir, one a second while its
// state changes) and its trace (spec.trace). Not thread-safe: main's loop.
class ShardFiles {
 public:
  ShardFiles(pstrain::ParameterShard* shard, pstrain::PsService* service)
      : shard_(shard), service_(service) {}

  absl::Status Start(const pstrain::JobSpec& spec, int index,
                     pstrain::TaskAgent& agent) {
    if (!spec.metrics_dir().empty()) {
      absl::StatusOr<std::unique_ptr<pstrain::ShardMetricsWriter>> created =
          pstrain::ShardMetricsWriter::Create(spec.metrics_dir(), index);
      if (!created.ok()) {
        return absl::Status(
            created.status().code(),
            absl::StrCat("metrics: ", created.status().message()));
      }
      writer_ = *std::move(created);
      metrics_ = std::make_unique<pstrain::ShardMetrics>(shard_->Stats(),
                                                         service_->counters());
    }
    if (!spec.trace()) return absl::OkStatus();
    pstrain::trace::TraceOptions trace_options;
    trace_options.path =
        absl::StrCat(spec.metrics_dir(), "/trace/ps", index, ".json");
    trace_options.process_name = absl::StrCat("ps ", index);
    trace_options.pid = index;
    if (absl::Status s = pstrain::trace::Start(trace_options); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("trace: ", s.message()));
    }
    absl::StatusOr<pstrain::ClockOffset> offset = agent.MeasureClockOffset();
    if (offset.ok()) {
      pstrain::trace::SetClockOffset(offset->offset_us, offset->rtt_us);
    } else {
      agent.Log(absl::StrCat("trace: no clock offset (",
                             offset.status().message(),
                             "); the merged timeline takes it as 0"));
    }
    return absl::OkStatus();
  }

  // A row once a second while the shard's state changes; after a failed
  // write (printed once) no more rows, and training goes on.
  void MaybeWriteRow() {
    if (metrics_ != nullptr && absl::Now() - last_row_ >= absl::Seconds(1) &&
        metrics_->Changed(shard_->Stats()) && !WriteRow()) {
      metrics_.reset();
    }
  }

  // The last row and the whole trace, once.
  void Finish() {
    if (finished_) return;
    finished_ = true;
    if (metrics_ != nullptr) WriteRow();
    if (absl::Status s = pstrain::trace::Stop(); !s.ok()) {
      pstrain::PrintError(kProgram, absl::StrCat("trace: ", s.message()));
    }
  }

 private:
  bool WriteRow() {
    absl::Status written = writer_->Write(
        metrics_->TakeInterval(shard_->Stats(), service_->counters()));
    last_row_ = absl::Now();
    if (!written.ok()) {
      pstrain::PrintError(kProgram,
                          absl::StrCat("metrics: ", written.message()));
    }
    return written.ok();
  }

  pstrain::ParameterShard* const shard_;
  pstrain::PsService* const service_;
  std::unique_ptr<pstrain::ShardMetricsWriter> writer_;
  std::unique_ptr<pstrain::ShardMetrics> metrics_;
  absl::Time last_row_ = absl::Now();
  bool finished_ = false;
};

// The flags' ranges, and --insecure on a --bind that is not loopback
// without --insecure_allow_remote (a bind from the job's spec is checked
// once the spec is known): the first wrong, as INVALID_ARGUMENT. The task
// flags (coordinator/task_flags.h CheckTaskFlags) are checked next, also
// before the coordinator is contacted.
absl::Status CheckFlags() {
  if (const std::string bind = absl::GetFlag(FLAGS_bind); !bind.empty()) {
    absl::StatusOr<pstrain::TlsOptions> tls =
        pstrain::TlsOptionsFromFlags(kProgram, bind, /*warn=*/false);
    if (!tls.ok()) return tls.status();
  }
  return pstrain::FirstError(
      {pstrain::CheckFlagRange("pull_timeout_s",
                               absl::GetFlag(FLAGS_pull_timeout_s), 1, 86400,
                               "seconds"),
       pstrain::CheckFlagRange("idle_timeout_s",
                               absl::GetFlag(FLAGS_idle_timeout_s), 1,
                               7 * 86400, "seconds"),
       pstrain::CheckFlagRange("health_port", absl::GetFlag(FLAGS_health_port),
                               0, 65535)});
}

// Serves `service` on the task's --bind:--port (and --health_port), health
// NOT_SERVING until worker 0 initialises the shard. The error is the line
// the task fails with.
absl::StatusOr<pstrain::ListeningServer> Listen(
    const pstrain::TaskAddress& address, pstrain::PsService* service,
    const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  const std::string listen = absl::StrCat(address.bind, ":", address.port);
  pstrain::HealthOptions health;
  health.service_name = "pstrain.ParameterServer";
  health.serving_at_start = false;  // until worker 0 initialises the shard
  if (absl::GetFlag(FLAGS_health_port) > 0) {
    health.plaintext_address =
        absl::StrCat(address.bind, ":", absl::GetFlag(FLAGS_health_port));
  }
  absl::StatusOr<pstrain::ListeningServer> listening = pstrain::StartGrpcServer(
      listen, service, "", credentials, pstrain::ServerLimits(), health);
  if (listening.ok()) return listening;
  // The health port's error names it.
  if (absl::StrContains(listening.status().message(), "(health port")) {
    return listening.status();
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot listen on ", listen, " (advertised as ", address.advertise_host,
      ":", address.port, "): in use, or not an address of this host"));
}

// Elastic jobs: a worker the coordinator removed after its death
// (HeartbeatResponse.removed_workers) that this shard's generation still
// counts as a member will push nothing more. One that died in a recovery,
// before it opened a stream to this shard, broke nothing, so a step that
// has the other workers' pushes would wait for it until the job's
// timeouts: the generation's barrier breaks then instead (every waiting
// pull ends ABORTED naming the worker), and worker 0 recovers and applies
// the membership without it. A generation with no push in yet (worker 0's
// recovery pulls its weights there) is left alone.
// The generation is read before the membership check, so a newer
// generation that left the worker out is never broken.
void BreakBarrierForRemovedWorkers(const pstrain::TaskAgent& agent,
                                   pstrain::ParameterShard* shard) {
  for (const int w : agent.removed_workers()) {
    const int64_t generation = shard->generation();
    if (!shard->IsMember(w) || !shard->StepWaitsFor(w)) continue;
    shard->BreakBarrier(
        generation,
        absl::StrCat("worker ", w,
                     " was removed from the job after its death (its restart "
                     "budget is spent); no step of generation ",
                     generation, " can complete without it"));
  }
}

// Serves until every worker is done (0), the job ends elsewhere (0 if it
// succeeded, else 1), a signal (128 + signal) or --idle_timeout_s without a
// request (1); returns the exit code. Meanwhile it keeps health, the log of
// refused updates and the metrics rows current.
int ServeUntilEnd(pstrain::TaskAgent& agent, pstrain::ParameterShard* shard,
                  pstrain::PsService* service,
                  pstrain::ListeningServer* listening, ShardFiles* files,
                  JobEnd* job_end) {
  const int index = agent.options().index;
  const absl::Duration idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_s));
  int64_t overflows_logged = 0;
  bool serving = false;
  while (true) {
    // Health: ready once initialised, not while a restore replaces the
    // state (draining sets NOT_SERVING below, before the loop ends).
    if (const bool ready = shard->initialized() && !service->restoring();
        ready != serving) {
      serving = ready;
      listening->SetServing(serving);
    }
    // Updates the shard refused for a non-finite result, in the job's log.
    if (shard->overflowed() > overflows_logged) {
      std::string last_overflow;
      overflows_logged = shard->overflowed(&last_overflow);
      agent.Log(absl::StrCat("shard ", index, ": ", last_overflow, " (",
                             overflows_logged, " so far)"));
    }
    files->MaybeWriteRow();
    BreakBarrierForRemovedWorkers(agent, shard);
    service->SetRemovedWorkers(agent.removed_workers());
    if (service->all_workers_done().WaitForNotificationWithTimeout(
            absl::Milliseconds(100))) {
      agent.Log(absl::StrCat("all workers done; shard ", index, " exiting"));
      listening->SetServing(false);  // draining
      // The files are complete before the coordinator hears of the end.
      files->Finish();
      absl::Status s = agent.Finish(true, "");
      if (!s.ok()) pstrain::PrintError(kProgram, s.message());
      return 0;
    }
    if (agent.removed()) {
      agent.Log(absl::StrCat(
          "shard ", index, " left the job's layout (elastic shards); exiting"));
      listening->SetServing(false);  // draining
      files->Finish();
      absl::Status s = agent.Finish(true, "left the job's layout");
      if (!s.ok()) pstrain::PrintError(kProgram, s.message());
      return 0;
    }
    {
      absl::MutexLock lock(&job_end->mu);
      if (job_end->ended) {
        pstrain::PrintError(
            kProgram, absl::StrCat(agent.name(), ": the job ended (",
                                   pstrain::JobState_Name(job_end->state), ")",
                                   job_end->message.empty() ? "" : ": ",
                                   job_end->message, "; exiting"));
        return job_end->state == pstrain::JOB_SUCCEEDED ? 0 : 1;
      }
    }
    if (g_signal != 0) {
      listening->SetServing(false);  // draining
      const int exit_code = 128 + g_signal;
      shard->Abort(absl::StrCat("signal ", static_cast<int>(g_signal)));
      pstrain::FailTask(
          agent, kProgram, exit_code,
          absl::StrCat("stopped by signal ", static_cast<int>(g_signal)));
      return exit_code;
    }
    if (absl::Now() - service->last_request_time() > idle_timeout) {
      shard->Abort("idle timeout");
      pstrain::FailTask(
          agent, kProgram, 1,
          absl::StrCat("no request for ", absl::GetFlag(FLAGS_idle_timeout_s),
                       " s (--idle_timeout_s)"));
      return 1;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread allocates: a step's buffers are reused, not faulted
  // in again (common/malloc_tuning.h).
  pstrain::KeepFreedMemoryForReuseOrWarn(kProgram);
  absl::SetProgramUsageMessage(
      "One pstrain parameter-server shard: pstrain_ps --coordinator=HOST:PORT "
      "--job=ID --task_index=N [--bind=ADDR --port=P --advertise=HOST]");
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "pstrain_ps --help");
  if (absl::Status s = CheckFlags(); !s.ok()) {
    pstrain::PrintError(kProgram, s.message());
    return 2;
  }

  int exit_code = 0;
  absl::StatusOr<pstrain::JoinedTask> joined =
      pstrain::JoinJobFromFlags(pstrain::ROLE_PS, kProgram, &exit_code);
  if (!joined.ok()) return exit_code;
  pstrain::TaskAgent& agent = *joined->agent;
  const pstrain::TaskAddress* address = &joined->address;
  const int index = agent.options().index;
  auto fail = [&](int code, const std::string& message) {
    return pstrain::FailTask(agent, kProgram, code, message);
  };
  const pstrain::JobConfig* config = &joined->config;
  const pstrain::JobSpec* spec = &config->spec;

  // Reported like every task's. The shard applies Adam on the thread of the
  // worker stream that completes a chunk (up to num_workers at once); it has
  // no pool of its own for --threads to size yet.
  if (!pstrain::TaskThreadsFromFlags(agent, kProgram, false, &exit_code).ok()) {
    return exit_code;
  }
  const pstrain::ShardOptions options =
      ShardOptionsOf(*config, agent.options().job_id, index);

  // TLS as shard `index` of the job, every call authorized (common/authz.h);
  // or --insecure, refused on a non-loopback address unless allowed.
  absl::StatusOr<pstrain::TlsOptions> tls =
      pstrain::TlsOptionsFromFlags(kProgram, address->bind);
  if (!tls.ok()) return fail(2, std::string(tls.status().message()));
  pstrain::TlsIdentity self;
  self.role = pstrain::TlsRole::kPs;
  self.index = index;
  self.job = options.job_id;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      pstrain::ServerCredentials(*tls, self);
  if (!credentials.ok()) {
    return fail(2, std::string(credentials.status().message()));
  }
  pstrain::ParameterShard shard(options);
  pstrain::PsService service(&shard,
                             absl::Seconds(absl::GetFlag(FLAGS_pull_timeout_s)),
                             /*authorize=*/!tls->insecure);
  absl::StatusOr<pstrain::ListeningServer> listening =
      Listen(*address, &service, *credentials);
  if (!listening.ok()) {
    return fail(1, std::string(listening.status().message()));
  }
  const std::string advertised =
      absl::StrCat(address->advertise_host, ":", listening->port);
  absl::Status registered = agent.Register(advertised);
  if (!registered.ok()) {
    pstrain::PrintError(kProgram,
                        absl::StrCat(agent.name(), ": ", registered.message()));
    return 1;
  }
  JobEnd job_end;
  agent.StartHeartbeats(
      [&job_end, &shard](pstrain::JobState state, const std::string& message) {
        // No barrier will complete now: release the pulls waiting on one so
        // that the server can shut down.
        if (state != pstrain::JOB_SUCCEEDED) shard.Abort(message);
        job_end.Record(state, message);
      },
      /*on_restart=*/nullptr,
      // An elastic job's worker 0 moved the state onto fewer shards (issue
      // 40): this one is closed and holds nothing the job needs.
      [&shard] { shard.Abort("the shard left the job's layout"); });
  agent.Log(absl::StrFormat(
      "shard %d/%d of %s listening on %s:%d, advertised as %s (%s, %d "
      "workers)",
      index, options.num_shards, options.job_id, address->bind, listening->port,
      advertised, pstrain::Spelling(config->mode), options.num_workers));

  // Metrics rows and the trace.
  ShardFiles files(&shard, &service);
  if (absl::Status s = files.Start(*spec, index, agent); !s.ok()) {
    return fail(1, std::string(s.message()));
  }

  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  exit_code =
      ServeUntilEnd(agent, &shard, &service, &*listening, &files, &job_end);
  files.Finish();
  std::fflush(stdout);
  // The server's Shutdown waits for every handler: a Checkpoint call
  // waiting for a write, and that write waiting for a deferred cut that no
  // worker will bring now, end first (a job whose workers are all done
  // aborts nothing).
  service.Close();
  listening->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  return exit_code;
}
