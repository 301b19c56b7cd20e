// pstrain_worker: one data-parallel worker task of a job on a coordinator.
//
//   pstrain_worker --coordinator=HOST:PORT --job=ID --task_index=N [--gpu=G]
//                  [--advertise=HOST] [--threads=N]
//
// Fetches the job's spec from the coordinator, loads the dataset, registers,
// sends heartbeats (with its step and epoch lines and its progress), waits
// for every task's address, and trains its shard of the data against the
// job's PS shards (see worker/trainer.h). Worker 0 reports the job's results
// when it finishes. Exit codes: 0 done; 2 a flag out of range (checked
// before the coordinator is contacted, so the job is left alone) or bad
// spec input (the job fails with the message); 1 a training or coordinator
// error, or the job ended elsewhere (a lost task, a cancel): the task stops
// at once.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/malloc_tuning.h"
#include "common/tls.h"
#include "common/trace.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "coordinator/task_agent.h"
#include "coordinator/task_flags.h"
#include "worker/checkpoint.h"
#include "worker/collective.h"
#include "worker/dataset.h"
#include "worker/input_pipeline.h"
#include "worker/job_inputs.h"
#include "worker/trainer.h"
#include "worker/world_announcement.h"

ABSL_FLAG(int, init_timeout_s, 120,
          "Seconds to wait for the shards to be initialised.");
ABSL_FLAG(int, rpc_timeout_s, 60, "Deadline of each unary PS RPC, seconds.");
ABSL_FLAG(int, gpu, 0, "Backend cuda: index of the GPU this worker uses.");
ABSL_FLAG(bool, rejoin, false,
          "This task replaces one that died (set by the supervisor that "
          "restarts it): join the running job instead of starting it; "
          "worker 0 restores the shards to the newest checkpoint.");

namespace {

constexpr char kProgram[] = "pstrain_worker";
// Worker 0's heartbeat interval in an elastic job (at most).
constexpr absl::Duration kWorker0Heartbeat = absl::Milliseconds(250);

// The allreduce workers' rendezvous, in the coordinator's per-job store.
class CoordinatorStore : public pstrain::RendezvousStore {
 public:
  explicit CoordinatorStore(pstrain::TaskAgent* agent) : agent_(agent) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return agent_->KvSet(key, value);
  }
  absl::StatusOr<std::string> Wait(const std::string& key,
                                   absl::Duration timeout) override {
    return agent_->KvWait(key, timeout);
  }

 private:
  pstrain::TaskAgent* const agent_;
};

// The flags' ranges: the first out of range, as INVALID_ARGUMENT.
absl::Status CheckFlags() {
  return pstrain::FirstError(
      {pstrain::CheckFlagRange("init_timeout_s",
                               absl::GetFlag(FLAGS_init_timeout_s), 1, 86400,
                               "seconds"),
       pstrain::CheckFlagRange("rpc_timeout_s",
                               absl::GetFlag(FLAGS_rpc_timeout_s), 1, 86400,
                               "seconds"),
       pstrain::CheckFlagRange("gpu", absl::GetFlag(FLAGS_gpu), 0, 1023)});
}

// Fails the task with exit code 1 and `message`, after `status` broke
// training. Allreduce: a collective broken by another worker's death (Gloo's
// error, a rendezvous cut short) is not this worker's failure. With
// restarts, the supervisor that restarts the dead worker has the
// coordinator restart every worker, and the heartbeats end this process
// (kRestartExitCode); it reports the failure itself only if that has not
// happened within --init_timeout_s (no supervisor, or none that restarts).
// Without, it gives the supervisor 3 s to report the death first, so that
// the job's message names it.
int FailOrAwaitRestart(pstrain::TaskAgent& agent,
                       const pstrain::JobConfig& config,
                       const absl::Status& status, const std::string& message) {
  const bool allreduce = config.mode == pstrain::MODE_ALLREDUCE;
  const bool peer_death = absl::IsDeadlineExceeded(status) ||
                          absl::IsUnavailable(status) ||
                          absl::IsAborted(status) || absl::IsCancelled(status);
  if (allreduce && config.spec.max_restarts() > 0 && peer_death) {
    agent.Log(absl::StrCat(agent.name(), ": ", status.message(),
                           "; waiting for the job's workers to restart"));
    absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s)));
  } else if (allreduce && peer_death) {
    absl::SleepFor(absl::Seconds(3));
  }
  return pstrain::FailTask(agent, kProgram, 1, message);
}

// How the task's `threads` are shared between the step and the input.
struct ThreadPlan {
  int input_threads = 1;    // TrainerOptions::input_threads
  bool idle_input = false;  // TrainerOptions::input_idle_priority
  int compute_threads = 1;  // the training thread's OpenMP pool
};

// A streamed dataset decodes on input threads (InputThreadsForCores of this
// task's share of cores). On a GPU they take their cores from the share
// (the step's host threads need few); on the CPU backend the step keeps
// every core and the input threads run under SCHED_IDLE in the cycles it
// leaves (decoding is a few percent of a CPU step: a whole core for it
// halved ResNet-18's step on 2 cores).
ThreadPlan PlanThreads(const pstrain::JobConfig& config, int threads) {
  const pstrain::JobSpec& spec = config.spec;
  ThreadPlan plan;
  plan.input_threads =
      spec.stream_images() ? pstrain::InputThreadsForCores(threads) : 1;
  plan.idle_input =
      spec.stream_images() && config.backend == pstrain::BACKEND_CPU;
  plan.compute_threads = spec.stream_images() && !plan.idle_input
                             ? std::max(1, threads - plan.input_threads)
                             : threads;
  return plan;
}

// The job's dataset; an empty one for synthetic compute, which reads none.
absl::StatusOr<pstrain::Dataset> LoadJobDataset(
    const pstrain::JobConfig& config) {
  if (config.compute == pstrain::COMPUTE_SYNTHETIC) return pstrain::Dataset();
  const pstrain::JobSpec& spec = config.spec;
  pstrain::DatasetOptions data_options;
  data_options.image_size = spec.image_size();
  data_options.stream_images = spec.stream_images();
  data_options.max_dataset_memory_bytes = spec.max_dataset_memory_bytes();
  data_options.num_classes = spec.num_classes();
  data_options.train_samples = spec.synthetic_samples();
  data_options.seq_len = spec.seq_len();
  return pstrain::LoadDatasetNamed(spec.dataset(), spec.data_dir(),
                                   data_options, "");
}

// The job's trace (common/trace.h), if it asks for one: this worker's
// timeline, on its clock with the offset to the coordinator's measured now.
absl::Status StartTrace(const pstrain::JobSpec& spec, int index,
                        pstrain::TaskAgent& agent) {
  if (!spec.trace()) return absl::OkStatus();
  pstrain::trace::TraceOptions trace_options;
  trace_options.path =
      absl::StrCat(spec.metrics_dir(), "/trace/worker", index, ".json");
  trace_options.process_name = absl::StrCat("worker ", index);
  trace_options.pid = 100 + index;
  if (absl::Status s = pstrain::trace::Start(trace_options); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("trace: ", s.message()));
  }
  pstrain::trace::SetThreadName("train");
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

// Heartbeats that end the process when the job ends elsewhere (a lost
// task, a cancel: 0 if it succeeded, else 1) or restarts its workers
// (kRestartExitCode). The training thread may be blocked in a PS call, so
// they exit from the heartbeat thread.
void StartHeartbeatsThatExit(pstrain::TaskAgent& agent) {
  agent.StartHeartbeats(
      [&agent](pstrain::JobState state, const std::string& message) {
        const std::string line = absl::StrCat(
            agent.name(), ": the job ended (", pstrain::JobState_Name(state),
            ")", message.empty() ? "" : ": ", message, "; stopping");
        if (state == pstrain::JOB_SUCCEEDED) {
          // A standby never added, or a worker past its last step.
          std::printf("%s: %s\n", kProgram, line.c_str());
        } else {
          pstrain::PrintError(kProgram, line);
        }
        std::fflush(stdout);
        std::_Exit(state == pstrain::JOB_SUCCEEDED ? 0 : 1);
      },
      [&agent](const std::string& why) {
        std::printf("%s: %s: stopping for the job's restart (%s)\n", kProgram,
                    agent.name().c_str(), why.c_str());
        std::fflush(stdout);
        std::_Exit(pstrain::kRestartExitCode);
      },
      // An elastic job's membership left this worker out (issue 40): it
      // may be waiting for a generation that has it, which none will.
      [&agent] {
        std::printf(
            "%s: %s: not a member of the job's workers any more; "
            "leaving\n",
            kProgram, agent.name().c_str());
        std::fflush(stdout);
        agent.Finish(true, "removed from the job's membership").IgnoreError();
        std::_Exit(0);
      });
}

// Allreduce: connects rank `rank` of `size` (Gloo: TCP on the advertised
// host; NCCL: this worker's GPU), under the prefix of the job's generation
// (after a restart of every worker, keys no earlier worker set) and, in an
// elastic job, of its membership `epoch` (each world's ranks meet under
// their own; epoch 0's is the generation's).
pstrain::WorldPrefixFn WorldPrefixOf(const pstrain::JobConfig& config,
                                     const pstrain::ClusterLayout& layout) {
  const std::string generation =
      layout.generation() == 0 ? "" : absl::StrCat("-", layout.generation());
  const bool nccl = config.collective == pstrain::COLLECTIVE_NCCL;
  return [=](int64_t epoch) {
    return absl::StrCat(nccl ? "nccl" : "gloo", generation,
                        epoch == 0 ? "" : absl::StrCat("-m", epoch));
  };
}

pstrain::CollectiveFactory CollectiveFactoryOf(
    const pstrain::JobConfig& config, int gpu,
    const pstrain::TaskAddress& address, const pstrain::ClusterLayout& layout,
    pstrain::RendezvousStore* store) {
  const pstrain::WorldPrefixFn world_prefix = WorldPrefixOf(config, layout);
  const bool nccl = config.collective == pstrain::COLLECTIVE_NCCL;
  const std::string host = address.advertise_host;
  return [=](int rank, int size, int64_t epoch, absl::Duration timeout)
             -> absl::StatusOr<std::unique_ptr<pstrain::Collective>> {
    const std::string prefix = world_prefix(epoch);
    if (nccl) {
      return pstrain::Collective::CreateNccl(rank, size, gpu, store, prefix,
                                             timeout);
    }
    return pstrain::Collective::CreateGloo(rank, size, host, store, prefix,
                                           timeout);
  };
}

// An elastic allreduce job's worker: the coordinator's membership whose
// world it starts in, or none when that leaves this worker out (OK: the
// worker ends). A fresh worker of the applied membership's world (the
// job's start) starts in that world; any other (a worker a Scale added,
// or after a restart of every worker, `rejoin`) in the newest membership's,
// which worker 0 applies at its next due step boundary (a restart: at
// once, every worker starting there). Such a worker but 0 (`*announced`)
// connects the world worker 0 announces (worker/world_announcement.h),
// which may be a newer membership's than the one it knew.
absl::StatusOr<std::optional<pstrain::WorkerMembership>> StartMembership(
    pstrain::TaskAgent& agent, int index, bool rejoin, bool* announced) {
  absl::StatusOr<pstrain::Membership> newest = agent.WaitForMembership(
      0, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s)));
  if (!newest.ok()) return newest.status();
  const std::optional<pstrain::Membership> applied = agent.applied_membership();
  auto world = [](const pstrain::Membership& m) {
    pstrain::WorkerMembership w;
    w.workers.assign(m.workers().begin(), m.workers().end());
    w.epoch = m.epoch();
    return w;
  };
  pstrain::WorkerMembership start = world(*newest);
  *announced = index != 0;
  if (!rejoin && applied.has_value() && world(*applied).RankOf(index) >= 0) {
    start = world(*applied);
    *announced = false;
  }
  if (start.RankOf(index) < 0) return std::nullopt;
  return start;
}

// A standby worker (JobSpec.standby_workers) of an elastic job: one that
// is in none of the coordinator's memberships when it starts (a worker a
// Scale started, or a restarted one, is in the newest). Workers below
// num_workers never are (no wait for the first heartbeat's answer).
absl::StatusOr<bool> IsStandby(pstrain::TaskAgent& agent,
                               const pstrain::JobSpec& spec, int index,
                               bool rejoin) {
  if (!pstrain::IsElastic(spec) || !spec.standby_workers() ||
      index < spec.num_workers() || rejoin) {
    return false;
  }
  absl::StatusOr<pstrain::Membership> newest = agent.WaitForMembership(
      0, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s)));
  if (!newest.ok()) return newest.status();
  return !pstrain::IsMember(*newest, index);
}

// A standby's wait (TrainerOptions::await_membership): the newest
// membership, from the heartbeats' answers, once one has this worker (its
// world: workers and epoch). Unbounded while the job runs; the heartbeat
// thread ends the process when the job ends or removes this worker, and
// CANCELLED comes back when the heartbeats stop otherwise.
absl::StatusOr<pstrain::WorkerMembership> AwaitMembership(
    pstrain::TaskAgent& agent, int index) {
  agent.Log(absl::StrCat("worker ", index,
                         ": prepared; standing by until a scale adds it"));
  int64_t epoch = 0;
  while (true) {
    absl::StatusOr<pstrain::Membership> newest =
        agent.WaitForMembership(epoch, absl::InfiniteFuture());
    if (!newest.ok()) return newest.status();
    if (pstrain::IsMember(*newest, index)) {
      pstrain::WorkerMembership world;
      world.workers.assign(newest->workers().begin(), newest->workers().end());
      world.epoch = newest->epoch();
      agent.Log(absl::StrCat("worker ", index, ": added by membership ",
                             world.epoch, "; joining"));
      return world;
    }
    epoch = newest->epoch() + 1;
  }
}

// The epoch of the membership worker 0 last applied, as the heartbeats'
// answers tell (0: none yet).
int64_t AppliedEpoch(pstrain::TaskAgent& agent) {
  const std::optional<pstrain::Membership> applied = agent.applied_membership();
  return applied.has_value() ? applied->epoch() : 0;
}

// A joining worker of an elastic allreduce job: the world worker 0
// announces that has it (worker/world_announcement.h), from the applied
// membership on; `known` is the epoch of the coordinator's membership it
// knew (a different one is logged).
absl::StatusOr<pstrain::WorkerMembership> AwaitWorld(
    pstrain::TaskAgent& agent, pstrain::RendezvousStore& store,
    const pstrain::WorldPrefixFn& world_prefix, int index, int64_t known) {
  pstrain::AwaitWorldOptions joiner;
  joiner.worker_id = index;
  absl::StatusOr<pstrain::WorkerMembership> world =
      pstrain::AwaitAnnouncedWorld(
          store, world_prefix, [&agent] { return AppliedEpoch(agent); },
          joiner);
  if (world.ok() && world->epoch != known) {
    agent.Log(absl::StrCat("worker ", index, ": worker 0 chose membership ",
                           world->epoch, " (not ", known,
                           "); joining its world"));
  }
  return world;
}

// The trainer's options from the job spec (validated at submission:
// coordinator/job_spec.h), the flags and the cluster's layout; the
// callbacks report through `agent`, which must outlive training. Errors:
// the TLS credentials' or the straggler's, the task's exit code 2.
absl::StatusOr<pstrain::TrainerOptions> TrainerOptionsOf(
    const pstrain::JobConfig& config, pstrain::TaskAgent& agent,
    const pstrain::ClusterLayout& layout, const ThreadPlan& threads,
    pstrain::Collective* collective) {
  // (An elastic allreduce job's exchange connects its own: main() sets
  // connect_collective and start_membership.)
  const pstrain::JobSpec& spec = config.spec;
  const int index = agent.options().index;
  pstrain::TrainerOptions options;
  options.job_id = agent.options().job_id;
  options.worker_id = index;
  options.num_workers = spec.num_workers();
  options.ps_addresses.assign(layout.ps_addresses().begin(),
                              layout.ps_addresses().end());
  // TLS to the shards as this worker: the agent's options, checked at join.
  pstrain::TlsIdentity self;
  self.role = pstrain::TlsRole::kWorker;
  self.index = index;
  self.job = agent.options().job_id;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      pstrain::ChannelCredentials(agent.options().tls, self);
  if (!credentials.ok()) return credentials.status();
  if (!agent.options().tls.insecure) options.ps_credentials = *credentials;
  options.model = spec.model();
  if (spec.has_dropout()) {
    options.transformer_dropout = static_cast<float>(spec.dropout());
  }
  options.mode = config.mode;
  options.collective = collective;
  options.bucket_bytes = spec.bucket_bytes();
  options.adam = pstrain::OptimizerOptionsOf(config);
  options.compute = config.compute;
  options.compute_ms = spec.compute_ms();
  options.model_bytes = spec.model_bytes();
  options.backward_fraction = spec.backward_fraction();
  options.synthetic_layers = spec.synthetic_layers();
  options.batch_size = spec.batch_size();
  options.input_threads = threads.input_threads;
  options.input_idle_priority = threads.idle_input;
  options.augment = config.augment;
  options.epochs = spec.epochs();
  options.seed = spec.seed();
  options.log_every_steps = spec.log_every_steps();
  options.metrics_dir = spec.metrics_dir();
  options.partition_bytes = spec.partition_bytes();
  options.partition_bytes_auto = spec.partition_bytes_auto();
  options.wire_dtype = config.wire_dtype;
  options.compression = config.compression;
  options.channels_per_shard = spec.channels_per_shard();
  options.priority_pulls = spec.priority_pulls();
  options.dense_pulls = spec.dense_pulls();
  options.sparse_embeddings = spec.sparse_embeddings();
  options.max_steps_per_epoch = spec.max_steps_per_epoch();
  options.init_from = spec.init_from();
  options.checkpoint_dir = spec.checkpoint_dir();
  options.checkpoint_every_steps = spec.checkpoint_every_steps();
  options.checkpoint_every_secs = spec.checkpoint_every_secs();
  options.max_nonfinite_steps = spec.max_nonfinite_steps();
  options.staleness = spec.staleness();
  options.backup_workers = spec.backup_workers();
  options.clip_grad_norm = spec.clip_grad_norm();
  absl::StatusOr<pstrain::Straggler> straggler =
      pstrain::ParseStraggler(spec.straggler(), spec.num_workers());
  if (!straggler.ok()) return straggler.status();
  options.straggler_worker = straggler->worker;
  options.straggler_delay_ms = straggler->delay_ms;
  if (spec.keep_checkpoints() > 0) {
    options.keep_checkpoints = spec.keep_checkpoints();
  }
  options.resume = spec.resume();
  options.max_restarts = spec.max_restarts();
  // An elastic job (issue 40): worker 0 applies the coordinator's newest
  // membership (from the heartbeats' answers) and reports it applied.
  options.elastic = pstrain::IsElastic(spec);
  options.min_workers = spec.min_workers();
  options.linear_lr_scaling = spec.linear_lr_scaling();
  if (options.elastic && index != 0) {
    // A membership that adds this worker is ready once it is prepared.
    options.prepared = [&agent] { agent.SetPrepared(); };
  }
  // Allreduce: every worker follows the coordinator's memberships (after
  // a death each joins the next one's world).
  if (options.elastic &&
      (index == 0 || config.mode == pstrain::MODE_ALLREDUCE)) {
    options.newest_membership = [&agent] { return agent.membership(); };
  }
  if (options.elastic && index == 0) {
    options.membership_applied =
        [&agent](const pstrain::MembershipApplied& applied) {
          agent.SetMembershipApplied(applied);
        };
  }
  // A worker restarted outside pstrain (PSTRAIN_SELF_RESTART) rejoins as
  // one that pstrain's supervisors restart with --rejoin.
  options.rejoin = absl::GetFlag(FLAGS_rejoin) || agent.rejoining();
  // Allreduce with restarts: a restarted worker resumes from the newest
  // checkpoint (every worker of the generation reads the same one: all of
  // the earlier generation have exited before the layout answers), or
  // starts afresh before the first.
  if (config.mode == pstrain::MODE_ALLREDUCE && spec.max_restarts() > 0 &&
      options.rejoin &&
      pstrain::ReadLatestCheckpoint(spec.checkpoint_dir()).ok()) {
    options.resume = true;
  }
  // A restarted shard registers a new address: ask the coordinator again
  // (it answers once every task is registered).
  options.ps_addresses_fn =
      [&agent]() -> absl::StatusOr<std::vector<std::string>> {
    absl::StatusOr<pstrain::ClusterLayout> now = agent.WaitForLayout();
    if (!now.ok()) return now.status();
    return std::vector<std::string>(now->ps_addresses().begin(),
                                    now->ps_addresses().end());
  };
  if (!spec.checkpoint_dir().empty()) {
    options.model_out = spec.checkpoint_dir() + "/model.safetensors";
  }
  options.backend = config.backend;
  options.precision = config.precision;
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.init_timeout = absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s));
  options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  options.log_line = [&agent](const std::string& line) { agent.Log(line); };
  options.on_progress = [&agent](int64_t steps, double samples_per_sec) {
    agent.SetProgress(steps, samples_per_sec);
  };
  options.on_epoch = [&agent](const pstrain::RunResult& so_far) {
    agent.SetResult(so_far);
  };
  return options;
}

}  // namespace

// How an elastic job's worker starts, into `options` (agent and store
// outlive training). A `standby` waits for the membership that adds it
// (AwaitMembership); an elastic allreduce job's worker connects each world
// through `connect`, starting in `start` (StartMembership) or, when
// `announced` or a standby, in the world worker 0 announces (AwaitWorld);
// worker 0 announces every world it connects, and every other worker
// joins the one worker 0 announces after a member's death
// (worker/world_announcement.h).
void SetStartCallbacks(bool standby,
                       const std::optional<pstrain::WorkerMembership>& start,
                       bool announced, bool elastic_allreduce,
                       const pstrain::CollectiveFactory& connect,
                       const pstrain::WorldPrefixFn& world_prefix,
                       pstrain::TaskAgent& agent,
                       pstrain::RendezvousStore& store,
                       pstrain::TrainerOptions* options) {
  const int index = agent.options().index;
  if (start.has_value() || (standby && elastic_allreduce)) {
    options->connect_collective = connect;
    if (start.has_value()) options->start_membership = *start;
  }
  if (elastic_allreduce && index != 0) {
    options->announced_world = [&agent, &store, world_prefix](
                                   int64_t from_epoch, absl::Time deadline) {
      pstrain::AwaitWorldOptions survivor;
      survivor.deadline = deadline;
      return pstrain::AwaitAnnouncedWorld(
          store, world_prefix,
          [&agent, from_epoch] {
            return std::max(from_epoch, AppliedEpoch(agent));
          },
          survivor);
    };
  }
  if (elastic_allreduce && index == 0) {
    options->announce_world = [&store, world_prefix](
                                  int64_t from_epoch,
                                  const pstrain::WorkerMembership& next) {
      return pstrain::AnnounceWorld(store, world_prefix, from_epoch, next);
    };
  }
  if (standby) {
    options->await_membership =
        [&agent, &store, world_prefix, index,
         elastic_allreduce]() -> absl::StatusOr<pstrain::WorkerMembership> {
      absl::StatusOr<pstrain::WorkerMembership> added =
          AwaitMembership(agent, index);
      if (!added.ok() || !elastic_allreduce) return added;
      return AwaitWorld(agent, store, world_prefix, index, added->epoch);
    };
  } else if (announced) {
    options->await_membership = [&agent, &store, world_prefix, index,
                                 known = start->epoch] {
      return AwaitWorld(agent, store, world_prefix, index, known);
    };
  }
}

int main(int argc, char** argv) {
  // Before any thread allocates: a step's buffers are reused, not faulted
  // in again (common/malloc_tuning.h).
  pstrain::KeepFreedMemoryForReuseOrWarn(kProgram);
  absl::SetProgramUsageMessage(
      "One pstrain data-parallel worker: pstrain_worker "
      "--coordinator=HOST:PORT --job=ID --task_index=N [--gpu=G]");
  pstrain::ParseFlagsOrExit(argc, argv, kProgram, "pstrain_worker --help");
  if (absl::Status s = CheckFlags(); !s.ok()) {
    pstrain::PrintError(kProgram, s.message());
    return 2;
  }

  int exit_code = 0;
  absl::StatusOr<pstrain::JoinedTask> joined =
      pstrain::JoinJobFromFlags(pstrain::ROLE_WORKER, kProgram, &exit_code);
  if (!joined.ok()) return exit_code;
  pstrain::TaskAgent& agent = *joined->agent;
  const pstrain::TaskAddress& address = joined->address;
  const int index = agent.options().index;
  auto fail = [&](int code, const std::string& message) {
    return pstrain::FailTask(agent, kProgram, code, message);
  };
  const pstrain::JobConfig& config = joined->config;
  const pstrain::JobSpec& spec = config.spec;
  // oneDNN's primitives run on the training (this) thread's OpenMP pool.
  absl::StatusOr<int> threads =
      pstrain::TaskThreadsFromFlags(agent, kProgram, true, &exit_code);
  if (!threads.ok()) return exit_code;
  const ThreadPlan thread_plan = PlanThreads(config, *threads);
  omp_set_num_threads(thread_plan.compute_threads);
  const int gpu = absl::GetFlag(FLAGS_gpu);
  if (absl::Status s = pstrain::CheckBackend(config.backend, gpu, "");
      !s.ok()) {
    return fail(2, std::string(s.message()));
  }
  if (absl::Status s =
          pstrain::CheckPrecision(config.backend, config.precision, "");
      !s.ok()) {
    return fail(2, std::string(s.message()));
  }
  absl::StatusOr<pstrain::Dataset> dataset = LoadJobDataset(config);
  if (!dataset.ok()) return fail(2, std::string(dataset.status().message()));

  // Workers do not listen (yet); the address names the host they run on.
  const std::string advertised =
      address.port > 0 ? absl::StrCat(address.advertise_host, ":", address.port)
                       : address.advertise_host;
  if (absl::Status s = agent.Register(advertised); !s.ok()) {
    pstrain::PrintError(kProgram,
                        absl::StrCat(agent.name(), ": ", s.message()));
    return 1;
  }
  if (absl::Status s = StartTrace(spec, index, agent); !s.ok()) {
    return fail(1, std::string(s.message()));
  }
  if (index == 0 && pstrain::IsElastic(spec)) {
    // Worker 0 applies the coordinator's memberships, which reach it in
    // the heartbeats' answers: a scale is planned at most this much later
    // (ElasticMembership), for 4 small RPCs a second.
    agent.set_heartbeat_interval(
        std::min(agent.options().heartbeat_interval, kWorker0Heartbeat));
  }
  StartHeartbeatsThatExit(agent);
  absl::StatusOr<pstrain::ClusterLayout> layout = agent.WaitForLayout();
  if (!layout.ok()) return fail(1, std::string(layout.status().message()));

  CoordinatorStore store(&agent);
  std::unique_ptr<pstrain::Collective> collective;
  const bool elastic = pstrain::IsElastic(spec);
  const bool elastic_allreduce =
      elastic && config.mode == pstrain::MODE_ALLREDUCE;
  const pstrain::CollectiveFactory connect =
      CollectiveFactoryOf(config, gpu, address, *layout, &store);
  std::optional<pstrain::WorkerMembership> start;
  bool announced = false;
  const bool rejoin = absl::GetFlag(FLAGS_rejoin) || agent.rejoining();
  absl::StatusOr<bool> standby = IsStandby(agent, spec, index, rejoin);
  if (!standby.ok()) return fail(1, std::string(standby.status().message()));
  if (*standby) {
    // Its world (allreduce) is the membership that adds it.
  } else if (elastic_allreduce) {
    absl::StatusOr<std::optional<pstrain::WorkerMembership>> m =
        StartMembership(agent, index, rejoin, &announced);
    if (!m.ok()) return fail(1, std::string(m.status().message()));
    if (!m->has_value()) {
      std::printf("%s: %s: not a member of the job's workers; leaving\n",
                  kProgram, agent.name().c_str());
      agent.Finish(true, "not a member of the job's membership").IgnoreError();
      return 0;
    }
    start = **m;
  } else if (config.mode == pstrain::MODE_ALLREDUCE) {
    absl::StatusOr<std::unique_ptr<pstrain::Collective>> connected =
        connect(index, spec.num_workers(), 0,
                absl::Seconds(absl::GetFlag(FLAGS_init_timeout_s)));
    if (!connected.ok()) {
      return FailOrAwaitRestart(agent, config, connected.status(),
                                std::string(connected.status().message()));
    }
    collective = *std::move(connected);
  }
  absl::StatusOr<pstrain::TrainerOptions> options =
      TrainerOptionsOf(config, agent, *layout, thread_plan, collective.get());
  if (!options.ok()) return fail(2, std::string(options.status().message()));
  SetStartCallbacks(*standby, start, announced, elastic_allreduce, connect,
                    WorldPrefixOf(config, *layout), agent, store, &*options);

  absl::StatusOr<pstrain::TrainerOutput> output =
      pstrain::RunWorker(*options, *dataset);
  // The trace is complete before the coordinator hears of the end.
  if (absl::Status s = pstrain::trace::Stop(); !s.ok()) {
    pstrain::PrintError(kProgram, absl::StrCat("trace: ", s.message()));
  }
  if (!output.ok()) {
    return FailOrAwaitRestart(agent, config, output.status(),
                              output.status().ToString());
  }
  absl::Status s =
      agent.Finish(true, "", index == 0 ? &output->result : nullptr);
  if (!s.ok()) {
    pstrain::PrintError(kProgram, s.message());
    return 1;
  }
  return 0;
}
