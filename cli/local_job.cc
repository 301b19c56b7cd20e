#include "cli/local_job.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/control_file.h"
#include "cli/node_supervisor.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "models/model.h"
#include "models/model_file.h"
#include "proto/coordinator.pb.h"
#include "worker/checkpoint.h"

namespace pstrain {
namespace {

constexpr char kIpBinary[] = "/usr/sbin/ip";

absl::StatusOr<std::vector<NetnsHost>> ParseNetnsHosts(
    const std::string& flag, const std::string& text) {
  std::vector<NetnsHost> hosts;
  if (text.empty()) return hosts;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(part, absl::MaxSplits(':', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", text, ": \"", part,
                       "\"; expected NETNS:IP entries separated by commas"));
    }
    hosts.push_back({kv.first, kv.second});
  }
  return hosts;
}

// One run of RunLocalJob: the job's TLS folder, coordinator, and the node
// supervisor of its tasks.
class LocalJob {
 public:
  LocalJob(const JobConfig& config, const Placement& placement,
           const LocalJobOptions& options)
      : config_(config),
        spec_(config.spec),
        placement_(placement),
        options_(options) {}

  // A fresh CA and the coordinator's certificate (mutual TLS with no flag;
  // --insecure: plaintext), the in-process coordinator, the job submitted
  // to its table, and the tasks' certificates or plaintext flags.
  absl::Status StartCoordinator();
  // Every shard, then every worker, as a child process of the job's
  // supervisor.
  absl::Status StartTasks();
  // Supervises the tasks until none runs (cli/node_supervisor: a task that
  // dies is restarted as the job table allows, else its death fails the
  // job; the others learn it from their heartbeats), then returns worker
  // 0's results or the job's failure. CANCELLED on a signal.
  absl::StatusOr<RunResult> Supervise();

 private:
  // argv of task `index` of `binary`, placed.
  std::vector<std::string> TaskArgv(const std::string& binary, bool ps,
                                    int index) const;
  // The supervisor's options: this command's names, the in-process
  // coordinator reached as each task, the grace after the job's end.
  SupervisorOptions Supervision();
  // Worker `index` as a task of the supervisor, its threads this
  // machine's cores over `num_workers`.
  SupervisedTask WorkerTask(int index, int num_workers) const;
  // Shard `index` as a task of the supervisor.
  SupervisedTask ShardTask(int index) const;
  // The control file's new lines: a Scale each on the in-process
  // coordinator (a refusal is a warning).
  void ReadControlFile();
  // The supervisor's more_tasks: ReadControlFile, then the workers and
  // shards a Scale added that were not started for the newest membership
  // and are not running.
  std::vector<SupervisedTask> ScaledTasks();

  // How often the control file is read.
  static constexpr absl::Duration kControlPoll = absl::Milliseconds(200);

  // Mutual TLS: the run's certificates are valid a day, in a private
  // folder (0700, keys 0600, named with this pid so the next run removes
  // it if this one is killed), removed at the end; the CA's key is deleted
  // as soon as the tasks' certificates are minted.
  static constexpr absl::Duration kCertificateValidity = absl::Hours(24);

  const JobConfig& config_;
  const JobSpec& spec_;  // config_.spec
  const Placement& placement_;
  const LocalJobOptions& options_;
  TlsOptions tls_;
  std::unique_ptr<PrivateFolder> tls_folder_;
  std::unique_ptr<CoordinatorServer> coordinator_;
  std::string job_id_;
  std::string coordinator_flag_;
  std::vector<std::string> tls_flags_;
  std::unique_ptr<NodeSupervisor> supervisor_;
  std::unique_ptr<ControlFile> control_;  // null without --control_file
  absl::Time control_read_ = absl::InfinitePast();
  // The membership epoch each worker (shard) a Scale added was started
  // for.
  std::map<int, int64_t> launched_;
  std::map<int, int64_t> launched_ps_;
};

absl::Status LocalJob::StartCoordinator() {
  tls_.insecure = options_.insecure;
  if (!tls_.insecure) {
    ASSIGN_OR_RETURN(tls_folder_, PrivateFolder::Create("pstrain-tls"));
    tls_.dir = tls_folder_->path();
    RETURN_IF_ERROR(MakeCertificates(tls_.dir,
                                     {TlsIdentity{TlsRole::kCoordinator}}, {},
                                     kCertificateValidity));
  }
  CoordinatorServerOptions coordinator_options;
  coordinator_options.address = absl::StrCat(placement_.coordinator_host, ":0");
  coordinator_options.heartbeat_timeout = options_.heartbeat_timeout;
  if (!tls_.insecure) {
    ASSIGN_OR_RETURN(
        coordinator_options.credentials,
        ServerCredentials(tls_, TlsIdentity{TlsRole::kCoordinator}));
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> started =
      CoordinatorServer::Start(coordinator_options);
  if (!started.ok()) {
    return absl::InternalError(absl::StrCat("in-process coordinator on ",
                                            coordinator_options.address, ": ",
                                            started.status().message()));
  }
  coordinator_ = *std::move(started);
  ASSIGN_OR_RETURN(job_id_, coordinator_->table().Submit(spec_, absl::Now()));
  coordinator_flag_ = absl::StrCat(
      "--coordinator=", placement_.coordinator_host, ":", coordinator_->port());
  if (tls_.insecure) {
    tls_flags_ = TaskTlsFlags(tls_, options_.insecure_allow_remote);
    return absl::OkStatus();
  }
  std::vector<TlsIdentity> tasks;
  // An elastic-shard job: a certificate for every shard a Scale may add.
  for (int s = 0; s < PsTaskCount(spec_); ++s) {
    tasks.push_back(TlsIdentity{TlsRole::kPs, s, job_id_});
  }
  // An elastic job: a certificate for every worker a Scale may add.
  for (int w = 0; w < WorkerTaskCount(spec_); ++w) {
    tasks.push_back(TlsIdentity{TlsRole::kWorker, w, job_id_});
  }
  absl::Status minted =
      MakeCertificates(tls_.dir, tasks, {}, kCertificateValidity);
  // No key that mints identities outlives the minting, failed or not.
  minted.Update(RemoveMintingKeys(tls_.dir));
  RETURN_IF_ERROR(minted);
  tls_flags_ = TaskTlsFlags(tls_, options_.insecure_allow_remote);
  return absl::OkStatus();
}

std::vector<std::string> LocalJob::TaskArgv(const std::string& binary, bool ps,
                                            int index) const {
  std::vector<std::string> argv;
  std::string ip = "127.0.0.1";
  if (placement_.netns()) {
    const NetnsHost& host =
        ps ? placement_.ps[index] : placement_.workers[index];
    argv = {kIpBinary, "netns", "exec", host.netns};
    ip = host.ip;
  }
  argv.insert(
      argv.end(),
      {binary, coordinator_flag_, absl::StrCat("--job=", job_id_),
       absl::StrCat("--task_index=", index), absl::StrCat("--advertise=", ip)});
  argv.insert(argv.end(), tls_flags_.begin(), tls_flags_.end());
  if (ps) {
    argv.insert(argv.end(), {absl::StrCat("--bind=", ip), "--port=0"});
  } else {
    // NCCL needs one GPU per rank: worker w takes GPU --gpu + w. Other
    // modes share --gpu.
    argv.push_back(absl::StrCat(
        "--gpu=",
        options_.gpu + (config_.collective == COLLECTIVE_NCCL ? index : 0)));
  }
  return argv;
}

SupervisorOptions LocalJob::Supervision() {
  SupervisorOptions options;
  options.program = "pstrain";
  options.names = TaskNames::kJobLog;
  options.coordinator =
      absl::StrCat(placement_.coordinator_host, ":", coordinator_->port());
  options.job_id = job_id_;
  options.tls = tls_;
  options.spec = spec_;
  options.more_tasks = [this] { return ScaledTasks(); };
  // Every task exits by itself once the job has ended (the shards after
  // their last worker's WorkerDone, the rest at their next heartbeat, 1 s).
  // With backup workers the job ends with worker 0 and a straggler may be
  // stopped or far behind: its steps are not needed, so it gets 3 s.
  const bool backups = spec_.backup_workers() > 0;
  options.end_grace = backups ? absl::Seconds(3) : absl::Seconds(10);
  options.poll = absl::Milliseconds(100);
  options.stop_signal = options_.stop_signal;
  options.on_signal = [this] {
    coordinator_->table().Cancel(job_id_, absl::Now()).IgnoreError();
  };
  options.on_grace_over =
      [backups](JobState state, const std::vector<SupervisedTask>& running) {
        if (!backups || state != JOB_SUCCEEDED) return;
        for (const SupervisedTask& task : running) {
          if (task.role != ROLE_WORKER) continue;
          std::printf(
              "pstrain: %s was still on its way when the last step was "
              "decided (backup workers: its steps were not needed); stopping "
              "it\n",
              TaskName(task.role, task.index).c_str());
        }
        std::fflush(stdout);
      };
  return options;
}

absl::Status LocalJob::StartTasks() {
  std::vector<SupervisedTask> tasks;
  // Shards 0 to num_ps - 1 and workers 0 to num_workers - 1; an elastic
  // job's others start idle, but for standby_workers' workers, which start
  // now (sharing the cores as if all max_workers ran).
  for (int s = 0; s < spec_.num_ps(); ++s) {
    tasks.push_back(ShardTask(s));
  }
  for (int w = 0; w < spec_.num_workers(); ++w) {
    tasks.push_back(WorkerTask(w, spec_.num_workers()));
  }
  if (spec_.standby_workers()) {
    for (int w = spec_.num_workers(); w < WorkerTaskCount(spec_); ++w) {
      tasks.push_back(WorkerTask(w, WorkerTaskCount(spec_)));
    }
  }
  if (!options_.control_file.empty()) {
    control_ = std::make_unique<ControlFile>(options_.control_file);
  }
  supervisor_ = std::make_unique<NodeSupervisor>(Supervision());
  return supervisor_->Start(tasks);
}

SupervisedTask LocalJob::ShardTask(int index) const {
  return {ROLE_PS, index, TaskArgv(options_.ps_binary, true, index), {}};
}

SupervisedTask LocalJob::WorkerTask(int index, int num_workers) const {
  // Every task of a local run shares this machine's cores.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string omp_threads =
      absl::StrCat("OMP_NUM_THREADS=",
                   std::max<unsigned>(1, cores / std::max(1, num_workers)));
  return {ROLE_WORKER,
          index,
          TaskArgv(options_.worker_binary, false, index),
          {omp_threads}};
}

void LocalJob::ReadControlFile() {
  JobTable& table = coordinator_->table();
  for (const ScaleLine& line : control_->Poll()) {
    ScaleTarget target;
    target.num_workers = line.num_workers;
    target.num_ps = line.num_ps;
    target.at_step = line.at_step;
    std::string wanted = absl::StrCat(line.num_workers, " workers");
    if (line.num_ps > 0) {
      wanted = line.num_workers > 0
                   ? absl::StrCat(wanted, " and ", line.num_ps, " shards")
                   : absl::StrCat(line.num_ps, " shards");
    }
    absl::StatusOr<Membership> m = table.Scale(job_id_, target, absl::Now());
    if (!m.ok()) {
      std::fprintf(stderr, "pstrain: warning: %s: scale to %s: %s\n",
                   control_->path().c_str(), wanted.c_str(),
                   std::string(m.status().message()).c_str());
      continue;
    }
    const std::string shards =
        m->num_ps() > 0 ? absl::StrCat("; shards 0 to ", m->num_ps() - 1) : "";
    std::printf("pstrain: scale to %s: membership %lld (workers %s%s)%s\n",
                wanted.c_str(), static_cast<long long>(m->epoch()),
                absl::StrJoin(m->workers(), ", ").c_str(), shards.c_str(),
                m->ready() ? "" : ", once the new tasks registered");
  }
  std::fflush(stdout);
  std::fflush(stderr);
}

std::vector<SupervisedTask> LocalJob::ScaledTasks() {
  JobTable& table = coordinator_->table();
  // Lines written before the job runs wait until it does (a Scale of a
  // pending job is refused).
  absl::StatusOr<JobInfo> now = table.Get(job_id_, JobTable::kNoLog);
  const bool running = now.ok() && now->state() == JOB_RUNNING;
  if (control_ != nullptr && running &&
      absl::Now() - control_read_ >= kControlPoll) {
    control_read_ = absl::Now();
    ReadControlFile();
  }
  // The workers and shards a Scale added: waiting to register, never
  // started for this membership.
  std::vector<SupervisedTask> start;
  absl::StatusOr<JobInfo> job = table.Get(job_id_, JobTable::kNoLog);
  if (!job.ok() || !IsElastic(job->spec())) return start;
  const int64_t epoch = job->membership().epoch();
  for (const TaskInfo& t : job->tasks()) {
    if (t.state() != TASK_WAITING) continue;
    SupervisedTask task =
        t.role() == ROLE_PS
            ? ShardTask(t.index())
            : WorkerTask(t.index(), job->membership().workers_size());
    // Those running are skipped: the first tasks before they registered,
    // restarted ones, and a removed one that a Scale took back while it
    // still exits (it is started once it has).
    if (supervisor_->Running(task.key())) continue;
    std::map<int, int64_t>& launched =
        t.role() == ROLE_PS ? launched_ps_ : launched_;
    auto [it, added] = launched.emplace(t.index(), epoch);
    if (!added && it->second >= epoch) continue;
    it->second = epoch;
    start.push_back(std::move(task));
  }
  return start;
}

absl::StatusOr<RunResult> LocalJob::Supervise() {
  int signal = supervisor_->Run().signal;
  JobTable& table = coordinator_->table();
  ASSIGN_OR_RETURN(JobInfo job, table.Get(job_id_, JobTable::kNoLog));
  // Every task has exited: the job has ended, or ends once the coordinator
  // finds its tasks lost.
  while (signal == 0 && !JobEnded(job.state())) {
    absl::SleepFor(absl::Milliseconds(100));
    signal = *options_.stop_signal;
    ASSIGN_OR_RETURN(job, table.Get(job_id_, JobTable::kNoLog));
  }
  if (signal != 0) {
    table.Cancel(job_id_, absl::Now()).IgnoreError();  // if not yet
    return absl::CancelledError(absl::StrCat("interrupted by signal ", signal,
                                             "; stopped every process"));
  }
  if (job.state() != JOB_SUCCEEDED) {
    return absl::AbortedError(absl::StrCat(
        job_id_, " ", JobStateName(job.state()), ": ", job.message()));
  }
  return job.result();
}

}  // namespace

absl::StatusOr<Placement> ParsePlacement(const std::string& ps_netns,
                                         const std::string& worker_netns,
                                         const std::string& coordinator_host) {
  Placement placement;
  ASSIGN_OR_RETURN(placement.ps, ParseNetnsHosts("ps_netns", ps_netns));
  ASSIGN_OR_RETURN(placement.workers,
                   ParseNetnsHosts("worker_netns", worker_netns));
  placement.coordinator_host = coordinator_host;
  if (placement.ps.empty() != placement.workers.empty()) {
    return absl::InvalidArgumentError(
        "--ps_netns and --worker_netns: give both or neither");
  }
  if (placement.netns() && access(kIpBinary, X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_netns: ", kIpBinary,
                     " is not an executable (apt-get install iproute2)"));
  }
  return placement;
}

constexpr int kLocalWorkersPerCore = 4;
absl::Status CheckRoom(const Placement& placement, int num_ps, int num_workers,
                       const std::string& workers_flag) {
  if (placement.netns()) {
    if (num_workers > static_cast<int>(placement.workers.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          workers_flag, "=", num_workers, ": only ", placement.workers.size(),
          " worker namespaces in --worker_netns"));
    }
    if (num_ps > static_cast<int>(placement.ps.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("--num_ps=", num_ps, ": only ", placement.ps.size(),
                       " PS namespaces in --ps_netns"));
    }
    return absl::OkStatus();
  }
  const int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (num_workers > kLocalWorkersPerCore * cores) {
    return absl::InvalidArgumentError(absl::StrCat(
        workers_flag, "=", num_workers, ": this machine has ", cores,
        " cores; at most ", kLocalWorkersPerCore * cores,
        " local workers can run (use a cluster, or --worker_netns)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> CheckSpec(const JobSpec& spec,
                                    const Dataset* dataset) {
  absl::StatusOr<JobConfig> config = ResolveJobSpec(spec);
  if (!config.ok()) {
    // "num_workers: 0; expected ..." names the flag --num_workers;
    // "optimizer.lr: ..." names --lr.
    absl::string_view message = config.status().message();
    absl::ConsumePrefix(&message, "optimizer.");
    return absl::InvalidArgumentError(absl::StrCat("--", message));
  }
  if (dataset != nullptr &&
      dataset->train.count / spec.num_workers() < spec.batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_size=", spec.batch_size(), ": larger than each of ",
        spec.num_workers(), " workers' ",
        dataset->train.count / spec.num_workers(), " training samples"));
  }
  return config;
}

absl::Status CheckModelFiles(const JobSpec& spec, const Dataset* dataset) {
  if (!spec.init_from().empty() && dataset != nullptr) {
    std::unique_ptr<Backend> cpu = NewCpuBackend();
    ModelOptions options;
    options.seed = spec.seed();
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                     Model::Create(spec.model(), dataset->train.chw,
                                   dataset->num_classes, options, cpu.get()));
    if (absl::Status s = LoadModelFile(spec.init_from(), model.get());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--init_from: ", s.message()));
    }
  }
  const std::string dir = spec.checkpoint_dir();
  const bool checkpointing =
      spec.checkpoint_every_steps() > 0 || spec.checkpoint_every_secs() > 0;
  if (dir.empty()) {
    if (spec.resume() || checkpointing) {
      return absl::InvalidArgumentError(
          "--resume, --checkpoint_every_steps and --checkpoint_every_secs "
          "need --checkpoint_dir");
    }
    return absl::OkStatus();
  }
  std::error_code error;
  if (spec.resume()) {
    // The newest checkpoint must be there and verify before anything starts.
    absl::StatusOr<CheckpointManifest> latest = ReadLatestCheckpoint(dir);
    absl::Status verified = latest.status();
    // The data position the workers would refuse once started (another
    // number of workers re-splits the epoch where it is:
    // worker/data_position.h).
    if (verified.ok() && (latest->position.batch_size != spec.batch_size() ||
                          latest->position.seed != spec.seed())) {
      verified = absl::InvalidArgumentError(absl::StrCat(
          latest->dir, ": saved with batch size ", latest->position.batch_size,
          " and seed ", latest->position.seed, "; this job has ",
          spec.batch_size(), " and ", spec.seed(),
          ": its data position cannot be restored"));
    }
    if (verified.ok() && dataset != nullptr) {
      // Every file read and checked against this job's model (on the CPU).
      std::unique_ptr<Backend> cpu = NewCpuBackend();
      ASSIGN_OR_RETURN(
          std::unique_ptr<Model> model,
          Model::Create(spec.model(), dataset->train.chw, dataset->num_classes,
                        ModelOptions(), cpu.get()));
      verified = LoadCheckpointState(*latest, model->PsTensorNames(),
                                     model->PsTensorShapes(),
                                     static_cast<int>(model->buffers().size()))
                     .status();
    }
    if (!verified.ok()) {
      return absl::Status(verified.code(),
                          absl::StrCat("--resume: ", verified.message()));
    }
    return absl::OkStatus();
  }
  if (std::filesystem::exists(dir, error)) {
    if (!std::filesystem::is_directory(dir, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint_dir=", dir, ": not a folder"));
    }
    std::filesystem::directory_iterator first(dir, error);
    if (error) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint_dir=", dir, ": cannot list it: ", error.message()));
    }
    if (first != std::filesystem::directory_iterator()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint_dir=", dir, ": not empty (holds ",
          first->path().filename().string(),
          "); nothing is overwritten: choose an empty or new folder, or "
          "--resume to continue from its checkpoints"));
    }
    return absl::OkStatus();
  }
  if (!std::filesystem::create_directories(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir=", dir, ": cannot create it: ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> RunLocalJob(const JobConfig& config,
                                      const Placement& placement,
                                      const LocalJobOptions& options) {
  LocalJob job(config, placement, options);
  RETURN_IF_ERROR(job.StartCoordinator());
  RETURN_IF_ERROR(job.StartTasks());
  return job.Supervise();
}

}  // namespace pstrain
