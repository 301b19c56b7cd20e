#include "coordinator/job_table.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "coordinator/job_spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

JobSpec Spec() {
  return *ParseJobSpec(
      "num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1 "
      "ps_hosts { host: \"10.0.0.2\" port: 7000 } "
      "ps_hosts { host: \"10.0.0.3\" port: 7000 } "
      "worker_hosts { host: \"10.0.0.4\" port: 7001 } "
      "worker_hosts { host: \"10.0.0.5\" port: 7001 }",
      "test");
}

struct Task {
  TaskRole role;
  int index;
  std::string address;
};

std::vector<Task> Tasks() {
  return {{ROLE_PS, 0, "10.0.0.2:7000"},
          {ROLE_PS, 1, "10.0.0.3:7000"},
          {ROLE_WORKER, 0, "10.0.0.4:7001"},
          {ROLE_WORKER, 1, "10.0.0.5:7001"}};
}

TaskRef Ref(const std::string& id, TaskRole role, int index) {
  TaskRef ref;
  ref.set_job_id(id);
  ref.set_role(role);
  ref.set_index(index);
  return ref;
}

absl::StatusOr<JobState> Beat(JobTable& table, const std::string& id,
                              TaskRole role, int index, absl::Time now,
                              std::vector<std::string> lines = {}) {
  HeartbeatRequest request;
  *request.mutable_task() = Ref(id, role, index);
  for (std::string& line : lines) request.add_log_lines(std::move(line));
  return table.Heartbeat(request, now);
}

absl::Status Finish(JobTable& table, const std::string& id, TaskRole role,
                    int index, bool ok, const std::string& message,
                    absl::Time now) {
  TaskFinishedRequest request;
  *request.mutable_task() = Ref(id, role, index);
  request.set_ok(ok);
  request.set_message(message);
  return table.TaskFinished(request, now);
}

std::string TempFile(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(JobTableTest, PendingRunningSucceeded) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  EXPECT_EQ(id, "job-1");
  EXPECT_EQ(table.Get(id)->state(), JOB_PENDING);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  EXPECT_EQ(*table.WaitForLayout(id, kT0),
            (std::vector<std::string>{"10.0.0.2:7000", "10.0.0.3:7000",
                                      "10.0.0.4:7001", "10.0.0.5:7001"}));
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 0, true, "", kT0).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 1, true, "", kT0).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_SUCCEEDED);
  // Heartbeats now tell the PS tasks to stop.
  EXPECT_EQ(*Beat(table, id, ROLE_PS, 0, kT0), JOB_SUCCEEDED);
  EXPECT_EQ(table.Cancel(id, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
}

// With backup workers the job is done when worker 0 is (the last step's
// update is decided); a straggler still running is not waited for, and
// still counts as DONE if it reports a clean finish after the end: its
// final report's lines are kept, not its progress (a task the success left
// running, as the shards).
TEST(JobTableTest, BackupWorkersJobEndsWithWorkerZero) {
  JobTable table;
  JobSpec spec = Spec();
  spec.set_mode("sync");
  spec.set_backup_workers(1);
  const std::string id = *table.Submit(spec, kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  // Another worker finishing first does not end it.
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 1, true, "", kT0).ok());
  EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING);
  JobTable table2;
  const std::string id2 = *table2.Submit(spec, kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table2.Register(id2, t.role, t.index, t.address, kT0).ok());
  }
  ASSERT_TRUE(Finish(table2, id2, ROLE_WORKER, 0, true, "", kT0).ok());
  EXPECT_EQ(table2.Get(id2)->state(), JOB_SUCCEEDED);
  EXPECT_EQ(*Beat(table2, id2, ROLE_WORKER, 1, kT0), JOB_SUCCEEDED);
  TaskFinishedRequest straggler;
  *straggler.mutable_task() = Ref(id2, ROLE_WORKER, 1);
  straggler.set_ok(true);
  straggler.set_steps(77);
  straggler.add_log_lines("straggler done");
  straggler.mutable_result()->set_test_accuracy(0.1);
  ASSERT_TRUE(table2.TaskFinished(straggler, kT0).ok());
  JobInfo job2 = *table2.Get(id2);
  EXPECT_EQ(job2.tasks(3).state(), TASK_DONE);
  EXPECT_EQ(job2.tasks(3).steps(), 0);
  EXPECT_FALSE(job2.has_result());
  ASSERT_EQ(job2.log_size(), 1);
  EXPECT_EQ(job2.log(0).text(), "straggler done");
  // Once: a retry keeps nothing more; its heartbeats are refused.
  ASSERT_TRUE(table2.TaskFinished(straggler, kT0).ok());
  EXPECT_EQ(table2.Get(id2)->log_size(), 1);
  EXPECT_EQ(Beat(table2, id2, ROLE_WORKER, 1, kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The shards, which exit once every worker is done, report after the end
  // too: their last lines are kept ("all workers done; shard 0 exiting").
  TaskFinishedRequest shard;
  *shard.mutable_task() = Ref(id2, ROLE_PS, 0);
  shard.set_ok(true);
  shard.add_log_lines("all workers done; shard 0 exiting");
  ASSERT_TRUE(table2.TaskFinished(shard, kT0).ok());
  job2 = *table2.Get(id2);
  EXPECT_EQ(job2.tasks(0).state(), TASK_DONE);
  EXPECT_EQ(job2.log(job2.log_size() - 1).text(),
            "all workers done; shard 0 exiting");
  EXPECT_EQ(job2.state(), JOB_SUCCEEDED);
  // Without backup workers worker 0 alone does not end the job.
  JobTable table3;
  const std::string id3 = *table3.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table3.Register(id3, t.role, t.index, t.address, kT0).ok());
  }
  ASSERT_TRUE(Finish(table3, id3, ROLE_WORKER, 0, true, "", kT0).ok());
  EXPECT_EQ(table3.Get(id3)->state(), JOB_RUNNING);
}

// Tasks register from threads in a random order, each twice (a retried
// call); the layout is complete and in index order every time.
TEST(JobTableTest, RegistrationInAnyOrderAndTwice) {
  for (int trial = 0; trial < 20; ++trial) {
    JobTable table;
    const std::string id = *table.Submit(Spec(), kT0);
    std::vector<Task> tasks = Tasks();
    std::mt19937 rng(trial);
    std::shuffle(tasks.begin(), tasks.end(), rng);
    std::vector<std::thread> threads;
    absl::StatusOr<std::vector<std::string>> layout;
    std::thread waiter([&] {
      layout = table.WaitForLayout(id, absl::Now() + absl::Seconds(10));
    });
    for (const Task& t : tasks) {
      threads.emplace_back([&table, &id, t] {
        EXPECT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
        EXPECT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
      });
    }
    for (std::thread& t : threads) t.join();
    waiter.join();
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ((*layout)[3], "10.0.0.5:7001");
  }
}

TEST(JobTableTest, BadRegistrationsAreRefusedAndChangeNothing) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(table.Register(id, ROLE_WORKER, 1, "10.0.0.5:7001", kT0).ok());
  absl::Status s = table.Register(id, ROLE_WORKER, 1, "10.0.0.9:7001", kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(),
            "job-1: worker 1 already registered from 10.0.0.5:7001; refusing "
            "10.0.0.9:7001");
  s = table.Register(id, ROLE_WORKER, 2, "10.0.0.6:7001", kT0);
  EXPECT_EQ(s.message(), "job-1: worker 2 is outside the job's 2 worker tasks");
  EXPECT_EQ(table.Register("job-9", ROLE_PS, 0, "h:1", kT0).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Get(id)->tasks(3).address(), "10.0.0.5:7001");
  absl::StatusOr<std::vector<std::string>> layout =
      table.WaitForLayout(id, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(layout.status().message(),
            "job-1: still waiting for ps 0, ps 1, worker 0");
}

TEST(JobTableTest, SilentTaskIsLostAndTheJobFailsNamingIt) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  const absl::Duration timeout = absl::Seconds(30);
  for (int s = 10; s <= 60; s += 10) {
    for (const Task& t : Tasks()) {
      if (t.role == ROLE_WORKER && t.index == 1) continue;  // Killed.
      ASSERT_TRUE(
          Beat(table, id, t.role, t.index, kT0 + absl::Seconds(s)).ok());
    }
    const auto failed = table.CheckHeartbeats(kT0 + absl::Seconds(s), timeout);
    // Silent since registering at 0 s: past the 30 s timeout at the check of
    // 40 s, which fails the job once.
    EXPECT_EQ(failed.empty(), s != 40) << s;
  }
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(job.message(),
            "lost worker 1 on 10.0.0.5:7001: no heartbeat for 40 s");
  EXPECT_EQ(job.tasks(3).state(), TASK_LOST);
  EXPECT_EQ(*Beat(table, id, ROLE_PS, 0, kT0), JOB_FAILED);
}

TEST(JobTableTest, TaskThatNeverRegistersFailsTheJob) {
  JobTable table;
  JobSpec spec = Spec();
  spec.set_registration_timeout_s(60);
  const std::string id = *table.Submit(spec, kT0);
  for (const Task& t : Tasks()) {
    if (t.role == ROLE_WORKER && t.index == 1) continue;
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  EXPECT_TRUE(
      table.CheckHeartbeats(kT0 + absl::Seconds(5), absl::Seconds(60)).empty());
  table.CheckHeartbeats(kT0 + absl::Seconds(62), absl::Seconds(60));
  EXPECT_EQ(table.Get(id)->message(),
            "lost ps 0 on 10.0.0.2:7000: no heartbeat for 62 s; lost ps 1 on "
            "10.0.0.3:7000: no heartbeat for 62 s; lost worker 0 on "
            "10.0.0.4:7001: no heartbeat for 62 s; waiting for worker 1 on "
            "10.0.0.5:7001 for 62 s");
}

TEST(JobTableTest, QueuedTasksHaveTheSpecsRegistrationTimeout) {
  // A submitted spec's default: 600 s, past the 60 s heartbeat timeout.
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  EXPECT_EQ(table.Get(id)->spec().registration_timeout_s(), 600);
  EXPECT_TRUE(table.CheckHeartbeats(kT0 + absl::Seconds(599), absl::Seconds(60))
                  .empty());
  EXPECT_EQ(table.Get(id)->state(), JOB_PENDING);
  table.CheckHeartbeats(kT0 + absl::Seconds(601), absl::Seconds(60));
  EXPECT_EQ(table.Get(id)->state(), JOB_FAILED);
  EXPECT_EQ(table.Get(id)->message().rfind("waiting for ps 0 on "
                                           "10.0.0.2:7000 for 601 s; ",
                                           0),
            0u)
      << table.Get(id)->message();
}

TEST(JobTableTest, FailureAndCancelEndTheJob) {
  JobTable table;
  const std::string a = *table.Submit(Spec(), kT0);
  const std::string b = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(table.Register(a, ROLE_WORKER, 0, "10.0.0.4:7001", kT0).ok());
  ASSERT_TRUE(Finish(table, a, ROLE_WORKER, 0, false, "cannot bind", kT0).ok());
  EXPECT_EQ(table.Get(a)->message(),
            "worker 0 on 10.0.0.4:7001 failed: cannot bind");
  ASSERT_TRUE(table.Cancel(b, kT0).ok());
  EXPECT_EQ(table.Get(b)->state(), JOB_CANCELLED);
  EXPECT_EQ(table.Register(b, ROLE_PS, 0, "h:1", kT0).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A PS that cannot bind its port reports it before registering: the job
// fails naming the address the spec planned for it.
TEST(JobTableTest, FailureBeforeRegisteringNamesThePlannedAddress) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(Finish(table, id, ROLE_PS, 1, false,
                     "cannot listen on 10.0.0.3:7000: address in use", kT0)
                  .ok());
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(job.message(),
            "ps 1 on 10.0.0.3:7000 failed: cannot listen on 10.0.0.3:7000: "
            "address in use");
  EXPECT_EQ(job.tasks(1).state(), TASK_FAILED);
}

// Log lines arrive with heartbeats and the final report, are numbered per
// job, can be read from an offset, and only the last kMaxLogLines stay.
TEST(JobTableTest, LogLinesProgressAndResult) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  ASSERT_TRUE(Beat(table, id, ROLE_PS, 0, kT0, {"listening"}).ok());
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(id, ROLE_WORKER, 0);
  beat.add_log_lines("Step200: 9000.00 data/sec");
  beat.set_steps(200);
  beat.set_samples_per_sec(4500);
  beat.mutable_result()->add_epoch_results()->set_test_accuracy(0.7);
  ASSERT_TRUE(table.Heartbeat(beat, kT0).ok());
  // Worker 0's results so far (its epochs) are the job's.
  EXPECT_DOUBLE_EQ(table.Get(id)->result().epoch_results(0).test_accuracy(),
                   0.7);
  JobInfo job = *table.Get(id);
  ASSERT_EQ(job.log_size(), 2);
  EXPECT_EQ(job.log(1).seq(), 1);
  EXPECT_EQ(job.log(1).role(), ROLE_WORKER);
  EXPECT_EQ(job.log(1).text(), "Step200: 9000.00 data/sec");
  EXPECT_EQ(job.tasks(2).steps(), 200);
  EXPECT_DOUBLE_EQ(job.tasks(2).samples_per_sec(), 4500);
  EXPECT_EQ(table.Get(id, 1)->log_size(), 1);
  EXPECT_EQ(table.Get(id, 2)->log_size(), 0);
  EXPECT_EQ(table.List()[0].log_size(), 0);

  TaskFinishedRequest done;
  *done.mutable_task() = Ref(id, ROLE_WORKER, 0);
  done.set_ok(true);
  done.add_log_lines("Epoch 0 in 1.00 sec, test accuracy: 0.8000");
  done.mutable_result()->set_test_accuracy(0.8);
  ASSERT_TRUE(table.TaskFinished(done, kT0).ok());
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 1, true, "", kT0).ok());
  job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(job.result().test_accuracy(), 0.8);
  EXPECT_EQ(job.log(2).text(), "Epoch 0 in 1.00 sec, test accuracy: 0.8000");

  // The cap (in a job still running: an ended job keeps no more lines):
  // the oldest lines go, the numbering goes on.
  const std::string b = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(Beat(table, b, ROLE_PS, 0, kT0, {"a", "b", "c"}).ok());
  std::vector<std::string> many(JobTable::kMaxLogLines, "x");
  ASSERT_TRUE(Beat(table, b, ROLE_PS, 1, kT0, many).ok());
  job = *table.Get(b);
  EXPECT_EQ(job.log_size(), JobTable::kMaxLogLines);
  EXPECT_EQ(job.log(0).seq(), 3);
  EXPECT_EQ(job.next_log_seq(), 3 + JobTable::kMaxLogLines);
}

// A cancelled job's tasks show what happened to them: told to stop
// (registered) or never came (waiting); none stays REGISTERED. A task that
// still reports a clean finish is answered OK and stays STOPPED.
TEST(JobTableTest, CancelledJobsTasksAreStoppedNotRegistered) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(table.Register(id, ROLE_PS, 0, "10.0.0.2:7000", kT0).ok());
  ASSERT_TRUE(table.Register(id, ROLE_WORKER, 0, "10.0.0.4:7001", kT0).ok());
  ASSERT_TRUE(table.Cancel(id, kT0).ok());
  JobInfo job = *table.Get(id);
  for (const TaskInfo& t : job.tasks()) {
    EXPECT_EQ(t.state(), TASK_STOPPED) << t.ShortDebugString();
  }
  EXPECT_EQ(job.tasks(0).address(), "10.0.0.2:7000");
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 0, true, "", kT0).ok());
  EXPECT_EQ(table.Get(id)->tasks(2).state(), TASK_STOPPED);
  EXPECT_EQ(table.Get(id)->state(), JOB_CANCELLED);

  // A lost task fails the job: it is LOST, the others STOPPED.
  const std::string b = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(b, t.role, t.index, t.address, kT0).ok());
  }
  for (const Task& t : Tasks()) {
    if (t.role == ROLE_PS && t.index == 1) continue;
    ASSERT_TRUE(Beat(table, b, t.role, t.index, kT0 + absl::Seconds(40)).ok());
  }
  table.CheckHeartbeats(kT0 + absl::Seconds(40), absl::Seconds(30));
  job = *table.Get(b);
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(job.tasks(0).state(), TASK_STOPPED);
  EXPECT_EQ(job.tasks(1).state(), TASK_LOST);
}

// Each line keeps the time its task printed it (never later than its
// arrival), so lines from tasks that report at different moments can be put
// in the order they were printed.
TEST(JobTableTest, LogLinesKeepTheTimeTheyWerePrinted) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  const int64_t t0 = absl::ToUnixMillis(kT0);
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(id, ROLE_WORKER, 1);
  beat.add_log_lines("late");
  beat.add_log_times_ms(t0 + 2000);
  beat.add_log_lines("from the future");
  beat.add_log_times_ms(t0 + 99000);
  beat.add_log_lines("no time");
  ASSERT_TRUE(table.Heartbeat(beat, kT0 + absl::Seconds(3)).ok());
  TaskFinishedRequest done;
  *done.mutable_task() = Ref(id, ROLE_PS, 0);
  done.set_ok(true);
  done.add_log_lines("early");
  done.add_log_times_ms(t0 + 1000);
  ASSERT_TRUE(table.TaskFinished(done, kT0 + absl::Seconds(4)).ok());
  const JobInfo job = *table.Get(id);
  ASSERT_EQ(job.log_size(), 4);
  EXPECT_EQ(job.log(0).time_ms(), t0 + 2000);
  EXPECT_EQ(job.log(1).time_ms(), t0 + 3000);  // Clamped to its arrival.
  EXPECT_EQ(job.log(2).time_ms(), t0 + 3000);
  EXPECT_EQ(job.log(3).text(), "early");
  EXPECT_EQ(job.log(3).time_ms(), t0 + 1000);
  EXPECT_EQ(job.log(3).seq(), 3);
}

TEST(JobTableTest, KeyValueStoreWaitsForKeys) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  EXPECT_EQ(
      table.WaitForKey(id, "nccl_id", absl::Now() + absl::Milliseconds(10))
          .status()
          .message(),
      "job-1: key \"nccl_id\" was not set in time");
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(table.Set(id, "nccl_id", std::string("\x01\x00\x02", 3)).ok());
  });
  absl::StatusOr<std::string> value =
      table.WaitForKey(id, "nccl_id", absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\x01\x00\x02", 3));
}

// A coordinator shutting down: the waits in flight end at once, and later
// ones do not start; what is ready is still answered.
TEST(JobTableTest, StopWaitsEndsTheWaitsUnavailable) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(table.Set(id, "set", "v").ok());
  absl::StatusOr<std::string> value;
  absl::StatusOr<std::vector<std::string>> layout;
  const absl::Time start = absl::Now();
  std::thread key_waiter([&] {
    value = table.WaitForKey(id, "never", absl::Now() + absl::Seconds(600));
  });
  std::thread layout_waiter([&] {
    layout = table.WaitForLayout(id, absl::Now() + absl::Seconds(600));
  });
  absl::SleepFor(absl::Milliseconds(50));
  table.StopWaits();
  key_waiter.join();
  layout_waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(value.status())) << value.status();
  EXPECT_EQ(value.status().message(),
            "job-1: coordinator shutting down; key \"never\" is not set yet");
  EXPECT_TRUE(absl::IsUnavailable(layout.status())) << layout.status();
  EXPECT_EQ(layout.status().message(),
            "job-1: coordinator shutting down; still waiting for ps 0, ps 1, "
            "worker 0, worker 1");
  // Later waits: no wait.
  EXPECT_TRUE(absl::IsUnavailable(
      table.WaitForKey(id, "never", absl::Now() + absl::Seconds(600))
          .status()));
  EXPECT_EQ(*table.WaitForKey(id, "set", absl::Now() + absl::Seconds(600)),
            "v");
  ASSERT_TRUE(table.Cancel(id, kT0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      table.WaitForKey(id, "never", absl::Now() + absl::Seconds(600))
          .status()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A wait whose caller went away ends within about a check interval.
TEST(JobTableTest, ACancelledWaitEnds) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  std::atomic<bool> gone{false};
  std::function<bool()> cancelled = [&gone] { return gone.load(); };
  absl::StatusOr<std::string> value;
  absl::StatusOr<std::vector<std::string>> layout;
  std::thread key_waiter([&] {
    value = table.WaitForKey(id, "never", absl::Now() + absl::Seconds(600),
                             cancelled);
  });
  std::thread layout_waiter([&] {
    layout =
        table.WaitForLayout(id, absl::Now() + absl::Seconds(600), cancelled);
  });
  absl::SleepFor(absl::Milliseconds(250));
  const absl::Time start = absl::Now();
  gone = true;
  key_waiter.join();
  layout_waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(absl::IsCancelled(value.status())) << value.status();
  EXPECT_TRUE(absl::IsCancelled(layout.status())) << layout.status();
  // Not cancelled: the answers as before.
  gone = false;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(250));
    EXPECT_TRUE(table.Set(id, "k", "v").ok());
  });
  EXPECT_EQ(
      *table.WaitForKey(id, "k", absl::Now() + absl::Seconds(10), cancelled),
      "v");
  setter.join();
  EXPECT_EQ(table
                .WaitForKey(id, "never", absl::Now() + absl::Milliseconds(250),
                            cancelled)
                .status()
                .message(),
            "job-1: key \"never\" was not set in time");
}

TEST(JobTableTest, RestartFromTheJobFileKeepsJobs) {
  const std::string path = TempFile("jobs.pb");
  std::string id;
  {
    JobTable table(path);
    id = *table.Submit(Spec(), kT0);
    ASSERT_TRUE(table.Register(id, ROLE_PS, 0, "10.0.0.2:7000", kT0).ok());
    ASSERT_TRUE(table.Set(id, "k", "v").ok());
  }
  // Restarted 10 minutes later, past the 60 s timeout of the task that
  // registered and of those that did not: the timeouts start again.
  const absl::Time restart = kT0 + absl::Minutes(10);
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(path, restart);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(
      (*loaded)
          ->CheckHeartbeats(restart + absl::Seconds(30), absl::Seconds(60))
          .empty());
  const JobInfo job = *(*loaded)->Get(id);
  EXPECT_EQ(job.state(), JOB_PENDING);
  EXPECT_EQ(job.tasks(0).address(), "10.0.0.2:7000");
  EXPECT_EQ(job.kv().at("k"), "v");
  EXPECT_EQ(job.spec().num_workers(), 2);
  // Ids keep counting after a restart.
  JobSpec quick = Spec();
  quick.set_registration_timeout_s(60);
  EXPECT_EQ(*(*loaded)->Submit(quick, kT0), "job-2");

  // Both jobs' tasks are silent 61 s after the restart (job-1's lost, job-2's
  // past its 60 s to register).
  EXPECT_EQ((*loaded)->CheckHeartbeats(restart + absl::Seconds(61),
                                       absl::Seconds(60)),
            (std::vector<std::string>{"job-1", "job-2"}));
  EXPECT_EQ(JobTable::Load(TempFile("none.pb"), kT0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(JobTableTest, PruningKeepsTheNewestFinishedJobsAndEveryRunningOne) {
  const std::string path = TempFile("pruned.pb");
  JobTable table(path);  // keep_finished_jobs 100
  std::vector<std::string> running, ended;
  // 150 jobs ended one second apart, in an order unlike submission's, and
  // 20 running ones submitted before them all.
  for (int i = 0; i < 20; ++i) {
    const std::string id = *table.Submit(Spec(), kT0);
    for (const Task& t : Tasks()) {
      ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
    }
    running.push_back(id);
  }
  for (int i = 0; i < 150; ++i) ended.push_back(*table.Submit(Spec(), kT0));
  std::vector<std::string> end_order = ended;
  std::reverse(end_order.begin(), end_order.end());
  for (int i = 0; i < 150; ++i) {
    ASSERT_TRUE(table.Cancel(end_order[i], kT0 + absl::Seconds(i)).ok());
  }
  auto kept = [](const JobTable& t) {
    int finished = 0, pending_or_running = 0;
    for (const JobInfo& job : t.List()) {
      (JobEnded(job.state()) ? finished : pending_or_running)++;
    }
    return std::pair<int, int>{finished, pending_or_running};
  };
  EXPECT_EQ(kept(table), (std::pair<int, int>{100, 20}));
  // The 50 that ended first are gone; the 100 that ended last are kept.
  for (int i = 0; i < 150; ++i) {
    EXPECT_EQ(table.Get(end_order[i]).ok(), i >= 50) << end_order[i];
  }
  for (const std::string& id : running) {
    EXPECT_EQ(table.Get(id)->state(), JOB_RUNNING) << id;
  }
  // The job file holds the same; a coordinator keeping fewer prunes at load.
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(path, kT0 + absl::Hours(1));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(kept(**loaded), (std::pair<int, int>{100, 20}));
  JobTableLimits keep_ten;
  keep_ten.keep_finished_jobs = 10;
  loaded = JobTable::Load(path, kT0 + absl::Hours(1), keep_ten);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(kept(**loaded), (std::pair<int, int>{10, 20}));
  EXPECT_TRUE((*loaded)->Get(end_order[149]).ok());
  EXPECT_FALSE((*loaded)->Get(end_order[139]).ok());
  // Ids are never reused after pruning.
  EXPECT_EQ(*(*loaded)->Submit(Spec(), kT0), "job-171");
}

TEST(JobTableTest, KeyValueStoreIsBounded) {
  JobTable table;  // key 256 B, value 64 KiB, 1024 keys per job
  const std::string id = *table.Submit(Spec(), kT0);
  const std::string other = *table.Submit(Spec(), kT0);
  EXPECT_EQ(table.Set(id, "", "v").code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = table.Set(id, std::string(257, 'k'), "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "kv: a key of 257 bytes; the limit is 256 bytes");
  EXPECT_TRUE(table.Set(id, std::string(256, 'k'), "v").ok());
  s = table.Set(id, "big", std::string((64 << 10) + 1, 'v'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "kv: the value of key \"big\" is 65537 bytes; the limit is 65536 "
            "bytes");
  EXPECT_TRUE(table.Set(id, "big", std::string(64 << 10, 'v')).ok());
  for (int i = 2; i < 1024; ++i) {
    ASSERT_TRUE(table.Set(id, absl::StrCat("key", i), "v").ok()) << i;
  }
  s = table.Set(id, "one more", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "job-1: kv: the job's store holds 1024 keys, the limit; refusing "
            "new key \"one more\"");
  // Setting a key again, and another job's keys, are still allowed.
  EXPECT_TRUE(table.Set(id, "key2", "again").ok());
  EXPECT_TRUE(table.Set(other, "one more", "v").ok());
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.kv().size(), 1024u);
  EXPECT_EQ(job.kv().at("key2"), "again");
  EXPECT_EQ(job.kv().at("big").size(), 64u << 10);
  EXPECT_FALSE(job.kv().contains("one more"));
  // A key that could never be set is not waited for.
  EXPECT_EQ(table
                .WaitForKey(id, std::string(300, 'k'),
                            absl::Now() + absl::Seconds(60))
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);

  JobTableLimits small;
  small.max_kv_key_bytes = 4;
  small.max_kv_value_bytes = 2;
  small.max_kv_keys_per_job = 1;
  JobTable bounded("", small);
  const std::string b = *bounded.Submit(Spec(), kT0);
  EXPECT_TRUE(bounded.Set(b, "abcd", "xy").ok());
  EXPECT_FALSE(bounded.Set(b, "abcde", "x").ok());
  EXPECT_FALSE(bounded.Set(b, "abcd", "xyz").ok());
  EXPECT_FALSE(bounded.Set(b, "b", "x").ok());
  JobTableLimits bad;
  bad.max_kv_keys_per_job = 0;
  EXPECT_EQ(ValidateJobTableLimits(bad).message(),
            "max_kv_keys_per_job 0: expected >= 1");
  bad = JobTableLimits();
  bad.keep_finished_jobs = -1;
  EXPECT_FALSE(ValidateJobTableLimits(bad).ok());
}

// Load() of a job file that is not one this table wrote: one line naming
// the file, never a crash.
TEST(JobTableTest, BrokenJobFilesAreRefusedNamingThem) {
  auto load = [](const std::string& path) {
    return JobTable::Load(path, kT0).status();
  };
  auto write = [](const std::string& name, const std::string& bytes) {
    const std::string path = TempFile(name);
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
  };
  std::string path = write("empty.pb", "");
  absl::Status s = load(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "job file " + path +
                ": is empty (a job table always holds its next job id)");

  path = write("garbage.pb", "\x0a\x10job");  // 16 bytes promised, 3 there
  s = load(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "job file " + path +
                             ": not a pstrain job table (5 bytes that do not "
                             "parse)");

  s = load(std::getenv("TEST_TMPDIR"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), absl::StrCat("job file ", std::getenv("TEST_TMPDIR"),
                                      ": is a folder, not a job file"));
  // A FIFO is refused at once, not waited on.
  const std::string fifo = TempFile("fifo.pb");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  s = load(fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "job file " + fifo + ": is not a regular file, not a job file");

  // Consistent tables only: the tasks the spec says, in order, known ids.
  JobTable good(TempFile("good.pb"));
  const std::string id = *good.Submit(Spec(), kT0);
  ASSERT_TRUE(good.Register(id, ROLE_PS, 0, "10.0.0.2:7000", kT0).ok());
  ASSERT_TRUE(
      ReadFile(TempFile("good.pb"), &path).ok());  // path: the bytes now
  JobTableFile file;
  ASSERT_TRUE(file.ParseFromString(path));
  ASSERT_TRUE(ValidateJobTableFile(file).ok());
  const std::vector<std::pair<std::function<void(JobTableFile*)>, std::string>>
      broken = {
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->mutable_tasks()->RemoveLast();
           },
           "job-1: 3 tasks for 2 ps and 2 workers"},
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->mutable_spec()->set_num_workers(100);
           },
           "job-1: 4 tasks for 2 ps and 100 workers"},
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->mutable_tasks(1)->set_index(0);
           },
           "job-1: task #1 is ps 0; expected ps 1"},
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->mutable_tasks(2)->set_state(
                 static_cast<TaskState>(42));
           },
           "job-1: worker 0 has unknown state 42"},
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->set_state(static_cast<JobState>(9));
           },
           "job-1: unknown job state 9"},
          {[](JobTableFile* f) { f->set_next_id(0); },
           "next job id 0: expected 1 to 9007199254740992"},
          {[](JobTableFile* f) { f->set_next_id(INT64_MAX); },
           "next job id 9223372036854775807: expected 1 to "
           "9007199254740992"},
          {[](JobTableFile* f) { f->mutable_jobs(0)->set_id("job-7"); },
           "job-7: not an id this table gives (job-1 .. job-1)"},
          {[](JobTableFile* f) {
             *f->add_jobs() = f->jobs(0);
             f->set_next_id(5);
           },
           "job-1: listed twice"},
          {[](JobTableFile* f) {
             f->mutable_jobs(0)->add_log()->set_seq(3);
             f->mutable_jobs(0)->add_log()->set_seq(2);
             f->mutable_jobs(0)->set_next_log_seq(4);
           },
           "job-1: log line 2 out of order (after 3, next 4)"},
      };
  for (const auto& [breaks, message] : broken) {
    JobTableFile bad = file;
    breaks(&bad);
    const std::string bad_path =
        write("inconsistent.pb", bad.SerializeAsString());
    s = load(bad_path);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(s.message(),
              absl::StrCat("job file ", bad_path,
                           ": not a consistent job table: ", message));
  }
}

TEST(JobTableTest, IdSuffixIsForTablesWithoutAFile) {
  JobTable table;
  ASSERT_TRUE(table.SetIdSuffix("3f9a0c2e").ok());
  JobSpec spec;
  spec.set_num_workers(1);
  absl::StatusOr<std::string> id = table.Submit(spec, absl::Now());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "job-1-3f9a0c2e");
  EXPECT_TRUE(table.Get(*id).ok());
  for (const char* bad : {"", "UPPER", "a-b", "0123456789abcdefg"}) {
    EXPECT_EQ(table.SetIdSuffix(bad).code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  JobTable kept(::testing::TempDir() + "/suffix.pb");
  EXPECT_EQ(kept.SetIdSuffix("abc").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(JobTableTest, KvKeyOwnerGivesEachWorkerItsOwnKeys) {
  EXPECT_EQ(KvKeyOwner("worker-3/anything"), 3);
  EXPECT_EQ(KvKeyOwner("worker-0/a/b"), 0);
  EXPECT_EQ(KvKeyOwner("gloo/2"), 2);        // Gloo: rank 2's addresses
  EXPECT_EQ(KvKeyOwner("gloo/rank_2"), 2);   // Gloo: rank 2's host name
  EXPECT_EQ(KvKeyOwner("nccl/nccl_id"), 0);  // NCCL: made by rank 0
  // Elastic allreduce: the world worker 0 chose (worker/world_announcement.h)
  EXPECT_EQ(KvKeyOwner("gloo-2-m3/world"), 0);
  EXPECT_EQ(KvKeyOwner("a/b/12"), 12);
  for (const char* nobody :
       {"k", "gloo", "gloo/", "/1", "gloo/01", "gloo/-1", "gloo/rank_",
        "gloo/rank_x", "gloo/1x", "worker-/x", "worker-1", "worker-01/x",
        "gloo/99999999999", "nccl_id"}) {
    EXPECT_EQ(KvKeyOwner(nobody), -1) << nobody;
  }
}

TEST(JobTableTest, KvSetIsBatchedAndWrittenByFlushIfDirty) {
  const std::string path = TempFile("batched.pb");
  JobTable table(path);
  const std::string id = *table.Submit(Spec(), kT0);
  ASSERT_TRUE(table.Set(id, "gloo/0", "v").ok());
  // Not written by the call itself.
  EXPECT_FALSE((*JobTable::Load(path, kT0))->Get(id)->kv().contains("gloo/0"));
  ASSERT_TRUE(table.FlushIfDirty().ok());
  EXPECT_EQ((*JobTable::Load(path, kT0))->Get(id)->kv().at("gloo/0"), "v");
}

TEST(JobTableTest, KvByteBudgetsPerJobAndPerWorker) {
  JobTableLimits limits;
  limits.max_kv_bytes_per_job = 100;
  limits.max_kv_bytes_per_task = 40;
  JobTable table("", limits);
  const std::string id = *table.Submit(Spec(), kT0);
  EXPECT_TRUE(table.Set(id, "gloo/0", std::string(34, 'a')).ok());  // 40 B
  absl::Status s = table.Set(id, "worker-0/x", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "job-1: kv: key \"worker-0/x\" would make the keys of worker 0 51 "
            "bytes; the limit is 40 bytes");
  // Setting a key again counts its new size only.
  EXPECT_TRUE(table.Set(id, "gloo/0", std::string(30, 'a')).ok());
  EXPECT_TRUE(table.Set(id, "gloo/1", std::string(34, 'b')).ok());
  s = table.Set(id, "gloo/2", std::string(30, 'c'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "job-1: kv: key \"gloo/2\" would make the job's store 112 bytes; "
            "the limit is 100 bytes");
  EXPECT_FALSE(table.Get(id)->kv().contains("gloo/2"));
}

// Every string a task sends is cut, not refused: per line, per task and per
// job, each cut with a marker; a task whose budget is spent says so once.
TEST(JobTableTest, TextIsCutWithAMarkerNeverRefused) {
  JobTableLimits limits;
  limits.max_text_item_bytes = 100;
  limits.max_text_bytes_per_task = 250;
  limits.max_text_bytes_per_job = 400;
  JobTable table("", limits);
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  // "é" is 2 bytes: a cut never splits it.
  std::string accents;
  for (int i = 0; i < 150; ++i) accents += "\xc3\xa9";
  ASSERT_TRUE(Beat(table, id, ROLE_WORKER, 0, kT0, {"short", accents}).ok());
  JobInfo job = *table.Get(id);
  ASSERT_EQ(job.log_size(), 2);
  EXPECT_EQ(job.log(0).text(), "short");
  const std::string& cut = job.log(1).text();
  EXPECT_LE(cut.size(), 100u);
  EXPECT_NE(cut.find("\xe2\x80\xa6[cut: "), std::string::npos) << cut;
  EXPECT_NE(cut.find(" bytes over the per-line limit of 100 bytes]"),
            std::string::npos)
      << cut;
  JobInfo reparsed;  // proto3 refuses a string that is not UTF-8
  EXPECT_TRUE(reparsed.ParseFromString(job.SerializeAsString()));

  // Worker 0 spends its 250 bytes: one line says so, and its later lines
  // are only counted; worker 1 then spends what is left of the job's 400.
  const std::string line90(90, 'x');
  auto marker_lines = [&](int index, const std::string& budget) {
    int markers = 0;
    bool after_marker = false;
    const JobInfo now = *table.Get(id);
    for (const LogLine& line : now.log()) {
      if (line.role() != ROLE_WORKER || line.index() != index) continue;
      EXPECT_FALSE(after_marker) << "a line after the marker: " << line.text();
      if (line.text().find("later lines are only counted]") !=
          std::string::npos) {
        EXPECT_NE(line.text().find(budget), std::string::npos) << line.text();
        ++markers;
        after_marker = true;
      }
    }
    return markers;
  };
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(Beat(table, id, ROLE_WORKER, 0, kT0, {line90}).ok());
  }
  EXPECT_EQ(marker_lines(0, "per-task budget of 250 bytes"), 1);
  job = *table.Get(id);
  const TaskInfo& w0 = job.tasks(2);
  EXPECT_LE(w0.text_bytes(), 250);
  EXPECT_GT(w0.text_bytes(), 150);
  // Its 2 lines kept cost kLogLineCostBytes each besides their text.
  EXPECT_EQ(w0.text_bytes() + w0.text_bytes_cut(),
            5 + 300 + 6 * 90 + 2 * JobTable::kLogLineCostBytes);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(Beat(table, id, ROLE_WORKER, 1, kT0, {line90}).ok());
  }
  EXPECT_EQ(marker_lines(1, "per-job budget of 400 bytes"), 1);
  job = *table.Get(id);
  EXPECT_LE(job.text_bytes(), 400);
  EXPECT_EQ(job.state(), JOB_RUNNING);

  // A message and a `why` are cut to the per-item limit.
  absl::StatusOr<int> restarts =
      table.TaskRestarting(id, ROLE_PS, 1, std::string(1000, 'w'), kT0);
  EXPECT_FALSE(restarts.ok());  // max_restarts 0: the job fails
  job = *table.Get(id);
  EXPECT_LE(job.tasks(1).message().size(), 100u);
  EXPECT_NE(job.tasks(1).message().find("per-message limit of 100 bytes]"),
            std::string::npos);
  EXPECT_LT(job.message().size(), 200u);
}

TEST(JobTableTest, AllreduceWorkerDeathRestartsEveryWorkerAsOneRestart) {
  JobTable table;
  const std::string id = *table.Submit(
      *ParseJobSpec("num_ps: 0 num_workers: 3 batch_size: 8 epochs: 1 "
                    "mode: \"allreduce\" max_restarts: 1 "
                    "checkpoint_dir: \"/tmp/ck\"",
                    "test"),
      kT0);
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(
        table.Register(id, ROLE_WORKER, w, absl::StrCat("h:", w), kT0).ok());
  }
  ASSERT_TRUE(table.Set(id, "gloo/rank_0", "a").ok());
  ASSERT_TRUE(table.Set(id, "worker-0/x", "b").ok());
  ASSERT_EQ(*table.TaskRestarting(id, ROLE_WORKER, 1, "died (signal 9)", kT0),
            1);
  JobInfo job = *table.Get(id);
  EXPECT_EQ(JobRestarts(job), 1);
  EXPECT_EQ(job.state(), JOB_RUNNING);
  for (const TaskInfo& t : job.tasks()) {
    EXPECT_EQ(t.state(), TASK_WAITING) << t.index();
    EXPECT_EQ(t.restart_requested(), t.index() != 1) << t.index();
  }
  // The rendezvous keys are dropped; the workers' own keys stay.
  EXPECT_EQ(job.kv().count("gloo/rank_0"), 0u);
  EXPECT_EQ(job.kv().count("worker-0/x"), 1u);
  // The survivors' heartbeats tell them to restart, until they register
  // again; the dead worker's replacement is not told.
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(id, ROLE_WORKER, 0);
  bool restart = false;
  ASSERT_TRUE(table.Heartbeat(beat, kT0, &restart).ok());
  EXPECT_TRUE(restart);
  ASSERT_TRUE(table.Register(id, ROLE_WORKER, 0, "h:10", kT0).ok());
  ASSERT_TRUE(table.Heartbeat(beat, kT0, &restart).ok());
  EXPECT_FALSE(restart);
  // The second death is past the budget: the job fails naming it.
  EXPECT_EQ(table.TaskRestarting(id, ROLE_WORKER, 0, "died (signal 9)", kT0)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_FAILED);
  EXPECT_EQ(job.message(),
            "worker 0 died (signal 9); the job's restart budget (1) is spent");
}

// An elastic allreduce job's restart of every worker leaves its standby
// worker idle (it is not running: nothing to restart).
TEST(JobTableTest, ElasticAllreduceRestartLeavesStandbyWorkersIdle) {
  JobTable table;
  const std::string id = *table.Submit(
      *ParseJobSpec("num_ps: 0 num_workers: 2 max_workers: 3 batch_size: 8 "
                    "epochs: 1 mode: \"allreduce\" max_restarts: 1 "
                    "checkpoint_dir: \"/tmp/ck\"",
                    "test"),
      kT0);
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(
        table.Register(id, ROLE_WORKER, w, absl::StrCat("h:", w), kT0).ok());
  }
  ASSERT_EQ(*table.TaskRestarting(id, ROLE_WORKER, 1, "died (signal 9)", kT0),
            1);
  const JobInfo job = *table.Get(id);
  for (const TaskInfo& t : job.tasks()) {
    EXPECT_EQ(t.state(), t.index() == 2 ? TASK_IDLE : TASK_WAITING)
        << t.index();
    EXPECT_EQ(t.restart_requested(), t.index() == 0) << t.index();
  }
}

TEST(JobTableTest, EndedTasksHeartbeatsAreRefused) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 1, true, "", kT0).ok());
  absl::StatusOr<JobState> state =
      Beat(table, id, ROLE_WORKER, 1, kT0, {"late line"});
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state.status().message(),
            "job-1: worker 1 has ended (TASK_DONE); refusing its heartbeat");
  // A retried report is OK and keeps nothing; the opposite is refused.
  EXPECT_TRUE(Finish(table, id, ROLE_WORKER, 1, true, "", kT0).ok());
  EXPECT_EQ(Finish(table, id, ROLE_WORKER, 1, false, "late", kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  const JobInfo after = *table.Get(id);
  for (const LogLine& line : after.log()) {
    EXPECT_NE(line.text(), "late line");
  }
  // Tasks stopped by the job's end are still answered, to learn it, and
  // nothing they send is kept: an ended job accepts nothing.
  ASSERT_TRUE(table.Set(id, "worker-0/x", "before").ok());
  ASSERT_TRUE(table.Cancel(id, kT0).ok());
  const JobInfo cancelled = *table.Get(id);
  state = Beat(table, id, ROLE_PS, 0, kT0, {"after the end"});
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, JOB_CANCELLED);
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(id, ROLE_WORKER, 0);
  beat.add_log_lines("accuracy rewritten");
  beat.set_steps(999);
  beat.set_samples_per_sec(1e9);
  beat.set_prepared(true);
  beat.mutable_result()->set_test_accuracy(0.999);
  bool restart = true;
  state = table.Heartbeat(beat, kT0 + absl::Seconds(1), &restart);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, JOB_CANCELLED);
  EXPECT_FALSE(restart);
  // Its report, with a result, is answered OK and keeps nothing either.
  TaskFinishedRequest done;
  *done.mutable_task() = Ref(id, ROLE_WORKER, 0);
  done.set_ok(true);
  done.add_log_lines("final accuracy rewritten");
  done.set_steps(1000);
  done.mutable_result()->set_test_accuracy(0.999);
  EXPECT_TRUE(table.TaskFinished(done, kT0 + absl::Seconds(2)).ok());
  // Nor is a key-value write.
  absl::Status set = table.Set(id, "worker-0/x", "after");
  EXPECT_EQ(set.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(set.message(),
            "job-1 has ended (CANCELLED); refusing to set key \"worker-0/x\"");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*table.Get(id),
                                                                 cancelled))
      << "before: " << cancelled.ShortDebugString()
      << "\nafter: " << table.Get(id)->ShortDebugString();
  EXPECT_EQ(
      table.Register(id, ROLE_WORKER, 0, std::string(1025, 'a'), kT0).code(),
      absl::StatusCode::kInvalidArgument);
}

// A failed job's worker 0 cannot rewrite the job's result or log
// afterwards, while its report before the end is kept: the job ends on it.
TEST(JobTableTest, AFailedJobKeepsTheResultItEndedWith) {
  JobTable table;
  JobSpec spec = Spec();
  spec.set_mode("sync");
  spec.set_backup_workers(1);
  const std::string id = *table.Submit(spec, kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  // Worker 0's final lines and result arrive with the report that ends the
  // job (backup workers: worker 0 done is the job done).
  TaskFinishedRequest done;
  *done.mutable_task() = Ref(id, ROLE_WORKER, 0);
  done.set_ok(true);
  done.add_log_lines("final line");
  done.mutable_result()->set_test_accuracy(0.8);
  ASSERT_TRUE(table.TaskFinished(done, kT0).ok());
  JobInfo job = *table.Get(id);
  EXPECT_EQ(job.state(), JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(job.result().test_accuracy(), 0.8);
  ASSERT_EQ(job.log_size(), 1);
  EXPECT_EQ(job.log(0).text(), "final line");

  // Job b fails on ps 1; worker 0, stopped by the end, still heartbeats
  // with a result and a log line, then reports one: none is kept.
  const std::string b = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(b, t.role, t.index, t.address, kT0).ok());
  }
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(b, ROLE_WORKER, 0);
  beat.mutable_result()->set_test_accuracy(0.5);
  ASSERT_TRUE(table.Heartbeat(beat, kT0).ok());
  ASSERT_TRUE(Finish(table, b, ROLE_PS, 1, false, "out of memory", kT0).ok());
  ASSERT_EQ(table.Get(b)->state(), JOB_FAILED);
  beat.mutable_result()->set_test_accuracy(0.99);
  beat.add_log_lines("rewritten");
  EXPECT_EQ(*table.Heartbeat(beat, kT0), JOB_FAILED);
  TaskFinishedRequest late;
  *late.mutable_task() = Ref(b, ROLE_WORKER, 0);
  late.set_ok(true);
  late.mutable_result()->set_test_accuracy(0.99);
  EXPECT_TRUE(table.TaskFinished(late, kT0).ok());
  job = *table.Get(b);
  EXPECT_DOUBLE_EQ(job.result().test_accuracy(), 0.5);
  EXPECT_EQ(job.log_size(), 0);
  EXPECT_EQ(job.tasks(2).state(), TASK_STOPPED);
}

// One request carries at most kMaxLogLinesPerRequest log lines and no more
// times than lines; past them it is refused whole, naming the field.
TEST(JobTableTest, TooManyLogLinesInOneRequestAreRefused) {
  JobTable table;
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  HeartbeatRequest beat;
  *beat.mutable_task() = Ref(id, ROLE_WORKER, 0);
  for (int i = 0; i <= JobTable::kMaxLogLinesPerRequest; ++i) {
    beat.add_log_lines("");
  }
  beat.set_steps(5);
  absl::StatusOr<JobState> state = table.Heartbeat(beat, kT0);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.status().message(),
            "job-1: worker 0's heartbeat carries 10001 log_lines; the limit "
            "is 10000 per request");
  TaskFinishedRequest done;
  *done.mutable_task() = Ref(id, ROLE_WORKER, 0);
  done.set_ok(true);
  *done.mutable_log_lines() = beat.log_lines();
  absl::Status s = table.TaskFinished(done, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "job-1: worker 0's report carries 10001 log_lines; the limit is "
            "10000 per request");
  HeartbeatRequest times;
  *times.mutable_task() = Ref(id, ROLE_PS, 1);
  times.add_log_lines("one");
  times.add_log_times_ms(1);
  times.add_log_times_ms(2);
  state = table.Heartbeat(times, kT0);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.status().message(),
            "job-1: ps 1's heartbeat carries 2 log_times_ms for 1 log_lines; "
            "expected at most one per line");
  // Nothing of them was kept.
  const JobInfo job = *table.Get(id);
  EXPECT_EQ(job.log_size(), 0);
  EXPECT_EQ(job.tasks(2).steps(), 0);
  EXPECT_EQ(job.tasks(2).state(), TASK_REGISTERED);
  EXPECT_EQ(job.text_bytes(), 0);
  // The cap itself passes (LogLinesProgressAndResult).
  beat.mutable_log_lines()->RemoveLast();
  EXPECT_TRUE(table.Heartbeat(beat, kT0).ok());
}

// An empty line costs kLogLineCostBytes of the text budgets: a task that
// sends nothing but empty lines spends its budget like any other.
TEST(JobTableTest, EmptyLogLinesCostTheirShareOfTheBudget) {
  JobTableLimits limits;
  limits.max_text_item_bytes = 64;
  limits.max_text_bytes_per_task = 100 * JobTable::kLogLineCostBytes;
  limits.max_text_bytes_per_job = 1000 * JobTable::kLogLineCostBytes;
  JobTable table("", limits);
  const std::string id = *table.Submit(Spec(), kT0);
  for (const Task& t : Tasks()) {
    ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
  }
  for (int beat = 0; beat < 10; ++beat) {
    ASSERT_TRUE(
        Beat(table, id, ROLE_WORKER, 0, kT0, std::vector<std::string>(1000, ""))
            .ok());
  }
  const JobInfo job = *table.Get(id);
  // 100 empty lines, then the one saying the budget is spent.
  ASSERT_EQ(job.log_size(), 101);
  EXPECT_EQ(job.log(99).text(), "");
  EXPECT_EQ(job.log(100).text(),
            "\u2026[cut: 0 bytes over the per-task budget of 6400 bytes (each "
            "line also costs 64 bytes); worker 0's later lines are only "
            "counted]");
  EXPECT_EQ(job.tasks(2).text_bytes(), 6400);
  EXPECT_EQ(job.text_bytes(), 6400);
  EXPECT_TRUE(job.tasks(2).text_budget_spent());
}

// Fill every budget of several jobs; the job file stays within its read
// limit and a restarted table finds every job.
TEST(JobTableTest, EveryBudgetFilledTheJobFileStillLoads) {
  const std::string path = TempFile("full.pb");
  JobTableLimits limits;
  limits.keep_finished_jobs = 3;
  limits.max_kv_value_bytes = 4 << 10;
  limits.max_kv_bytes_per_job = 16 << 10;
  limits.max_kv_bytes_per_task = 8 << 10;
  limits.max_text_item_bytes = 1 << 10;
  limits.max_text_bytes_per_task = 8 << 10;
  limits.max_text_bytes_per_job = 24 << 10;
  limits.max_log_bytes_per_job = 16 << 10;
  limits.max_result_bytes = 2 << 10;
  // Less than 8 jobs' full stores and logs: Persist must drop some.
  limits.max_job_file_bytes = 128 << 10;
  std::vector<std::string> ids;
  {
    JobTable table(path, limits);
    for (int j = 0; j < 8; ++j) {
      const std::string id = *table.Submit(Spec(), kT0);
      ids.push_back(id);
      for (const Task& t : Tasks()) {
        ASSERT_TRUE(table.Register(id, t.role, t.index, t.address, kT0).ok());
      }
      for (int w = 0; w < 2; ++w) {
        for (int k = 0; k < 4; ++k) {
          // Refused past a budget; the rest fill it.
          table
              .Set(id, absl::StrCat("worker-", w, "/", k),
                   std::string(limits.max_kv_value_bytes, 'v'))
              .IgnoreError();
        }
      }
      for (const Task& t : Tasks()) {
        HeartbeatRequest request;
        *request.mutable_task() = Ref(id, t.role, t.index);
        for (int i = 0; i < 20; ++i) {
          request.add_log_lines(std::string(2000, 'l'));
        }
        if (t.role == ROLE_WORKER && t.index == 0) {
          request.mutable_result()->set_model(std::string(4000, 'r'));
        }
        ASSERT_TRUE(table.Heartbeat(request, kT0).ok());
      }
      if (j % 2 == 0) {
        ASSERT_TRUE(Finish(table, id, ROLE_WORKER, 0, false,
                           std::string(5000, 'm'), kT0 + absl::Seconds(j))
                        .ok());
      }
    }
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_LE(static_cast<int64_t>(in.tellg()), limits.max_job_file_bytes);
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(path, kT0, limits);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The 4 running jobs and the newest 3 ended ones.
  std::vector<std::string> found;
  for (const JobInfo& job : (*loaded)->List()) found.push_back(job.id());
  EXPECT_EQ(found, (std::vector<std::string>{"job-2", "job-3", "job-4", "job-5",
                                             "job-6", "job-7", "job-8"}));
  EXPECT_EQ((*loaded)->Get("job-8")->tasks(2).state(), TASK_REGISTERED);
}

// A table that does not fit its file is never written: the file keeps the
// last table that did.
TEST(JobTableTest, ATableOverTheFileLimitIsNeverWritten) {
  const std::string path = TempFile("over.pb");
  JobTableLimits limits;
  limits.max_job_file_bytes = 4 << 10;
  JobTable table(path, limits);
  const std::string first = *table.Submit(Spec(), kT0);
  JobSpec huge = Spec();
  huge.set_data_dir(std::string(8 << 10, 'd'));
  absl::StatusOr<std::string> second = table.Submit(huge, kT0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<std::unique_ptr<JobTable>> loaded =
      JobTable::Load(path, kT0, limits);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->List().size(), 1u);
  EXPECT_EQ(table.List().size(), 1u);
}

}  // namespace
}  // namespace pstrain
