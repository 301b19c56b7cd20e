// Elastic jobs through the JobTable (issue 40): idle tasks, Scale, the
// membership in heartbeat answers, worker 0's reports, shrink on failure
// and the job file.
#include "coordinator/job_membership.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

// One shard; `extra`: the elastic fields.
JobSpec Spec(int num_workers, const std::string& extra) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(absl::StrCat("num_ps: 1 num_workers: ", num_workers,
                                " batch_size: 8 epochs: 1 ", extra),
                   "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::string Address(TaskRole role, int index) {
  return absl::StrCat("10.0.0.", role == ROLE_PS ? 1 : 10 + index, ":7000");
}

// Submits `spec` and registers the shard and workers 0 to `members` - 1.
std::string Running(JobTable& table, const JobSpec& spec, int members) {
  const std::string id = *table.Submit(spec, kT0);
  EXPECT_TRUE(table.Register(id, ROLE_PS, 0, Address(ROLE_PS, 0), kT0).ok());
  for (int w = 0; w < members; ++w) {
    EXPECT_TRUE(
        table.Register(id, ROLE_WORKER, w, Address(ROLE_WORKER, w), kT0).ok());
  }
  return id;
}

TaskState WorkerState(JobTable& table, const std::string& id, int index) {
  const JobInfo job = *table.Get(id);
  return job.tasks(job.spec().num_ps() + index).state();
}

HeartbeatResponse Beat(JobTable& table, const std::string& id, int worker,
                       const MembershipApplied* applied = nullptr,
                       absl::Time now = kT0 + absl::Seconds(1),
                       TaskRole role = ROLE_WORKER) {
  HeartbeatRequest request;
  request.mutable_task()->set_job_id(id);
  request.mutable_task()->set_role(role);
  request.mutable_task()->set_index(worker);
  if (applied != nullptr) *request.mutable_membership_applied() = *applied;
  HeartbeatResponse answer;
  absl::StatusOr<JobState> state =
      table.Heartbeat(request, now, nullptr, &answer);
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) answer.set_state(*state);
  return answer;
}

absl::Status Finish(JobTable& table, const std::string& id, int worker,
                    bool ok) {
  TaskFinishedRequest request;
  request.mutable_task()->set_job_id(id);
  request.mutable_task()->set_role(ROLE_WORKER);
  request.mutable_task()->set_index(worker);
  request.set_ok(ok);
  request.set_message(ok ? "" : "exited with signal 9");
  return table.TaskFinished(request, kT0 + absl::Seconds(2));
}

MembershipApplied Applied(int64_t epoch, int64_t step, int old_workers,
                          int new_workers) {
  MembershipApplied applied;
  applied.set_epoch(epoch);
  applied.set_step(step);
  applied.set_elapsed_ms(12.5);
  applied.set_old_workers(old_workers);
  applied.set_new_workers(new_workers);
  return applied;
}

bool LogHas(const JobInfo& job, const std::string& text) {
  for (const LogLine& line : job.log()) {
    if (line.text() == text) return true;
  }
  return false;
}

std::string Workers(const Membership& m) {
  std::string out;
  for (int w : m.workers()) absl::StrAppend(&out, out.empty() ? "" : ",", w);
  return out;
}

TEST(JobMembershipTest, IdleTasksAreNotWaitedForAndCannotRegister) {
  JobTable table;
  const std::string id = Running(table, Spec(2, "max_workers: 4"), 2);
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_RUNNING);
  ASSERT_EQ(job.tasks_size(), 5);
  EXPECT_EQ(WorkerState(table, id, 2), TASK_IDLE);
  EXPECT_EQ(WorkerState(table, id, 3), TASK_IDLE);
  EXPECT_EQ(job.membership().epoch(), 0);
  EXPECT_EQ(Workers(job.membership()), "0,1");
  EXPECT_TRUE(job.membership().ready());
  const absl::Status idle =
      table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0);
  EXPECT_EQ(idle.code(), absl::StatusCode::kFailedPrecondition) << idle;
  EXPECT_EQ(table.Register(id, ROLE_WORKER, 4, "h:1", kT0).code(),
            absl::StatusCode::kInvalidArgument);
  // The layout lists the idle tasks without addresses.
  absl::StatusOr<std::vector<std::string>> layout =
      table.WaitForLayout(id, kT0 + absl::Seconds(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->size(), 5u);
  EXPECT_EQ((*layout)[3], "");
  // A job that is not elastic answers heartbeats without a membership.
  const std::string plain = Running(table, Spec(2, ""), 2);
  const HeartbeatResponse answer = Beat(table, plain, 1);
  EXPECT_FALSE(answer.has_membership());
  EXPECT_FALSE(answer.removed());
}

TEST(JobMembershipTest, GrowingAddsTheLowestIdleWorkersReadyOnceRegistered) {
  JobTable table;
  const std::string id = Running(table, Spec(2, "max_workers: 4"), 2);
  absl::StatusOr<Membership> m =
      table.Scale(id, 3, 200, kT0 + absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->epoch(), 1);
  EXPECT_EQ(Workers(*m), "0,1,2");
  EXPECT_FALSE(m->ready());
  EXPECT_EQ(m->at_step(), 200);
  EXPECT_EQ(m->reason(), "scale to 3 workers");
  JobInfo job = *table.Get(id);
  EXPECT_EQ(job.tasks(3).state(), TASK_WAITING);
  EXPECT_EQ(job.tasks(3).waiting_since_ms(),
            absl::ToUnixMillis(kT0 + absl::Seconds(5)));
  EXPECT_EQ(WorkerState(table, id, 3), TASK_IDLE);
  EXPECT_TRUE(LogHas(job,
                     "scale to 3 workers requested: membership 1 (workers 0, "
                     "1, 2) at step 200 or the next"));
  // The workers learn it from their heartbeats, not yet ready.
  HeartbeatResponse answer = Beat(table, id, 0);
  EXPECT_EQ(answer.membership().epoch(), 1);
  EXPECT_FALSE(answer.membership().ready());
  EXPECT_FALSE(answer.removed());
  // The same count again changes nothing.
  EXPECT_EQ(table.Scale(id, 3, 0, kT0)->epoch(), 1);
  // 4, then 3 again before worker 3 registered: it is not waited for, and
  // the membership waits for worker 2 still.
  ASSERT_TRUE(table.Scale(id, 4, 0, kT0).ok());
  EXPECT_EQ(WorkerState(table, id, 3), TASK_WAITING);
  m = table.Scale(id, 3, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->epoch(), 3);
  EXPECT_FALSE(m->ready());
  EXPECT_EQ(WorkerState(table, id, 3), TASK_REMOVED);
  ASSERT_TRUE(
      table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0).ok());
  job = *table.Get(id);
  EXPECT_TRUE(job.membership().ready());
  EXPECT_TRUE(job.memberships(job.memberships_size() - 1).ready());
  EXPECT_TRUE(Beat(table, id, 2).membership().ready());
  // A joining task that never registers fails the job as any other, within
  // registration_timeout_s (600 s) of the Scale.
  m = table.Scale(id, 4, 0, kT0 + absl::Seconds(10));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1,2,3");
  EXPECT_TRUE(
      table.CheckHeartbeats(kT0 + absl::Seconds(600), absl::Hours(1)).empty());
  EXPECT_EQ(
      table.CheckHeartbeats(kT0 + absl::Seconds(611), absl::Hours(1)).size(),
      1u);
  EXPECT_TRUE(absl::StrContains(table.Get(id)->message(),
                                "waiting for worker 3 on an unassigned host "
                                "for 601 s"))
      << table.Get(id)->message();
}

TEST(JobMembershipTest, ScaleRefusals) {
  JobTable table;
  const std::string plain = Running(table, Spec(2, ""), 2);
  const std::string id =
      Running(table, Spec(2, "max_workers: 4 min_workers: 2"), 2);
  const struct {
    std::string id;
    int num_workers;
    int64_t at_step;
    absl::StatusCode code;
    std::string error;
  } cases[] = {
      {plain, 3, 0, absl::StatusCode::kInvalidArgument,
       "job-1 is not elastic: its spec has no max_workers; a job is scaled "
       "only within max_workers"},
      {id, 5, 0, absl::StatusCode::kInvalidArgument,
       "job-2: scale to 5 workers; expected 2 to 4 (max(1, min_workers, "
       "backup_workers + 1) to max_workers)"},
      {id, 1, 0, absl::StatusCode::kInvalidArgument,
       "job-2: scale to 1 workers; expected 2 to 4 (max(1, min_workers, "
       "backup_workers + 1) to max_workers)"},
      {id, 3, -1, absl::StatusCode::kInvalidArgument,
       "job-2: at_step -1; expected >= 0 (0: the next step)"},
      {"job-9", 3, 0, absl::StatusCode::kNotFound, "unknown job job-9"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Membership> m =
        table.Scale(c.id, c.num_workers, c.at_step, kT0);
    EXPECT_EQ(m.status().code(), c.code) << c.error;
    EXPECT_EQ(m.status().message(), c.error);
  }
  // Pending: not running yet.
  const std::string pending = *table.Submit(Spec(2, "max_workers: 4"), kT0);
  absl::StatusOr<Membership> m = table.Scale(pending, 3, 0, kT0);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.status().message(),
            "job-3 is JOB_PENDING; only a RUNNING job is scaled");
  EXPECT_EQ(table.Get(id)->membership().epoch(), 0);
}

TEST(JobMembershipTest, ShrinkIsAppliedByWorkerZeroThenTheRemovedExit) {
  JobTable table;
  const std::string id = Running(table, Spec(4, "max_workers: 4"), 4);
  absl::StatusOr<Membership> m = table.Scale(id, 2, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1");
  EXPECT_TRUE(m->ready());
  // Not applied yet: worker 3 still trains. Worker 2 may learn that it
  // left from a shard first: its failure is no failure.
  EXPECT_FALSE(Beat(table, id, 3).removed());
  ASSERT_TRUE(Finish(table, id, 2, false).ok());
  EXPECT_EQ(WorkerState(table, id, 2), TASK_REMOVED);
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  const MembershipApplied applied = Applied(1, 100, 4, 2);
  Beat(table, id, 0, &applied);
  Beat(table, id, 0, &applied);  // a repeat is ignored
  JobInfo job = *table.Get(id);
  ASSERT_EQ(job.membership_history_size(), 1);
  EXPECT_EQ(job.membership_history(0).step(), 100);
  EXPECT_TRUE(
      LogHas(job,
             "membership 1: 4 workers -> 2 at step 100 (12 ms): scale to 2 "
             "workers"));
  const HeartbeatResponse answer = Beat(table, id, 3);
  EXPECT_TRUE(answer.removed());
  EXPECT_EQ(answer.membership().epoch(), 1);
  EXPECT_FALSE(Beat(table, id, 1).removed());
  // A removed worker's end, clean or not, is no failure.
  ASSERT_TRUE(Finish(table, id, 3, true).ok());
  ASSERT_TRUE(Finish(table, id, 2, false).ok());
  EXPECT_EQ(WorkerState(table, id, 3), TASK_REMOVED);
  EXPECT_EQ(WorkerState(table, id, 2), TASK_REMOVED);
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  // The layout leaves the removed out.
  absl::StatusOr<std::vector<std::string>> layout =
      table.WaitForLayout(id, kT0 + absl::Seconds(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ((*layout)[1 + 1], Address(ROLE_WORKER, 1));
  EXPECT_EQ((*layout)[1 + 3], "");
  // Growing again takes the removed slots back.
  m = table.Scale(id, 3, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1,2");
  EXPECT_EQ(WorkerState(table, id, 2), TASK_WAITING);
  ASSERT_TRUE(table.Scale(id, 2, 0, kT0).ok());
  // The members' ends make the job succeed.
  const MembershipApplied back = Applied(3, 150, 2, 2);
  Beat(table, id, 0, &back);
  ASSERT_TRUE(Finish(table, id, 1, true).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  ASSERT_TRUE(Finish(table, id, 0, true).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_SUCCEEDED);
}

TEST(JobMembershipTest, ShrinkOnFailureKeepsMinWorkers) {
  JobTable table;
  const std::string id =
      Running(table, Spec(3, "min_workers: 2 max_restarts: 1"), 3);
  // One restart is in the budget.
  ASSERT_TRUE(
      table.TaskRestarting(id, ROLE_WORKER, 2, "died (signal 9)", kT0).ok());
  ASSERT_TRUE(
      table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0).ok());
  absl::StatusOr<int> spent =
      table.TaskRestarting(id, ROLE_WORKER, 2, "died (signal 9)", kT0);
  EXPECT_EQ(spent.status().code(), absl::StatusCode::kFailedPrecondition);
  JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_RUNNING);
  EXPECT_EQ(WorkerState(table, id, 2), TASK_REMOVED);
  EXPECT_EQ(job.membership().epoch(), 1);
  EXPECT_EQ(Workers(job.membership()), "0,1");
  EXPECT_TRUE(job.membership().ready());
  EXPECT_EQ(job.membership().reason(),
            "worker 2 removed: its restart budget is spent");
  EXPECT_TRUE(LogHas(job,
                     "worker 2 removed: its restart budget is spent; "
                     "membership 1: 2 workers (min_workers 2); the job goes "
                     "on"));
  // The supervisor's report of the same death changes nothing.
  EXPECT_TRUE(Finish(table, id, 2, false).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  // One more would leave fewer than min_workers: the job fails as before.
  ASSERT_TRUE(Finish(table, id, 1, false).ok());
  job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "worker 1")) << job.message();
}

TEST(JobMembershipTest, WithoutMinWorkersOrForWorkerZeroAFailureFailsTheJob) {
  JobTable table;
  const std::string elastic = Running(table, Spec(3, "max_workers: 4"), 3);
  ASSERT_TRUE(Finish(table, elastic, 2, false).ok());
  EXPECT_EQ(table.Get(elastic)->state(), JOB_FAILED);
  const std::string chief = Running(table, Spec(3, "min_workers: 1"), 3);
  ASSERT_TRUE(Finish(table, chief, 0, false).ok());
  EXPECT_EQ(table.Get(chief)->state(), JOB_FAILED);
  // A silent worker is removed with min_workers, lost without.
  for (const std::string spec : {"min_workers: 1", "max_workers: 3"}) {
    const std::string id = Running(table, Spec(3, spec), 3);
    const absl::Time later = kT0 + absl::Seconds(25);
    for (int w : {0, 1}) Beat(table, id, w, nullptr, later);
    Beat(table, id, 0, nullptr, later, ROLE_PS);
    table.CheckHeartbeats(kT0 + absl::Seconds(30), absl::Seconds(10));
    const JobInfo job = *table.Get(id);
    if (spec == "max_workers: 3") {
      EXPECT_EQ(job.state(), JOB_FAILED);
      EXPECT_TRUE(absl::StrContains(job.message(), "lost worker 2"));
      continue;
    }
    EXPECT_EQ(job.state(), JOB_RUNNING) << job.message();
    EXPECT_EQ(WorkerState(table, id, 2), TASK_REMOVED);
    EXPECT_TRUE(LogHas(job,
                       "worker 2 removed: no heartbeat for 30 s; membership "
                       "1: 2 workers (min_workers 1); the job goes on"));
  }
}

// Worker 0's report is written with the next flush (within a second).
TEST(JobMembershipTest, AppliedReportIsWrittenByFlushIfDirty) {
  const std::string file =
      std::string(std::getenv("TEST_TMPDIR")) + "/applied.jobs";
  JobTable table(file);
  const std::string id = Running(table, Spec(3, "max_workers: 3"), 3);
  ASSERT_TRUE(table.Scale(id, 2, 0, kT0).ok());
  const MembershipApplied applied = Applied(1, 9, 3, 2);
  Beat(table, id, 0, &applied);
  ASSERT_TRUE(table.FlushIfDirty().ok());
  absl::StatusOr<std::unique_ptr<JobTable>> loaded = JobTable::Load(file, kT0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->Get(id)->membership_history_size(), 1);
  EXPECT_EQ((*loaded)->Get(id)->memberships_size(), 1);
}

TEST(JobMembershipTest, MembershipSurvivesLoad) {
  const std::string file =
      std::string(std::getenv("TEST_TMPDIR")) + "/membership.jobs";
  std::string id;
  {
    JobTable table(file);
    id = Running(table, Spec(2, "max_workers: 4 min_workers: 1"), 2);
    ASSERT_TRUE(table.Scale(id, 3, 50, kT0).ok());
    ASSERT_TRUE(
        table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0).ok());
    const MembershipApplied applied = Applied(1, 60, 2, 3);
    Beat(table, id, 0, &applied);
    ASSERT_TRUE(table.Scale(id, 2, 0, kT0).ok());
  }
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(file, kT0 + absl::Seconds(3));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const JobInfo job = *(*loaded)->Get(id);
  EXPECT_EQ(job.membership().epoch(), 2);
  EXPECT_EQ(Workers(job.membership()), "0,1");
  ASSERT_EQ(job.memberships_size(), 2);
  EXPECT_EQ(job.memberships(0).epoch(), 1);
  ASSERT_EQ(job.membership_history_size(), 1);
  EXPECT_EQ(job.membership_history(0).step(), 60);
  EXPECT_EQ(job.tasks(4).state(), TASK_IDLE);
  // Worker 2 leaves once worker 0 applies membership 2.
  EXPECT_FALSE(Beat(**loaded, id, 2).removed());
  const MembershipApplied applied = Applied(2, 80, 3, 2);
  Beat(**loaded, id, 0, &applied);
  EXPECT_TRUE(Beat(**loaded, id, 2).removed());
}

}  // namespace
}  // namespace pstrain
