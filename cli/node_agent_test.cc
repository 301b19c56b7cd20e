// Which of a job's tasks a node agent starts (PlanNodeTasks), and with
// which command line (NodeTaskArgv).
#include "cli/node_agent.h"

#include <string>
#include <vector>

#include "coordinator/job_spec.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

JobSpec Spec(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "job.pbtxt");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

std::string Names(const std::vector<NodeTask>& tasks) {
  std::string out;
  for (const NodeTask& t : tasks) {
    out += (t.role == ROLE_PS ? "ps" : "worker") + std::to_string(t.index) +
           "/" + std::to_string(t.threads) +
           (t.gpu >= 0 ? "/gpu" + std::to_string(t.gpu) : "") + " ";
  }
  return out;
}

TEST(PlanNodeTasksTest, WithoutHostsTasksGoRoundRobinByNodeRank) {
  const JobSpec spec = Spec("num_ps: 2 num_workers: 4 batch_size: 8 epochs: 1");
  NodePlacement node;
  node.num_nodes = 2;
  node.cores = 16;
  node.node_rank = 1;
  EXPECT_EQ(Names(*PlanNodeTasks(spec, node)), "ps1/1 worker1/8 worker3/8 ");
  node.num_nodes = 1;
  node.node_rank = 0;
  node.gpus_per_node = 2;
  EXPECT_EQ(Names(*PlanNodeTasks(spec, node)),
            "ps0/1 ps1/1 worker0/4/gpu0 worker1/4/gpu1 worker2/4/gpu0 "
            "worker3/4/gpu1 ");
  node.node_rank = 1;
  EXPECT_EQ(PlanNodeTasks(spec, node).status().message(),
            "node rank 1 of 1 nodes; expected 0..0");
}

// An elastic job's tasks up to max_workers / max_ps are planned too, those
// beyond the first started once a Scale adds them (standby_workers: the
// workers at once), and the workers share the cores as if every planned
// one ran.
TEST(PlanNodeTasksTest, ElasticTasksBeyondTheFirstStartOnAScale) {
  const JobSpec spec = Spec(
      "num_ps: 2 num_workers: 2 max_workers: 4 max_ps: 3 batch_size: 8 "
      "epochs: 1");
  NodePlacement node;
  node.num_nodes = 2;
  node.cores = 8;
  node.node_rank = 0;
  const std::vector<NodeTask> tasks =
      PlanNodeTasks(spec, node).value_or(std::vector<NodeTask>{});
  EXPECT_EQ(Names(tasks), "ps0/1 ps2/1 worker0/4 worker2/4 ");
  auto on_scale = [](const std::vector<NodeTask>& planned) {
    std::string flags;
    for (const NodeTask& t : planned) flags += t.on_scale ? "1" : "0";
    return flags;
  };
  EXPECT_EQ(on_scale(tasks), "0101");
  // standby_workers: worker 2 starts with the job; shard 2 on a Scale.
  JobSpec standby = spec;
  standby.set_standby_workers(true);
  const std::vector<NodeTask> warm =
      PlanNodeTasks(standby, node).value_or(std::vector<NodeTask>{});
  EXPECT_EQ(Names(warm), "ps0/1 ps2/1 worker0/4 worker2/4 ");
  EXPECT_EQ(on_scale(warm), "0100");
  // A job that is not elastic has no task started on a scale.
  const std::vector<NodeTask> fixed =
      PlanNodeTasks(Spec("num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1"),
                    node)
          .value_or(std::vector<NodeTask>{});
  EXPECT_EQ(Names(fixed), "ps0/1 worker0/8 ");
  for (size_t i = 0; i < fixed.size(); ++i) EXPECT_FALSE(fixed[i].on_scale);
}

TEST(PlanNodeTasksTest, WithHostsTheNodesOwnNamesAndAddressesPick) {
  const JobSpec spec = Spec(
      "num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1\n"
      "ps_hosts { host: \"10.0.0.2\" } ps_hosts { host: \"n3\" }\n"
      "worker_hosts { host: \"n3\" } worker_hosts { host: \"10.0.0.2\" }\n");
  NodePlacement node;
  node.cores = 3;
  node.local_names = {"n3", "n3.cluster", "10.0.0.3", "127.0.0.1"};
  EXPECT_EQ(Names(*PlanNodeTasks(spec, node)), "ps1/1 worker0/3 ");
  node.local_names = {"n9", "10.0.0.9"};
  EXPECT_EQ(PlanNodeTasks(spec, node).status().message(),
            "no task of the job runs on this node (10.0.0.9, n9); expected "
            "one of the spec's hosts");
}

// The tasks speak to the coordinator as the node does: a node with
// --insecure starts plaintext tasks (they refused to start without a TLS
// folder, failing the job), one with a TLS folder hands it on.
TEST(NodeTaskArgvTest, TasksGetTheNodesTlsFlags) {
  NodeTask worker;
  worker.role = ROLE_WORKER;
  worker.index = 1;
  worker.threads = 4;
  worker.gpu = 1;
  NodeTaskContext context;
  context.coordinator = "10.0.0.1:7070";
  context.job_id = "job-3";
  context.tls.insecure = true;
  EXPECT_EQ(
      NodeTaskArgv(worker, "/b/pstrain_worker", context),
      (std::vector<std::string>{
          "/b/pstrain_worker", "--coordinator=10.0.0.1:7070", "--job=job-3",
          "--task_index=1", "--threads=4", "--gpu=1", "--insecure"}));
  NodeTask ps;
  ps.role = ROLE_PS;
  ps.index = 0;
  context.insecure_allow_remote = true;
  EXPECT_EQ(
      NodeTaskArgv(ps, "/b/pstrain_ps", context),
      (std::vector<std::string>{"/b/pstrain_ps", "--coordinator=10.0.0.1:7070",
                                "--job=job-3", "--task_index=0", "--threads=1",
                                "--insecure", "--insecure_allow_remote"}));
  context.tls.insecure = false;
  context.tls.dir = "/etc/pstrain/tls";
  EXPECT_EQ(
      NodeTaskArgv(ps, "/b/pstrain_ps", context),
      (std::vector<std::string>{"/b/pstrain_ps", "--coordinator=10.0.0.1:7070",
                                "--job=job-3", "--task_index=0", "--threads=1",
                                "--tls_dir=/etc/pstrain/tls"}));
}

TEST(LocalNamesTest, HasLoopbackAndHostname) {
  const std::set<std::string> names = LocalNames();
  EXPECT_EQ(names.count("localhost"), 1u);
  EXPECT_EQ(names.count("127.0.0.1"), 1u);
}

}  // namespace
}  // namespace pstrain
