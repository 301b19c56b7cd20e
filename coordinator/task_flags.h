// Command-line flags of a task under a coordinator, shared by pstrain_ps
// and pstrain_worker:
//   --coordinator=HOST:PORT  the coordinator (required)
//   --job=ID                 the job, as `pstrain submit` printed it (required)
//   --role=ps|worker         optional; must name this binary's role
//   --task_index=N           this task's index; unset: SLURM_PROCID, then
//                            OMPI_COMM_WORLD_RANK, then PMI_RANK, then
//                            JOB_COMPLETION_INDEX (Kubernetes)
//   --bind=ADDR              the address to listen on (PS; default: the
//                            advertised host's, not every interface)
//   --port=N                 the port to listen on; unset: the job spec's
//                            port for this task, else any free port
//   --advertise=HOST[:PORT]  how other tasks reach this one; unset: the job
//                            spec's host for this task, else the hostname
//   --heartbeat_interval_s, --coordinator_timeout_s,
//   --coordinator_rpc_timeout_s
//   --threads=N              CPU threads of the task (see TaskThreads)
//
// Thread-safety: call from main() only.
#ifndef PSTRAIN_COORDINATOR_TASK_FLAGS_H_
#define PSTRAIN_COORDINATOR_TASK_FLAGS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "catalog/job_config.h"
#include "common/usable_cores.h"
#include "coordinator/task_agent.h"
#include "proto/job.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, role);
ABSL_DECLARE_FLAG(int, task_index);
ABSL_DECLARE_FLAG(std::string, bind);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, advertise);
ABSL_DECLARE_FLAG(int, threads);

namespace pstrain {

// --threads: 0 (automatic) or 1 to this.
inline constexpr int kMaxTaskThreads = 1024;

// The launchers' variables that carry a task's index, in the order they are
// tried: Slurm (srun), Open MPI (mpirun), PMI (MPICH, Hydra), a Kubernetes
// Indexed Job (the pod's completion index).
inline constexpr const char* kTaskIndexVariables[] = {
    "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JOB_COMPLETION_INDEX"};

// The task's index: `flag` (--task_index) when >= 0, else the first of
// kTaskIndexVariables that `getenv` finds. INVALID_ARGUMENT naming the
// variable and its value when that is not a non-negative integer, or naming
// them all when none is set.
absl::StatusOr<int> ResolveTaskIndex(
    int flag, const std::function<const char*(const char*)>& getenv);

// The ranges of the task flags above, checked from the flags alone (no
// spec, no coordinator), so that a typo ends the task at its start with
// exit 2 instead of failing the job: --task_index -1 (unset) or an index a
// job of `role` can have, --port -1 (unset) to 65535, --threads 0 to
// kMaxTaskThreads, --advertise's port 0 to 65535 and equal to a --port set
// above 0, --coordinator a gRPC target (common/flags_util.h
// CheckGrpcTarget) when set, --heartbeat_interval_s 0.01 to 3600, the
// coordinator timeouts 1 to 86400. INVALID_ARGUMENT "--flag=value: expected
// ..." for the first out of range.
absl::Status CheckTaskFlags(TaskRole role);

// The task's identity and timeouts from the flags. INVALID_ARGUMENT naming
// the flag: CheckTaskFlags, --coordinator or --job empty, --role not
// `role`, no index (neither --task_index nor a launcher's rank variable),
// a negative index, the TLS flags (neither a folder nor --insecure, the
// task's files missing). Reads no file but the TLS folder's and contacts
// nothing.
absl::StatusOr<TaskAgentOptions> TaskAgentOptionsFromFlags(TaskRole role);

struct TaskAddress {
  // Where to listen: --bind and the port.
  std::string bind;
  int port = 0;
  // How others reach this task: host only; the port is the bound one.
  std::string advertise_host;
};

// Resolves --bind, --port and --advertise against the spec's host list for
// task (role, index). INVALID_ARGUMENT for a port outside 0..65535 or an
// --advertise port that differs from the port.
absl::StatusOr<TaskAddress> TaskAddressFromFlags(const JobSpec& spec,
                                                 TaskRole role, int index);

// A task that has joined its job: its agent (not yet registered), the
// job's config (its spec resolved: coordinator/job_spec.h ResolveJobSpec)
// and its address.
struct JoinedTask {
  std::unique_ptr<TaskAgent> agent;
  JobConfig config;
  TaskAddress address;
};

// How many CPU threads a task runs (a worker's oneDNN/OpenMP pool), and
// where the number came from. In order: --threads; OMP_NUM_THREADS (what
// `pstrain run` gives each local worker: the cores divided among them);
// SLURM_CPUS_PER_TASK (srun --cpus-per-task); the cores divided by
// OMPI_COMM_WORLD_LOCAL_SIZE (mpirun's tasks on this node); else every core
// this process may run on, with `warning` set: other tasks on the node would
// compete for the same cores (7 to 25 times slower steps were seen).
struct TaskThreads {
  int threads = 1;
  // "--threads", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK",
  // "OMPI_COMM_WORLD_LOCAL_SIZE=2 of 16 cores", "all 16 cores".
  std::string source;
  bool warning = false;
};

// `flag`: --threads (0: unset); `cores`: the cores this process may use;
// `getenv`: the environment. INVALID_ARGUMENT for a negative --threads or a
// variable that is not a positive integer, naming it.
absl::StatusOr<TaskThreads> ResolveTaskThreads(
    int flag, int cores, const std::function<const char*(const char*)>& getenv);

// Resolves --threads from the flags and the environment and reports it:
// "`agent`'s name: N threads (source)" through the agent's log, and the
// warning line on stderr when there is one and `warn` (a task whose work
// the count sizes). On error, fails the task (FailTask, exit code 2) and
// returns the status.
absl::StatusOr<int> TaskThreadsFromFlags(TaskAgent& agent, const char* program,
                                         bool warn, int* exit_code);

// Prints "`program`: error: `agent`'s name: `message`", reports the failure
// to the coordinator (which fails the job with `message`) and returns
// `exit_code`, for main() to return.
int FailTask(TaskAgent& agent, const char* program, int exit_code,
             const std::string& message);

// The start every task shares: its flags checked (TaskAgentOptionsFromFlags,
// before anything is contacted), its identity from them, the job's spec
// from the coordinator, its index checked against the spec's task count,
// the spec resolved into the job's config (once, here), and its address. On
// error prints one line and sets `*exit_code`: 2 for bad flags or an index
// outside the job (a spec that does not resolve, or an --advertise port
// other than the spec's port for the task, is also reported to the
// coordinator, failing the job), 1 when the coordinator cannot be reached,
// has no such job, or the job has ended.
absl::StatusOr<JoinedTask> JoinJobFromFlags(TaskRole role, const char* program,
                                            int* exit_code);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_TASK_FLAGS_H_
