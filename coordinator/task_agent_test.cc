// TaskAgent's self-restart (TaskAgentOptions::self_restart, set by
// PSTRAIN_SELF_RESTART=1): a process whose slot a dead predecessor still
// holds reports the restart itself before registering, within the job's
// max_restarts; past it the job fails with the reason. Without it,
// registration is as before.
#include "coordinator/task_agent.h"

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_server.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// A plaintext coordinator on 127.0.0.1 with one job of one PS and one worker
// and max_restarts: 1.
class SelfRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions options;
    options.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    JobSpec spec;
    spec.set_num_ps(1);
    spec.set_num_workers(1);
    spec.set_max_restarts(1);
    absl::StatusOr<std::string> job =
        server_->table().Submit(spec, absl::Now());
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
  }

  // A worker 0 process; `self_restart` as PSTRAIN_SELF_RESTART=1 sets it.
  std::unique_ptr<TaskAgent> Worker(bool self_restart) {
    TaskAgentOptions options;
    options.coordinator = absl::StrCat("127.0.0.1:", server_->port());
    options.job_id = job_;
    options.role = ROLE_WORKER;
    options.index = 0;
    options.rpc_timeout = absl::Seconds(5);
    options.coordinator_timeout = absl::Seconds(5);
    options.self_restart = self_restart;
    return std::make_unique<TaskAgent>(options);
  }

  TaskInfo WorkerSlot() {
    absl::StatusOr<JobInfo> job = server_->table().Get(job_);
    EXPECT_TRUE(job.ok()) << job.status();
    return job->tasks(1);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string job_;
};

TEST_F(SelfRestartTest, ReportsItsRestartThenRegistersUntilTheBudgetIsSpent) {
  // The first process: its slot is waiting, nothing to report.
  std::unique_ptr<TaskAgent> first = Worker(true);
  ASSERT_TRUE(first->Register("worker-0.pod").ok());
  EXPECT_FALSE(first->rejoining());
  EXPECT_EQ(WorkerSlot().restarts(), 0);

  // Its container restarted (same pod, same address): restart 1 of 1.
  std::unique_ptr<TaskAgent> second = Worker(true);
  absl::Status s = second->Register("worker-0.pod");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(second->rejoining());
  TaskInfo slot = WorkerSlot();
  EXPECT_EQ(slot.restarts(), 1);
  EXPECT_EQ(slot.state(), TASK_REGISTERED);
  EXPECT_NE(slot.message().find("PSTRAIN_SELF_RESTART=1"), std::string::npos)
      << slot.message();

  // Once more: past the budget the job fails, and Register says why.
  std::unique_ptr<TaskAgent> third = Worker(true);
  s = third->Register("worker-0.pod");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("restart budget (1) is spent"), std::string::npos)
      << s;
  absl::StatusOr<JobInfo> job = server_->table().Get(job_);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), JOB_FAILED);
}

TEST_F(SelfRestartTest, WithoutItASecondRegistrationIsAsBefore) {
  std::unique_ptr<TaskAgent> first = Worker(false);
  ASSERT_TRUE(first->Register("worker-0.pod").ok());
  // The same address: a retried registration, a no-op; another: refused.
  std::unique_ptr<TaskAgent> second = Worker(false);
  EXPECT_TRUE(second->Register("worker-0.pod").ok());
  EXPECT_FALSE(second->rejoining());
  EXPECT_EQ(second->Register("elsewhere.pod").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(WorkerSlot().restarts(), 0);
}

// Elastic jobs (issue 40): the heartbeats carry the membership to the
// workers; worker 0's MembershipApplied reaches the table; a worker left
// out is told it was removed.
TEST(TaskAgentMembershipTest, HeartbeatsCarryTheMembershipBothWays) {
  CoordinatorServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  JobTable& table = (*server)->table();
  JobSpec spec;
  spec.set_num_ps(1);
  spec.set_num_workers(3);
  spec.set_max_workers(3);
  const std::string job = *table.Submit(spec, absl::Now());
  ASSERT_TRUE(table.Register(job, ROLE_PS, 0, "ps0:1", absl::Now()).ok());
  std::vector<std::unique_ptr<TaskAgent>> workers;
  for (int w = 0; w < 3; ++w) {
    TaskAgentOptions options;
    options.coordinator = absl::StrCat("127.0.0.1:", (*server)->port());
    options.job_id = job;
    options.index = w;
    options.rpc_timeout = absl::Seconds(5);
    options.heartbeat_interval = absl::Milliseconds(20);
    workers.push_back(std::make_unique<TaskAgent>(options));
    ASSERT_TRUE(workers.back()->Register(absl::StrCat("w", w, ":1")).ok());
  }
  absl::Notification removed;
  workers[2]->StartHeartbeats([](JobState, const std::string&) {}, nullptr,
                              [&removed] { removed.Notify(); });
  workers[0]->StartHeartbeats([](JobState, const std::string&) {});
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<Membership> first = workers[0]->WaitForMembership(0, deadline);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->workers_size(), 3);
  // Without heartbeats nothing arrives.
  EXPECT_EQ(workers[1]
                ->WaitForMembership(0, absl::Now() + absl::Milliseconds(50))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(workers[1]->membership().has_value());
  // A membership is ready once its workers but 0 are prepared (their
  // models built): worker 1 says so with its first heartbeat.
  workers[1]->SetPrepared();
  workers[1]->StartHeartbeats([](JobState, const std::string&) {});
  while (!table.Get(job)->tasks(2).prepared() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(table.Get(job)->tasks(2).prepared());
  EXPECT_FALSE(table.Get(job)->tasks(3).prepared());

  ASSERT_TRUE(table.Scale(job, 2, 7, absl::Now()).ok());
  absl::StatusOr<Membership> shrunk =
      workers[0]->WaitForMembership(1, deadline);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->workers_size(), 2);
  EXPECT_EQ(shrunk->at_step(), 7);
  EXPECT_TRUE(shrunk->ready());
  EXPECT_FALSE(workers[2]->removed());  // not applied yet
  MembershipApplied applied;
  applied.set_epoch(1);
  applied.set_step(7);
  applied.set_old_workers(3);
  applied.set_new_workers(2);
  workers[0]->SetMembershipApplied(applied);
  ASSERT_TRUE(removed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(workers[2]->removed());
  EXPECT_EQ(workers[2]->membership()->epoch(), 1);
  EXPECT_EQ(table.Get(job)->membership_history_size(), 1);
  // The removed worker reports its end: no failure.
  ASSERT_TRUE(workers[2]->Finish(true, "").ok());
  EXPECT_EQ(table.Get(job)->tasks(3).state(), TASK_REMOVED);
  EXPECT_EQ(table.Get(job)->state(), JOB_RUNNING);
  // Its heartbeats stopped: a wait ends at once.
  EXPECT_EQ(workers[2]->WaitForMembership(5, deadline).status().code(),
            absl::StatusCode::kCancelled);
}

// A task's lines quote bytes as they come (a file name that is not UTF-8,
// worker/image_folder_scan.cc): they reach the table escaped, the task
// keeps running, and its report with such text lands too.
TEST(TaskAgentUtf8Test, TextThatIsNotUtf8ReachesTheTableEscaped) {
  CoordinatorServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  JobTable& table = (*server)->table();
  JobSpec spec;
  spec.set_num_ps(1);
  spec.set_num_workers(1);
  const std::string job = *table.Submit(spec, absl::Now());
  ASSERT_TRUE(table.Register(job, ROLE_PS, 0, "ps0:1", absl::Now()).ok());
  absl::Notification ended;
  std::string why;
  TaskAgentOptions options;
  options.coordinator = absl::StrCat("127.0.0.1:", (*server)->port());
  options.job_id = job;
  options.rpc_timeout = absl::Seconds(5);
  options.heartbeat_interval = absl::Milliseconds(20);
  TaskAgent agent(options);
  ASSERT_TRUE(agent.Register("w0:1").ok());
  agent.StartHeartbeats([&](JobState, const std::string& message) {
    why = message;
    ended.Notify();
  });
  agent.Log("cannot decode photo-\xff.jpg");
  auto logged = [&](const std::string& text) {
    const JobInfo info = *table.Get(job);
    for (const LogLine& line : info.log()) {
      if (line.text() == text) return true;
    }
    return false;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!logged("cannot decode photo-\\xff.jpg") && !ended.HasBeenNotified() &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(logged("cannot decode photo-\\xff.jpg"));
  // More heartbeats pass; none is refused.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(ended.HasBeenNotified()) << why;

  agent.Log("last line \xfe");
  RunResult result;
  result.set_model("lenet5\xc3");
  result.set_test_accuracy(0.5);
  const absl::Status finished = agent.Finish(true, "done \xff", &result);
  ASSERT_TRUE(finished.ok()) << finished;
  const JobInfo info = *table.Get(job);
  EXPECT_EQ(info.state(), JOB_SUCCEEDED);
  EXPECT_EQ(info.result().model(), "lenet5\\xc3");
  EXPECT_TRUE(logged("last line \\xfe"));
  EXPECT_FALSE(ended.HasBeenNotified()) << why;
}

// A KvWait parked on a coordinator that stops (its polls end UNAVAILABLE)
// asks its successor on the same port and job file, and gets the value set
// there, within its timeout (it failed at the stop).
TEST(TaskAgentKvWaitTest, AWaitRidesOutACoordinatorRestart) {
  const std::string job_file =
      absl::StrCat(::testing::TempDir(), "/kv_wait_restart_jobs.pb");
  std::remove(job_file.c_str());
  CoordinatorServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  server_options.job_file = job_file;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> first =
      CoordinatorServer::Start(server_options);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  JobSpec spec;
  spec.set_num_ps(1);
  spec.set_num_workers(2);
  absl::StatusOr<std::string> job = (*first)->table().Submit(spec, absl::Now());
  ASSERT_TRUE(job.ok()) << job.status();

  TaskAgentOptions options;
  options.coordinator = absl::StrCat("127.0.0.1:", port);
  options.job_id = *job;
  options.role = ROLE_WORKER;
  options.index = 1;
  options.rpc_timeout = absl::Seconds(5);
  options.coordinator_timeout = absl::Seconds(5);
  TaskAgent agent(options);
  absl::StatusOr<std::string> value = absl::UnknownError("not waited");
  std::thread waiter(
      [&] { value = agent.KvWait("worker-0/address", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(500));  // parked on the first
  first->reset();
  server_options.address = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> second =
      CoordinatorServer::Start(server_options);
  // The waiter is joined before any assertion can return.
  EXPECT_TRUE(second.ok()) << second.status();
  if (second.ok()) {
    EXPECT_TRUE(
        (*second)->table().Set(*job, "worker-0/address", "w0.pod:7001").ok());
  }
  waiter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "w0.pod:7001");
}

// A job at the table's caps: its key-value store full (4 MiB, 16 workers'
// 256 KiB each), a result of nearly 1 MiB and a full log (4 MiB). GetJob
// without the log still answers 5 MB, over gRPC's default receive limit
// of 4 MiB, which made FetchSpec and a self-restarting task's Register fail
// with RESOURCE_EXHAUSTED (no task of the job could start or restart).
TEST(TaskAgentCapsTest, AJobAtItsCapsIsRead) {
  CoordinatorServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  JobTable& table = (*server)->table();
  const JobTableLimits limits;
  constexpr int kWorkers = 16;
  ASSERT_EQ(kWorkers * limits.max_kv_bytes_per_task,
            limits.max_kv_bytes_per_job);
  JobSpec spec;
  spec.set_num_ps(1);
  spec.set_num_workers(kWorkers);
  spec.set_max_restarts(1);
  absl::StatusOr<std::string> job = table.Submit(spec, absl::Now());
  ASSERT_TRUE(job.ok()) << job.status();
  for (int w = 0; w < kWorkers; ++w) {
    for (int k = 0; k < 4; ++k) {
      const std::string key = absl::StrCat("worker-", w, "/k", k);
      const absl::Status set = table.Set(
          *job, key,
          std::string(limits.max_kv_bytes_per_task / 4 - key.size(), 'v'));
      ASSERT_TRUE(set.ok()) << set;
    }
  }
  HeartbeatRequest beat;
  beat.mutable_task()->set_job_id(*job);
  beat.mutable_task()->set_role(ROLE_WORKER);
  beat.mutable_task()->set_index(1);
  for (int i = 0; i < 1100; ++i) {
    beat.add_log_lines(std::string(limits.max_text_item_bytes, 'x'));
  }
  ASSERT_TRUE(table.Heartbeat(beat, absl::Now()).ok());
  beat.clear_log_lines();
  beat.mutable_task()->set_index(0);
  beat.mutable_result()->set_dataset(
      std::string(limits.max_result_bytes - 64, 'r'));
  ASSERT_TRUE(table.Heartbeat(beat, absl::Now()).ok());
  absl::StatusOr<JobInfo> info = table.Get(*job, JobTable::kNoLog);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->ByteSizeLong(), size_t{5} << 20);
  EXPECT_EQ(table.Get(*job)->log_bytes(), limits.max_log_bytes_per_job);

  TaskAgentOptions options;
  options.coordinator = absl::StrCat("127.0.0.1:", (*server)->port());
  options.job_id = *job;
  options.role = ROLE_WORKER;
  options.index = 2;
  options.rpc_timeout = absl::Seconds(5);
  options.coordinator_timeout = absl::Seconds(5);
  options.self_restart = true;
  TaskAgent agent(options);
  absl::StatusOr<JobSpec> fetched = agent.FetchSpec();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->num_workers(), kWorkers);
  // Register first reads the task's slot (GetJob) as well.
  const absl::Status registered = agent.Register("worker-2.pod");
  ASSERT_TRUE(registered.ok()) << registered;
  // A value at its cap, by KvWait.
  absl::StatusOr<std::string> value =
      agent.KvWait("worker-15/k3", absl::Seconds(5));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->size(), limits.max_kv_bytes_per_task / 4 - 12);
}

}  // namespace
}  // namespace pstrain
