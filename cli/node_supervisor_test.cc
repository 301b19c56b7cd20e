// NodeSupervisor against an in-process coordinator, with small shell
// scripts as the tasks: a death restarted while the job table allows it and
// reported once the budget is spent, one budget for every node, the
// coordinator's restart exit code answered uncounted, a job without
// restarts failed at once, a signal stopping every task, and the allreduce
// restart over mutual TLS (each call as the task's own identity).
#include "cli/node_supervisor.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/job_at_caps_test_util.h"
#include "common/tls.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const std::string& path) {
  return absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
}

class NodeSupervisorTest : public ::testing::Test {
 protected:
  // An in-process coordinator (mutual TLS with `tls`) holding one job of
  // `num_ps` shards and `num_workers` workers in `mode`.
  void StartJob(int num_ps, int num_workers, int max_restarts,
                const std::string& mode = "sync", bool tls = false,
                int min_workers = 0, int max_ps = 0) {
    CoordinatorServerOptions options;
    options.address = "127.0.0.1:0";
    if (tls) {
      tls_.dir = dir_ + "/tls";
      ASSERT_TRUE(
          MakeCertificates(tls_.dir, {TlsIdentity{TlsRole::kCoordinator}})
              .ok());
      absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
          ServerCredentials(tls_, TlsIdentity{TlsRole::kCoordinator});
      ASSERT_TRUE(credentials.ok()) << credentials.status();
      options.credentials = *credentials;
    } else {
      tls_ = InsecureTlsOptions();
    }
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> started =
        CoordinatorServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    spec_.set_mode(mode);
    spec_.set_num_ps(num_ps);
    spec_.set_num_workers(num_workers);
    spec_.set_max_restarts(max_restarts);
    spec_.set_min_workers(min_workers);
    spec_.set_max_ps(max_ps);
    ApplyJobDefaults(&spec_);
    absl::StatusOr<std::string> id =
        coordinator_->table().Submit(spec_, absl::Now());
    ASSERT_TRUE(id.ok()) << id.status();
    job_id_ = *id;
    if (tls) {
      std::vector<TlsIdentity> tasks;
      for (int s = 0; s < num_ps; ++s) {
        tasks.push_back(TlsIdentity{TlsRole::kPs, s, job_id_});
      }
      for (int w = 0; w < num_workers; ++w) {
        tasks.push_back(TlsIdentity{TlsRole::kWorker, w, job_id_});
      }
      ASSERT_TRUE(MakeCertificates(tls_.dir, tasks).ok());
      ASSERT_TRUE(RemoveMintingKeys(tls_.dir).ok());
    }
  }

  SupervisorOptions Options() const {
    SupervisorOptions options;
    options.coordinator = absl::StrCat("127.0.0.1:", coordinator_->port());
    options.job_id = job_id_;
    options.tls = tls_;
    options.spec = spec_;
    options.end_grace = absl::Seconds(1);
    options.poll = absl::Milliseconds(50);
    return options;
  }

  // A task running `script` under /bin/sh; "$*" is its extra arguments
  // (--rejoin). `name` names its files: runs (one line "run ARGS" per
  // start) and a marker the script may create.
  SupervisedTask Task(TaskRole role, int index, const std::string& name,
                      const std::string& script) const {
    const std::string runs = Runs(name);
    const std::string marker = dir_ + "/" + name + ".marker";
    SupervisedTask task;
    task.role = role;
    task.index = index;
    task.argv = {
        "/bin/sh", "-c",
        absl::StrCat("echo \"run $*\" >> ", runs, "; M=", marker, "; ", script),
        name};
    return task;
  }
  std::string Runs(const std::string& name) const {
    return dir_ + "/" + name + ".runs";
  }

  JobInfo Job() const {
    absl::StatusOr<JobInfo> job =
        coordinator_->table().Get(job_id_, JobTable::kNoLog);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : JobInfo();
  }

  // Runs `tasks` under a supervisor with `options` to their end; its
  // stdout in *output.
  SupervisorResult Supervise(SupervisorOptions options,
                             const std::vector<SupervisedTask>& tasks,
                             std::string* output) {
    NodeSupervisor supervisor(std::move(options));
    ::testing::internal::CaptureStdout();
    const absl::Status started = supervisor.Start(tasks);
    SupervisorResult result;
    if (started.ok()) result = supervisor.Run();
    *output = ::testing::internal::GetCapturedStdout();
    EXPECT_TRUE(started.ok()) << started;
    return result;
  }

  const std::string dir_ = ::testing::TempDir();
  TlsOptions tls_;
  std::unique_ptr<CoordinatorServer> coordinator_;
  JobSpec spec_;
  std::string job_id_;
};

// Restarts within max_restarts=2, then the third death is reported with
// the spent budget, which fails the job; the other task gets the grace.
TEST_F(NodeSupervisorTest, DeathsAreRestartedUntilTheBudgetIsSpent) {
  StartJob(/*num_ps=*/1, /*num_workers=*/1, /*max_restarts=*/2);
  SupervisorOptions options = Options();
  std::vector<std::string> still_running;
  JobState state_at_grace = JOB_STATE_UNSPECIFIED;
  options.on_grace_over = [&](JobState state,
                              const std::vector<SupervisedTask>& running) {
    state_at_grace = state;
    for (const SupervisedTask& t : running) still_running.push_back(t.key());
  };
  std::string output;
  const absl::Time start = absl::Now();
  const SupervisorResult result =
      Supervise(options,
                {Task(ROLE_PS, 0, "budget-ps", "exit 3"),
                 Task(ROLE_WORKER, 0, "budget-worker", "exec sleep 60")},
                &output);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_THAT(output, HasSubstr("pstrain: ps 0 died (exit code 3); restarting "
                                "it (restart 1 of 2)\n"));
  EXPECT_THAT(output, HasSubstr("pstrain: ps 0 died (exit code 3); restarting "
                                "it (restart 2 of 2)\n"));
  EXPECT_THAT(output, Not(HasSubstr("restart 3")));
  // A shard starts again without --rejoin.
  EXPECT_EQ(Lines(Runs("budget-ps")),
            std::vector<std::string>({"run ", "run ", "run "}));
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.first_failure.role, "ps0");
  EXPECT_EQ(still_running, std::vector<std::string>({"worker0"}));
  EXPECT_EQ(state_at_grace, JOB_FAILED);
  const JobInfo job = Job();
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(JobRestarts(job), 2);
  EXPECT_THAT(job.message(),
              HasSubstr("ps 0 (not registered) failed: exited with exit "
                        "code 3 (the restart budget, --max_restarts=2, is "
                        "spent; deaths: ps 0 (exit code 3), ps 0 (exit code "
                        "3), ps 0 (exit code 3); last checkpoint: none)"));
}

// Two nodes' supervisors of one job spend one budget, the coordinator's: a
// worker restarted (with --rejoin) on one node, a shard on the other.
TEST_F(NodeSupervisorTest, EveryNodeSpendsTheJobsOneBudget) {
  StartJob(/*num_ps=*/1, /*num_workers=*/1, /*max_restarts=*/3);
  const std::string once =
      "if [ ! -e $M ]; then touch $M; kill -9 $$; fi; exit 0";
  SupervisorOptions node = Options();
  node.program = "pstrain node";
  node.names = TaskNames::kOutputPrefix;
  std::string output;
  SupervisorResult result =
      Supervise(node, {Task(ROLE_WORKER, 0, "one-worker", once)}, &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("pstrain node: worker0 died (signal 9); "
                                "restarting it (restart 1 of 3)\n"));
  EXPECT_EQ(Lines(Runs("one-worker")),
            std::vector<std::string>({"run ", "run --rejoin"}));

  result = Supervise(node, {Task(ROLE_PS, 0, "one-ps", once)}, &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("pstrain node: ps0 died (signal 9); "
                                "restarting it (restart 2 of 3)\n"));
  const JobInfo job = Job();
  EXPECT_EQ(JobRestarts(job), 2);
  EXPECT_FALSE(JobEnded(job.state())) << job.message();
}

// kRestartExitCode: the coordinator stopped the task for the job's restart;
// it starts again with --rejoin and no restart is counted, even with none
// allowed.
TEST_F(NodeSupervisorTest, RestartExitCodeStartsTheTaskAgainUncounted) {
  StartJob(/*num_ps=*/0, /*num_workers=*/1, /*max_restarts=*/0);
  std::string output;
  const SupervisorResult result =
      Supervise(Options(),
                {Task(ROLE_WORKER, 0, "rejoin-worker",
                      absl::StrCat("if [ ! -e $M ]; then touch $M; exit ",
                                   kRestartExitCode, "; fi; exit 0"))},
                &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("pstrain: worker 0 stopped for the job's "
                                "restart; starting it again\n"));
  EXPECT_EQ(Lines(Runs("rejoin-worker")),
            std::vector<std::string>({"run ", "run --rejoin"}));
  const JobInfo job = Job();
  EXPECT_EQ(JobRestarts(job), 0);
  EXPECT_FALSE(JobEnded(job.state())) << job.message();
}

// max_restarts 0: the coordinator is not asked; the death is reported,
// which fails the job at once, and the command hears of the failure.
TEST_F(NodeSupervisorTest, WithoutRestartsADeathFailsTheJob) {
  StartJob(/*num_ps=*/1, /*num_workers=*/1, /*max_restarts=*/0);
  SupervisorOptions options = Options();
  std::vector<std::string> failures;
  options.on_failure = [&](const SupervisedTask& task, const ChildExit& exit) {
    failures.push_back(
        absl::StrCat(task.key(), " ", exit.code, " ", exit.last_error_line));
  };
  std::string output;
  const SupervisorResult result =
      Supervise(options,
                {Task(ROLE_PS, 0, "none-ps", "exec sleep 60"),
                 Task(ROLE_WORKER, 0, "none-worker",
                      "echo 'error: the disk is full'; kill -9 $$")},
                &output);
  EXPECT_EQ(result.exit_code, 128 + 9);
  EXPECT_EQ(result.first_failure.role, "worker0");
  EXPECT_EQ(failures,
            std::vector<std::string>({"worker0 -9 error: the disk is full"}));
  EXPECT_THAT(output, Not(HasSubstr("restarting")));
  const JobInfo job = Job();
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(JobRestarts(job), 0);
  EXPECT_THAT(job.message(),
              HasSubstr("worker 0 (not registered) failed: exited with "
                        "signal 9: error: the disk is full"));
  EXPECT_THAT(job.message(), Not(HasSubstr("budget")));
}

// A death whose last line holds a byte that is not UTF-8 is still reported
// (the byte as \xff): a message that is not UTF-8 does not parse at the
// coordinator (INTERNAL), and the job ran on as if nothing had died.
TEST_F(NodeSupervisorTest, ADeathsLastLineThatIsNotUtf8IsReported) {
  StartJob(/*num_ps=*/1, /*num_workers=*/1, /*max_restarts=*/0);
  std::string output;
  const SupervisorResult result =
      Supervise(Options(),
                {Task(ROLE_PS, 0, "utf8-ps", "exec sleep 60"),
                 Task(ROLE_WORKER, 0, "utf8-worker",
                      "printf 'error: cannot open photo-\\377.jpg\\n'; "
                      "kill -9 $$")},
                &output);
  EXPECT_EQ(result.first_failure.role, "worker0");
  EXPECT_EQ(result.first_failure.last_error_line,
            "error: cannot open photo-\xff.jpg");
  const JobInfo job = Job();
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_THAT(job.message(),
              HasSubstr("worker 0 (not registered) failed: exited with "
                        "signal 9: error: cannot open photo-\\xff.jpg"));
}

// The supervisors' stub (CoordinatorStubAs) reads a job at its caps, with
// its log or without: each answer is over gRPC's default 4 MiB.
TEST_F(NodeSupervisorTest, TheStubReadsAJobAtItsCaps) {
  StartJob(/*num_ps=*/1, /*num_workers=*/kWorkersToFillTheStore,
           /*max_restarts=*/0);
  absl::StatusOr<std::string> last =
      FillJobToItsCaps(coordinator_->table(), job_id_);
  ASSERT_TRUE(last.ok()) << last.status();
  absl::StatusOr<std::unique_ptr<Coordinator::Stub>> stub = CoordinatorStubAs(
      Options().coordinator, tls_, TlsIdentity{TlsRole::kWorker, 0, job_id_});
  ASSERT_TRUE(stub.ok()) << stub.status();
  for (const int64_t log_since : {JobTable::kNoLog, int64_t{0}}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    JobRequest request;
    request.set_job_id(job_id_);
    request.set_log_since(log_since);
    JobInfo job;
    const grpc::Status status = (*stub)->GetJob(&context, request, &job);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_GT(job.ByteSizeLong(), size_t{4} << 20);
    EXPECT_EQ(job.log_size(), log_since == 0 ? kLogLinesAtTheCap : 0);
  }
}

// Issue 40, min_workers: a worker whose death finds the budget spent is
// removed by the coordinator; the supervisor leaves it out and the others
// run on (exit 0, the job not failed).
TEST_F(NodeSupervisorTest, AWorkerRemovedOnFailureIsLeftOut) {
  StartJob(/*num_ps=*/0, /*num_workers=*/3, /*max_restarts=*/0, "sync",
           /*tls=*/false, /*min_workers=*/2);
  std::string output;
  const SupervisorResult result =
      Supervise(Options(),
                {Task(ROLE_WORKER, 0, "shrink-0", "sleep 1; exit 0"),
                 Task(ROLE_WORKER, 1, "shrink-1", "sleep 1; exit 0"),
                 Task(ROLE_WORKER, 2, "shrink-2", "kill -9 $$")},
                &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_EQ(result.first_failure.role, "");
  EXPECT_THAT(output, HasSubstr("pstrain: worker 2 removed from the job ("));
  EXPECT_THAT(output, HasSubstr("); the job goes on with 2 workers\n"));
  const JobInfo job = Job();
  EXPECT_FALSE(JobEnded(job.state())) << job.message();
  EXPECT_EQ(job.tasks(2).state(), TASK_REMOVED);
}

// Issue 40, max_ps: a shard an applied membership left out that exits
// non-zero is left out as well (no restart asked, no failure).
TEST_F(NodeSupervisorTest, AShardRemovedByAShrinkIsLeftOut) {
  StartJob(/*num_ps=*/2, /*num_workers=*/1, /*max_restarts=*/0, "sync",
           /*tls=*/false, /*min_workers=*/0, /*max_ps=*/2);
  JobTable& table = coordinator_->table();
  const absl::Time now = absl::Now();
  ASSERT_TRUE(table.Register(job_id_, ROLE_PS, 0, "10.0.0.1:1", now).ok());
  ASSERT_TRUE(table.Register(job_id_, ROLE_PS, 1, "10.0.0.2:1", now).ok());
  ASSERT_TRUE(table.Register(job_id_, ROLE_WORKER, 0, "10.0.0.3:1", now).ok());
  ScaleTarget one;
  one.num_ps = 1;
  ASSERT_TRUE(table.Scale(job_id_, one, now).ok());
  HeartbeatRequest applied;
  applied.mutable_task()->set_job_id(job_id_);
  applied.mutable_task()->set_role(ROLE_WORKER);
  applied.mutable_task()->set_index(0);
  applied.mutable_membership_applied()->set_epoch(1);
  ASSERT_TRUE(table.Heartbeat(applied, now).ok());
  ASSERT_EQ(Job().tasks(1).state(), TASK_REMOVED);
  std::string output;
  const SupervisorResult result =
      Supervise(Options(),
                {Task(ROLE_PS, 0, "shard-0", "sleep 1; exit 0"),
                 Task(ROLE_PS, 1, "shard-1", "exit 3"),
                 Task(ROLE_WORKER, 0, "shard-w0", "sleep 1; exit 0")},
                &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_EQ(result.first_failure.role, "");
  EXPECT_THAT(output, HasSubstr("pstrain: ps 1 removed from the job (left "
                                "out by membership 1 (1 shards)); the job "
                                "goes on with 1 shards\n"));
  EXPECT_EQ(Lines(Runs("shard-1")).size(), 1u);  // not started again
  const JobInfo job = Job();
  EXPECT_FALSE(JobEnded(job.state())) << job.message();
  EXPECT_EQ(job.tasks(1).state(), TASK_REMOVED);
}

// more_tasks: the tasks it returns start while the job runs (a Scale's
// workers in `pstrain run`); one already running is not started twice.
TEST_F(NodeSupervisorTest, MoreTasksStartWhileTheJobRuns) {
  StartJob(/*num_ps=*/0, /*num_workers=*/2, /*max_restarts=*/0);
  SupervisorOptions options = Options();
  int calls = 0;
  // Asked for on the first 5 polls (250 ms), while it sleeps its 1 s.
  options.more_tasks = [&] {
    if (++calls > 5) return std::vector<SupervisedTask>();
    return std::vector<SupervisedTask>{
        Task(ROLE_WORKER, 1, "more-1", "sleep 1; exit 0")};
  };
  std::string output;
  const SupervisorResult result = Supervise(
      options, {Task(ROLE_WORKER, 0, "more-0", "sleep 0.3; exit 0")}, &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_GT(calls, 1);
  EXPECT_EQ(Lines(Runs("more-1")), std::vector<std::string>({"run "}));
}

// A signal (SIGTERM through stop_signal) stops every task at once, after
// the command's own step (on_signal).
TEST_F(NodeSupervisorTest, SigtermStopsEveryTask) {
  StartJob(/*num_ps=*/1, /*num_workers=*/2, /*max_restarts=*/3);
  static volatile std::sig_atomic_t stop = 0;
  stop = 0;
  SupervisorOptions options = Options();
  options.stop_signal = &stop;
  options.end_grace = absl::Seconds(60);
  bool on_signal = false;
  options.on_signal = [&] { on_signal = true; };
  std::thread signaller([] {
    absl::SleepFor(absl::Milliseconds(500));
    stop = SIGTERM;
  });
  std::string output;
  const absl::Time start = absl::Now();
  const SupervisorResult result =
      Supervise(options,
                {Task(ROLE_PS, 0, "stop-ps", "exec sleep 60"),
                 Task(ROLE_WORKER, 0, "stop-worker0", "exec sleep 60"),
                 Task(ROLE_WORKER, 1, "stop-worker1", "exec sleep 60")},
                &output);
  signaller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(on_signal);
  EXPECT_EQ(result.signal, SIGTERM);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM);
  EXPECT_THAT(output, Not(HasSubstr("restarting")));
  EXPECT_EQ(JobRestarts(Job()), 0);
}

// Allreduce over mutual TLS: worker 1's death restarts every worker (one
// restart, asked as worker 1); worker 0, stopped by the coordinator, starts
// again uncounted.
TEST_F(NodeSupervisorTest, AllreduceRestartOverMutualTls) {
  StartJob(/*num_ps=*/0, /*num_workers=*/2, /*max_restarts=*/3, "allreduce",
           /*tls=*/true);
  std::string output;
  const SupervisorResult result = Supervise(
      Options(),
      {Task(ROLE_WORKER, 0, "ar-worker0",
            absl::StrCat("if [ ! -e $M ]; then touch $M; sleep 1; exit ",
                         kRestartExitCode, "; fi; exit 0")),
       Task(ROLE_WORKER, 1, "ar-worker1",
            "if [ ! -e $M ]; then touch $M; kill -9 $$; fi; exit 0")},
      &output);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_THAT(output,
              HasSubstr("pstrain: worker 1 died (signal 9); restarting every "
                        "worker from the newest checkpoint (restart 1 of "
                        "3)\n"));
  EXPECT_THAT(output, HasSubstr("pstrain: worker 0 stopped for the job's "
                                "restart; starting it again\n"));
  EXPECT_EQ(Lines(Runs("ar-worker1")),
            std::vector<std::string>({"run ", "run --rejoin"}));
  const JobInfo job = Job();
  EXPECT_EQ(JobRestarts(job), 1);
  EXPECT_FALSE(JobEnded(job.state())) << job.message();
}

}  // namespace
}  // namespace pstrain
