// A job spec run on this machine, as `pstrain run` and `pstrain compare`
// run one: the checks that can be made before any process starts, then an
// in-process coordinator (the same one `pstrain submit` talks to) and the
// spec's tasks as child processes, on 127.0.0.1 or each in its own network
// namespace, under the node supervisor `pstrain node` uses
// (cli/node_supervisor.h: restarts as the job table allows them).
//
// Thread-safety: call from one thread (RunLocalJob blocks until the job
// ends).
#ifndef PSTRAIN_CLI_LOCAL_JOB_H_
#define PSTRAIN_CLI_LOCAL_JOB_H_

#include <csignal>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "catalog/job_config.h"
#include "proto/job.pb.h"
#include "proto/results.pb.h"
#include "worker/dataset.h"

namespace pstrain {

// Where a job's tasks run: all on 127.0.0.1 (default), or each in its own
// network namespace ("ip netns exec NS ..."), bound to that namespace's
// address; the coordinator then listens on `coordinator_host`.
struct NetnsHost {
  std::string netns;
  std::string ip;
};
struct Placement {
  std::string coordinator_host = "127.0.0.1";
  std::vector<NetnsHost> ps;
  std::vector<NetnsHost> workers;
  bool netns() const { return !workers.empty(); }
};

// The placement --ps_netns and --worker_netns give ("NETNS:IP,..." each,
// both or neither; empty: 127.0.0.1) with the coordinator on
// `coordinator_host`. INVALID_ARGUMENT naming the flag for a malformed
// list, one list without the other, or namespaces without /usr/sbin/ip.
absl::StatusOr<Placement> ParsePlacement(const std::string& ps_netns,
                                         const std::string& worker_netns,
                                         const std::string& coordinator_host);

// Whether `placement` has room for `num_ps` shards and `num_workers`
// workers: with namespaces one per task, on one machine at most 4 workers
// per core (beyond that a run measures the scheduler). INVALID_ARGUMENT
// naming `workers_flag` ("--num_workers", "--workers") or --num_ps.
absl::Status CheckRoom(const Placement& placement, int num_ps, int num_workers,
                       const std::string& workers_flag);

// The spec's fields (ResolveJobSpec, its message naming the flag:
// "--num_workers: ...", "--lr: ...") and, with a `dataset` (null with
// synthetic compute), that each worker's shard holds a batch; the job's
// config. INVALID_ARGUMENT otherwise.
absl::StatusOr<JobConfig> CheckSpec(const JobSpec& spec,
                                    const Dataset* dataset);

// The spec's files: --init_from loads into its model (built on the CPU
// from `dataset`'s input shape; skipped when `dataset` is null), and
// --checkpoint_dir is a new or empty folder (created here) or, with
// --resume, holds a newest checkpoint that verifies against the job (its
// data position, its tensors). An error naming the flag otherwise.
absl::Status CheckModelFiles(const JobSpec& spec, const Dataset* dataset);

struct LocalJobOptions {
  std::string ps_binary;
  std::string worker_binary;
  // Plaintext gRPC among the job's processes; with it, let them listen on
  // an address other than loopback. Otherwise mutual TLS from a fresh CA
  // in a private folder removed at the end.
  bool insecure = false;
  bool insecure_allow_remote = false;
  // Silence after which the coordinator counts a task lost.
  absl::Duration heartbeat_timeout = absl::Seconds(60);
  // The workers' --gpu; with NCCL worker w gets gpu + w.
  int gpu = 0;
  // Set by a signal handler (not null): nonzero cancels the job.
  const volatile std::sig_atomic_t* stop_signal = nullptr;
  // An elastic job's control file (cli/control_file.h; "": none), read
  // every 200 ms: each new line is a Scale of the job (workers, shards or
  // both) on the in-process coordinator.
  std::string control_file;
};

// Runs `config`'s spec (checked: CheckSpec) to its end with its tasks
// placed by `placement`. An elastic job (max_workers, max_ps) starts
// workers 0 to num_workers - 1 and shards 0 to num_ps - 1; the workers and
// shards a Scale adds are started when it is made, with the same flags, and
// removed ones exit by themselves (exit 0). Returns worker 0's
// results; ABORTED with the job's message when it failed (every process
// stopped); CANCELLED when *stop_signal became nonzero; another error when the
// coordinator or a task could not start.
absl::StatusOr<RunResult> RunLocalJob(const JobConfig& config,
                                      const Placement& placement,
                                      const LocalJobOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_LOCAL_JOB_H_
