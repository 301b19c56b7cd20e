#include "cli/launch_lines.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "coordinator/job_membership.h"
#include "coordinator/job_spec.h"

ABSL_DECLARE_FLAG(std::string, coordinator);  // cli/job_commands.cc

ABSL_FLAG(std::string, launcher, "",
          "launch-lines: slurm, mpirun, ssh or kubernetes.");
ABSL_FLAG(std::string, job, "$JOB",
          "launch-lines: the job id the script passes to the tasks (default: "
          "the script's environment variable JOB, e.g. "
          "JOB=$(pstrain submit JOB.pbtxt)).");
ABSL_FLAG(std::string, bin_dir, "",
          "launch-lines: the folder holding pstrain_ps and pstrain_worker on "
          "every node (default: this pstrain's folder when it is an installed "
          "one, see pstrain install).");
ABSL_FLAG(bool, sbatch, false,
          "launch-lines, slurm: add an #SBATCH header asking for the job's "
          "tasks, so that `sbatch --wait launch.sh` runs the script.");
ABSL_FLAG(int, cpus_per_task, 1,
          "launch-lines, slurm: CPUs of each task (srun --cpus-per-task); "
          "each task runs that many threads.");
ABSL_FLAG(bool, agent, false,
          "launch-lines: start one `pstrain node` agent per node, which "
          "starts that node's tasks (see pstrain node).");
ABSL_FLAG(int, nodes, 1,
          "launch-lines --agent, spec without hosts: how many nodes get an "
          "agent.");
ABSL_FLAG(int, gpus_per_node, 0,
          "GPUs per node: launch-lines --agent passes it to the agents, "
          "which give worker k of a node GPU k % this.");
ABSL_FLAG(std::string, image, "",
          "launch-lines --launcher=kubernetes: the container image holding "
          "the binaries in --bin_dir (default /opt/pstrain/bin).");
ABSL_FLAG(std::string, k8s_objects, "tasks",
          "launch-lines --launcher=kubernetes: coordinator (its Deployment "
          "and Service) or tasks (per role a headless Service and an Indexed "
          "Job; needs --job=ID).");
ABSL_FLAG(std::string, memory_per_task, "",
          "launch-lines --launcher=kubernetes: each task's memory request and "
          "limit, a Kubernetes quantity (4Gi); unset: none.");
ABSL_FLAG(int, gpus_per_worker, 0,
          "launch-lines --launcher=kubernetes: each worker pod's "
          "nvidia.com/gpu limit.");
ABSL_FLAG(std::string, prefix, "",
          "install: copy the binaries to PREFIX/bin (created if missing).");

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

// The flags of launch-lines that `options` (built from them) and `spec`
// would ignore, given on the command line anyway: an error naming the
// first, as `pstrain run` refuses the flags its mode ignores.
absl::Status CheckIgnoredLaunchFlags(const JobSpec& spec,
                                     const LaunchOptions& options) {
  auto ignored = [](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " would be ignored: ", why,
                     "; see pstrain help launch-lines"));
  };
  const bool have_hosts =
      !spec.ps_hosts().empty() || !spec.worker_hosts().empty();
  if (!options.agent) {
    for (const char* flag : {"nodes", "gpus_per_node"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, "it is for --agent (one pstrain node per node)");
      }
    }
    if (FlagSpecified("bin_dir") && FlagSpecified("ps_binary") &&
        FlagSpecified("worker_binary")) {
      return ignored("bin_dir",
                     "--ps_binary and --worker_binary name both binaries");
    }
  } else {
    if (have_hosts && FlagSpecified("nodes")) {
      return ignored("nodes",
                     "the job spec lists hosts, one agent runs on each");
    }
    for (const char* flag : {"ps_binary", "worker_binary"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag,
                       "with --agent, each pstrain node starts the binaries "
                       "in --bin_dir");
      }
    }
  }
  if (options.launcher != "kubernetes") {
    for (const char* flag :
         {"image", "k8s_objects", "memory_per_task", "gpus_per_worker"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, "it is for --launcher=kubernetes");
      }
    }
  } else if (options.agent) {
    return absl::InvalidArgumentError(
        "--agent with --launcher=kubernetes: each pod runs one task; expected "
        "no --agent");
  }
  if (FlagSpecified("cpus_per_task") &&
      ((options.launcher != "slurm" && options.launcher != "kubernetes") ||
       options.agent)) {
    return ignored("cpus_per_task",
                   options.agent
                       ? "with --agent, each pstrain node divides its cores"
                       : absl::StrCat("it is for --launcher=slurm or "
                                      "kubernetes, not ",
                                      options.launcher));
  }
  return absl::OkStatus();
}

// What the script does around the launcher commands: `task NAME CMD...`
// starts CMD in the background in its own process group; its wrapper
// outlives a SIGTERM to that group and appends "STATUS NAME" to $done_file
// when CMD ends, so the file lists the commands in the order they ended.
constexpr char kPrologue[] = R"sh(GRACE_S="${PSTRAIN_GRACE_S:-60}"
done_file="$(mktemp)"
trap 'rm -f "$done_file"' EXIT
pids=()
# task NAME COMMAND...: runs COMMAND in the background, in its own process
# group; when it ends, "STATUS NAME" is appended to $done_file.
task() {
  local name="$1"
  shift
  echo "launch: starting $name" >&2
  set -m
  {
    trap : TERM INT
    rc=0
    "$@" || rc=$?
    echo "$rc $name" >>"$done_file"
  } &
  set +m
  pids+=("$!")
}
# stop SIGNAL: sends SIGNAL to every task's process group.
stop() {
  local pid
  for pid in "${pids[@]}"; do kill -s "$1" -- "-$pid" 2>/dev/null || true; done
}
trap 'stop TERM; exit 143' TERM
trap 'stop TERM; exit 130' INT
)sh";

// Waits for every task; the first that failed decides the exit status.
constexpr char kEpilogue[] = R"sh(
failed=""
status=0
stop_at=-1
while true; do
  finished="$(wc -l <"$done_file")"
  if [[ -z "$failed" ]]; then
    while read -r rc name; do
      if [[ "$rc" != 0 ]]; then
        failed="$name"
        status="$rc"
        break
      fi
    done <"$done_file"
    if [[ -n "$failed" ]]; then
      echo "launch: $failed exited with status $status; the other tasks get ${GRACE_S} s to end" >&2
      stop_at=$((SECONDS + GRACE_S))
    fi
  fi
  ((finished < ${#pids[@]})) || break
  alive=0
  for pid in "${pids[@]}"; do ! kill -0 "$pid" 2>/dev/null || alive=1; done
  ((alive)) || break
  if ((stop_at >= 0 && SECONDS >= stop_at)); then
    echo "launch: stopping the tasks still running" >&2
    stop TERM
    stop_at=-1
  fi
  sleep 1
done
wait || true
if [[ -n "$failed" ]]; then
  echo "launch: FAILED: $failed exited with status $status" >&2
  exit "$status"
fi
echo "launch: all ${#pids[@]} launcher commands exited 0" >&2
)sh";

struct Role {
  const char* name;  // "ps", "worker"
  int count;
  const google::protobuf::RepeatedPtrField<HostPort>* hosts;
  const char* binary_variable;  // "$PS", "$WORKER"
};

// The role's hosts in order of first appearance with their task counts, and
// whether each host's tasks are contiguous in the spec (a, a, b: yes;
// a, b, a: no).
struct HostSlots {
  std::vector<std::pair<std::string, int>> slots;
  bool grouped = true;
};

HostSlots SlotsOf(const google::protobuf::RepeatedPtrField<HostPort>& hosts) {
  HostSlots out;
  std::map<std::string, size_t> where;
  for (const HostPort& h : hosts) {
    auto it = where.find(h.host());
    if (it == where.end()) {
      where[h.host()] = out.slots.size();
      out.slots.push_back({h.host(), 1});
    } else {
      out.grouped &= it->second + 1 == out.slots.size();
      ++out.slots[it->second].second;
    }
  }
  return out;
}

}  // namespace

int LaunchedWorkers(const JobSpec& spec) {
  return spec.standby_workers()
             ? std::max(spec.num_workers(), spec.max_workers())
             : spec.num_workers();
}

namespace {

bool HasHosts(const JobSpec& spec) {
  return !spec.ps_hosts().empty() || !spec.worker_hosts().empty();
}

// Every task of the spec has a host: an elastic job's up to max_ps and
// max_workers (ValidateJobSpec's count), of which the script starts the
// first num_ps and LaunchedWorkers().
bool HasAllHosts(const JobSpec& spec) {
  return spec.ps_hosts().size() == PsTaskCount(spec) &&
         spec.worker_hosts().size() == WorkerTaskCount(spec) && HasHosts(spec);
}

// The launcher and the options LaunchScript can carry out for `spec`.
absl::Status CheckScriptOptions(const JobSpec& spec,
                                const LaunchOptions& options) {
  const std::string& launcher = options.launcher;
  if (launcher != "slurm" && launcher != "mpirun" && launcher != "ssh") {
    return absl::InvalidArgumentError(
        absl::StrCat("--launcher=", launcher,
                     ": expected slurm, mpirun, ssh or kubernetes"));
  }
  const bool all_hosts = HasAllHosts(spec);
  if (launcher == "ssh" && !all_hosts) {
    return absl::InvalidArgumentError(
        "--launcher=ssh needs ps_hosts and worker_hosts in the job spec "
        "(slurm and mpirun do not)");
  }
  if (HasHosts(spec) && !all_hosts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--launcher=", launcher,
        ": the job spec lists hosts for one role only; expected both "
        "ps_hosts and worker_hosts, or neither"));
  }
  if (options.sbatch && launcher != "slurm") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sbatch with --launcher=", launcher, ": expected --launcher=slurm"));
  }
  if (options.agent && options.nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes=", options.nodes, ": expected >= 1"));
  }
  if (options.cpus_per_task < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpus_per_task=", options.cpus_per_task, ": expected >= 1"));
  }
  return absl::OkStatus();
}

// What every part of a launch script reads: the spec and options (checked
// by CheckScriptOptions, both outliving the plan) and what follows from
// them.
struct ScriptPlan {
  const JobSpec* spec = nullptr;
  const LaunchOptions* options = nullptr;
  bool all_hosts = false;  // HasAllHosts(*spec)
  std::vector<Role> roles;
  // The spec's distinct hosts, in order of first appearance.
  std::vector<std::string> distinct_hosts;
  int agents = 0;    // --agent: one per distinct host, else --nodes
  std::string cpus;  // --cpus_per_task
};

ScriptPlan PlanOf(const JobSpec& spec, const LaunchOptions& options) {
  ScriptPlan plan;
  plan.spec = &spec;
  plan.options = &options;
  plan.all_hosts = HasAllHosts(spec);
  plan.roles = {
      {"ps", spec.num_ps(), &spec.ps_hosts(), "$PS"},
      {"worker", LaunchedWorkers(spec), &spec.worker_hosts(), "$WORKER"}};
  for (const Role& role : plan.roles) {
    for (const HostPort& h : *role.hosts) {
      if (std::find(plan.distinct_hosts.begin(), plan.distinct_hosts.end(),
                    h.host()) == plan.distinct_hosts.end()) {
        plan.distinct_hosts.push_back(h.host());
      }
    }
  }
  plan.agents = plan.all_hosts ? static_cast<int>(plan.distinct_hosts.size())
                               : options.nodes;
  plan.cpus = absl::StrCat(options.cpus_per_task);
  return plan;
}

// --sbatch: the #SBATCH lines asking for the job's tasks (or, with --agent,
// one task per node); else empty.
std::string SbatchHeader(const ScriptPlan& plan) {
  const JobSpec& spec = *plan.spec;
  const LaunchOptions& options = *plan.options;
  if (!options.sbatch) return "";
  std::string out =
      absl::StrCat("#SBATCH --job-name=pstrain-", spec.model(), "\n");
  if (options.agent) {
    absl::StrAppend(&out, "#SBATCH --nodes=", plan.agents, "\n");
    if (plan.all_hosts) {
      absl::StrAppend(&out, "#SBATCH --nodelist=",
                      absl::StrJoin(plan.distinct_hosts, ","), "\n");
    }
    absl::StrAppend(&out,
                    "#SBATCH --ntasks-per-node=1\n"
                    "#SBATCH --exclusive\n");
    return out;
  }
  if (plan.all_hosts) {
    std::map<std::string, int> per_host;
    for (const Role& role : plan.roles) {
      for (const HostPort& h : *role.hosts) ++per_host[h.host()];
    }
    int most = 0;
    std::vector<std::string> names;
    for (const auto& [host, count] : per_host) {
      names.push_back(host);
      most = std::max(most, count);
    }
    absl::StrAppend(&out, "#SBATCH --nodes=", per_host.size(), "\n",
                    "#SBATCH --nodelist=", absl::StrJoin(names, ","), "\n",
                    "#SBATCH --ntasks-per-node=", most, "\n");
  } else {
    absl::StrAppend(
        &out, "#SBATCH --ntasks=", spec.num_ps() + LaunchedWorkers(spec), "\n");
  }
  absl::StrAppend(&out, "#SBATCH --cpus-per-task=", plan.cpus, "\n");
  return out;
}

// The comment saying what the script does, the shell options, the job,
// the coordinator and the binaries, and what the launcher needs set up
// (mpirun's options, ssh's environment).
std::string ScriptHead(const ScriptPlan& plan) {
  const JobSpec& spec = *plan.spec;
  const LaunchOptions& options = *plan.options;
  std::string out = absl::StrCat(
      "# Printed by `pstrain launch-lines --launcher=", options.launcher,
      "`: ", "starts the ", spec.num_ps(), " ps and ", LaunchedWorkers(spec),
      " worker tasks of a ", spec.model(), " job on coordinator ",
      options.coordinator,
      ",\n# waits for each, and exits 0 once all exited 0; otherwise it "
      "names the first that failed\n# and exits with its status (the "
      "others get $PSTRAIN_GRACE_S s, default 60, to end first).\n");
  if (options.sbatch) {
    absl::StrAppend(&out,
                    "# Run it with: JOB=<id> sbatch --wait THIS_FILE (or as "
                    "bash inside an allocation).\n");
  }
  absl::StrAppend(&out, "set -euo pipefail\n");
  if (options.job == "$JOB") {
    absl::StrAppend(
        &out,
        "JOB=\"${JOB:?set JOB to the job id, e.g. JOB=$(pstrain submit "
        "job.pbtxt)}\"\n");
  } else {
    absl::StrAppend(&out, "JOB=", ShellQuote(options.job), "\n");
  }
  absl::StrAppend(&out, "COORDINATOR=", ShellQuote(options.coordinator), "\n");
  if (options.agent) {
    absl::StrAppend(&out, "PSTRAIN=", ShellQuote(options.pstrain_binary), "\n");
  } else {
    absl::StrAppend(&out, "PS=", ShellQuote(options.ps_binary), "\n",
                    "WORKER=", ShellQuote(options.worker_binary), "\n");
  }
  if (options.launcher == "mpirun") {
    absl::StrAppend(
        &out,
        "# Open MPI refuses to run as root unless asked to, and passes the\n"
        "# tasks' TLS folder to other nodes only when asked to.\n"
        "mpirun_options=()\n"
        "if [[ \"$(id -u)\" == 0 ]]; then "
        "mpirun_options+=(--allow-run-as-root); fi\n"
        "if [[ -n \"${PSTRAIN_TLS_DIR:-}\" ]]; then "
        "mpirun_options+=(-x PSTRAIN_TLS_DIR); fi\n"
        "# Two mpirun started in the same instant on one host can race on\n"
        "# creating Open MPI's session folder (\"mkdir /tmp/ompi.HOST.UID: "
        "File\n"
        "# exists\", open-mpi/ompi#8510): the mpirun tasks start 0.5 s apart.\n"
        "mpirun_task() { task \"$@\"; sleep 0.5; }\n");
  }
  if (options.launcher == "ssh") {
    absl::StrAppend(&out,
                    "# ssh does not carry the environment: the tasks' TLS "
                    "folder goes with the command.\n"
                    "remote_env=()\n"
                    "if [[ -n \"${PSTRAIN_TLS_DIR:-}\" ]]; then "
                    "remote_env=(env \"PSTRAIN_TLS_DIR=$PSTRAIN_TLS_DIR\"); "
                    "fi\n");
  }
  return out;
}

// mpirun with hosts: a temporary folder for the hostfiles, removed on exit
// with the prologue's done file (after the prologue, whose EXIT trap this
// one replaces); else empty.
std::string HostfilesFolder(const ScriptPlan& plan) {
  if (plan.options->launcher != "mpirun" || !plan.all_hosts) return "";
  return "hostfiles=\"$(mktemp -d)\"\n"
         "trap 'rm -f \"$done_file\"; rm -rf \"$hostfiles\"' EXIT\n";
}

// The flags every task and agent gets.
constexpr char kTaskFlags[] = " --coordinator=\"$COORDINATOR\" --job=\"$JOB\"";

// --agent: the lines starting one `pstrain node` per node.
std::string AgentTasks(const ScriptPlan& plan) {
  const LaunchOptions& options = *plan.options;
  const int agents = plan.agents;
  std::string agent = absl::StrCat("\"$PSTRAIN\" node", kTaskFlags);
  if (options.gpus_per_node > 0) {
    absl::StrAppend(&agent, " --gpus_per_node=", options.gpus_per_node);
  }
  std::string out;
  if (options.launcher == "slurm") {
    absl::StrAppend(&out, "task \"node agents (srun, ", agents,
                    " nodes)\" srun --nodes=", agents, " --ntasks-per-node=1",
                    plan.all_hosts
                        ? absl::StrCat(" --nodelist=",
                                       absl::StrJoin(plan.distinct_hosts, ","))
                        : "",
                    " --job-name=pstrain-node ", agent, "\n");
  } else if (options.launcher == "mpirun") {
    const std::string mpirun =
        "mpirun \"${mpirun_options[@]}\" --map-by ppr:1:node --bind-to none";
    if (plan.all_hosts) {
      absl::StrAppend(&out, "cat >\"$hostfiles/nodes\" <<'EOF'\n");
      for (const std::string& host : plan.distinct_hosts) {
        absl::StrAppend(&out, host, " slots=1\n");
      }
      absl::StrAppend(&out, "EOF\n", "mpirun_task \"node agents (mpirun, ",
                      agents, " nodes)\" ", mpirun, " -np ", agents,
                      " --hostfile \"$hostfiles/nodes\" ", agent, "\n");
    } else {
      absl::StrAppend(&out, "mpirun_task \"node agents (mpirun, ", agents,
                      " nodes)\" ", mpirun, " -np ", agents, " ", agent, "\n");
    }
  } else {
    for (const std::string& host : plan.distinct_hosts) {
      const std::string quoted = ShellQuote(host);
      absl::StrAppend(
          &out, "task \"node agent on ", quoted, "\" ssh -n -o BatchMode=yes ",
          quoted, " \"$(printf '%q ' \"${remote_env[@]}\" ", agent, ")\"\n");
    }
  }
  return out;
}

// slurm: one srun step for the role, or with hosts one per task.
std::string SlurmTasks(const Role& role, const ScriptPlan& plan,
                       const std::string& command) {
  if (!plan.all_hosts) {
    return absl::StrCat("task \"", role.name, " tasks (srun step of ",
                        role.count, ")\" srun --exact --ntasks=", role.count,
                        " --cpus-per-task=", plan.cpus, " --job-name=pstrain-",
                        role.name, " ", command, "\n");
  }
  std::string out;
  for (int i = 0; i < role.count; ++i) {
    const std::string host = ShellQuote((*role.hosts)[i].host());
    absl::StrAppend(&out, "task \"", role.name, " ", i, " on ", host,
                    "\" srun --exact --nodes=1 --ntasks=1 --nodelist=", host,
                    " --cpus-per-task=", plan.cpus, " --job-name=pstrain-",
                    role.name, " ", command, " --task_index=", i, "\n");
  }
  return out;
}

// mpirun: one mpirun for the role (with hosts, over a hostfile in the
// spec's order), or one per task where the role's hosts interleave.
std::string MpirunTasks(const Role& role, const ScriptPlan& plan,
                        const std::string& command) {
  const std::string mpirun = "mpirun \"${mpirun_options[@]}\"";
  const std::string placement = " --map-by slot --bind-to none ";
  if (!plan.all_hosts) {
    return absl::StrCat("mpirun_task \"", role.name, " tasks (mpirun -np ",
                        role.count, ")\" ", mpirun, " -np ", role.count,
                        placement, command, "\n");
  }
  std::string out;
  const HostSlots slots = SlotsOf(*role.hosts);
  if (slots.grouped) {
    const std::string hostfile =
        absl::StrCat("\"$hostfiles/", role.name, "_hosts\"");
    absl::StrAppend(&out, "cat >", hostfile, " <<'EOF'\n");
    for (const auto& [host, count] : slots.slots) {
      absl::StrAppend(&out, host, " slots=", count, "\n");
    }
    absl::StrAppend(&out, "EOF\n");
    absl::StrAppend(&out, "mpirun_task \"", role.name, " tasks (mpirun -np ",
                    role.count, ")\" ", mpirun, " -np ", role.count,
                    " --hostfile ", hostfile, placement, command, "\n");
    return out;
  }
  // Hosts interleaved: rank order cannot follow the spec's order, so each
  // task is its own mpirun with its index.
  for (int i = 0; i < role.count; ++i) {
    const std::string host = ShellQuote((*role.hosts)[i].host());
    absl::StrAppend(&out, "mpirun_task \"", role.name, " ", i, " on ", host,
                    "\" ", mpirun, " -np 1 --host ", host, placement, command,
                    " --task_index=", i, "\n");
  }
  return out;
}

// ssh: one per task; the remote shell gets one string, each word quoted for
// it.
std::string SshTasks(const Role& role, const std::string& binary) {
  std::string out;
  for (int i = 0; i < role.count; ++i) {
    const std::string host = ShellQuote((*role.hosts)[i].host());
    absl::StrAppend(&out, "task \"", role.name, " ", i, " on ", host,
                    "\" ssh -n -o BatchMode=yes ", host,
                    " \"$(printf '%q ' \"${remote_env[@]}\" ", binary,
                    kTaskFlags, " --task_index=", i, ")\"\n");
  }
  return out;
}

// The lines starting the tasks of one role (count > 0) with the launcher.
std::string RoleTasks(const Role& role, const ScriptPlan& plan) {
  const std::string binary = absl::StrCat("\"", role.binary_variable, "\"");
  const std::string command = absl::StrCat(binary, kTaskFlags);
  if (plan.options->launcher == "slurm") {
    return SlurmTasks(role, plan, command);
  }
  if (plan.options->launcher == "mpirun") {
    return MpirunTasks(role, plan, command);
  }
  return SshTasks(role, binary);
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  const bool safe =
      !s.empty() && s.find_first_not_of(
                        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789@%+=:,./_-") == std::string::npos;
  if (safe) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

absl::StatusOr<std::string> LaunchScript(const JobSpec& spec,
                                         const LaunchOptions& options) {
  RETURN_IF_ERROR(CheckScriptOptions(spec, options));
  const ScriptPlan plan = PlanOf(spec, options);
  std::string out =
      absl::StrCat("#!/usr/bin/env bash\n", SbatchHeader(plan),
                   ScriptHead(plan), kPrologue, "\n", HostfilesFolder(plan));
  if (options.agent) {
    absl::StrAppend(&out, AgentTasks(plan));
  } else {
    for (const Role& role : plan.roles) {
      if (role.count > 0) absl::StrAppend(&out, RoleTasks(role, plan));
    }
  }
  absl::StrAppend(&out, kEpilogue);
  return out;
}

std::string InstalledBinDir() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, n);
  dir = dir.substr(0, dir.rfind('/'));
  for (const char* name : {"pstrain_ps", "pstrain_worker"}) {
    if (access(absl::StrCat(dir, "/", name).c_str(), X_OK) != 0) return "";
  }
  return dir;
}

absl::Status InstallBinaries(const std::vector<std::string>& sources,
                             const std::string& prefix,
                             const std::vector<std::string>& names) {
  if (!names.empty() && names.size() != sources.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("install: ", names.size(), " names for ", sources.size(),
                     " binaries; expected one each"));
  }
  const std::string bin = prefix + "/bin";
  std::error_code error;
  std::filesystem::create_directories(bin, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", bin, ": ", error.message()));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string& source = sources[i];
    std::string contents;
    RETURN_IF_ERROR(ReadFile(source, &contents));
    const std::string name =
        names.empty() ? source.substr(source.rfind('/') + 1) : names[i];
    const std::string target = absl::StrCat(bin, "/", name);
    const std::string temporary = absl::StrCat(target, ".tmp");
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot write ", temporary, ": ", std::strerror(errno)));
    }
    size_t written = 0;
    while (written < contents.size()) {
      const ssize_t w =
          write(fd, contents.data() + written, contents.size() - written);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = errno;
        close(fd);
        unlink(temporary.c_str());
        return absl::InternalError(
            absl::StrCat("cannot write ", temporary, ": ", std::strerror(e)));
      }
      written += static_cast<size_t>(w);
    }
    // The umask may have narrowed the mode.
    if (fchmod(fd, 0755) != 0 || close(fd) != 0 ||
        rename(temporary.c_str(), target.c_str()) != 0) {
      const int e = errno;
      unlink(temporary.c_str());
      return absl::InternalError(
          absl::StrCat("cannot install ", target, ": ", std::strerror(e)));
    }
  }
  return absl::OkStatus();
}

int LaunchLinesCommand(const std::vector<std::string>& args,
                       const std::string& ps_binary,
                       const std::string& worker_binary) {
  if (args.size() != 1) {
    return Fail(2,
                "usage: pstrain launch-lines JOB.pbtxt "
                "--launcher=slurm|mpirun|ssh|kubernetes "
                "[--coordinator=HOST:PORT] [--job=ID] [--bin_dir=DIR] "
                "[--sbatch] [--cpus_per_task=N] [--image=IMAGE]");
  }
  std::string text;
  absl::Status s = ReadFile(args[0], &text);
  if (!s.ok()) return Fail(2, std::string(s.message()));
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, args[0]);
  if (!spec.ok()) return Fail(2, std::string(spec.status().message()));
  LaunchOptions options;
  options.launcher = absl::GetFlag(FLAGS_launcher);
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.job = absl::GetFlag(FLAGS_job);
  options.sbatch = absl::GetFlag(FLAGS_sbatch);
  options.cpus_per_task = absl::GetFlag(FLAGS_cpus_per_task);
  options.agent = absl::GetFlag(FLAGS_agent);
  options.nodes = absl::GetFlag(FLAGS_nodes);
  options.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  if (absl::Status s = CheckIgnoredLaunchFlags(*spec, options); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  const bool kubernetes = options.launcher == "kubernetes";
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  // Kubernetes: the binaries' folder in the image.
  if (bin_dir.empty())
    bin_dir = kubernetes ? "/opt/pstrain/bin" : InstalledBinDir();
  if (bin_dir.empty() &&
      (ps_binary.empty() || worker_binary.empty() || options.agent)) {
    return Fail(2,
                "launch-lines: expected --bin_dir=DIR, the folder holding "
                "pstrain_ps and pstrain_worker on every node (this pstrain "
                "runs from Bazel's output tree, which the nodes do not have; "
                "`pstrain install --prefix=DIR` copies the binaries to "
                "DIR/bin)");
  }
  while (bin_dir.size() > 1 && bin_dir.back() == '/') bin_dir.pop_back();
  options.ps_binary =
      ps_binary.empty() ? absl::StrCat(bin_dir, "/pstrain_ps") : ps_binary;
  options.worker_binary = worker_binary.empty()
                              ? absl::StrCat(bin_dir, "/pstrain_worker")
                              : worker_binary;
  options.pstrain_binary = absl::StrCat(bin_dir, "/pstrain");
  options.coordinator_binary = absl::StrCat(bin_dir, "/pstrain_coordinator");
  if (kubernetes) {
    options.image = absl::GetFlag(FLAGS_image);
    options.k8s_objects = absl::GetFlag(FLAGS_k8s_objects);
    options.memory_per_task = absl::GetFlag(FLAGS_memory_per_task);
    options.gpus_per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
    if (!FlagSpecified("coordinator")) {
      options.coordinator = "pstrain-coordinator:7070";
    }
  }
  absl::StatusOr<std::string> script = kubernetes
                                           ? KubernetesManifests(*spec, options)
                                           : LaunchScript(*spec, options);
  if (!script.ok()) return Fail(2, std::string(script.status().message()));
  std::printf("%s", script->c_str());
  return 0;
}

std::string ExecutableFileProblem(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return errno == ENOENT
               ? "does not exist"
               : absl::StrCat("cannot be read (", std::strerror(errno), ")");
  }
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (access(path.c_str(), X_OK) != 0) {
    return absl::StrFormat("not executable (mode %04o)", st.st_mode & 07777);
  }
  return "";
}

int InstallCommand(const std::vector<std::string>& args,
                   const std::vector<InstallSource>& binaries) {
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  if (!args.empty() || prefix.empty()) {
    return Fail(2, "usage: pstrain install --prefix=DIR");
  }
  // Every binary, before anything is copied: a half-installed PREFIX/bin
  // is a broken one.
  for (const InstallSource& b : binaries) {
    const std::string problem = ExecutableFileProblem(b.path);
    if (problem.empty()) continue;
    if (!b.flag.empty()) {
      return Fail(2, absl::StrCat("install: --", b.flag, "=", b.path, ": ",
                                  problem, "; expected the ", b.name,
                                  " program (an executable file)"));
    }
    return Fail(1, absl::StrCat("install: ", b.path, " ", problem,
                                "; expected the ", b.name,
                                " program: build it first (bazel build "
                                "//cli:pstrain)"));
  }
  std::vector<std::string> sources, names;
  for (const InstallSource& b : binaries) {
    sources.push_back(b.path);
    names.push_back(b.name);
  }
  if (absl::Status s = InstallBinaries(sources, prefix, names); !s.ok()) {
    return Fail(1, absl::StrCat("install: ", s.message()));
  }
  for (const std::string& name : names) {
    std::printf("%s/bin/%s\n", prefix.c_str(), name.c_str());
  }
  return 0;
}

}  // namespace pstrain
