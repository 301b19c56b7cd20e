// `pstrain launch-lines` and `pstrain install`: starting a submitted job's
// tasks on a cluster.
//
//   pstrain install --prefix=DIR
//       copies pstrain, pstrain_ps, pstrain_worker and pstrain_coordinator
//       to DIR/bin (each replaced atomically), so that the nodes can run them
//       from a path that exists there (a shared file system, or the same DIR
//       on every node).
//   pstrain launch-lines JOB.pbtxt --launcher=slurm|mpirun|ssh
//       [--coordinator=HOST:PORT] [--job=ID] [--bin_dir=DIR] [--sbatch]
//       [--cpus_per_task=N]
//       prints a bash script (LaunchScript below) that starts every task of
//       the job and waits for them.
//   pstrain launch-lines JOB.pbtxt --launcher=kubernetes --image=IMAGE
//       [--k8s_objects=coordinator|tasks] [--job=ID] [--cpus_per_task=N]
//       [--memory_per_task=Q] [--gpus_per_worker=G]
//       prints Kubernetes manifests (KubernetesManifests below).
//
// Exit codes: 0 success; 1 a copy failed; 2 bad input (usage, spec, flags).
#ifndef PSTRAIN_CLI_LAUNCH_LINES_H_
#define PSTRAIN_CLI_LAUNCH_LINES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace pstrain {

struct LaunchOptions {
  // "slurm", "mpirun", "ssh" or "kubernetes".
  std::string launcher;
  // host:port of the coordinator, as the nodes reach it.
  std::string coordinator;
  // The job id; "$JOB": the script takes it from its environment (and stops
  // at once if JOB is not set).
  std::string job = "$JOB";
  // The binaries as the nodes see them (absolute paths).
  std::string ps_binary;
  std::string worker_binary;
  // slurm: an sbatch header (#SBATCH lines for the job's tasks), so that
  // `sbatch --wait launch.sh` runs it.
  bool sbatch = false;
  // slurm: CPUs of each task (srun --cpus-per-task; the tasks take their
  // thread count from it through SLURM_CPUS_PER_TASK).
  int cpus_per_task = 1;
  // One `pstrain node` agent per node instead of the tasks themselves
  // (cli/node_agent.h): it starts the node's tasks with their share of the
  // cores and their GPU. `pstrain_binary`: the agent as the nodes see it.
  bool agent = false;
  std::string pstrain_binary;
  // agent, spec without hosts: how many nodes (slurm: --nodes of the srun
  // step and of the sbatch header; mpirun: -np with --map-by ppr:1:node).
  int nodes = 1;
  // agent: GPUs per node, passed as --gpus_per_node (0: none).
  int gpus_per_node = 0;
  // kubernetes (KubernetesManifests): the container image, which holds the
  // binaries at the paths above; which objects to print ("coordinator" or
  // "tasks"); the coordinator binary in the image; each task's memory
  // request and limit (a quantity such as "4Gi"; "": none) and each worker's
  // nvidia.com/gpu limit (0: none). cpus_per_task is each task's CPU
  // request and its OMP_NUM_THREADS.
  std::string image;
  std::string k8s_objects = "tasks";
  std::string coordinator_binary;
  std::string memory_per_task;
  int gpus_per_worker = 0;
  // The Secrets holding the tasks' TLS folder (ca.pem and the tasks' .pem
  // and .key, as `pstrain certs --nodes_out` writes it) and the
  // coordinator's (ca.pem, coordinator.pem, coordinator.key).
  std::string tls_secret = "pstrain-tls";
  std::string coordinator_tls_secret = "pstrain-coordinator-tls";
};

// A complete bash script (`#!/usr/bin/env bash`, `set -euo pipefail`) that
// starts every task of `spec` and waits for each. It exits 0 once every
// launcher command exited 0; otherwise it prints the first that failed (in
// the order they ended) and exits with its status, after giving the others
// $PSTRAIN_GRACE_S (default 60) seconds to end on their own (the
// coordinator fails the job, so they do) and then SIGTERM. SIGINT or
// SIGTERM to the script stops every task. The launcher commands:
//   slurm:  without hosts in the spec, one step per role,
//           `srun --exact --ntasks=N --cpus-per-task=C` (index from
//           SLURM_PROCID; --exact lets the steps run side by side in one
//           allocation, Slurm >= 20.11); with hosts, one
//           `srun --exact --nodes=1 --ntasks=1 --nodelist=HOST` step per task.
//           With `sbatch`, a header asking for the job's tasks: --ntasks,
//           or with hosts --nodes, --nodelist and --ntasks-per-node (the most
//           tasks the spec puts on one host), and --cpus-per-task.
//   mpirun: per role, a hostfile with one line per host and its slot count
//           (the role's tasks on that host) and `mpirun -np N --hostfile F
//           --map-by slot --bind-to none` (rank r on the r-th slot, so index
//           from OMPI_COMM_WORLD_RANK); when a role's hosts are not grouped
//           (a, b, a), one `mpirun -np 1 --host HOST` per task with its
//           --task_index instead; without hosts, `mpirun -np N` on the
//           hosts mpirun knows (an allocation, or this one). Root runs it
//           with --allow-run-as-root, decided when the script runs.
//   ssh:    one `ssh -n -o BatchMode=yes HOST 'CMD --task_index=I'` per task;
//           needs the spec's hosts.
// With `agent`, the launcher starts one `pstrain node` per node instead:
//   slurm:  `srun --nodes=N --ntasks-per-node=1` (N: the spec's distinct
//           hosts, with --nodelist, or `nodes`); --sbatch asks for N whole
//           nodes (--exclusive), whose cores the agent divides;
//   mpirun: `mpirun --map-by ppr:1:node --bind-to none`, with a hostfile of
//           the spec's distinct hosts (slots=1), or -np `nodes`;
//   ssh:    one ssh per distinct host.
// INVALID_ARGUMENT naming the launcher, a missing host list (ssh), --sbatch
// without slurm, or a cpus_per_task < 1.
absl::StatusOr<std::string> LaunchScript(const JobSpec& spec,
                                         const LaunchOptions& options);

// The worker tasks a launch script (or the Kubernetes manifests) starts:
// num_workers, or max_workers with standby_workers (the standbys start
// with the job and wait for a grow, so a static launcher scales up to
// max_workers). An elastic job's other tasks need `pstrain node` (one
// agent per node), which starts what a Scale adds.
int LaunchedWorkers(const JobSpec& spec);

// Kubernetes manifests (YAML, `---` between objects) for `kubectl apply -f`:
//   k8s_objects "coordinator": the coordinator as a Deployment of one replica
//       (strategy Recreate) and a Service named by --coordinator's host
//       (default pstrain-coordinator:7070); its job file lives in an
//       emptyDir, so a new coordinator pod starts with no jobs.
//   k8s_objects "tasks" (needs options.job, the submitted id): per role, a
//       headless Service pstrain-JOB-ROLE and an Indexed Job of the same
//       name (completions = parallelism = the role's tasks), whose pod I
//       runs task I: the binary takes its index from JOB_COMPLETION_INDEX and
//       advertises its DNS name pstrain-JOB-ROLE-I.pstrain-JOB-ROLE; a PS
//       listens on 0.0.0.0:7000. restartPolicy Never and backoffLimit 0:
//       the coordinator ends the job when a task fails.
// Indexed Jobs rather than one JobSet: they are built into Kubernetes
// (batch/v1, GA since 1.24), so no controller needs installing and the
// manifests can be checked offline against the built-in schema; JobSet is a
// CRD. Every pod mounts its Secret read-only (mode 0400) at
// /etc/pstrain/tls. INVALID_ARGUMENT for a spec with hosts or with
// max_restarts > 0, no image, a bad quantity or coordinator, or tasks
// without a job id.
absl::StatusOr<std::string> KubernetesManifests(const JobSpec& spec,
                                                const LaunchOptions& options);

// `s` quoted for bash: as it is if it has only safe characters
// (A-Za-z0-9 and @%+=:,./_-), else in single quotes.
std::string ShellQuote(const std::string& s);

// The folder of this running program if it is an installed pstrain (one with
// pstrain_ps and pstrain_worker beside it), else "" (it runs from Bazel's
// output tree, which other nodes do not have).
std::string InstalledBinDir();

// Copies `sources` (executables) into `prefix`/bin, creating the folders
// that are missing, as `names` (one per source; empty: each source's own
// file name); each file is
// written beside its final name and renamed over it, so a running copy is
// never overwritten in place. Errors name the file.
absl::Status InstallBinaries(const std::vector<std::string>& sources,
                             const std::string& prefix,
                             const std::vector<std::string>& names = {});

// What is wrong with `path` as a program to copy or run: "" when it is a
// regular file (a link to one is followed) this user may execute, else
// "does not exist", "a folder", "not a regular file" or "not executable
// (mode 0644)".
std::string ExecutableFileProblem(const std::string& path);

// A binary `pstrain install` copies: the file, its name in PREFIX/bin, and
// the flag that named it ("" when this program found it itself).
struct InstallSource {
  std::string path;
  std::string name;
  std::string flag;
};

// `args`: the positional arguments after the command name. `ps_binary` and
// `worker_binary`: --ps_binary / --worker_binary when set, else "".
int LaunchLinesCommand(const std::vector<std::string>& args,
                       const std::string& ps_binary,
                       const std::string& worker_binary);
// `binaries`: pstrain itself, pstrain_ps, pstrain_worker and
// pstrain_coordinator, as this program finds them or as --ps_binary and
// --worker_binary name them. Every one is checked before anything is
// copied: exit 2 naming the flag for a flag's path that is not an
// executable regular file (a folder, a missing or non-executable file),
// exit 1 for one this program found that is not (not built yet).
int InstallCommand(const std::vector<std::string>& args,
                   const std::vector<InstallSource>& binaries);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_LAUNCH_LINES_H_
