// `pstrain submit | status | cancel | wait` against a real
// pstrain_coordinator process: what a user sees, exit codes, and that a
// restarted coordinator still knows the job (its job file).
#include <string>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::CommandResult;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using Coordinator = pstrain::testing::CoordinatorProcess;
using Result = pstrain::testing::CommandResult;

void WriteFile(const std::string& path, const std::string& text) {
  pstrain::testing::WriteTextFile(path, text);
}

TEST(JobCliTest, SubmitStatusCancelWaitAndRestart) {
  const std::string job_file = TempDir() + "/jobs.pb";
  const std::string spec = TempDir() + "/job.pbtxt";
  WriteFile(spec,
            "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 2\nbatch_size: 64\n"
            "epochs: 1\nworker_hosts { host: \"10.0.0.4\" port: 7001 }\n"
            "worker_hosts { host: \"10.0.0.5\" port: 7001 }\n");
  {
    Coordinator coordinator(job_file, 600);
    ASSERT_TRUE(coordinator.up());
    Result r = RunCommand("tools/pstrain submit " + spec + coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "job-1\n");
    r = RunCommand("tools/pstrain status job-1" + coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output,
              "job-1 PENDING lenet5 1 ps 2 workers (0/3 registered)\n"
              "  ps 0       WAITING    -\n"
              "  worker 0   WAITING    -\n"
              "  worker 1   WAITING    -\n");
  }
  // A restarted coordinator still knows job-1.
  Coordinator coordinator(job_file, 600);
  ASSERT_TRUE(coordinator.up());
  Result r = RunCommand("tools/pstrain status" + coordinator.flag());
  EXPECT_EQ(r.output, "job-1 PENDING lenet5 1 ps 2 workers (0/3 registered)\n");
  r = RunCommand("tools/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand("tools/pstrain wait job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "job-1 CANCELLED lenet5 1 ps 2 workers (0/3 registered): "
            "cancelled\n");
  r = RunCommand("tools/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "pstrain: error: coordinator 127.0.0.1:" + coordinator.port() +
                ": job-1 has already ended (JOB_CANCELLED)\n");
}

// What the printed scripts do is tools/launch_lines_test (stand-in
// launchers) and tests/launcher_test.sh (real Slurm and Open MPI); here the
// command line: where the binaries come from, and the errors.
TEST(JobCliTest, LaunchLinesNameInstalledBinariesNeverBazelsCache) {
  const std::string spec = TempDir() + "/hosts.pbtxt";
  WriteFile(spec,
            "num_ps: 2 num_workers: 2 batch_size: 64 epochs: 1\n"
            "ps_hosts { host: \"n2\" port: 7000 }\n"
            "ps_hosts { host: \"n3\" port: 7000 }\n"
            "worker_hosts { host: \"n4\" } worker_hosts { host: \"n5\" }\n");
  // From Bazel's output tree, a --bin_dir is needed.
  Result r = RunCommand("tools/pstrain launch-lines " + spec +
                        " --launcher=ssh --coordinator=n1:7070");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("pstrain: error: launch-lines: expected "
                          "--bin_dir=DIR, the folder holding pstrain_ps and "
                          "pstrain_worker on every node"),
            std::string::npos)
      << r.output;
  r = RunCommand("tools/pstrain launch-lines " + spec +
                 " --launcher=ssh --coordinator=n1:7070 --bin_dir=/opt/p/bin/");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("#!/usr/bin/env bash\n", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("\nPS=/opt/p/bin/pstrain_ps\n"
                          "WORKER=/opt/p/bin/pstrain_worker\n"),
            std::string::npos)
      << r.output;
  // An installed pstrain names its own folder.
  const std::string prefix = TempDir() + "/opt";
  r = RunCommand("tools/pstrain install --prefix=" + prefix);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, prefix + "/bin/pstrain\n" + prefix + "/bin/pstrain_ps\n" +
                          prefix + "/bin/pstrain_worker\n" + prefix +
                          "/bin/pstrain_coordinator\n");
  r = RunCommand(prefix + "/bin/pstrain launch-lines " + spec +
                 " --launcher=mpirun --coordinator=n1:7070 --job=job-7");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nJOB=job-7\nCOORDINATOR=n1:7070\nPS=" + prefix +
                          "/bin/pstrain_ps\nWORKER=" + prefix +
                          "/bin/pstrain_worker\n"),
            std::string::npos)
      << r.output;

  const std::string anywhere = TempDir() + "/anywhere.pbtxt";
  WriteFile(anywhere, "num_ps: 2 num_workers: 4 batch_size: 64 epochs: 1\n");
  r = RunCommand("tools/pstrain launch-lines " + anywhere +
                 " --launcher=ssh --bin_dir=/opt/p/bin");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "pstrain: error: --launcher=ssh needs ps_hosts and worker_hosts "
            "in the job spec (slurm and mpirun do not)\n");
  r = RunCommand("tools/pstrain launch-lines " + anywhere +
                 " --launcher=pbs --bin_dir=/opt/p/bin");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "pstrain: error: --launcher=pbs: expected slurm, mpirun or ssh\n");
  r = RunCommand("tools/pstrain install");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: usage: pstrain install --prefix=DIR\n");
}

TEST(JobCliTest, BadSpecIsRefusedBeforeSubmitWithTheFieldNamed) {
  const std::string spec = TempDir() + "/bad.pbtxt";
  WriteFile(spec,
            "num_ps: 1\nnum_workers: 1\nbatch_size: 8\nepochs: 1\n"
            "ps_hosts { host: \"h\" port: 7000 }\n"
            "worker_hosts { host: \"h\" port: 7000 }\n");
  // No coordinator needed: the spec is checked first.
  Result r =
      RunCommand("tools/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: " + spec +
                          ": worker_hosts[0]: h:7000 is already the address "
                          "of ps_hosts[0]\n");
  r = RunCommand("tools/pstrain submit " + TempDir() + "/missing.pbtxt");
  EXPECT_EQ(r.exit_code, 2);
  r = RunCommand(
      "tools/pstrain status --coordinator=127.0.0.1:1 --rpc_timeout_s=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output.rfind("pstrain: error: coordinator 127.0.0.1:1: ", 0), 0u)
      << r.output;
}

}  // namespace
