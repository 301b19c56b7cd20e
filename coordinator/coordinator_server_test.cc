// WaitingReport: the line the coordinator prints once a minute while a
// job's tasks have not all registered.
#include "coordinator/coordinator_server.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(WaitingReportTest, NamesTheTasksNotRegisteredYet) {
  JobInfo job;
  job.set_id("job-4");
  job.set_state(JOB_PENDING);
  job.set_submit_ms(1000000);
  job.mutable_spec()->set_registration_timeout_s(600);
  HostPort* h = job.mutable_spec()->add_ps_hosts();
  h->set_host("10.0.0.2");
  h->set_port(7000);
  TaskInfo* ps = job.add_tasks();
  ps->set_role(ROLE_PS);
  ps->set_state(TASK_WAITING);
  TaskInfo* w0 = job.add_tasks();
  w0->set_role(ROLE_WORKER);
  w0->set_state(TASK_REGISTERED);
  TaskInfo* w1 = job.add_tasks();
  w1->set_role(ROLE_WORKER);
  w1->set_index(1);
  w1->set_state(TASK_WAITING);
  const absl::Time now = absl::FromUnixMillis(1000000 + 120500);
  EXPECT_EQ(WaitingReport(job, now),
            "job-4: 1/3 tasks registered after 120 s; waiting for ps 0 on "
            "10.0.0.2:7000, worker 1 (registration timeout 600 s)");
  job.set_state(JOB_RUNNING);
  EXPECT_EQ(WaitingReport(job, now), "");
}

}  // namespace
}  // namespace pstrain
