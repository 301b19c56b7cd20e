// gRPC's standard services on the real daemons (issue 37): a Python client
// (tests/grpc_probe.py, python3-grpcio) asks pstrain_coordinator and
// pstrain_ps for their health (grpc.health.v1) over mutual TLS and on the
// plaintext --health_port, and lists their services through reflection. A
// shard is NOT_SERVING until worker 0 initialises it, then SERVING.
// Skips, saying why, where python3-grpcio is not installed.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::CommandResult;
using pstrain::testing::CoordinatorProcess;
using pstrain::testing::FreePort;
using pstrain::testing::HaveFashionMnist;
using pstrain::testing::Process;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using pstrain::testing::UseTestCertificates;
using pstrain::testing::WriteTextFile;

constexpr int kSkipped = 77;  // grpc_probe.py without python3-grpcio

// tests/grpc_probe.py at `target` over TLS as `client` (the test
// certificates), expecting the server name `server_name`; plaintext when
// `client` is empty.
CommandResult Probe(const std::string& target, const std::string& client,
                    const std::string& server_name, const std::string& args) {
  std::string command = "python3 tests/grpc_probe.py --target=" + target;
  if (!client.empty()) {
    command += " --tls_dir=" + TempDir() + "/tls --client=" + client +
               " --server_name=" + server_name;
  }
  return RunCommand(command + " " + args + " 2>&1");
}

bool HaveGrpcio(std::string* why) {
  const CommandResult r = RunCommand("python3 tests/grpc_probe.py --help");
  *why = r.output;
  return r.exit_code != kSkipped;
}

std::string WaitForPortFile(const std::string& path) {
  std::string port;
  for (int i = 0; i < 200 && port.empty(); ++i) {
    usleep(50000);
    std::ifstream f(path);
    std::getline(f, port);
  }
  return port;
}

TEST(HealthTest, CoordinatorAnswersHealthAndReflectionToItsCertificates) {
  std::string why;
  if (!HaveGrpcio(&why)) GTEST_SKIP() << why;
  UseTestCertificates();
  const std::string port_file = TempDir() + "/coordinator_health.port";
  const std::string health =
      "127.0.0.1:" + std::to_string(FreePort());  // plaintext
  Process coordinator(
      {"coordinator/pstrain_coordinator", "--bind=127.0.0.1", "--port=0",
       "--port_file=" + port_file, "--health_port=" + health.substr(10)},
      TempDir() + "/coordinator_health.log");
  const std::string port = WaitForPortFile(port_file);
  ASSERT_FALSE(port.empty());
  const std::string target = "127.0.0.1:" + port;
  const std::string name = "coordinator.pstrain";

  // Over mutual TLS: any certificate of the CA, the administrator's or a
  // task's.
  CommandResult r = Probe(target, "admin", name, "health");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "SERVING\n");
  r = Probe(target, "worker-0", name, "health --service=pstrain.Coordinator");
  EXPECT_EQ(r.output, "SERVING\n");
  r = Probe(target, "ps-0-client", name, "list");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* service :
       {"pstrain.Coordinator\n", "grpc.health.v1.Health\n",
        "grpc.reflection.v1alpha.ServerReflection\n",
        "grpc.channelz.v1.Channelz\n"}) {
    EXPECT_NE(r.output.find(service), std::string::npos) << r.output;
  }
  r = Probe(target, "admin", name, "describe pstrain.Coordinator");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pstrain.Coordinator (proto/coordinator.proto): "
                          "Submit GetJob"),
            std::string::npos)
      << r.output;
  // Without a certificate the TLS port answers nothing.
  r = Probe(target, "", "", "health");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("UNAVAILABLE", 0), 0u) << r.output;

  // The plaintext health port: health alone.
  r = Probe(health, "", "", "health --service=pstrain.Coordinator");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "SERVING\n");
  r = Probe(health, "", "", "list");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("UNIMPLEMENTED", 0), 0u) << r.output;
  r = Probe(health, "", "", "health --service=pstrain.ParameterServer");
  EXPECT_EQ(r.output.rfind("NOT_FOUND", 0), 0u) << r.output;

  coordinator.Kill(SIGTERM);
  EXPECT_EQ(coordinator.Wait(10), 0);
}

TEST(HealthTest, ShardIsNotServingUntilInitialisedThenServing) {
  std::string why;
  if (!HaveGrpcio(&why)) GTEST_SKIP() << why;
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
  CoordinatorProcess coordinator(TempDir() + "/jobs.pb", 30);
  ASSERT_TRUE(coordinator.up());
  const std::string spec = TempDir() + "/job.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\" num_ps: 1 num_workers: 1 batch_size: 64 "
                "epochs: 1 max_steps_per_epoch: 200 log_every_steps: 50\n");
  CommandResult r =
      RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r.output, "job-1\n");

  const std::string port = std::to_string(FreePort());
  const std::string health = "127.0.0.1:" + std::to_string(FreePort());
  Process ps({"server/pstrain_ps", "--coordinator=" + coordinator.address(),
              "--job=job-1", "--task_index=0", "--bind=127.0.0.1",
              "--advertise=127.0.0.1", "--port=" + port,
              "--health_port=" + health.substr(10)},
             TempDir() + "/ps0.log");
  // Up, and not serving before worker 0 initialised it: no SERVING ever
  // seen before NOT_SERVING (errors while it starts listening are fine).
  r = Probe(health, "", "", "health --wait_for=NOT_SERVING --timeout_s=30");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("\nSERVING"), std::string::npos) << r.output;
  EXPECT_NE(r.output.rfind("SERVING", 0), 0u) << r.output;
  const std::string target = "127.0.0.1:" + port;
  const std::string name = "job-1.ps-0.pstrain";
  r = Probe(target, "worker-0", name,
            "health --service=pstrain.ParameterServer");
  EXPECT_EQ(r.output, "NOT_SERVING\n");
  r = Probe(target, "admin", name, "list");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pstrain.ParameterServer\n"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("grpc.channelz.v1.Channelz\n"), std::string::npos)
      << r.output;

  Process worker(
      {"worker/pstrain_worker", "--coordinator=" + coordinator.address(),
       "--job=job-1", "--task_index=0", "--advertise=127.0.0.1"},
      TempDir() + "/worker0.log", {"OMP_NUM_THREADS=1"});
  r = Probe(health, "", "",
            "health --service=pstrain.ParameterServer --wait_for=SERVING "
            "--timeout_s=120");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Probe(target, "worker-0", name, "health");
  EXPECT_TRUE(r.output == "SERVING\n" || r.output == "NOT_SERVING\n")
      << r.output;  // NOT_SERVING if training already ended (draining)

  r = RunCommand("cli/pstrain wait job-1 --wait_poll_ms=200" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ps.Wait(30), 0);
  EXPECT_EQ(worker.Wait(30), 0);
}

}  // namespace
