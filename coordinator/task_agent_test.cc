// TaskAgent's self-restart (TaskAgentOptions::self_restart, set by
// PSTRAIN_SELF_RESTART=1): a process whose slot a dead predecessor still
// holds reports the restart itself before registering, within the job's
// max_restarts; past it the job fails with the reason. Without it,
// registration is as before.
#include "coordinator/task_agent.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace pstrain
