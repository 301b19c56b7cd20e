// `pstrain node`: the per-node agent. Started once per node (by
// `srun --ntasks-per-node=1`, `mpirun --map-by ppr:1:node`, ssh or a service
// manager), it fetches the job's spec from the coordinator, works out which
// of the job's tasks run on this node, and starts them as child processes
// with their share of the node's cores (--threads) and, for workers, their
// GPU; their output comes out prefixed ("[worker1] ..."), SIGINT/SIGTERM
// stop them all, and it exits 0 once all exited 0, else with the first
// failure's status after giving the others time to end (the coordinator
// fails the job, so they do).
//
//   pstrain node --coordinator=HOST:PORT --job=ID [--node_rank=R
//                --num_nodes=N] [--gpus_per_node=G] [--bin_dir=DIR]
//
// The tasks run under the node supervisor `pstrain run` uses
// (cli/node_supervisor.h): a task that dies while its job runs is restarted
// when the coordinator's RestartTask, asked with the dead task's own key
// from the TLS folder, allows it (the job table counts the spec's
// `max_restarts` over every node); a restarted worker gets --rejoin. The
// coordinator is reached over mutual TLS with the key of any of the job's
// tasks in $PSTRAIN_TLS_DIR (--tls_dir), or plaintext with --insecure; the
// tasks it starts are given the same (NodeTaskArgv).
#ifndef PSTRAIN_CLI_NODE_AGENT_H_
#define PSTRAIN_CLI_NODE_AGENT_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"
#include "proto/coordinator.pb.h"
#include "proto/job.pb.h"

namespace pstrain {

// Where this agent runs.
struct NodePlacement {
  // Names and addresses of this node (hostname, short hostname, "localhost",
  // every interface address): a spec's host that is one of them is here.
  std::set<std::string> local_names;
  // Without hosts in the spec: this node's rank among `num_nodes`.
  int node_rank = 0;
  int num_nodes = 1;
  // Cores this agent may use (divided among its workers) and GPUs of the
  // node (0: none; worker k of this node gets GPU k % gpus_per_node).
  int cores = 1;
  int gpus_per_node = 0;
};

struct NodeTask {
  TaskRole role = ROLE_WORKER;
  int index = 0;
  // --threads for the task; workers share the cores, a shard gets 1 (its
  // Adam runs on its stream threads whatever the flag says).
  int threads = 1;
  // Workers with gpus_per_node > 0: their GPU; else -1.
  int gpu = -1;
  // An elastic job's task beyond its first num_workers (num_ps): started
  // only once a Scale adds it (the coordinator has it waiting to
  // register). Not the workers of a spec with standby_workers: those start
  // with the job.
  bool on_scale = false;
};

// The tasks of `spec` that run on this node: with hosts in the spec, those
// whose host is one of `local_names`; without, task i of each role goes to
// node i % num_nodes. An elastic job's tasks up to max_workers (max_ps) are
// planned the same way, those beyond num_workers (num_ps) as `on_scale`;
// the workers share the cores as if every planned one ran. INVALID_ARGUMENT
// if the node rank is outside 0..num_nodes-1 or, with hosts, none of them
// is this node (naming the node's names).
absl::StatusOr<std::vector<NodeTask>> PlanNodeTasks(
    const JobSpec& spec, const NodePlacement& placement);

// What every task a node starts is told besides its own place: its
// coordinator and job, and how to reach the coordinator, as the node does.
struct NodeTaskContext {
  std::string coordinator;  // host:port
  std::string job_id;
  // The node's --tls_dir (or PSTRAIN_TLS_DIR) or --insecure.
  TlsOptions tls;
  // The node's --insecure_allow_remote: with --insecure, a shard may listen
  // on an address other than loopback.
  bool insecure_allow_remote = false;
};

// The command line of `task` (`binary`: its pstrain_ps or pstrain_worker):
// --coordinator, --job, --task_index, --threads, --gpu for a worker with
// one, and the context's TaskTlsFlags (common/tls_flags.h).
std::vector<std::string> NodeTaskArgv(const NodeTask& task,
                                      const std::string& binary,
                                      const NodeTaskContext& context);

// This machine's names and interface addresses.
std::set<std::string> LocalNames();

// `args`: the positional arguments after `node` (none). `ps_binary` and
// `worker_binary`: the tasks' binaries unless --bin_dir names another
// folder.
int NodeCommand(const std::vector<std::string>& args,
                const std::string& ps_binary, const std::string& worker_binary);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_NODE_AGENT_H_
