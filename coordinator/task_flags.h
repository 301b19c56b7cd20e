// Command-line flags of a task under a coordinator, shared by pstrain_ps
// and pstrain_worker:
//   --coordinator=HOST:PORT  the coordinator (required)
//   --job=ID                 the job, as `pstrain submit` printed it (required)
//   --role=ps|worker         optional; must name this binary's role
//   --task_index=N           this task's index; unset: SLURM_PROCID, then
//                            OMPI_COMM_WORLD_RANK, then PMI_RANK
//   --bind=ADDR              the address to listen on (PS; default 0.0.0.0)
//   --port=N                 the port to listen on; unset: the job spec's
//                            port for this task, else any free port
//   --advertise=HOST[:PORT]  how other tasks reach this one; unset: the job
//                            spec's host for this task, else the hostname
//   --heartbeat_interval_s, --coordinator_timeout_s,
//   --coordinator_rpc_timeout_s
//
// Thread-safety: call from main() only.
#ifndef PSTRAIN_COORDINATOR_TASK_FLAGS_H_
#define PSTRAIN_COORDINATOR_TASK_FLAGS_H_

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "coordinator/task_agent.h"
#include "proto/job.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, role);
ABSL_DECLARE_FLAG(int, task_index);
ABSL_DECLARE_FLAG(std::string, bind);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, advertise);

namespace pstrain {

// The task's identity and timeouts from the flags. INVALID_ARGUMENT naming
// the flag: --coordinator or --job empty, --role not `role`, no index
// (neither --task_index nor a launcher's rank variable), a negative index.
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
// job's spec and its address.
struct JoinedTask {
  std::unique_ptr<TaskAgent> agent;
  JobSpec spec;
  TaskAddress address;
};

// Prints "`program`: error: `agent`'s name: `message`", reports the failure
// to the coordinator (which fails the job with `message`) and returns
// `exit_code`, for main() to return.
int FailTask(TaskAgent& agent, const char* program, int exit_code,
             const std::string& message);

// The start every task shares: its identity from the flags, the job's spec
// from the coordinator, its index checked against the spec's task count, and
// its address. On error prints one line and sets `*exit_code`: 2 for bad
// flags or an index outside the job (a bad --advertise or --port is also
// reported to the coordinator, failing the job), 1 when the coordinator
// cannot be reached, has no such job, or the job has ended.
absl::StatusOr<JoinedTask> JoinJobFromFlags(TaskRole role, const char* program,
                                            int* exit_code);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_TASK_FLAGS_H_
