// Elastic jobs through the JobTable (issue 40): idle tasks, Scale, the
// membership in heartbeat answers, worker 0's reports, shrink on failure
// and the job file.
#include "coordinator/job_membership.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "google/protobuf/util/message_differencer.h"
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

// Worker `worker` says it built its model and waits to join
// (HeartbeatRequest.prepared).
void Prepared(JobTable& table, const std::string& id, int worker,
              absl::Time now = kT0) {
  HeartbeatRequest request;
  request.mutable_task()->set_job_id(id);
  request.mutable_task()->set_role(ROLE_WORKER);
  request.mutable_task()->set_index(worker);
  request.set_prepared(true);
  EXPECT_TRUE(table.Heartbeat(request, now, nullptr, nullptr).ok());
}

// Worker `worker` registers and, but for worker 0, says it is prepared.
void Join(JobTable& table, const std::string& id, int worker) {
  EXPECT_TRUE(
      table.Register(id, ROLE_WORKER, worker, Address(ROLE_WORKER, worker), kT0)
          .ok());
  if (worker != 0) Prepared(table, id, worker);
}

// Submits `spec` and registers the shard and workers 0 to `members` - 1.
std::string Running(JobTable& table, const JobSpec& spec, int members) {
  const std::string id = *table.Submit(spec, kT0);
  EXPECT_TRUE(table.Register(id, ROLE_PS, 0, Address(ROLE_PS, 0), kT0).ok());
  for (int w = 0; w < members; ++w) Join(table, id, w);
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
  // The workers learn it from their heartbeats, not yet ready, beside the
  // one worker 0 applied (epoch 0: where a fresh allreduce worker of it
  // starts).
  HeartbeatResponse answer = Beat(table, id, 0);
  EXPECT_EQ(answer.membership().epoch(), 1);
  EXPECT_FALSE(answer.membership().ready());
  EXPECT_FALSE(answer.removed());
  EXPECT_EQ(answer.applied_membership().epoch(), 0);
  EXPECT_EQ(Workers(answer.applied_membership()), "0,1");
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
  // Registered, but its model is not built yet: the others train on.
  EXPECT_FALSE(table.Get(id)->membership().ready());
  Prepared(table, id, 2);
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

// standby_workers: the tasks past num_workers are TASK_STANDBY, started
// with the job but not waited for; they register and report prepared as
// standbys (never told removed), a grow takes the prepared ones first and
// is ready at once, and a standby that dies, goes silent or never
// registers is removed without failing the job.
TEST(JobMembershipTest, StandbyWorkersJoinAGrowReadyAtOnce) {
  JobTable table;
  const JobSpec spec = Spec(2, "max_workers: 5 standby_workers: true");
  const std::string id = Running(table, spec, 2);
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  for (int w = 2; w < 5; ++w)
    EXPECT_EQ(WorkerState(table, id, w), TASK_STANDBY);
  // Worker 3 registers and is prepared, worker 2 only registers; worker 4
  // has not started yet. They stay standbys, and a standby is not removed.
  ASSERT_TRUE(
      table.Register(id, ROLE_WORKER, 3, Address(ROLE_WORKER, 3), kT0).ok());
  Prepared(table, id, 3);
  ASSERT_TRUE(
      table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0).ok());
  EXPECT_EQ(table.Register(id, ROLE_WORKER, 2, "10.0.0.99:7000", kT0).code(),
            absl::StatusCode::kAlreadyExists);
  JobInfo job = *table.Get(id);
  EXPECT_EQ(WorkerState(table, id, 3), TASK_STANDBY);
  EXPECT_TRUE(job.tasks(4).prepared());
  EXPECT_FALSE(job.tasks(3).prepared());
  const HeartbeatResponse standby = Beat(table, id, 3);
  EXPECT_FALSE(standby.removed());
  EXPECT_EQ(Workers(standby.membership()), "0,1");
  // A grow by one takes the prepared standby (3, not the lowest index 2)
  // and is ready at once.
  absl::StatusOr<Membership> m = table.Scale(id, 3, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1,3");
  EXPECT_TRUE(m->ready());
  EXPECT_EQ(WorkerState(table, id, 3), TASK_REGISTERED);
  EXPECT_EQ(WorkerState(table, id, 2), TASK_STANDBY);
  EXPECT_EQ(Workers(Beat(table, id, 3).membership()), "0,1,3");
  // The next takes worker 2 (registered, not prepared: ready once it is),
  // then worker 4, still starting: it waits for its registration (its
  // process runs already).
  m = table.Scale(id, 5, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1,2,3,4");
  EXPECT_FALSE(m->ready());
  EXPECT_EQ(WorkerState(table, id, 2), TASK_REGISTERED);
  EXPECT_EQ(WorkerState(table, id, 4), TASK_WAITING);
  Prepared(table, id, 2);
  Join(table, id, 4);
  EXPECT_TRUE(table.Get(id)->membership().ready());

  // Standbys that go away: a silent one and one never registered are
  // removed, with a line each, and the job goes on.
  ASSERT_TRUE(table.Cancel(id, kT0).ok());
  const std::string other = Running(table, spec, 2);
  auto beat_members = [&](absl::Time now) {
    for (int w : {0, 1, 4}) Beat(table, other, w, nullptr, now);
    Beat(table, other, 0, nullptr, now, ROLE_PS);
  };
  for (int w : {2, 4}) {
    ASSERT_TRUE(
        table.Register(other, ROLE_WORKER, w, Address(ROLE_WORKER, w), kT0)
            .ok());
  }
  EXPECT_TRUE(table.CheckHeartbeats(kT0 + absl::Seconds(30), absl::Seconds(60))
                  .empty());
  beat_members(kT0 + absl::Seconds(59));
  EXPECT_TRUE(table.CheckHeartbeats(kT0 + absl::Seconds(61), absl::Seconds(60))
                  .empty());
  job = *table.Get(other);
  EXPECT_EQ(job.state(), JOB_RUNNING);
  EXPECT_EQ(WorkerState(table, other, 2), TASK_REMOVED);
  EXPECT_TRUE(LogHas(job,
                     "standby worker 2 removed: no heartbeat for 61 s (a "
                     "scale starts it again)"));
  EXPECT_EQ(WorkerState(table, other, 3), TASK_STANDBY);
  beat_members(kT0 + absl::Seconds(600));
  EXPECT_TRUE(table.CheckHeartbeats(kT0 + absl::Seconds(601), absl::Seconds(60))
                  .empty());
  EXPECT_EQ(WorkerState(table, other, 3), TASK_REMOVED);
  EXPECT_EQ(table.Get(other)->state(), JOB_RUNNING);
  // A standby's death is a removal too; a grow then starts a removed task
  // again (TASK_WAITING).
  EXPECT_EQ(WorkerState(table, other, 4), TASK_STANDBY);
  EXPECT_TRUE(Finish(table, other, 4, false).ok());
  EXPECT_EQ(WorkerState(table, other, 4), TASK_REMOVED);
  EXPECT_EQ(table.Get(other)->state(), JOB_RUNNING);
  m = table.Scale(other, 3, 0, kT0 + absl::Seconds(602));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Workers(*m), "0,1,2");
  EXPECT_EQ(WorkerState(table, other, 2), TASK_WAITING);

  // standby_workers needs room past num_workers.
  for (const char* bad :
       {"standby_workers: true", "max_workers: 2 standby_workers: true"}) {
    EXPECT_EQ(ParseJobSpec(absl::StrCat("num_ps: 1 num_workers: 2 batch_size: "
                                        "8 epochs: 1 ",
                                        bad),
                           "test")
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
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

// An elastic allreduce job's rendezvous keys of the worlds before the
// applied membership go; the newer world's and the workers' own stay.
TEST(JobMembershipTest, ApplyingDropsTheEndedWorldsRendezvousKeys) {
  JobTable table;
  const std::string id = Running(table, Spec(3, "max_workers: 3"), 3);
  ASSERT_TRUE(table.Scale(id, 2, 0, kT0).ok());
  for (const char* key :
       {"gloo/rank_0", "gloo-1/rank_0", "nccl/nccl_id", "gloo-m1/rank_1",
        "gloo-2-m1/rank_1", "gloo-m2/rank_0", "gloo-mx/rank_0", "worker-0/x"}) {
    ASSERT_TRUE(table.Set(id, key, "v").ok()) << key;
  }
  const MembershipApplied applied = Applied(1, 100, 3, 2);
  Beat(table, id, 0, &applied);
  std::vector<std::string> kept;
  const JobInfo job = *table.Get(id);
  for (const auto& [key, value] : job.kv()) kept.push_back(key);
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"gloo-2-m1/rank_1",
                                            "gloo-m1/rank_1", "gloo-m2/rank_0",
                                            "gloo-mx/rank_0", "worker-0/x"}));
}

// A reported time that is not a duration (NaN, infinite, negative, past
// any job's length) is kept as 0 ms, not cast to an integer undefined.
TEST(JobMembershipTest, AHostileElapsedTimeIsKeptAsZero) {
  for (const double elapsed :
       {std::nan(""), HUGE_VAL, -HUGE_VAL, -5.0, 1e300}) {
    JobTable table;
    const std::string id = Running(table, Spec(3, "max_workers: 3"), 3);
    ASSERT_TRUE(table.Scale(id, 2, 0, kT0).ok());
    MembershipApplied applied = Applied(1, 100, 3, 2);
    applied.set_elapsed_ms(elapsed);
    Beat(table, id, 0, &applied);
    const JobInfo job = *table.Get(id);
    ASSERT_EQ(job.membership_history_size(), 1) << elapsed;
    EXPECT_EQ(job.membership_history(0).elapsed_ms(), 0.0) << elapsed;
    bool logged = false;
    for (const LogLine& line : job.log()) {
      logged |= line.text().find("at step 100 (0 ms)") != std::string::npos;
    }
    EXPECT_TRUE(logged) << elapsed;
  }
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
  EXPECT_EQ(answer.applied_membership().epoch(), 1);
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

// An ended job accepts nothing: worker 0's report that it applied a
// membership and a standby's "prepared" after the end are answered (the
// answer still carries the membership) but not kept.
TEST(JobMembershipTest, AnEndedJobKeepsNoMembershipReports) {
  JobTable table;
  const std::string id =
      Running(table, Spec(3, "max_workers: 4 standby_workers: true"), 3);
  // Worker 3, a standby, registers but is not prepared yet.
  ASSERT_TRUE(
      table.Register(id, ROLE_WORKER, 3, Address(ROLE_WORKER, 3), kT0).ok());
  absl::StatusOr<Membership> m = table.Scale(id, 2, 0, kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->ready());
  ASSERT_TRUE(table.Cancel(id, kT0).ok());
  const JobInfo cancelled = *table.Get(id);
  ASSERT_EQ(WorkerState(table, id, 3), TASK_STANDBY);
  const MembershipApplied applied = Applied(1, 100, 3, 2);
  const HeartbeatResponse answer = Beat(table, id, 0, &applied);
  EXPECT_EQ(answer.state(), JOB_CANCELLED);
  EXPECT_EQ(answer.membership().epoch(), 1);
  Prepared(table, id, 3);
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.membership_history_size(), 0);
  EXPECT_FALSE(job.tasks(1 + 3).prepared());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(job, cancelled))
      << "before: " << cancelled.ShortDebugString()
      << "\nafter: " << job.ShortDebugString();
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
  // The shards hear of it (a step of theirs may wait for its push), the
  // workers do not.
  const HeartbeatResponse to_shard =
      Beat(table, id, 0, nullptr, kT0 + absl::Seconds(1), ROLE_PS);
  ASSERT_EQ(to_shard.removed_workers_size(), 1);
  EXPECT_EQ(to_shard.removed_workers(0), 2);
  EXPECT_FALSE(to_shard.removed());
  EXPECT_EQ(Beat(table, id, 1).removed_workers_size(), 0);
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
    Join(table, id, 2);
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

// A registered standby survives a coordinator restart: its state comes
// back, its silence counts from the load (its heartbeats are not written),
// as a member's does, and its next heartbeat says again that it is
// prepared (every one does).
TEST(JobMembershipTest, StandbySurvivesLoad) {
  const std::string file =
      std::string(std::getenv("TEST_TMPDIR")) + "/standby.jobs";
  std::string id;
  {
    JobTable table(file);
    id = Running(table, Spec(2, "max_workers: 3 standby_workers: true"), 2);
    ASSERT_TRUE(
        table.Register(id, ROLE_WORKER, 2, Address(ROLE_WORKER, 2), kT0).ok());
    Prepared(table, id, 2);
  }
  const absl::Time later = kT0 + absl::Seconds(300);
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(file, later);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // Silent since its registration 300 s before the load, but not since
  // the load.
  EXPECT_TRUE(
      (*loaded)
          ->CheckHeartbeats(later + absl::Seconds(30), absl::Seconds(60))
          .empty());
  EXPECT_EQ(WorkerState(**loaded, id, 2), TASK_STANDBY);
  Prepared(**loaded, id, 2, later + absl::Seconds(1));
  EXPECT_TRUE((*loaded)->Get(id)->tasks(3).prepared());
  EXPECT_TRUE((*loaded)->Scale(id, 3, 0, later + absl::Seconds(31))->ready());
}

// Elastic shards (max_ps): `num_ps` shards, `num_workers` workers.
JobSpec ShardSpec(int num_ps, int num_workers, const std::string& extra) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      absl::StrCat("num_ps: ", num_ps, " num_workers: ", num_workers,
                   " batch_size: 8 epochs: 1 ", extra),
      "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::string ShardAddress(int index, int generation = 0) {
  return absl::StrCat("10.0.1.", index, ":", 7000 + generation);
}

// Submits `spec` and registers its first num_ps shards and num_workers
// workers.
std::string RunningShards(JobTable& table, const JobSpec& spec) {
  const std::string id = *table.Submit(spec, kT0);
  for (int s = 0; s < spec.num_ps(); ++s) {
    EXPECT_TRUE(table.Register(id, ROLE_PS, s, ShardAddress(s), kT0).ok());
  }
  for (int w = 0; w < spec.num_workers(); ++w) Join(table, id, w);
  return id;
}

TaskState ShardState(JobTable& table, const std::string& id, int index) {
  return table.Get(id)->tasks(index).state();
}

std::string Joined(const google::protobuf::RepeatedPtrField<std::string>& a) {
  std::string out;
  for (const std::string& s : a)
    absl::StrAppend(&out, out.empty() ? "" : ",", s);
  return out;
}

absl::Status FinishShard(JobTable& table, const std::string& id, int shard,
                         bool ok) {
  TaskFinishedRequest request;
  request.mutable_task()->set_job_id(id);
  request.mutable_task()->set_role(ROLE_PS);
  request.mutable_task()->set_index(shard);
  request.set_ok(ok);
  request.set_message(ok ? "" : "exited with signal 9");
  return table.TaskFinished(request, kT0 + absl::Seconds(2));
}

ScaleTarget Shards(int num_ps, int64_t at_step = 0, int num_workers = 0) {
  ScaleTarget target;
  target.num_ps = num_ps;
  target.num_workers = num_workers;
  target.at_step = at_step;
  return target;
}

TEST(JobMembershipTest, ShardGrowIsReadyOnceTheNewShardsRegistered) {
  JobTable table;
  const std::string id = RunningShards(table, ShardSpec(2, 2, "max_ps: 4"));
  JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_RUNNING);
  // PS tasks 0 to max_ps - 1, then the workers; shards 2 and 3 idle.
  ASSERT_EQ(job.tasks_size(), 6);
  EXPECT_EQ(job.tasks(4).role(), ROLE_WORKER);
  EXPECT_EQ(ShardState(table, id, 2), TASK_IDLE);
  EXPECT_EQ(ShardState(table, id, 3), TASK_IDLE);
  // Epoch 0: the spec's shards, their addresses once registered.
  EXPECT_EQ(job.membership().num_ps(), 2);
  EXPECT_EQ(Joined(job.membership().ps_addresses()),
            ShardAddress(0) + "," + ShardAddress(1));
  EXPECT_EQ(table.Register(id, ROLE_PS, 2, ShardAddress(2), kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<std::string>> layout =
      table.WaitForLayout(id, kT0 + absl::Seconds(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout, (std::vector<std::string>{ShardAddress(0), ShardAddress(1),
                                               Address(ROLE_WORKER, 0),
                                               Address(ROLE_WORKER, 1)}));

  absl::StatusOr<Membership> m = table.Scale(id, Shards(3, 300), kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->epoch(), 1);
  EXPECT_EQ(m->num_ps(), 3);
  EXPECT_EQ(Workers(*m), "0,1");
  EXPECT_FALSE(m->ready());
  EXPECT_TRUE(m->ps_addresses().empty());
  EXPECT_EQ(m->reason(), "scale to 3 shards");
  EXPECT_EQ(ShardState(table, id, 2), TASK_WAITING);
  EXPECT_EQ(ShardState(table, id, 3), TASK_IDLE);
  EXPECT_TRUE(LogHas(*table.Get(id),
                     "scale to 3 shards requested: membership 1 (workers 0, "
                     "1, shards 0 to 2) at step 300 or the next"));
  // Not ready while shard 2 has not registered, though every worker has.
  HeartbeatResponse answer = Beat(table, id, 0);
  EXPECT_EQ(answer.membership().epoch(), 1);
  EXPECT_EQ(answer.membership().num_ps(), 3);
  EXPECT_FALSE(answer.membership().ready());
  ASSERT_TRUE(table.Register(id, ROLE_PS, 2, ShardAddress(2), kT0).ok());
  answer = Beat(table, id, 0);
  EXPECT_TRUE(answer.membership().ready());
  EXPECT_EQ(Joined(answer.membership().ps_addresses()),
            ShardAddress(0) + "," + ShardAddress(1) + "," + ShardAddress(2));
  // The new shard is no member of the layout until worker 0 applies it.
  EXPECT_FALSE(
      Beat(table, id, 2, nullptr, kT0 + absl::Seconds(1), ROLE_PS).removed());
  EXPECT_EQ(table.WaitForLayout(id, kT0 + absl::Seconds(1))->size(), 4u);
  MembershipApplied applied = Applied(1, 300, 2, 2);
  applied.set_old_ps(2);
  applied.set_new_ps(3);
  Beat(table, id, 0, &applied);
  job = *table.Get(id);
  EXPECT_TRUE(LogHas(job,
                     "membership 1: 2 workers -> 2, 2 shards -> 3 at step "
                     "300 (12 ms): scale to 3 shards"))
      << job.DebugString();
  layout = table.WaitForLayout(id, kT0 + absl::Seconds(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout, (std::vector<std::string>{
                         ShardAddress(0), ShardAddress(1), ShardAddress(2),
                         Address(ROLE_WORKER, 0), Address(ROLE_WORKER, 1)}));
  // An idle shard is outside every membership.
  EXPECT_TRUE(
      Beat(table, id, 3, nullptr, kT0 + absl::Seconds(1), ROLE_PS).removed());
}

TEST(JobMembershipTest, ShardShrinkRemovesTheShardsWhenAppliedAndGrowReuses) {
  JobTable table;
  const std::string id =
      RunningShards(table, ShardSpec(3, 2, "max_ps: 3 max_restarts: 2"));
  absl::StatusOr<Membership> m = table.Scale(id, Shards(2), kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_ps(), 2);
  EXPECT_TRUE(m->ready());  // its shards are registered already
  EXPECT_EQ(Joined(m->ps_addresses()), ShardAddress(0) + "," + ShardAddress(1));
  // Shard 2 holds its part of the state until worker 0 applies it.
  EXPECT_EQ(ShardState(table, id, 2), TASK_REGISTERED);
  EXPECT_FALSE(
      Beat(table, id, 2, nullptr, kT0 + absl::Seconds(1), ROLE_PS).removed());
  EXPECT_EQ(table.WaitForLayout(id, kT0 + absl::Seconds(1))->size(), 5u);
  // The report leaves the shard counts 0: the memberships' own are kept.
  const MembershipApplied applied = Applied(1, 40, 2, 2);
  Beat(table, id, 0, &applied);
  JobInfo job = *table.Get(id);
  EXPECT_TRUE(LogHas(job,
                     "membership 1: 2 workers -> 2, 3 shards -> 2 at step 40 "
                     "(12 ms): scale to 2 shards"));
  ASSERT_EQ(job.membership_history_size(), 1);
  EXPECT_EQ(job.membership_history(0).old_ps(), 3);
  EXPECT_EQ(job.membership_history(0).new_ps(), 2);
  EXPECT_EQ(ShardState(table, id, 2), TASK_REMOVED);
  EXPECT_EQ(job.tasks(2).message(), "left out by membership 1 (2 shards)");
  EXPECT_TRUE(
      Beat(table, id, 2, nullptr, kT0 + absl::Seconds(1), ROLE_PS).removed());
  EXPECT_FALSE(
      Beat(table, id, 1, nullptr, kT0 + absl::Seconds(1), ROLE_PS).removed());
  // Its end, clean or not, is no failure, and it is not restarted.
  ASSERT_TRUE(FinishShard(table, id, 2, false).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  absl::StatusOr<int> restart =
      table.TaskRestarting(id, ROLE_PS, 2, "died (signal 9)", kT0);
  EXPECT_EQ(restart.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(restart.status().message(),
            "job-1: ps 2 is outside the job's layout (a membership removed "
            "it); not restarting it");
  EXPECT_EQ(table.Register(id, ROLE_PS, 2, ShardAddress(2), kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  // The layout has the applied membership's 2 shards.
  absl::StatusOr<std::vector<std::string>> layout =
      table.WaitForLayout(id, kT0 + absl::Seconds(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout, (std::vector<std::string>{ShardAddress(0), ShardAddress(1),
                                               Address(ROLE_WORKER, 0),
                                               Address(ROLE_WORKER, 1)}));
  // A shard inside the layout still dies as before: it is restarted.
  ASSERT_TRUE(table.TaskRestarting(id, ROLE_PS, 1, "died", kT0).ok());
  EXPECT_EQ(ShardState(table, id, 1), TASK_WAITING);
  ASSERT_TRUE(table.Register(id, ROLE_PS, 1, ShardAddress(1, 1), kT0).ok());
  // Growing again starts the removed shard's task anew.
  m = table.Scale(id, Shards(3, 0, 1), kT0 + absl::Seconds(3));
  ASSERT_FALSE(m.ok());  // no max_workers: the workers are fixed
  m = table.Scale(id, Shards(3), kT0 + absl::Seconds(3));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->epoch(), 2);
  EXPECT_FALSE(m->ready());
  EXPECT_EQ(ShardState(table, id, 2), TASK_WAITING);
  EXPECT_EQ(table.Get(id)->tasks(2).message(), "");
  EXPECT_FALSE(
      Beat(table, id, 2, nullptr, kT0 + absl::Seconds(3), ROLE_PS).removed());
  ASSERT_TRUE(table.Register(id, ROLE_PS, 2, ShardAddress(2, 1), kT0).ok());
  job = *table.Get(id);
  EXPECT_TRUE(job.membership().ready());
  EXPECT_EQ(
      Joined(job.membership().ps_addresses()),
      ShardAddress(0) + "," + ShardAddress(1, 1) + "," + ShardAddress(2, 1));
  // The workers' ends still end the job.
  ASSERT_TRUE(Finish(table, id, 1, true).ok());
  ASSERT_TRUE(Finish(table, id, 0, true).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_SUCCEEDED);
}

TEST(JobMembershipTest, ShardScaleRefusalsAndShardsNotWaitedFor) {
  JobTable table;
  const std::string plain = Running(table, Spec(2, "max_workers: 3"), 2);
  const std::string id =
      RunningShards(table, ShardSpec(2, 2, "max_ps: 4 max_workers: 3"));
  const struct {
    std::string id;
    ScaleTarget target;
    absl::StatusCode code;
    std::string error;
  } cases[] = {
      {plain, Shards(2), absl::StatusCode::kInvalidArgument,
       "job-1 has a fixed number of shards: its spec has no max_ps; shards "
       "are scaled only within max_ps"},
      {id, Shards(5), absl::StatusCode::kInvalidArgument,
       "job-2: scale to 5 shards; expected 1 to 4 (max_ps)"},
      {id, Shards(-1), absl::StatusCode::kInvalidArgument,
       "job-2: scale to -1 shards; expected 1 to 4 (max_ps)"},
      {id, Shards(0), absl::StatusCode::kInvalidArgument,
       "job-2: a scale to 0 workers and 0 shards; expected num_workers, "
       "num_ps or both (0: unchanged)"},
      {id, Shards(3, -2), absl::StatusCode::kInvalidArgument,
       "job-2: at_step -2; expected >= 0 (0: the next step)"},
      {id, Shards(3, 0, 4), absl::StatusCode::kInvalidArgument,
       "job-2: scale to 4 workers; expected 1 to 3 (max(1, min_workers, "
       "backup_workers + 1) to max_workers)"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Membership> m = table.Scale(c.id, c.target, kT0);
    EXPECT_EQ(m.status().code(), c.code) << c.error;
    EXPECT_EQ(m.status().message(), c.error);
  }
  EXPECT_EQ(table.Get(id)->membership().epoch(), 0);
  // Workers and shards at once.
  absl::StatusOr<Membership> m = table.Scale(id, Shards(3, 0, 3), kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->reason(), "scale to 3 workers and 3 shards");
  EXPECT_EQ(Workers(*m), "0,1,2");
  // A shrink before shard 2 registered: it is not waited for.
  m = table.Scale(id, Shards(1), kT0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_ps(), 1);
  EXPECT_EQ(Workers(*m), "0,1,2");  // the workers as the newest
  EXPECT_EQ(ShardState(table, id, 2), TASK_REMOVED);
  EXPECT_EQ(table.Get(id)->tasks(2).message(),
            "left out by a scale to 1 shards before it registered");
  // Shard 1 is in the applied layout: it stays until worker 0 applies.
  EXPECT_EQ(ShardState(table, id, 1), TASK_REGISTERED);
  // Growing past shard 1 while a shrink not applied still holds it.
  m = table.Scale(id, Shards(2), kT0);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.status().message(),
            "job-2: scale to 2 shards: ps 1 is TASK_REGISTERED (a shrink not "
            "yet applied still holds it, or it is exiting); try again once "
            "worker 0 applied membership 2");
}

TEST(JobMembershipTest, ShardMembershipSurvivesLoadAndIsChecked) {
  const std::string file =
      std::string(std::getenv("TEST_TMPDIR")) + "/shards.jobs";
  std::string id;
  {
    JobTable table(file);
    id = RunningShards(table, ShardSpec(2, 2, "max_ps: 3"));
    ASSERT_TRUE(table.Scale(id, Shards(3, 50), kT0).ok());
    ASSERT_TRUE(table.Register(id, ROLE_PS, 2, ShardAddress(2), kT0).ok());
  }
  absl::StatusOr<std::unique_ptr<JobTable>> loaded = JobTable::Load(file, kT0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  JobInfo job = *(*loaded)->Get(id);
  EXPECT_EQ(job.membership().num_ps(), 3);
  EXPECT_EQ(job.membership().ps_addresses_size(), 3);
  EXPECT_EQ(job.memberships(0).num_ps(), 2);
  // A damaged file: a shard count outside the job's PS tasks, and
  // addresses that do not match it.
  JobTableFile damaged;
  *damaged.add_jobs() = job;
  damaged.set_next_id(2);
  damaged.mutable_jobs(0)->mutable_memberships(1)->set_num_ps(4);
  absl::Status s = ValidateJobTableFile(damaged);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "job-1: membership 1 has 4 shards; expected 1 to 3");
  damaged.mutable_jobs(0)->mutable_memberships(1)->set_num_ps(2);
  s = ValidateJobTableFile(damaged);
  EXPECT_EQ(s.message(),
            "job-1: membership 1 lists 3 shard addresses for its 2 shards");
  // Without max_ps a membership has no shard count.
  *damaged.mutable_jobs(0) = job;
  damaged.mutable_jobs(0)->mutable_spec()->set_max_ps(0);
  damaged.mutable_jobs(0)->mutable_spec()->set_max_workers(3);
  damaged.mutable_jobs(0)->mutable_tasks()->DeleteSubrange(2, 1);
  damaged.mutable_jobs(0)->add_tasks()->set_role(ROLE_WORKER);
  damaged.mutable_jobs(0)->mutable_tasks(4)->set_index(2);
  damaged.mutable_jobs(0)->mutable_tasks(4)->set_state(TASK_IDLE);
  s = ValidateJobTableFile(damaged);
  EXPECT_EQ(s.message(),
            "job-1: membership 0 has 2 shards; expected 0 (no max_ps)");
}

}  // namespace
}  // namespace pstrain
