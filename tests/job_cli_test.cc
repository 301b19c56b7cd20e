// `pstrain submit | status | cancel | wait` against a real
// pstrain_coordinator process: what a user sees, exit codes, and that a
// restarted coordinator still knows the job (its job file).
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::CommandResult;
using pstrain::testing::Process;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;
using Coordinator = pstrain::testing::CoordinatorProcess;
using Result = pstrain::testing::CommandResult;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// `output` without gRPC's own log lines ("E1128 01:02:21.535294268  178
// ssl_transport_security.cc:1743] ..."): its threads may still log a
// failed handshake after pstrain's last line, so an output's end is
// pstrain's once they are left out.
std::string WithoutGrpcLogLines(const std::string& output) {
  static const std::regex kGrpcLog(
      R"(^[EWID][0-9]{4} [0-9:.]+ +[0-9]+ [^ ]+:[0-9]+\] .*$)");
  std::string kept;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_match(line, kGrpcLog)) kept += line + "\n";
  }
  return kept;
}

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
    Result r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "job-1\n");
    r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
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
  Result r = RunCommand("cli/pstrain status" + coordinator.flag());
  EXPECT_EQ(r.output, "job-1 PENDING lenet5 1 ps 2 workers (0/3 registered)\n");
  r = RunCommand("cli/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand("cli/pstrain wait job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "job-1 CANCELLED lenet5 1 ps 2 workers (0/3 registered): "
            "cancelled\n");
  // Its tasks never came: STOPPED, not WAITING or REGISTERED.
  r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
  EXPECT_EQ(r.output,
            "job-1 CANCELLED lenet5 1 ps 2 workers (0/3 registered): "
            "cancelled\n"
            "  ps 0       STOPPED    -\n"
            "  worker 0   STOPPED    -\n"
            "  worker 1   STOPPED    -\n");
  r = RunCommand("cli/pstrain cancel job-1" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output,
            "pstrain: error: coordinator 127.0.0.1:" + coordinator.port() +
                ": job-1 has already ended (JOB_CANCELLED)\n");
}

// `pstrain wait` rides out a coordinator restart (issue 37): it retries
// while the coordinator is away and follows the job once it is back; a
// coordinator away for longer than --coordinator_timeout_s ends it with
// exit 1 and one line naming that deadline. (A job that trains through the
// restart to SUCCEEDED: tests/cluster_test.cc.)
TEST(JobCliTest, WaitRidesOutACoordinatorRestartWithinItsDeadline) {
  const std::string job_file = TempDir() + "/restart_jobs.pb";
  const std::string spec = TempDir() + "/restart.pbtxt";
  WriteFile(spec,
            "model: \"lenet5\"\nnum_ps: 1\nnum_workers: 1\nbatch_size: 64\n"
            "epochs: 1\n");
  const int port = pstrain::testing::FreePort();
  auto coordinator = std::make_unique<Coordinator>(job_file, 600, port);
  ASSERT_TRUE(coordinator->up());
  const std::string address = coordinator->address();
  Result r = RunCommand("cli/pstrain submit " + spec + coordinator->flag());
  ASSERT_EQ(r.output, "job-1\n");
  r = RunCommand("cli/pstrain submit " + spec + coordinator->flag());
  ASSERT_EQ(r.output, "job-2\n");
  const std::string log = TempDir() + "/wait_restart.log";
  {
    Process wait({"cli/pstrain", "wait", "job-1", "--wait_poll_ms=100",
                  "--coordinator_timeout_s=30", "--rpc_timeout_s=2",
                  "--coordinator=" + address},
                 log);
    usleep(500000);
    coordinator->Crash();
    sleep(3);
    coordinator = std::make_unique<Coordinator>(job_file, 600, port);
    ASSERT_TRUE(coordinator->up());
    EXPECT_EQ(
        RunCommand("cli/pstrain cancel job-1" + coordinator->flag()).exit_code,
        0);
    EXPECT_EQ(wait.Wait(30), 1);
    const std::string output =
        WithoutGrpcLogLines(pstrain::testing::ReadTextFile(log));
    EXPECT_THAT(output, StartsWith("job-1 PENDING lenet5 1 ps 1 workers "
                                   "(0/2 registered)\npstrain: coordinator " +
                                   address + " unreachable ("));
    EXPECT_THAT(output, HasSubstr("); retrying for up to 30 s "
                                  "(--coordinator_timeout_s)\n"));
    EXPECT_THAT(output,
                EndsWith("pstrain: coordinator " + address +
                         " answers again\njob-1 CANCELLED lenet5 1 ps 1 "
                         "workers (0/2 registered): cancelled\n"));
  }
  // Away for longer than the deadline: exit 1, the deadline named.
  Process wait({"cli/pstrain", "wait", "job-2", "--wait_poll_ms=100",
                "--coordinator_timeout_s=2", "--rpc_timeout_s=1",
                "--coordinator=" + address},
               log);
  usleep(500000);
  coordinator->Crash();
  EXPECT_EQ(wait.Wait(20), 1);
  const std::string output =
      WithoutGrpcLogLines(pstrain::testing::ReadTextFile(log));
  EXPECT_THAT(output,
              EndsWith("; retrying for up to 2 s (--coordinator_timeout_s)\n"
                       "pstrain: error: coordinator " +
                       address +
                       ": unreachable for longer than "
                       "--coordinator_timeout_s=2 s (" +
                       "Deadline Exceeded)\n"))
      << output;
  // status too; with --coordinator_timeout_s=0 it does not retry.
  r = RunCommand(
      "cli/pstrain status --coordinator_timeout_s=0 "
      "--rpc_timeout_s=1 --coordinator=" +
      address);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              StartsWith("pstrain: error: coordinator " + address + ": "))
      << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("retrying")));
}

// What the printed scripts do is cli/launch_lines_test (stand-in
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
  Result r = RunCommand("cli/pstrain launch-lines " + spec +
                        " --launcher=ssh --coordinator=n1:7070");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("pstrain: error: launch-lines: expected "
                          "--bin_dir=DIR, the folder holding pstrain_ps and "
                          "pstrain_worker on every node"),
            std::string::npos)
      << r.output;
  r = RunCommand("cli/pstrain launch-lines " + spec +
                 " --launcher=ssh --coordinator=n1:7070 --bin_dir=/opt/p/bin/");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("#!/usr/bin/env bash\n", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("\nPS=/opt/p/bin/pstrain_ps\n"
                          "WORKER=/opt/p/bin/pstrain_worker\n"),
            std::string::npos)
      << r.output;
  // An installed pstrain names its own folder.
  const std::string prefix = TempDir() + "/opt";
  r = RunCommand("cli/pstrain install --prefix=" + prefix);
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
  r = RunCommand("cli/pstrain launch-lines " + anywhere +
                 " --launcher=ssh --bin_dir=/opt/p/bin");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "pstrain: error: --launcher=ssh needs ps_hosts and worker_hosts "
            "in the job spec (slurm and mpirun do not)\n");
  r = RunCommand("cli/pstrain launch-lines " + anywhere +
                 " --launcher=pbs --bin_dir=/opt/p/bin");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "pstrain: error: --launcher=pbs: expected slurm, mpirun, ssh or "
            "kubernetes\n");
  r = RunCommand("cli/pstrain install");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: usage: pstrain install --prefix=DIR\n");
}

// --ps_binary and --worker_binary of `pstrain install` must name a program:
// a folder, a missing or a non-executable file is refused with exit 2 and
// one line naming the flag, before anything is copied. A program of
// another name is installed under the name the launchers start.
TEST(JobCliTest, InstallRefusesABinaryFlagThatIsNoProgram) {
  const std::string prefix = TempDir() + "/refused-install";
  const std::string folder = TempDir() + "/a-folder";
  const std::string text = TempDir() + "/not-a-program";
  ASSERT_EQ(mkdir(folder.c_str(), 0755), 0);
  WriteFile(text, "#!/bin/sh\n");
  ASSERT_EQ(chmod(text.c_str(), 0644), 0);
  struct Case {
    std::string flag, path, name, says;
  };
  for (const Case& c : std::vector<Case>{
           {"ps_binary", folder, "pstrain_ps", "a folder"},
           {"worker_binary", folder + "/", "pstrain_worker", "a folder"},
           {"ps_binary", text, "pstrain_ps", "not executable (mode 0644)"},
           {"worker_binary", TempDir() + "/missing", "pstrain_worker",
            "does not exist"}}) {
    const Result r = RunCommand("cli/pstrain install --prefix=" + prefix +
                                " --" + c.flag + "=" + c.path);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, "pstrain: error: install: --" + c.flag + "=" + c.path +
                            ": " + c.says + "; expected the " + c.name +
                            " program (an executable file)\n");
    EXPECT_NE(access(prefix.c_str(), F_OK), 0) << c.path << ": installed";
  }
  const std::string script = TempDir() + "/my_ps";
  WriteFile(script, "#!/bin/sh\necho ps\n");
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  const Result r = RunCommand("cli/pstrain install --prefix=" + prefix +
                              " --ps_binary=" + script);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(prefix + "/bin/pstrain_ps\n"));
  EXPECT_EQ(pstrain::testing::ReadTextFile(prefix + "/bin/pstrain_ps"),
            "#!/bin/sh\necho ps\n");
  EXPECT_NE(access((prefix + "/bin/my_ps").c_str(), F_OK), 0);
}

TEST(JobCliTest, BadSpecIsRefusedBeforeSubmitWithTheFieldNamed) {
  const std::string spec = TempDir() + "/bad.pbtxt";
  WriteFile(spec,
            "num_ps: 1\nnum_workers: 1\nbatch_size: 8\nepochs: 1\n"
            "ps_hosts { host: \"h\" port: 7000 }\n"
            "worker_hosts { host: \"h\" port: 7000 }\n");
  // No coordinator needed: the spec is checked first.
  Result r =
      RunCommand("cli/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "pstrain: error: " + spec +
                          ": worker_hosts[0]: h:7000 is already the address "
                          "of ps_hosts[0]\n");
  r = RunCommand("cli/pstrain submit " + TempDir() + "/missing.pbtxt");
  EXPECT_EQ(r.exit_code, 2);
  r = RunCommand(
      "cli/pstrain status --coordinator=127.0.0.1:1 --rpc_timeout_s=1 "
      "--coordinator_timeout_s=0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output.rfind("pstrain: error: coordinator 127.0.0.1:1: ", 0), 0u)
      << r.output;
}

// A job spec out of range is refused by `pstrain submit` before any call:
// one line naming the file, the field, the value and the range; exit 2.
TEST(JobCliTest, SubmitRefusesAnOutOfRangeSpecWithExit2) {
  const std::string spec = TempDir() + "/huge.pbtxt";
  WriteFile(spec,
            "num_ps: 1\nnum_workers: 2147483647\nbatch_size: 8\n"
            "epochs: 1\n");
  Result r =
      RunCommand("cli/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "pstrain: error: " + spec +
                          ": num_workers: 2147483647; expected 1 to 4096\n");
  WriteFile(spec,
            "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1 "
            "optimizer { beta2: 0.99999999 }");
  r = RunCommand("cli/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.beta2: 0.99999999; expected 0 <= beta < "
                          "1, and below 1 in fp32"),
            std::string::npos)
      << r.output;
}

// `pstrain scale` (issue 40): a bad command line exits 2 with one line
// before any call; the coordinator's refusals exit 1 naming the job.
TEST(JobCliTest, ScaleFlagErrorsExit2AndRefusalsExit1) {
  const std::string usage =
      "usage: pstrain scale JOB_ID [--num_workers=N] [--num_ps=M] "
      "[--at_step=S] [--coordinator=HOST:PORT]";
  const struct {
    std::string args;
    std::string error;
  } bad[] = {
      {"", usage},
      {" job-1",
       "scale: --num_workers, --num_ps or both are required; " + usage},
      {" job-1 --num_workers=0", "--num_workers=0: expected 1 to 4096 workers"},
      {" job-1 --num_ps=0", "--num_ps=0: expected 1 to 64 shards"},
      {" job-1 --num_ps=2,3",
       "--num_ps=2,3: expected a number of shards, 1 to 64"},
      {" job-1 --num_workers=2 --at_step=-1",
       "--at_step=-1: expected 0 to 1000000000 (0: the next step)"},
      {" job-1 --num_workers=2 --max_workers=4",
       "--max_workers is not a flag of pstrain scale (it would be ignored); "
       "see pstrain help scale"},
  };
  for (const auto& b : bad) {
    const Result r =
        RunCommand("cli/pstrain scale" + b.args + " --coordinator=127.0.0.1:1");
    EXPECT_EQ(r.exit_code, 2) << b.args << ": " << r.output;
    EXPECT_EQ(r.output, "pstrain: error: " + b.error + "\n") << b.args;
  }
  const std::string spec = TempDir() + "/elastic.pbtxt";
  WriteFile(spec,
            "num_ps: 1 num_workers: 2 max_workers: 4 batch_size: 8 epochs: 1");
  Coordinator coordinator(TempDir() + "/scale_jobs.pb", 600);
  ASSERT_TRUE(coordinator.up());
  Result r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Its idle workers are not waited for.
  r = RunCommand("cli/pstrain status job-1" + coordinator.flag());
  EXPECT_EQ(r.output,
            "job-1 PENDING lenet5 1 ps 2 workers (membership 0, at most 4) "
            "(0/3 registered)\n"
            "  ps 0       WAITING    -\n"
            "  worker 0   WAITING    -\n"
            "  worker 1   WAITING    -\n"
            "  worker 2   IDLE       -\n"
            "  worker 3   IDLE       -\n");
  r = RunCommand("cli/pstrain scale job-1 --num_workers=3" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output,
            "pstrain: error: coordinator 127.0.0.1:" + coordinator.port() +
                ": job-1 is JOB_PENDING; only a RUNNING job is "
                "scaled\n");
  r = RunCommand("cli/pstrain scale job-1 --num_workers=5" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("job-1: scale to 5 workers; expected 1 to 4"));
  // Shards only within max_ps (issue 40): this job has none.
  r = RunCommand("cli/pstrain scale job-1 --num_ps=2" + coordinator.flag());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("job-1 has a fixed number of shards: its "
                                  "spec has no max_ps"));
}

// Every binary's --help exits 0 and lists the flags of every file it links
// (absl alone shows only the main file's, or "No flags matched"), with
// their defaults.
TEST(JobCliTest, EveryBinaryHelpExitsZeroAndListsAllItsFlags) {
  const struct {
    std::string binary;
    std::vector<std::string> flags;
  } binaries[] = {
      {"cli/pstrain",
       {"--model (", "--dataset (", "--backend (", "--coordinator (",
        "--insecure (", "--launcher (", "--node_rank (", "--out ("}},
      {"server/pstrain_ps",
       {"--pull_timeout_s (", "--task_index (", "--threads (", "--tls_dir ("}},
      {"worker/pstrain_worker",
       {"--init_timeout_s (", "--rejoin (", "--coordinator (", "--insecure ("}},
      {"coordinator/pstrain_coordinator",
       {"--heartbeat_timeout_s (", "--job_file (", "--tls_dir ("}},
  };
  for (const auto& b : binaries) {
    const Result r = RunCommand(b.binary + " --help");
    EXPECT_EQ(r.exit_code, 0) << b.binary << ": " << r.output;
    EXPECT_EQ(r.output.find("No flags matched"), std::string::npos) << b.binary;
    EXPECT_NE(r.output.find("default: "), std::string::npos) << b.binary;
    for (const std::string& flag : b.flags) {
      EXPECT_NE(r.output.find(flag), std::string::npos)
          << b.binary << " --help lacks " << flag << ":\n"
          << r.output;
    }
  }
}

// An unknown flag or command: exit 2 and one line saying where to look,
// for pstrain and for the daemons.
TEST(JobCliTest, UnknownFlagsAndCommandsExit2WithOneLine) {
  const struct {
    std::string command;
    std::string output;
  } cases[] = {
      {"cli/pstrain run --bogus",
       "pstrain: error: unknown flag --bogus; see pstrain help run\n"},
      {"cli/pstrain --bogus status",
       "pstrain: error: unknown flag --bogus; see pstrain help status\n"},
      {"cli/pstrain --nomodel run",
       "pstrain: error: unknown flag --nomodel; see pstrain help run\n"},
      {"cli/pstrain frob",
       "pstrain: error: unknown command \"frob\"; see pstrain help\n"},
      {"cli/pstrain help frob",
       "pstrain: error: unknown command \"frob\"; see pstrain help\n"},
      {"cli/pstrain run --num_workers=two",
       "pstrain: error: --num_workers=two: Illegal value 'two' specified for "
       "flag 'num_workers'; see pstrain help run\n"},
      {"cli/pstrain run --num_workers",
       "pstrain: error: --num_workers: missing its value; see pstrain help "
       "run\n"},
      {"server/pstrain_ps --bogus",
       "pstrain_ps: error: unknown flag --bogus; see pstrain_ps --help\n"},
      {"worker/pstrain_worker --bogus=1",
       "pstrain_worker: error: unknown flag --bogus; see pstrain_worker "
       "--help\n"},
      {"coordinator/pstrain_coordinator --bogus",
       "pstrain_coordinator: error: unknown flag --bogus; see "
       "pstrain_coordinator --help\n"},
  };
  for (const auto& c : cases) {
    const Result r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
}

// Flags read from absl's --flagfile (and --fromenv) are checked like the
// command line's: exit 2 and one line naming the file, never absl's exit 1;
// a good flag file's values take effect and count as given.
TEST(JobCliTest, FlagfileFlagsAreCheckedLikeTheCommandLines) {
  const std::string dir = TempDir();
  WriteFile(dir + "/unknown.flags",
            "# a comment\n  --num_workers=3\n\n--bogus=1\n");
  WriteFile(dir + "/value.flags", "--num_workers=two\n");
  WriteFile(dir + "/ps.flags", "--threads=2\n--bogus\n");
  WriteFile(dir + "/nested.flags", "--flagfile=" + dir + "/unknown.flags\n");
  WriteFile(dir + "/line.flags", "num_workers=3\n");
  WriteFile(dir + "/self.flags", "--flagfile=" + dir + "/self.flags\n");
  WriteFile(dir + "/steps.flags", "--model=lenet5\n--steps=3\n");
  const struct {
    std::string command;
    std::string output;
  } cases[] = {
      {"cli/pstrain run --flagfile=" + dir + "/unknown.flags",
       "pstrain: error: unknown flag --bogus in " + dir +
           "/unknown.flags; see pstrain help run\n"},
      {"cli/pstrain run --flagfile " + dir + "/nested.flags",
       "pstrain: error: unknown flag --bogus in " + dir +
           "/unknown.flags; see pstrain help run\n"},
      {"cli/pstrain run --flagfile=" + dir + "/value.flags",
       "pstrain: error: --num_workers=two in " + dir +
           "/value.flags: Illegal value 'two' specified for flag "
           "'num_workers'; see pstrain help run\n"},
      {"cli/pstrain run --flagfile=" + dir + "/line.flags",
       "pstrain: error: --flagfile=" + dir +
           "/line.flags: unexpected line \"num_workers=3\"; expected "
           "--flag=value, a comment (#) or an empty line; see pstrain help "
           "run\n"},
      {"cli/pstrain run --flagfile=" + dir + "/missing.flags",
       "pstrain: error: --flagfile: " + dir +
           "/missing.flags: No such file or directory; see pstrain help "
           "run\n"},
      {"cli/pstrain run --flagfile=" + dir + "/self.flags",
       "pstrain: error: --flagfile=" + dir + "/self.flags in " + dir +
           "/self.flags: flag files nested more than 10 deep; see pstrain "
           "help run\n"},
      // A flag from a file is given like any other: run does not read it.
      {"cli/pstrain run --flagfile=" + dir + "/steps.flags",
       "pstrain: error: --steps is not a flag of pstrain run (it would be "
       "ignored); see pstrain help run\n"},
      {"server/pstrain_ps --flagfile=" + dir + "/ps.flags",
       "pstrain_ps: error: unknown flag --bogus in " + dir +
           "/ps.flags; see pstrain_ps --help\n"},
      {"FLAGS_num_workers=x cli/pstrain run --fromenv=num_workers",
       "pstrain: error: --num_workers=x (--fromenv): Illegal value 'x' "
       "specified for flag 'num_workers'; see pstrain help run\n"},
      {"cli/pstrain run --fromenv=bogus",
       "pstrain: error: --fromenv=bogus: FLAGS_bogus is not set; see pstrain "
       "help run\n"},
      // Schedule and optimizer knobs the chosen ones would ignore.
      {"cli/pstrain run --lr_gamma=0.5",
       "pstrain: error: --lr_gamma: 0.5 with lr_schedule constant; expected "
       "it unset (only step multiplies the lr by lr_gamma)\n"},
      {"cli/pstrain run --dataset=image_folder --data_dir=/nowhere "
       "--stream_images --max_dataset_memory=1G",
       "pstrain: error: --max_dataset_memory would be ignored: "
       "--stream_images decodes each batch as it trains and never holds the "
       "folder in memory; see pstrain help run\n"},
      {"cli/pstrain run --optimizer=sgd --beta2=0.98",
       "pstrain: error: --beta2: 0.98 with optimizer sgd; expected it unset "
       "(it is Adam's)\n"},
      {"cli/pstrain run --lr_min=1e-5 --lr_total_steps=5000",
       "pstrain: error: --lr_min: 1e-05 with lr_schedule constant; "
       "expected 0 (only cosine decays to lr_min over lr_total_steps)\n"},
      {"FLAGS_bogus=1 cli/pstrain run --fromenv=bogus",
       "pstrain: error: unknown flag --bogus (--fromenv); see pstrain help "
       "run\n"},
  };
  for (const auto& c : cases) {
    const Result r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
  // A good flag file: its values are the command's.
  WriteFile(dir + "/spec.pbtxt",
            "num_ps: 1 num_workers: 1 batch_size: 64 epochs: 1\n");
  WriteFile(dir + "/launch.flags",
            "# where the tasks report\n--launcher=slurm\n"
            "--coordinator=n1:7070\n  --job=job-9\n");
  const Result r = RunCommand("cli/pstrain launch-lines " + dir +
                              "/spec.pbtxt --flagfile=" + dir +
                              "/launch.flags --bin_dir=/opt/p/bin");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nJOB=job-9\nCOORDINATOR=n1:7070\n"),
            std::string::npos)
      << r.output;
}

// As `pstrain run` does, eval, launch-lines and node refuse a flag that
// what they would do ignores: exit 2 and one line naming it; the same flags
// where they do apply are accepted.
TEST(JobCliTest, FlagsEvalLaunchLinesAndNodeWouldIgnoreExit2) {
  const std::string dir = TempDir();
  const std::string spec = dir + "/nohosts.pbtxt";
  const std::string hosts = dir + "/hosts.pbtxt";
  WriteFile(spec, "num_ps: 1 num_workers: 2 batch_size: 64 epochs: 1\n");
  WriteFile(hosts,
            "num_ps: 1 num_workers: 1 batch_size: 64 epochs: 1\n"
            "ps_hosts { host: \"localhost\" port: 7000 }\n"
            "worker_hosts { host: \"localhost\" }\n");
  const std::string lines = "cli/pstrain launch-lines ";
  const std::string see_eval = "; see pstrain help eval\n";
  const std::string see_lines = "; see pstrain help launch-lines\n";
  const struct {
    std::string command;
    std::string output;
  } cases[] = {
      {"cli/pstrain eval --checkpoint=/none --num_classes=10",
       "pstrain: error: --num_classes would be ignored: it is for "
       "--dataset=synthetic, not fashion_mnist" +
           see_eval},
      {"cli/pstrain eval --checkpoint=/none --dataset=synthetic "
       "--data_dir=/data",
       "pstrain: error: --data_dir would be ignored: --dataset=synthetic "
       "reads no files" +
           see_eval},
      {"cli/pstrain eval --checkpoint=/none --dataset=mnist "
       "--bad_images=skip",
       "pstrain: error: --bad_images would be ignored: it is for "
       "--dataset=image_folder, not mnist" +
           see_eval},
      {"cli/pstrain eval --checkpoint=/none --dataset=cifar10 "
       "--image_size=32",
       "pstrain: error: --image_size would be ignored: it is for "
       "--dataset=synthetic or image_folder, not cifar10" +
           see_eval},
      {"cli/pstrain eval --checkpoint=/none --gpu=1",
       "pstrain: error: --gpu would be ignored: it is for --backend=cuda" +
           see_eval},
      {lines + spec + " --launcher=slurm --bin_dir=/b --nodes=2",
       "pstrain: error: --nodes would be ignored: it is for --agent (one "
       "pstrain node per node)" +
           see_lines},
      {lines + spec + " --launcher=ssh --bin_dir=/b --gpus_per_node=2",
       "pstrain: error: --gpus_per_node would be ignored: it is for --agent "
       "(one pstrain node per node)" +
           see_lines},
      {lines + spec + " --launcher=mpirun --bin_dir=/b --cpus_per_task=2",
       "pstrain: error: --cpus_per_task would be ignored: it is for "
       "--launcher=slurm or kubernetes, not mpirun" +
           see_lines},
      {lines + spec +
           " --launcher=slurm --agent --bin_dir=/b --cpus_per_task=2",
       "pstrain: error: --cpus_per_task would be ignored: with --agent, each "
       "pstrain node divides its cores" +
           see_lines},
      {lines + hosts + " --launcher=slurm --agent --bin_dir=/b --nodes=2",
       "pstrain: error: --nodes would be ignored: the job spec lists hosts, "
       "one agent runs on each" +
           see_lines},
      {lines + spec + " --launcher=slurm --agent --bin_dir=/b --ps_binary=/p",
       "pstrain: error: --ps_binary would be ignored: with --agent, each "
       "pstrain node starts the binaries in --bin_dir" +
           see_lines},
      {lines + spec +
           " --launcher=slurm --bin_dir=/b --ps_binary=/p --worker_binary=/w",
       "pstrain: error: --bin_dir would be ignored: --ps_binary and "
       "--worker_binary name both binaries" +
           see_lines},
      {"cli/pstrain node --coordinator=127.0.0.1:1 --job=job-1 --bin_dir=/b "
       "--worker_binary=/w",
       "pstrain node: error: --worker_binary would be ignored: --bin_dir names "
       "the tasks' binaries; see pstrain help node\n"},
  };
  for (const auto& c : cases) {
    const Result r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
  // Where they apply, the same flags are taken.
  Result r = RunCommand(lines + spec +
                        " --launcher=slurm --bin_dir=/b --cpus_per_task=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--cpus-per-task=2"), std::string::npos) << r.output;
  r = RunCommand(lines + spec +
                 " --launcher=mpirun --agent --bin_dir=/b --nodes=2 "
                 "--gpus_per_node=4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("-np 2 \"$PSTRAIN\" node"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--gpus_per_node=4"), std::string::npos) << r.output;

  // pstrain node learns the spec from the coordinator: a job with hosts
  // places its tasks itself, and a cpu job has no GPUs to give out.
  Coordinator coordinator(dir + "/node_flags_jobs.pb", 600);
  ASSERT_TRUE(coordinator.up());
  r = RunCommand("cli/pstrain submit " + hosts + coordinator.flag());
  ASSERT_EQ(r.output, "job-1\n");
  r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
  ASSERT_EQ(r.output, "job-2\n");
  r = RunCommand("cli/pstrain node --job=job-1 --node_rank=0" +
                 coordinator.flag());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain node: error: job-1: --node_rank would be ignored: the job "
            "spec lists hosts, which place its tasks; see pstrain help node\n");
  r = RunCommand(
      "cli/pstrain node --job=job-2 --node_rank=0 --num_nodes=1 "
      "--gpus_per_node=2" +
      coordinator.flag());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output,
            "pstrain node: error: job-2: --gpus_per_node would be ignored: the "
            "job's backend is cpu, not cuda; see pstrain help node\n");
}

// A job spec whose text is not UTF-8: refused before it is sent (exit 2,
// the field named); tests the coordinator's own answer in
// coordinator/coordinator_server_test.
TEST(JobCliTest, SubmitRefusesASpecThatIsNotUtf8) {
  const std::string spec = TempDir() + "/latin1.pbtxt";
  WriteFile(spec,
            "model: \"lenet5\" data_dir: \"/data/caf\\351\"\n"
            "num_ps: 1 num_workers: 1 batch_size: 64 epochs: 1\n");
  const Result r =
      RunCommand("cli/pstrain submit " + spec + " --coordinator=127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "pstrain: error: " + spec +
                          ": data_dir: \"/data/caf\\xe9\" is not UTF-8; "
                          "expected UTF-8 text\n");
}

// `pstrain help COMMAND` and `pstrain COMMAND --help` for every command:
// exit 0, the synopsis, and each flag the command reads with its default.
TEST(JobCliTest, HelpOfEveryCommand) {
  for (const std::string command :
       {"run", "compare", "eval", "submit", "status", "logs", "cancel", "scale",
        "wait", "launch-lines", "install", "certs", "node"}) {
    for (const std::string& line : {"cli/pstrain help " + command,
                                    "cli/pstrain " + command + " --help"}) {
      const Result r = RunCommand(line);
      EXPECT_EQ(r.exit_code, 0) << line << ": " << r.output;
      EXPECT_EQ(r.output.rfind("usage: pstrain " + command, 0), 0u)
          << line << ": " << r.output;
    }
  }
  Result r = RunCommand("cli/pstrain help run");
  for (const std::string flag :
       {"--num_workers (Worker processes.); default: 2;", "--dataset (",
        "--backend (", "--max_nonfinite_steps (", "--bucket_bytes ("}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << r.output;
  }
  // Flags of other commands are not run's.
  EXPECT_EQ(r.output.find("--out_dir ("), std::string::npos) << r.output;
  r = RunCommand("cli/pstrain help help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("usage: pstrain help [COMMAND]", 0), 0u) << r.output;
  r = RunCommand("cli/pstrain help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pstrain launch-lines JOB.pbtxt"), std::string::npos)
      << r.output;
  r = RunCommand("cli/pstrain");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// The daemons' own flags have ranges too: exit 2 and one line.
TEST(JobCliTest, DaemonFlagRangesExit2) {
  const struct {
    std::string command;
    std::string output;
  } cases[] = {
      {"coordinator/pstrain_coordinator --heartbeat_timeout_s=0",
       "pstrain_coordinator: error: --heartbeat_timeout_s=0: expected 1 to "
       "86400 seconds\n"},
      {"coordinator/pstrain_coordinator --port=65536",
       "pstrain_coordinator: error: --port=65536: expected 0 to 65535\n"},
      {"server/pstrain_ps --idle_timeout_s=0",
       "pstrain_ps: error: --idle_timeout_s=0: expected 1 to 604800 "
       "seconds\n"},
      {"worker/pstrain_worker --rpc_timeout_s=0",
       "pstrain_worker: error: --rpc_timeout_s=0: expected 1 to 86400 "
       "seconds\n"},
      {"cli/pstrain wait job-1 --wait_poll_ms=0",
       "pstrain: error: --wait_poll_ms=0: expected 1 to 60000 ms\n"},
      // A typo in the address, before the command dials it (it retried
      // for --coordinator_timeout_s).
      {"cli/pstrain node --job=job-1 --gpus_per_node=-1",
       "pstrain node: error: --gpus_per_node=-1: expected 0 to 64\n"},
      {"cli/pstrain node --job=job-1 --node_rank=2 --num_nodes=2",
       "pstrain node: error: --node_rank=2: expected 0 to 1 "
       "(--num_nodes=2)\n"},
      {"cli/pstrain status job-1 --coordinator=localhost:70700",
       "pstrain: error: --coordinator=localhost:70700: port \"70700\"; "
       "expected HOST:PORT (PORT 1 to 65535), or unix:PATH\n"},
  };
  for (const auto& c : cases) {
    const Result r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
}

// The tools and benchmarks check their flags, and the places they write,
// before their work: ps_bench --partition_bytes=0 aborted, and
// train_tokenizer found a bad --seq_len or output folder only after
// training the tokenizer.
TEST(JobCliTest, ToolsCheckTheirFlagsBeforeTheirWork) {
  const struct {
    std::string command;
    std::string output;
  } cases[] = {
      {"bench/ps_bench --partition_bytes=0",
       "ps_bench: error: --partition_bytes=0: expected 4 to 1073741824 "
       "bytes\n"},
      {"bench/pull_scan_bench --repeats=0",
       "pull_scan_bench: error: --repeats=0: expected 1 to 1000\n"},
      {"bench/pull_scan_bench --bogus",
       "pull_scan_bench: error: unknown flag --bogus; see pull_scan_bench "
       "--help\n"},
      {"bench/checkpoint_bench --num_ps=0",
       "checkpoint_bench: error: --num_ps=0: expected 1 to 64\n"},
      {"text/train_tokenizer --output=t.model --seq_len=1",
       "train_tokenizer: error: --seq_len=1: expected 2 to 65536\n"},
      {"text/train_tokenizer --output=t.model --vocab_size=8",
       "train_tokenizer: error: --vocab_size=8: expected 16 to 1048576\n"},
      {"text/train_tokenizer --output=no_such_folder/t.model",
       "train_tokenizer: error: --output=no_such_folder/t.model: its folder "
       "no_such_folder does not exist\n"},
      {"text/train_tokenizer --output=t.model --tokens_dir=/dev/null/t",
       "train_tokenizer: error: --tokens_dir=/dev/null/t: /dev/null is not a "
       "folder\n"},
  };
  for (const auto& c : cases) {
    const Result r = RunCommand(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << ": " << r.output;
    EXPECT_EQ(r.output, c.output) << c.command;
  }
}

}  // namespace
