#include "coordinator/task_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "common/tls_flags.h"
#include "coordinator/job_spec.h"

ABSL_FLAG(std::string, coordinator, "",
          "host:port of the pstrain coordinator (required).");
ABSL_FLAG(std::string, job, "",
          "Id of the job to join, as `pstrain submit` printed it (required).");
ABSL_FLAG(std::string, role, "",
          "ps or worker; optional, must match the binary.");
ABSL_FLAG(int, task_index, -1,
          "This task's index among the job's tasks of its role; unset: "
          "SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or "
          "JOB_COMPLETION_INDEX (a Kubernetes Indexed Job).");
ABSL_FLAG(std::string, bind, "",
          "Address to listen on (PS); unset: the advertised host's address, "
          "so that only the interface other tasks reach listens (0.0.0.0: "
          "all).");
ABSL_FLAG(int, port, -1,
          "Port to listen on; unset: the job spec's port for this task, else "
          "any free port.");
ABSL_FLAG(std::string, advertise, "",
          "host[:port] other tasks use to reach this one; unset: the job "
          "spec's host for this task, else this machine's hostname.");
ABSL_FLAG(double, heartbeat_interval_s, 1.0,
          "Seconds between heartbeats to the coordinator.");
ABSL_FLAG(int, coordinator_timeout_s, 120,
          "Give up (and exit) after the coordinator has been unreachable "
          "this long, seconds.");
ABSL_FLAG(int, coordinator_rpc_timeout_s, 30,
          "Deadline of each call to the coordinator, seconds.");
ABSL_FLAG(int, threads, 0,
          "CPU threads of this task (a worker's oneDNN/OpenMP pool); 0: "
          "OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, the cores divided by "
          "OMPI_COMM_WORLD_LOCAL_SIZE, else every core (with a warning).");

namespace pstrain {

absl::StatusOr<int> ResolveTaskIndex(
    int flag, const std::function<const char*(const char*)>& getenv) {
  if (flag >= 0) return flag;
  for (const char* variable : kTaskIndexVariables) {
    const char* value = getenv(variable);
    if (value == nullptr) continue;
    int index = -1;
    if (!absl::SimpleAtoi(value, &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          variable, "=", value, ": expected a non-negative task index"));
    }
    return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--task_index is not set and none of ",
                   absl::StrJoin(kTaskIndexVariables, ", "),
                   " is in the environment; expected the task's index"));
}

namespace {

// --advertise's port, if it names one: -1 if not (a host alone),
// INVALID_ARGUMENT if it is not 0 to 65535.
absl::StatusOr<int> AdvertisedPort(const std::string& advertise) {
  const size_t colon = advertise.rfind(':');
  if (colon == std::string::npos) return -1;
  int port = -1;
  if (!absl::SimpleAtoi(advertise.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--advertise=", advertise,
                     ": expected host or host:PORT, PORT 0 to 65535"));
  }
  return port;
}

}  // namespace

absl::Status CheckTaskFlags(TaskRole role) {
  const int max_index = (role == ROLE_PS ? kMaxNumPs : kMaxNumWorkers) - 1;
  const int index = absl::GetFlag(FLAGS_task_index);
  if (index < -1 || index > max_index) {
    return absl::InvalidArgumentError(
        absl::StrCat("--task_index=", index, ": expected 0 to ", max_index,
                     " (-1: from the launcher's environment)"));
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (port < -1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port=", port,
                     ": expected 0 to 65535 (0: any free port; -1: the job "
                     "spec's)"));
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0 || threads > kMaxTaskThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", threads, ": expected 1 to ", kMaxTaskThreads,
                     " (0: automatic)"));
  }
  const std::string advertise = absl::GetFlag(FLAGS_advertise);
  ASSIGN_OR_RETURN(const int advertised_port, AdvertisedPort(advertise));
  if (advertised_port >= 0 && port > 0 && advertised_port != port) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise=", advertise, ": expected host or host:", port,
        " (the port this task listens on, --port)"));
  }
  // An empty one is named below, with the task's other identity flags.
  if (const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
      !coordinator.empty()) {
    RETURN_IF_ERROR(CheckGrpcTarget("coordinator", coordinator));
  }
  const double interval = absl::GetFlag(FLAGS_heartbeat_interval_s);
  if (!(interval >= 0.01 && interval <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval_s=", interval,
                     ": expected 0.01 to 3600 seconds"));
  }
  return FirstError(
      {CheckFlagRange("coordinator_timeout_s",
                      absl::GetFlag(FLAGS_coordinator_timeout_s), 1, 86400,
                      "seconds"),
       CheckFlagRange("coordinator_rpc_timeout_s",
                      absl::GetFlag(FLAGS_coordinator_rpc_timeout_s), 1, 86400,
                      "seconds")});
}

absl::StatusOr<TaskAgentOptions> TaskAgentOptionsFromFlags(TaskRole role) {
  RETURN_IF_ERROR(CheckTaskFlags(role));
  TaskAgentOptions options;
  options.role = role;
  const char* role_name = role == ROLE_PS ? "ps" : "worker";
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator is not set; expected host:port of the coordinator");
  }
  options.job_id = absl::GetFlag(FLAGS_job);
  if (options.job_id.empty()) {
    return absl::InvalidArgumentError(
        "--job is not set; expected the id `pstrain submit` printed");
  }
  const std::string flag_role = absl::GetFlag(FLAGS_role);
  if (!flag_role.empty() && flag_role != role_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("--role=", flag_role, ": this binary runs ", role_name,
                     " tasks; expected ", role_name));
  }
  ASSIGN_OR_RETURN(
      options.index,
      ResolveTaskIndex(absl::GetFlag(FLAGS_task_index),
                       [](const char* v) { return std::getenv(v); }));
  // A supervisor outside pstrain (Kubernetes) restarts this task.
  const char* self_restart = std::getenv(kSelfRestartVariable);
  options.self_restart =
      self_restart != nullptr && std::string(self_restart) == "1";
  absl::StatusOr<TlsOptions> tls =
      TlsOptionsFromFlags(role_name, "", /*warn=*/false);
  if (!tls.ok()) return tls.status();
  TlsIdentity self;
  self.role = role == ROLE_PS ? TlsRole::kPs : TlsRole::kWorker;
  self.index = options.index;
  self.job = options.job_id;
  if (absl::Status s = CheckTlsFiles(*tls, self); !s.ok()) return s;
  options.tls = *tls;
  options.heartbeat_interval =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_interval_s));
  options.coordinator_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_coordinator_timeout_s));
  options.rpc_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_coordinator_rpc_timeout_s));
  return options;
}

absl::StatusOr<TaskAddress> TaskAddressFromFlags(const JobSpec& spec,
                                                 TaskRole role, int index) {
  const auto& hosts = role == ROLE_PS ? spec.ps_hosts() : spec.worker_hosts();
  const HostPort* planned = index < hosts.size() ? &hosts[index] : nullptr;
  TaskAddress address;
  address.bind = absl::GetFlag(FLAGS_bind);
  address.port = absl::GetFlag(FLAGS_port);
  if (address.port < 0) address.port = planned ? planned->port() : 0;
  if (address.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port=", address.port, ": expected 0..65535"));
  }
  std::string advertise = absl::GetFlag(FLAGS_advertise);
  if (!advertise.empty()) {
    const size_t colon = advertise.rfind(':');
    if (colon != std::string::npos) {
      int port = 0;
      if (!absl::SimpleAtoi(advertise.substr(colon + 1), &port) ||
          (address.port != 0 && port != address.port)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--advertise=", advertise, ": expected host or host:", address.port,
            " (the port this task listens on)"));
      }
      address.port = port;
      advertise = advertise.substr(0, colon);
    }
    address.advertise_host = advertise;
  } else if (planned != nullptr) {
    address.advertise_host = planned->host();
  } else {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
      return absl::InvalidArgumentError(
          "--advertise is not set and the hostname is unknown; expected "
          "host[:port]");
    }
    address.advertise_host = name;
  }
  // Safe default: only the interface the other tasks are told to use.
  if (address.bind.empty()) address.bind = address.advertise_host;
  return address;
}

absl::StatusOr<TaskThreads> ResolveTaskThreads(
    int flag, int cores,
    const std::function<const char*(const char*)>& getenv) {
  TaskThreads out;
  if (flag < 0 || flag > kMaxTaskThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", flag, ": expected 1 to ", kMaxTaskThreads,
                     " (0: automatic)"));
  }
  if (flag > 0) {
    out.threads = flag;
    out.source = "--threads";
    return out;
  }
  for (const char* variable : {"OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK",
                               "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* value = getenv(variable);
    if (value == nullptr || *value == '\0') continue;
    int n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable, "=", value,
                       ": expected a positive integer (or pass "
                       "--threads)"));
    }
    if (std::string(variable) == "OMPI_COMM_WORLD_LOCAL_SIZE") {
      out.threads = std::max(1, cores / n);
      out.source = absl::StrCat(variable, "=", n, " of ", cores, " cores");
    } else {
      out.threads = n;
      out.source = variable;
    }
    return out;
  }
  out.threads = std::max(1, cores);
  out.source = absl::StrCat("all ", cores, " cores");
  out.warning = true;
  return out;
}

absl::StatusOr<int> TaskThreadsFromFlags(TaskAgent& agent, const char* program,
                                         bool warn, int* exit_code) {
  absl::StatusOr<TaskThreads> threads =
      ResolveTaskThreads(absl::GetFlag(FLAGS_threads), UsableCores(),
                         [](const char* name) { return std::getenv(name); });
  if (!threads.ok()) {
    *exit_code =
        FailTask(agent, program, 2, std::string(threads.status().message()));
    return threads.status();
  }
  agent.Log(absl::StrCat(agent.name(), ": ", threads->threads,
                         threads->threads == 1 ? " thread (" : " threads (",
                         threads->source, ")"));
  if (warn && threads->warning) {
    std::fprintf(stderr,
                 "%s: warning: %s: no --threads, OMP_NUM_THREADS, "
                 "SLURM_CPUS_PER_TASK or OMPI_COMM_WORLD_LOCAL_SIZE; using "
                 "all %d cores. Pass --threads if other tasks share this "
                 "node.\n",
                 program, agent.name().c_str(), threads->threads);
    std::fflush(stderr);
  }
  return threads->threads;
}

int FailTask(TaskAgent& agent, const char* program, int exit_code,
             const std::string& message) {
  PrintError(program, absl::StrCat(agent.name(), ": ", message));
  absl::Status s = agent.Finish(false, message);
  if (!s.ok()) PrintError(program, s.message());
  return exit_code;
}

absl::StatusOr<JoinedTask> JoinJobFromFlags(TaskRole role, const char* program,
                                            int* exit_code) {
  absl::StatusOr<TaskAgentOptions> options = TaskAgentOptionsFromFlags(role);
  if (!options.ok()) {
    PrintError(program, options.status().message());
    *exit_code = 2;
    return options.status();
  }
  JoinedTask task;
  task.agent = std::make_unique<TaskAgent>(*options);
  absl::StatusOr<JobSpec> spec = task.agent->FetchSpec();
  if (!spec.ok()) {
    PrintError(program,
               absl::StrCat(task.agent->name(), ": ", spec.status().message()));
    *exit_code = 1;
    return spec.status();
  }
  // An elastic job's worker tasks are its max_workers, its PS tasks its
  // max_ps (issue 40).
  const int count = role == ROLE_PS
                        ? std::max(spec->num_ps(), spec->max_ps())
                        : std::max(spec->num_workers(), spec->max_workers());
  if (options->index >= count) {
    // Not a task of this job, so the coordinator would refuse its report.
    const absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("task index ", options->index, " is outside the job's ",
                     count, " ", role == ROLE_PS ? "ps" : "worker", " tasks"));
    PrintError(program,
               absl::StrCat(task.agent->name(), ": ", status.message()));
    *exit_code = 2;
    return status;
  }
  // Validated at submission; its choices are parsed here, once per task.
  absl::StatusOr<JobConfig> config = ResolveJobSpec(*spec);
  if (!config.ok()) {
    *exit_code = FailTask(*task.agent, program, 2,
                          std::string(config.status().message()));
    return config.status();
  }
  task.config = *std::move(config);
  absl::StatusOr<TaskAddress> address =
      TaskAddressFromFlags(task.config.spec, role, options->index);
  if (!address.ok()) {
    *exit_code = FailTask(*task.agent, program, 2,
                          std::string(address.status().message()));
    return address.status();
  }
  task.address = *std::move(address);
  return task;
}

}  // namespace pstrain
