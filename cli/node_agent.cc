#include "cli/node_agent.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "catalog/job_config.h"
#include "cli/node_supervisor.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "common/usable_cores.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_table.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);     // cli/job_commands.cc
ABSL_DECLARE_FLAG(std::string, job);             // cli/launch_lines.cc
ABSL_DECLARE_FLAG(std::string, bin_dir);         // cli/launch_lines.cc
ABSL_DECLARE_FLAG(int, gpus_per_node);           // cli/launch_lines.cc
ABSL_DECLARE_FLAG(bool, insecure_allow_remote);  // common/tls_flags.cc

ABSL_FLAG(int, node_rank, -1,
          "node: this node's rank, for specs without hosts; unset: "
          "SLURM_NODEID, else OMPI_COMM_WORLD_RANK (mpirun --map-by "
          "ppr:1:node), else 0.");
ABSL_FLAG(int, num_nodes, 0,
          "node: how many nodes the job's tasks are spread over, for specs "
          "without hosts; unset: SLURM_NNODES, else OMPI_COMM_WORLD_SIZE, "
          "else 1.");
ABSL_FLAG(int, node_grace_s, 60,
          "node: after a task failed, seconds the others get to end before "
          "SIGTERM.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain node";
volatile std::sig_atomic_t g_node_signal = 0;
void OnNodeSignal(int signal) { g_node_signal = signal; }

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

// The flags of `pstrain node` that the job (`config`) would ignore, given
// on the command line anyway: an error naming the first, as `pstrain run`
// refuses the flags its mode ignores.
absl::Status CheckIgnoredNodeFlags(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  auto ignored = [](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " would be ignored: ", why, "; see pstrain help node"));
  };
  if (!spec.ps_hosts().empty() || !spec.worker_hosts().empty()) {
    for (const char* flag : {"node_rank", "num_nodes"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, "the job spec lists hosts, which place its tasks");
      }
    }
  }
  if (config.backend != BACKEND_CUDA && FlagSpecified("gpus_per_node")) {
    return ignored("gpus_per_node",
                   absl::StrCat("the job's backend is ",
                                Spelling(config.backend), ", not cuda"));
  }
  return absl::OkStatus();
}

// The first of `variables` set in the environment, as an int >= 0; -1 if
// none is.
absl::StatusOr<int> FromEnvironment(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    int n = -1;
    if (!absl::SimpleAtoi(value, &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "=", value, ": expected an integer >= 0"));
    }
    return n;
  }
  return -1;
}

// A coordinator stub that reads job `id` with the key of any of its tasks
// in the TLS folder (the node knows its tasks only from the spec).
absl::StatusOr<std::unique_ptr<Coordinator::Stub>> JobReaderStub(
    const std::string& coordinator, const std::string& id,
    const TlsOptions& tls) {
  TlsIdentity reader{TlsRole::kWorker, 0, id};
  if (!tls.insecure) {
    ASSIGN_OR_RETURN(reader, AnyTaskIdentityOfJob(tls, id));
  }
  return CoordinatorStubAs(coordinator, tls, reader);
}

// One GetJob of `id` (no log) within `deadline`; the job, or gRPC's status.
grpc::Status ReadJob(Coordinator::Stub& stub, const std::string& id,
                     absl::Duration deadline, JobInfo* job) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  JobRequest request;
  request.set_job_id(id);
  request.set_log_since(JobTable::kNoLog);
  return stub.GetJob(&context, request, job);
}

// The job, retried while the coordinator cannot be reached (it may come up
// after the agents) for at most `timeout`.
absl::StatusOr<JobInfo> FetchJob(const std::string& coordinator,
                                 const std::string& id, const TlsOptions& tls,
                                 absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<Coordinator::Stub> stub,
                   JobReaderStub(coordinator, id, tls));
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    JobInfo job;
    const grpc::Status status = ReadJob(*stub, id, absl::Seconds(10), &job);
    if (status.ok()) return job;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "coordinator ", coordinator, ": ", status.error_message()));
    }
    if (absl::Now() > give_up) {
      return absl::UnavailableError(
          absl::StrCat("coordinator ", coordinator, " unreachable for ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Seconds(1));
  }
}

}  // namespace

std::set<std::string> LocalNames() {
  std::set<std::string> names = {"localhost"};
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
    const std::string full(host);
    names.insert(full);
    names.insert(full.substr(0, full.find('.')));
  }
  ifaddrs* addresses = nullptr;
  if (getifaddrs(&addresses) == 0) {
    for (ifaddrs* a = addresses; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      char text[INET6_ADDRSTRLEN] = {};
      if (a->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET,
                  &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                  sizeof(text));
      } else if (a->ifa_addr->sa_family == AF_INET6) {
        inet_ntop(AF_INET6,
                  &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr,
                  text, sizeof(text));
      } else {
        continue;
      }
      names.insert(text);
    }
    freeifaddrs(addresses);
  }
  return names;
}

absl::StatusOr<std::vector<NodeTask>> PlanNodeTasks(
    const JobSpec& spec, const NodePlacement& placement) {
  const bool have_hosts =
      !spec.ps_hosts().empty() || !spec.worker_hosts().empty();
  if (!have_hosts && (placement.num_nodes < 1 || placement.node_rank < 0 ||
                      placement.node_rank >= placement.num_nodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node rank ", placement.node_rank, " of ", placement.num_nodes,
        " nodes; expected 0..", placement.num_nodes - 1));
  }
  std::vector<NodeTask> tasks;
  for (TaskRole role : {ROLE_PS, ROLE_WORKER}) {
    const auto& hosts = role == ROLE_PS ? spec.ps_hosts() : spec.worker_hosts();
    const int first = role == ROLE_PS ? spec.num_ps() : spec.num_workers();
    const int count =
        std::max(first, role == ROLE_PS ? spec.max_ps() : spec.max_workers());
    for (int i = 0; i < count; ++i) {
      const bool here =
          have_hosts ? i < hosts.size() &&
                           placement.local_names.count(hosts[i].host()) > 0
                     : i % placement.num_nodes == placement.node_rank;
      if (!here) continue;
      NodeTask task;
      task.role = role;
      task.index = i;
      // standby_workers: the workers past num_workers start with the job
      // (TASK_STANDBY, waiting to be added).
      task.on_scale =
          i >= first && !(role == ROLE_WORKER && spec.standby_workers());
      tasks.push_back(task);
    }
  }
  if (tasks.empty() && have_hosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("no task of the job runs on this node (",
                     absl::StrJoin(placement.local_names, ", "),
                     "); expected one of the spec's hosts"));
  }
  const int workers = static_cast<int>(
      std::count_if(tasks.begin(), tasks.end(),
                    [](const NodeTask& t) { return t.role == ROLE_WORKER; }));
  int local_worker = 0;
  for (NodeTask& t : tasks) {
    if (t.role != ROLE_WORKER) continue;
    t.threads = std::max(1, placement.cores / std::max(1, workers));
    if (placement.gpus_per_node > 0) {
      t.gpu = local_worker % placement.gpus_per_node;
    }
    ++local_worker;
  }
  return tasks;
}

std::vector<std::string> NodeTaskArgv(const NodeTask& task,
                                      const std::string& binary,
                                      const NodeTaskContext& context) {
  std::vector<std::string> argv = {
      binary, absl::StrCat("--coordinator=", context.coordinator),
      absl::StrCat("--job=", context.job_id),
      absl::StrCat("--task_index=", task.index),
      absl::StrCat("--threads=", task.threads)};
  if (task.gpu >= 0) argv.push_back(absl::StrCat("--gpu=", task.gpu));
  for (std::string& flag :
       TaskTlsFlags(context.tls, context.insecure_allow_remote)) {
    argv.push_back(std::move(flag));
  }
  return argv;
}

namespace {

// --job, else $JOB when --job is "$JOB"; INVALID_ARGUMENT if neither is set.
absl::StatusOr<std::string> NodeJobId() {
  std::string job_id = absl::GetFlag(FLAGS_job);
  if (job_id == "$JOB") {
    const char* from_env = std::getenv("JOB");
    job_id = from_env != nullptr ? from_env : "";
  }
  if (job_id.empty()) {
    return absl::InvalidArgumentError(
        "--job is not set (nor JOB); expected the id `pstrain submit` "
        "printed");
  }
  return job_id;
}

// The most nodes and GPUs per node the flags take.
constexpr int kMaxNodes = 65536;
constexpr int kMaxGpusPerNode = 64;

// This node's names, cores and GPUs, and its rank among the job's nodes
// from --node_rank/--num_nodes, else Slurm's or Open MPI's environment;
// INVALID_ARGUMENT naming a flag out of range or a variable that is not a
// count.
absl::StatusOr<NodePlacement> PlacementFromFlags() {
  // The flags' ranges first (a negative --gpus_per_node divided by it).
  RETURN_IF_ERROR(FirstError(
      {CheckFlagRange("node_rank", absl::GetFlag(FLAGS_node_rank), -1,
                      kMaxNodes - 1),
       CheckFlagRange("num_nodes", absl::GetFlag(FLAGS_num_nodes), 0,
                      kMaxNodes),
       CheckFlagRange("gpus_per_node", absl::GetFlag(FLAGS_gpus_per_node), 0,
                      kMaxGpusPerNode),
       CheckFlagRange("node_grace_s", absl::GetFlag(FLAGS_node_grace_s), 0,
                      86400, "seconds")}));
  if (const int rank = absl::GetFlag(FLAGS_node_rank),
      nodes = absl::GetFlag(FLAGS_num_nodes);
      rank >= 0 && nodes > 0 && rank >= nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank=", rank, ": expected 0 to ", nodes - 1,
                     " (--num_nodes=", nodes, ")"));
  }
  NodePlacement placement;
  placement.local_names = LocalNames();
  placement.cores = UsableCores();
  placement.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  placement.node_rank = absl::GetFlag(FLAGS_node_rank);
  placement.num_nodes = absl::GetFlag(FLAGS_num_nodes);
  if (placement.node_rank < 0) {
    absl::StatusOr<int> rank =
        FromEnvironment({"SLURM_NODEID", "OMPI_COMM_WORLD_RANK"});
    if (!rank.ok()) return rank.status();
    placement.node_rank = std::max(0, *rank);
  }
  if (placement.num_nodes <= 0) {
    absl::StatusOr<int> nodes =
        FromEnvironment({"SLURM_NNODES", "OMPI_COMM_WORLD_SIZE"});
    if (!nodes.ok()) return nodes.status();
    placement.num_nodes = std::max(1, *nodes);
  }
  return placement;
}

// One node's part of a job: its coordinator, job and TLS, which its tasks
// are given too, and the job's spec.
struct NodeRun : NodeTaskContext {
  // The job's spec, as the coordinator holds it, and its choices.
  JobConfig config;
};

// The launches of `tasks` (`ps` and `worker`: their binaries), and in
// `names` each one's name with its GPU and threads ("worker1 (GPU 1) 4
// threads").
std::vector<SupervisedTask> NodeLaunches(const std::vector<NodeTask>& tasks,
                                         const std::string& ps,
                                         const std::string& worker,
                                         const NodeRun& run,
                                         std::vector<std::string>* names) {
  std::vector<SupervisedTask> launches;
  for (const NodeTask& t : tasks) {
    const bool is_ps = t.role == ROLE_PS;
    SupervisedTask launch;
    launch.role = t.role;
    launch.index = t.index;
    launch.argv = NodeTaskArgv(t, is_ps ? ps : worker, run);
    names->push_back(absl::StrCat(
        launch.key(), t.gpu >= 0 ? absl::StrCat(" (GPU ", t.gpu, ")") : "", " ",
        t.threads, t.threads == 1 ? " thread" : " threads"));
    launches.push_back(std::move(launch));
  }
  return launches;
}

// An elastic job's tasks of this node that a Scale adds (cli/local_job's
// ScaledTasks, over the coordinator's GetJob): every planned task the
// coordinator has waiting to register for a membership it was not started
// for, and that is not running (the first tasks before they registered,
// restarted ones, and a removed one that a Scale took back while it still
// exits, which is started once it has). Polled from the supervisor's
// thread (SupervisorOptions::more_tasks); the job is read every 500 ms at
// most, each read with a 5 s deadline (an error waits for the next).
class NodeScaler {
 public:
  NodeScaler(const NodeRun& run, std::vector<SupervisedTask> planned)
      : run_(run) {
    for (SupervisedTask& t : planned) {
      std::string key = t.key();
      planned_.emplace(std::move(key), std::move(t));
    }
  }

  void set_supervisor(const NodeSupervisor* supervisor) {
    supervisor_ = supervisor;
  }

  std::vector<SupervisedTask> Poll() {
    std::vector<SupervisedTask> start;
    if (absl::Now() - last_read_ < absl::Milliseconds(500)) return start;
    last_read_ = absl::Now();
    absl::StatusOr<JobInfo> job = Read();
    if (!job.ok() || job->state() != JOB_RUNNING) return start;
    const int64_t epoch = job->membership().epoch();
    for (const TaskInfo& t : job->tasks()) {
      if (t.state() != TASK_WAITING) continue;
      SupervisedTask named;
      named.role = t.role();
      named.index = t.index();
      const std::string key = named.key();
      auto planned = planned_.find(key);
      if (planned == planned_.end()) continue;  // another node's
      if (supervisor_ != nullptr && supervisor_->Running(key)) continue;
      auto [it, added] = launched_.emplace(key, epoch);
      if (!added && it->second >= epoch) continue;
      it->second = epoch;
      std::printf("%s: starting %s for membership %lld\n", kProgram,
                  key.c_str(), static_cast<long long>(epoch));
      std::fflush(stdout);
      start.push_back(planned->second);
      ++started_;
    }
    return start;
  }

  // Tasks Poll() has started.
  int started() const { return started_; }

 private:
  absl::StatusOr<JobInfo> Read() {
    if (stub_ == nullptr) {
      ASSIGN_OR_RETURN(stub_,
                       JobReaderStub(run_.coordinator, run_.job_id, run_.tls));
    }
    JobInfo job;
    const grpc::Status status =
        ReadJob(*stub_, run_.job_id, absl::Seconds(5), &job);
    if (!status.ok()) {
      return absl::UnavailableError(std::string(status.error_message()));
    }
    return job;
  }

  const NodeRun& run_;
  std::map<std::string, SupervisedTask> planned_;  // by key()
  std::map<std::string, int64_t> launched_;        // key -> membership epoch
  std::unique_ptr<Coordinator::Stub> stub_;
  const NodeSupervisor* supervisor_ = nullptr;
  absl::Time last_read_ = absl::InfinitePast();
  int started_ = 0;
};

// The supervisor of `run`'s tasks (cli/node_supervisor: restarts through
// the coordinator's RestartTask) with this command's lines: the first
// failure, and the tasks stopped --node_grace_s after it or the job's end.
SupervisorOptions NodeSupervision(const NodeRun& run) {
  SupervisorOptions options;
  options.program = kProgram;
  options.names = TaskNames::kOutputPrefix;
  options.coordinator = run.coordinator;
  options.job_id = run.job_id;
  options.tls = run.tls;
  options.spec = run.config.spec;
  options.end_grace = absl::Seconds(absl::GetFlag(FLAGS_node_grace_s));
  options.stop_signal = &g_node_signal;
  const absl::Duration grace = options.end_grace;
  options.on_failure = [grace](const SupervisedTask&, const ChildExit& exit) {
    PrintError(kProgram,
               absl::StrCat(exit.role, " exited with status ", exit.code,
                            exit.last_error_line.empty() ? "" : ": ",
                            exit.last_error_line, "; the other tasks get ",
                            absl::FormatDuration(grace), " to end"));
  };
  options.on_grace_over = [](JobState, const std::vector<SupervisedTask>&) {
    PrintError(kProgram, "stopping the tasks still running");
  };
  return options;
}

// Supervises the tasks to their end; the first failure decides the exit
// status.
int WaitForNodeTasks(NodeSupervisor* supervisor, size_t num_first,
                     const NodeScaler& scaler) {
  const SupervisorResult result = supervisor->Run();
  const size_t num_tasks = num_first + static_cast<size_t>(scaler.started());
  if (result.signal != 0) {
    return Fail(result.exit_code,
                absl::StrCat("stopped by signal ", result.signal,
                             "; stopped every task of this node"));
  }
  if (result.first_failure.role.empty()) {
    std::printf("%s: all %zu tasks of this node exited 0\n", kProgram,
                num_tasks);
    return 0;
  }
  return Fail(result.exit_code,
              absl::StrCat("FAILED: ", result.first_failure.role,
                           " exited with status ", result.first_failure.code));
}

}  // namespace

int NodeCommand(const std::vector<std::string>& args,
                const std::string& ps_binary,
                const std::string& worker_binary) {
  if (!args.empty()) {
    return Fail(2,
                "usage: pstrain node --coordinator=HOST:PORT --job=ID "
                "[--node_rank=R --num_nodes=N] [--gpus_per_node=G] "
                "[--bin_dir=DIR]");
  }
  if (FlagSpecified("bin_dir")) {
    for (const char* flag : {"ps_binary", "worker_binary"}) {
      if (FlagSpecified(flag)) {
        return Fail(2, absl::StrCat("--", flag,
                                    " would be ignored: --bin_dir names the "
                                    "tasks' binaries; see pstrain help node"));
      }
    }
  }
  absl::StatusOr<std::string> job_id = NodeJobId();
  if (!job_id.ok()) return Fail(2, std::string(job_id.status().message()));
  absl::StatusOr<NodePlacement> placement = PlacementFromFlags();
  if (!placement.ok()) {
    return Fail(2, std::string(placement.status().message()));
  }
  NodeRun run;
  run.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (absl::Status s = CheckGrpcTarget("coordinator", run.coordinator);
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  run.job_id = *job_id;
  absl::StatusOr<TlsOptions> tls = TlsOptionsFromFlags(kProgram);
  if (!tls.ok()) return Fail(2, std::string(tls.status().message()));
  run.tls = *tls;
  run.insecure_allow_remote = absl::GetFlag(FLAGS_insecure_allow_remote);
  absl::StatusOr<JobInfo> job =
      FetchJob(run.coordinator, run.job_id, run.tls, absl::Seconds(120));
  if (!job.ok()) return Fail(1, std::string(job.status().message()));
  // The coordinator validated the spec when it was submitted.
  absl::StatusOr<JobConfig> config = ParseJobChoices(job->spec());
  if (!config.ok()) {
    return Fail(1, absl::StrCat(run.job_id, ": ", config.status().message()));
  }
  run.config = *std::move(config);
  if (absl::Status s = CheckIgnoredNodeFlags(run.config); !s.ok()) {
    return Fail(2, absl::StrCat(run.job_id, ": ", s.message()));
  }
  absl::StatusOr<std::vector<NodeTask>> tasks =
      PlanNodeTasks(run.config.spec, *placement);
  if (!tasks.ok()) {
    return Fail(2, absl::StrCat(run.job_id, ": ", tasks.status().message()));
  }
  const std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  const std::string ps =
      bin_dir.empty() ? ps_binary : absl::StrCat(bin_dir, "/pstrain_ps");
  const std::string worker = bin_dir.empty()
                                 ? worker_binary
                                 : absl::StrCat(bin_dir, "/pstrain_worker");

  std::signal(SIGINT, OnNodeSignal);
  std::signal(SIGTERM, OnNodeSignal);
  std::vector<std::string> names, planned_names;
  std::vector<NodeTask> first, on_scale;
  for (const NodeTask& t : *tasks) (t.on_scale ? on_scale : first).push_back(t);
  const std::vector<SupervisedTask> launches =
      NodeLaunches(first, ps, worker, run, &names);
  // An elastic job: every planned task may be (re)started by a Scale.
  NodeScaler scaler(run, NodeLaunches(*tasks, ps, worker, run, &planned_names));
  SupervisorOptions supervision = NodeSupervision(run);
  if (IsElastic(run.config.spec)) {
    supervision.more_tasks = [&scaler] { return scaler.Poll(); };
  }
  NodeSupervisor supervisor(supervision);
  scaler.set_supervisor(&supervisor);
  if (absl::Status s = supervisor.Start(launches); !s.ok()) {
    return Fail(1, std::string(s.message()));
  }
  std::printf("%s: node %d of %d, %d cores: started %s%s\n", kProgram,
              placement->node_rank, placement->num_nodes, placement->cores,
              absl::StrJoin(names, ", ").c_str(),
              on_scale.empty() ? ""
                               : absl::StrCat("; ", on_scale.size(),
                                              " more if the job scales up")
                                     .c_str());
  std::fflush(stdout);
  return WaitForNodeTasks(&supervisor, first.size(), scaler);
}

}  // namespace pstrain
