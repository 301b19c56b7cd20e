// The scripts of `pstrain launch-lines`, run by bash with stand-ins for
// srun, mpirun and ssh that record their arguments (and, for mpirun, the
// hostfile) and exit with a chosen status: what each launcher is asked to
// run, and the script's own waiting and exit status. The real schedulers
// run these scripts in tests/launcher_test.sh.
#include "cli/launch_lines.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/job_spec.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

JobSpec Spec(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "job.pbtxt");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

LaunchOptions Options(const std::string& launcher) {
  LaunchOptions options;
  options.launcher = launcher;
  options.coordinator = "n1:7070";
  options.ps_binary = "/opt/pstrain/bin/pstrain_ps";
  options.worker_binary = "/opt/pstrain/bin/pstrain_worker";
  return options;
}

struct ScriptRun {
  int exit_code = -1;
  // What the stand-ins recorded, one line per call (sorted, as the tasks
  // start concurrently).
  std::string calls;
  std::string stderr_text;
};

// Runs `script` with fake srun/mpirun/ssh first on PATH. A call whose
// arguments contain `fail_match` exits `fail_code` (after a short sleep, so
// that it ends after the others started).
ScriptRun RunScript(const std::string& script, const std::string& env,
                    const std::string& fail_match = "", int fail_code = 0) {
  static int runs = 0;
  const std::string dir = absl::StrCat(TempDir(), "/run", ++runs);
  mkdir(dir.c_str(), 0755);
  const std::string bin = dir + "/bin";
  mkdir(bin.c_str(), 0755);
  const std::string fake = absl::StrCat(
      "#!/bin/bash\n"
      "line=\"$(basename \"$0\") $*\"\n"
      "prev=\"\"\n"
      "for a in \"$@\"; do\n"
      "  if [[ \"$prev\" == --hostfile ]]; then\n"
      "    line+=\" [hostfile: $(tr '\\n' ';' <\"$a\")]\"\n"
      "  fi\n"
      "  prev=\"$a\"\n"
      "done\n"
      "echo \"$line\" >>",
      dir,
      "/calls\n"
      "if [[ -n \"",
      fail_match, "\" && \"$*\" == *\"", fail_match,
      "\"* ]]; then sleep 0.5; exit ", fail_code,
      "; fi\n"
      "exit 0\n");
  for (const char* name : {"srun", "mpirun", "ssh"}) {
    const std::string path = absl::StrCat(bin, "/", name);
    Write(path, fake);
    chmod(path.c_str(), 0755);
  }
  Write(dir + "/launch.sh", script);
  const std::string command = absl::StrCat(
      "cd ", dir, " && env ", env, " PATH=", bin,
      ":/usr/bin:/bin PSTRAIN_GRACE_S=2 bash launch.sh >stdout 2>stderr");
  const int status = std::system(command.c_str());
  ScriptRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::system(absl::StrCat("sort ", dir, "/calls >", dir, "/sorted 2>/dev/null")
                  .c_str());
  run.calls = Read(dir + "/sorted");
  run.stderr_text = Read(dir + "/stderr");
  return run;
}

constexpr char kAnywhere[] =
    "num_ps: 2 num_workers: 2 batch_size: 64 epochs: 1\n";
constexpr char kHosts[] =
    "num_ps: 2 num_workers: 3 batch_size: 64 epochs: 1\n"
    "ps_hosts { host: \"n2\" port: 7000 } ps_hosts { host: \"n3\" port: 7000 "
    "}\n"
    "worker_hosts { host: \"n4\" } worker_hosts { host: \"n4\" }\n"
    "worker_hosts { host: \"n5\" }\n";

TEST(LaunchScriptTest, IsACompleteStrictBashScript) {
  for (const char* launcher : {"slurm", "mpirun", "ssh"}) {
    absl::StatusOr<std::string> script =
        LaunchScript(Spec(kHosts), Options(launcher));
    ASSERT_TRUE(script.ok()) << script.status();
    EXPECT_EQ(script->rfind("#!/usr/bin/env bash\n", 0), 0u) << launcher;
    EXPECT_NE(script->find("\nset -euo pipefail\n"), std::string::npos);
    Write(TempDir() + "/syntax.sh", *script);
    EXPECT_EQ(
        std::system(absl::StrCat("bash -n ", TempDir(), "/syntax.sh").c_str()),
        0)
        << launcher;
  }
}

TEST(LaunchScriptTest, SlurmStepsRunSideBySideWithTheirTaskCounts) {
  const std::string script = *LaunchScript(Spec(kAnywhere), Options("slurm"));
  ScriptRun run = RunScript(script, "JOB=job-3");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.calls,
            "srun --exact --ntasks=2 --cpus-per-task=1 --job-name=pstrain-ps "
            "/opt/pstrain/bin/pstrain_ps --coordinator=n1:7070 --job=job-3\n"
            "srun --exact --ntasks=2 --cpus-per-task=1 "
            "--job-name=pstrain-worker /opt/pstrain/bin/pstrain_worker "
            "--coordinator=n1:7070 --job=job-3\n");
  EXPECT_NE(run.stderr_text.find("launch: all 2 launcher commands exited 0"),
            std::string::npos)
      << run.stderr_text;
}

// standby_workers: the script starts every worker task up to max_workers
// (the standbys wait for a grow), so a static launcher scales up too.
TEST(LaunchScriptTest, StandbyWorkersStartWithTheJob) {
  const std::string spec =
      "num_ps: 2 num_workers: 2 max_workers: 3 standby_workers: true "
      "batch_size: 64 epochs: 1\n";
  ScriptRun run =
      RunScript(*LaunchScript(Spec(spec), Options("slurm")), "JOB=job-3");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("srun --exact --ntasks=3 --cpus-per-task=1 "
                           "--job-name=pstrain-worker "),
            std::string::npos)
      << run.calls;
  // Without standbys only num_workers start (`pstrain node` starts what a
  // Scale adds).
  run = RunScript(*LaunchScript(Spec("num_ps: 2 num_workers: 2 max_workers: 3 "
                                     "batch_size: 64 epochs: 1\n"),
                                Options("slurm")),
                  "JOB=job-3");
  EXPECT_NE(run.calls.find("srun --exact --ntasks=2 --cpus-per-task=1 "
                           "--job-name=pstrain-worker "),
            std::string::npos)
      << run.calls;
}

// An elastic spec lists a host for every task up to max_workers and max_ps
// (ValidateJobSpec): the script starts num_workers and num_ps of them on
// their hosts, and with --agent puts an agent on every host, those of the
// tasks a scale adds included. It was refused as "hosts for one role only".
TEST(LaunchScriptTest, ElasticSpecsWithHostsLaunch) {
  const std::string spec =
      "num_ps: 1 max_ps: 2 num_workers: 1 max_workers: 2 batch_size: 64 "
      "epochs: 1 ps_hosts { host: \"n2\" port: 7000 } "
      "ps_hosts { host: \"n3\" port: 7000 } worker_hosts { host: \"n4\" } "
      "worker_hosts { host: \"n5\" }\n";
  absl::StatusOr<std::string> script =
      LaunchScript(Spec(spec), Options("slurm"));
  ASSERT_TRUE(script.ok()) << script.status();
  ScriptRun run = RunScript(*script, "JOB=job-3");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(std::count(run.calls.begin(), run.calls.end(), '\n'), 2)
      << run.calls;
  EXPECT_NE(run.calls.find("--nodelist=n4 "), std::string::npos) << run.calls;
  EXPECT_EQ(run.calls.find("--nodelist=n5 "), std::string::npos) << run.calls;
  LaunchOptions options = Options("ssh");
  options.agent = true;
  options.pstrain_binary = "/opt/pstrain/bin/pstrain";
  run = RunScript(*LaunchScript(Spec(spec), options), "JOB=job-3");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(std::count(run.calls.begin(), run.calls.end(), '\n'), 4)
      << run.calls;
}

TEST(LaunchScriptTest, SlurmWithHostsOneStepPerTaskOnItsNode) {
  LaunchOptions options = Options("slurm");
  options.cpus_per_task = 4;
  const std::string script = *LaunchScript(Spec(kHosts), options);
  ScriptRun run = RunScript(script, "JOB=job-3");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("srun --exact --nodes=1 --ntasks=1 --nodelist=n4 "
                           "--cpus-per-task=4 --job-name=pstrain-worker "
                           "/opt/pstrain/bin/pstrain_worker "
                           "--coordinator=n1:7070 --job=job-3 --task_index=1"),
            std::string::npos)
      << run.calls;
  EXPECT_EQ(std::count(run.calls.begin(), run.calls.end(), '\n'), 5);
}

TEST(LaunchScriptTest, SbatchHeaderAsksForTheSpecsTasks) {
  LaunchOptions options = Options("slurm");
  options.sbatch = true;
  options.cpus_per_task = 2;
  const std::string anywhere = *LaunchScript(Spec(kAnywhere), options);
  EXPECT_EQ(anywhere.rfind("#!/usr/bin/env bash\n"
                           "#SBATCH --job-name=pstrain-lenet5\n"
                           "#SBATCH --ntasks=4\n"
                           "#SBATCH --cpus-per-task=2\n",
                           0),
            0u)
      << anywhere;
  // Two workers on n4: every node gets room for two tasks.
  const std::string hosts = *LaunchScript(Spec(kHosts), options);
  EXPECT_EQ(hosts.rfind("#!/usr/bin/env bash\n"
                        "#SBATCH --job-name=pstrain-lenet5\n"
                        "#SBATCH --nodes=4\n"
                        "#SBATCH --nodelist=n2,n3,n4,n5\n"
                        "#SBATCH --ntasks-per-node=2\n"
                        "#SBATCH --cpus-per-task=2\n",
                        0),
            0u)
      << hosts;
}

TEST(LaunchScriptTest, MpirunHostfileHasOneLinePerHostWithItsSlots) {
  const std::string script = *LaunchScript(Spec(kHosts), Options("mpirun"));
  ScriptRun run = RunScript(script, "JOB=job-7");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  const std::string root =
      getuid() == 0 ? std::string("--allow-run-as-root ") : std::string();
  EXPECT_NE(run.calls.find(absl::StrCat("mpirun ", root, "-np 3 --hostfile ")),
            std::string::npos)
      << run.calls;
  EXPECT_NE(run.calls.find("--map-by slot --bind-to none "
                           "/opt/pstrain/bin/pstrain_worker "
                           "--coordinator=n1:7070 --job=job-7 [hostfile: n4 "
                           "slots=2;n5 slots=1;]"),
            std::string::npos)
      << run.calls;
  EXPECT_NE(run.calls.find("[hostfile: n2 slots=1;n3 slots=1;]"),
            std::string::npos)
      << run.calls;
}

TEST(LaunchScriptTest, MpirunInterleavedHostsStartEachTaskWithItsIndex) {
  const std::string spec =
      "num_ps: 1 num_workers: 3 batch_size: 64 epochs: 1\n"
      "ps_hosts { host: \"a\" }\n"
      "worker_hosts { host: \"a\" } worker_hosts { host: \"b\" }\n"
      "worker_hosts { host: \"a\" }\n";
  const std::string script = *LaunchScript(Spec(spec), Options("mpirun"));
  ScriptRun run = RunScript(script, "JOB=job-7");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("-np 1 --host b --map-by slot --bind-to none "
                           "/opt/pstrain/bin/pstrain_worker "
                           "--coordinator=n1:7070 --job=job-7 --task_index=1"),
            std::string::npos)
      << run.calls;
  EXPECT_NE(run.calls.find("-np 1 --host a --map-by slot --bind-to none "
                           "/opt/pstrain/bin/pstrain_worker "
                           "--coordinator=n1:7070 --job=job-7 --task_index=2"),
            std::string::npos)
      << run.calls;
}

TEST(LaunchScriptTest, SshQuotesTheRemoteCommand) {
  LaunchOptions options = Options("ssh");
  options.ps_binary = "/opt/my pstrain/pstrain_ps";
  const std::string script = *LaunchScript(Spec(kHosts), options);
  ScriptRun run = RunScript(script, "JOB=job-1");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("ssh -n -o BatchMode=yes n3 /opt/my\\ "
                           "pstrain/pstrain_ps --coordinator=n1:7070 "
                           "--job=job-1 --task_index=1 \n"),
            std::string::npos)
      << run.calls;
}

TEST(LaunchScriptTest, TheTlsFolderReachesOtherNodes) {
  // srun and sbatch pass the environment on; mpirun and ssh are told to.
  ScriptRun run = RunScript(*LaunchScript(Spec(kHosts), Options("mpirun")),
                            "JOB=job-1 PSTRAIN_TLS_DIR=/shared/tls");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("-x PSTRAIN_TLS_DIR -np 3 --hostfile"),
            std::string::npos)
      << run.calls;
  run = RunScript(*LaunchScript(Spec(kHosts), Options("ssh")),
                  "JOB=job-1 PSTRAIN_TLS_DIR=/shared/tls");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("ssh -n -o BatchMode=yes n5 env "
                           "PSTRAIN_TLS_DIR=/shared/tls "
                           "/opt/pstrain/bin/pstrain_worker "),
            std::string::npos)
      << run.calls;
}

TEST(LaunchScriptTest, FirstFailedTaskIsNamedAndDecidesTheExitStatus) {
  const std::string script = *LaunchScript(Spec(kHosts), Options("ssh"));
  ScriptRun run = RunScript(script, "JOB=job-1", "n5", 3);
  EXPECT_EQ(run.exit_code, 3) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("launch: FAILED: worker 2 on n5 exited with "
                                 "status 3"),
            std::string::npos)
      << run.stderr_text;
}

TEST(LaunchScriptTest, TasksStillRunningAfterAFailureAreStopped) {
  // The ps step hangs; the worker step fails: after PSTRAIN_GRACE_S the
  // script stops the ps step and exits with the worker step's status.
  std::string script = *LaunchScript(Spec(kAnywhere), Options("slurm"));
  const std::string hang = "task \"ps tasks";
  const size_t at = script.find(hang);
  ASSERT_NE(at, std::string::npos);
  script.insert(at, "task \"hanging\" sleep 300\n");
  ScriptRun run = RunScript(script, "JOB=job-1", "pstrain_worker", 1);
  EXPECT_EQ(run.exit_code, 1) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("launch: stopping the tasks still running"),
            std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find(
                "launch: FAILED: worker tasks (srun step of 2) exited with "
                "status 1"),
            std::string::npos)
      << run.stderr_text;
}

TEST(LaunchScriptTest, WithoutJobTheScriptStopsBeforeStartingAnything) {
  const std::string script = *LaunchScript(Spec(kAnywhere), Options("slurm"));
  ScriptRun run = RunScript(script, "-u JOB");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.calls, "");
  EXPECT_NE(run.stderr_text.find("set JOB to the job id"), std::string::npos)
      << run.stderr_text;
}

TEST(LaunchScriptTest, RefusesWhatCannotWork) {
  EXPECT_EQ(LaunchScript(Spec(kAnywhere), Options("ssh")).status().message(),
            "--launcher=ssh needs ps_hosts and worker_hosts in the job spec "
            "(slurm and mpirun do not)");
  EXPECT_EQ(LaunchScript(Spec(kAnywhere), Options("pbs")).status().message(),
            "--launcher=pbs: expected slurm, mpirun, ssh or kubernetes");
  LaunchOptions sbatch = Options("mpirun");
  sbatch.sbatch = true;
  EXPECT_EQ(LaunchScript(Spec(kAnywhere), sbatch).status().message(),
            "--sbatch with --launcher=mpirun: expected --launcher=slurm");
}

TEST(LaunchScriptTest, AgentsOnePerNode) {
  LaunchOptions options = Options("slurm");
  options.agent = true;
  options.pstrain_binary = "/opt/pstrain/bin/pstrain";
  options.nodes = 3;
  options.sbatch = true;
  const std::string slurm = *LaunchScript(Spec(kAnywhere), options);
  EXPECT_EQ(slurm.rfind("#!/usr/bin/env bash\n"
                        "#SBATCH --job-name=pstrain-lenet5\n"
                        "#SBATCH --nodes=3\n"
                        "#SBATCH --ntasks-per-node=1\n"
                        "#SBATCH --exclusive\n",
                        0),
            0u)
      << slurm;
  ScriptRun run = RunScript(slurm, "JOB=job-2");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.calls,
            "srun --nodes=3 --ntasks-per-node=1 --job-name=pstrain-node "
            "/opt/pstrain/bin/pstrain node --coordinator=n1:7070 "
            "--job=job-2\n");
  // With hosts: one agent per distinct host (n2, n3, n4, n5).
  options.launcher = "mpirun";
  options.sbatch = false;
  options.gpus_per_node = 8;
  run = RunScript(*LaunchScript(Spec(kHosts), options), "JOB=job-2");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.calls.find("--map-by ppr:1:node --bind-to none -np 4 "
                           "--hostfile "),
            std::string::npos)
      << run.calls;
  EXPECT_NE(run.calls.find("/opt/pstrain/bin/pstrain node "
                           "--coordinator=n1:7070 --job=job-2 "
                           "--gpus_per_node=8 [hostfile: n2 slots=1;n3 "
                           "slots=1;n4 slots=1;n5 slots=1;]"),
            std::string::npos)
      << run.calls;
  options.launcher = "ssh";
  options.gpus_per_node = 0;
  run = RunScript(*LaunchScript(Spec(kHosts), options), "JOB=job-2");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(std::count(run.calls.begin(), run.calls.end(), '\n'), 4)
      << run.calls;
  EXPECT_NE(run.calls.find("ssh -n -o BatchMode=yes n4 "
                           "/opt/pstrain/bin/pstrain node "
                           "--coordinator=n1:7070 --job=job-2 \n"),
            std::string::npos)
      << run.calls;
}

TEST(ShellQuoteTest, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(ShellQuote("/opt/pstrain/bin"), "/opt/pstrain/bin");
  EXPECT_EQ(ShellQuote("10.0.0.1:7070"), "10.0.0.1:7070");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote(""), "''");
}

TEST(InstallTest, CopiesExecutablesIntoPrefixBin) {
  const std::string source = TempDir() + "/tool";
  Write(source, "#!/bin/sh\necho installed\n");
  chmod(source.c_str(), 0700);
  const std::string prefix = TempDir() + "/prefix";
  ASSERT_TRUE(InstallBinaries({source}, prefix).ok());
  struct stat st;
  ASSERT_EQ(stat((prefix + "/bin/tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  EXPECT_EQ(Read(prefix + "/bin/tool"), "#!/bin/sh\necho installed\n");
  // Again, over the installed copy.
  EXPECT_TRUE(InstallBinaries({source}, prefix).ok());
  EXPECT_EQ(InstallBinaries({TempDir() + "/missing"}, prefix).code(),
            absl::StatusCode::kNotFound);
}

// Kubernetes: the manifests as text; tests/kubernetes_test.sh checks them
// against the schema and runs them.
LaunchOptions KubernetesOptions(const std::string& objects) {
  LaunchOptions options;
  options.launcher = "kubernetes";
  options.coordinator = "pstrain-coordinator:7070";
  options.job = "job-3-ab12";
  options.image = "registry.example/pstrain:1";
  options.k8s_objects = objects;
  options.ps_binary = "/opt/pstrain/bin/pstrain_ps";
  options.worker_binary = "/opt/pstrain/bin/pstrain_worker";
  options.coordinator_binary = "/opt/pstrain/bin/pstrain_coordinator";
  return options;
}

constexpr char kKubernetesSpec[] =
    "model: \"lenet5\" dataset: \"fashion_mnist\" mode: \"sync\" "
    "num_ps: 2 num_workers: 3 batch_size: 64 epochs: 1";

TEST(KubernetesManifestsTest, IndexedJobAndHeadlessServicePerRole) {
  LaunchOptions options = KubernetesOptions("tasks");
  options.cpus_per_task = 4;
  options.memory_per_task = "8Gi";
  options.gpus_per_worker = 1;
  absl::StatusOr<std::string> yaml =
      KubernetesManifests(Spec(kKubernetesSpec), options);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  for (const char* want :
       {"kind: Job\n", "name: \"pstrain-job-3-ab12-ps\"",
        "name: \"pstrain-job-3-ab12-worker\"", "completionMode: \"Indexed\"",
        "completions: 3\n", "clusterIP: \"None\"",
        "subdomain: \"pstrain-job-3-ab12-worker\"", "restartPolicy: \"Never\"",
        "backoffLimit: 0\n",
        "\"--advertise=pstrain-job-3-ab12-ps-$(JOB_COMPLETION_INDEX)."
        "pstrain-job-3-ab12-ps\"",
        "\"--job=job-3-ab12\"", "cpu: \"4\"", "memory: \"8Gi\"",
        "nvidia.com/gpu: \"1\"", "secretName: \"pstrain-tls\"",
        "readOnly: true",
        "name: \"OMP_NUM_THREADS\"\n          value: \"4\""}) {
    EXPECT_NE(yaml->find(want), std::string::npos) << want << "\n" << *yaml;
  }
  // The PS pods ask for no GPU.
  EXPECT_EQ(yaml->find("nvidia.com/gpu"), yaml->rfind("nvidia.com/gpu"));
  EXPECT_GT(yaml->find("nvidia.com/gpu"), yaml->find("kind: Job"));
}

// standby_workers: every worker task up to max_workers gets a pod.
TEST(KubernetesManifestsTest, StandbyWorkersHavePods) {
  absl::StatusOr<std::string> yaml = KubernetesManifests(
      Spec("num_ps: 2 num_workers: 2 max_workers: 3 standby_workers: true "
           "batch_size: 64 epochs: 1\n"),
      KubernetesOptions("tasks"));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_NE(yaml->find("The 2 ps and 3 worker tasks"), std::string::npos)
      << *yaml;
}

// max_restarts: 2 of 2 PS and 3 workers: containers restart in their pods
// and report it themselves; each Job's backoffLimit allows 2 restarts of
// every one of its tasks (an allreduce restart restarts every worker).
TEST(KubernetesManifestsTest, RestartsInThePodWithinTheBudget) {
  JobSpec spec = Spec(kKubernetesSpec);
  spec.set_max_restarts(2);
  absl::StatusOr<std::string> yaml =
      KubernetesManifests(spec, KubernetesOptions("tasks"));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  for (const char* want :
       {"restartPolicy: \"OnFailure\"", "backoffLimit: 4\n",
        "backoffLimit: 6\n",
        "name: \"PSTRAIN_SELF_RESTART\"\n          value: \"1\""}) {
    EXPECT_NE(yaml->find(want), std::string::npos) << want << "\n" << *yaml;
  }
  EXPECT_EQ(yaml->find("Never"), std::string::npos) << *yaml;
  // Without restarts the variable is not set.
  yaml = KubernetesManifests(Spec(kKubernetesSpec), KubernetesOptions("tasks"));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(yaml->find("PSTRAIN_SELF_RESTART"), std::string::npos);
}

TEST(KubernetesManifestsTest, CoordinatorDeploymentAndService) {
  absl::StatusOr<std::string> yaml = KubernetesManifests(
      Spec(kKubernetesSpec), KubernetesOptions("coordinator"));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  for (const char* want :
       {"kind: Deployment\n", "kind: Service\n", "replicas: 1\n",
        "type: \"Recreate\"", "\"--port=7070\"",
        "secretName: \"pstrain-coordinator-tls\"", "emptyDir: {}"}) {
    EXPECT_NE(yaml->find(want), std::string::npos) << want << "\n" << *yaml;
  }
  EXPECT_EQ(yaml->find("kind: Job"), std::string::npos);
}

TEST(KubernetesManifestsTest, RefusesWhatItCannotHonour) {
  const JobSpec spec = Spec(kKubernetesSpec);
  LaunchOptions no_job = KubernetesOptions("tasks");
  no_job.job = "$JOB";
  LaunchOptions no_image = KubernetesOptions("tasks");
  no_image.image = "";
  LaunchOptions memory = KubernetesOptions("tasks");
  memory.memory_per_task = "8 GB";
  LaunchOptions coordinator = KubernetesOptions("tasks");
  coordinator.coordinator = "10.0.0.1";
  for (const LaunchOptions& bad : {no_job, no_image, memory, coordinator}) {
    EXPECT_EQ(KubernetesManifests(spec, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  JobSpec hosts = spec;
  hosts.add_ps_hosts()->set_host("10.0.0.2");
  EXPECT_EQ(
      KubernetesManifests(hosts, KubernetesOptions("tasks")).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
