// The Coordinator service over real gRPC (an in-process server on a free
// port): statuses and messages as clients see them.
#include "coordinator/coordinator_service.h"

#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<CoordinatorService>(&table_, absl::Seconds(5));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = Coordinator::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  static void SetDeadline(grpc::ClientContext* c, int ms = 5000) {
    c->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(ms));
  }

  grpc::Status Register(const std::string& id, TaskRole role, int index,
                        const std::string& address) {
    grpc::ClientContext c;
    SetDeadline(&c);
    RegisterRequest r;
    r.mutable_task()->set_job_id(id);
    r.mutable_task()->set_role(role);
    r.mutable_task()->set_index(index);
    r.set_address(address);
    RegisterResponse response;
    return stub_->Register(&c, r, &response);
  }

  JobTable table_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Coordinator::Stub> stub_;
};

TEST_F(CoordinatorServiceTest, SubmitRegisterLayoutHeartbeatFinish) {
  grpc::ClientContext c;
  SetDeadline(&c);
  SubmitRequest submit;
  submit.mutable_spec()->set_num_ps(1);
  submit.mutable_spec()->set_num_workers(2);
  submit.mutable_spec()->set_batch_size(8);
  submit.mutable_spec()->set_epochs(1);
  SubmitResponse submitted;
  ASSERT_TRUE(stub_->Submit(&c, submit, &submitted).ok());
  const std::string id = submitted.job_id();
  EXPECT_EQ(id, "job-1");

  ClusterLayout layout;
  grpc::Status layout_status;
  std::thread waiter([&] {
    grpc::ClientContext wc;
    SetDeadline(&wc);
    JobRequest r;
    r.set_job_id(id);
    layout_status = stub_->WaitForLayout(&wc, r, &layout);
  });
  ASSERT_TRUE(Register(id, ROLE_WORKER, 1, "w1:7001").ok());
  ASSERT_TRUE(Register(id, ROLE_PS, 0, "p0:7000").ok());
  ASSERT_TRUE(Register(id, ROLE_WORKER, 0, "w0:7001").ok());
  waiter.join();
  ASSERT_TRUE(layout_status.ok()) << layout_status.error_message();
  EXPECT_EQ(layout.ps_addresses(0), "p0:7000");
  EXPECT_EQ(layout.worker_addresses(1), "w1:7001");

  grpc::ClientContext hc;
  SetDeadline(&hc);
  HeartbeatRequest hb;
  hb.mutable_task()->set_job_id(id);
  hb.mutable_task()->set_role(ROLE_PS);
  HeartbeatResponse hr;
  ASSERT_TRUE(stub_->Heartbeat(&hc, hb, &hr).ok());
  EXPECT_EQ(hr.state(), JOB_RUNNING);

  for (int w = 0; w < 2; ++w) {
    grpc::ClientContext fc;
    SetDeadline(&fc);
    TaskFinishedRequest f;
    f.mutable_task()->set_job_id(id);
    f.mutable_task()->set_role(ROLE_WORKER);
    f.mutable_task()->set_index(w);
    f.set_ok(true);
    TaskFinishedResponse fr;
    ASSERT_TRUE(stub_->TaskFinished(&fc, f, &fr).ok());
  }
  grpc::ClientContext gc;
  SetDeadline(&gc);
  JobRequest get;
  get.set_job_id(id);
  JobInfo job;
  ASSERT_TRUE(stub_->GetJob(&gc, get, &job).ok());
  EXPECT_EQ(job.state(), JOB_SUCCEEDED);
}

// ListJobs answers a summary of every job: the store (up to 4 MiB a job)
// is GetJob's.
TEST_F(CoordinatorServiceTest, ListJobsLeavesTheStoreToGetJob) {
  grpc::ClientContext c;
  SetDeadline(&c);
  SubmitRequest submit;
  submit.mutable_spec()->set_num_ps(1);
  submit.mutable_spec()->set_num_workers(1);
  submit.mutable_spec()->set_batch_size(8);
  submit.mutable_spec()->set_epochs(1);
  SubmitResponse submitted;
  ASSERT_TRUE(stub_->Submit(&c, submit, &submitted).ok());
  const std::string id = submitted.job_id();
  ASSERT_TRUE(Register(id, ROLE_PS, 0, "p0:7000").ok());
  ASSERT_TRUE(Register(id, ROLE_WORKER, 0, "w0:7001").ok());
  grpc::ClientContext kc;
  SetDeadline(&kc);
  KvSetRequest set;
  set.set_job_id(id);
  set.set_key("worker-0/blob");
  set.set_value(std::string(60000, 'x'));
  KvSetResponse set_response;
  ASSERT_TRUE(stub_->KvSet(&kc, set, &set_response).ok());

  grpc::ClientContext lc;
  SetDeadline(&lc);
  ListJobsResponse listed;
  ASSERT_TRUE(stub_->ListJobs(&lc, ListJobsRequest(), &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), id);
  EXPECT_EQ(listed.jobs(0).tasks_size(), 2);
  EXPECT_EQ(listed.jobs(0).tasks(1).address(), "w0:7001");
  EXPECT_TRUE(listed.jobs(0).kv().empty());
  EXPECT_LT(listed.ByteSizeLong(), 2000u);

  grpc::ClientContext gc;
  SetDeadline(&gc);
  JobRequest get;
  get.set_job_id(id);
  JobInfo job;
  ASSERT_TRUE(stub_->GetJob(&gc, get, &job).ok());
  EXPECT_EQ(job.kv().at("worker-0/blob").size(), 60000u);
}

TEST_F(CoordinatorServiceTest, ErrorsReachTheClientWithTheirCodes) {
  grpc::ClientContext c;
  SetDeadline(&c);
  SubmitRequest submit;
  submit.mutable_spec()->set_num_ps(1);
  submit.mutable_spec()->set_num_workers(0);
  SubmitResponse submitted;
  grpc::Status s = stub_->Submit(&c, submit, &submitted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "num_workers: 0; expected 1 to 4096");

  EXPECT_EQ(Register("job-7", ROLE_PS, 0, "h:1").error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A wait is bounded by the caller's deadline and names what is missing.
  grpc::ClientContext kc;
  SetDeadline(&kc);
  SubmitRequest ok = submit;
  ok.mutable_spec()->set_num_workers(1);
  ok.mutable_spec()->set_batch_size(1);
  ok.mutable_spec()->set_epochs(1);
  ASSERT_TRUE(stub_->Submit(&kc, ok, &submitted).ok());
  grpc::ClientContext wc;
  SetDeadline(&wc, 100);
  KvWaitRequest wait;
  wait.set_job_id(submitted.job_id());
  wait.set_key("rendezvous");
  KvWaitResponse value;
  s = stub_->KvWait(&wc, wait, &value);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// A spec out of range is INVALID_ARGUMENT naming the field, the value and
// the range, nothing is allocated or stored for it, and the coordinator
// serves the next good submit.
TEST_F(CoordinatorServiceTest, BadSpecIsInvalidArgumentAndTheNextGoodOneRuns) {
  SubmitRequest good;
  good.mutable_spec()->set_num_ps(1);
  good.mutable_spec()->set_num_workers(2);
  good.mutable_spec()->set_batch_size(8);
  good.mutable_spec()->set_epochs(1);
  const struct {
    SubmitRequest request;
    std::string error;
  } bad[] = {
      {[&] {
         SubmitRequest r = good;
         r.mutable_spec()->set_num_workers(2147483647);
         return r;
       }(),
       "num_workers: 2147483647; expected 1 to 4096"},
      {[&] {
         SubmitRequest r = good;
         r.mutable_spec()->mutable_optimizer()->set_lr(
             std::numeric_limits<double>::infinity());
         return r;
       }(),
       "optimizer.lr: inf; expected 1e-30 to 10"},
      {[&] {
         SubmitRequest r = good;
         r.mutable_spec()->mutable_optimizer()->set_beta2(0.99999999);
         return r;
       }(),
       "optimizer.beta2: 0.99999999; expected 0 <= beta < 1, and below 1 in "
       "fp32 (at most 0.99999994)"},
  };
  for (const auto& b : bad) {
    grpc::ClientContext c;
    SetDeadline(&c);
    SubmitResponse response;
    const grpc::Status s = stub_->Submit(&c, b.request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), b.error);
  }
  EXPECT_TRUE(table_.List().empty());
  grpc::ClientContext c;
  SetDeadline(&c);
  SubmitResponse response;
  ASSERT_TRUE(stub_->Submit(&c, good, &response).ok());
  EXPECT_EQ(response.job_id(), "job-1");
}

// Elastic shards (issue 40): Scale with num_ps, and WaitForLayout answers
// the shards of the membership worker 0 applied, so that a worker
// recovering after the layout changed finds the new shards.
TEST_F(CoordinatorServiceTest, ScaleShardsAndLayoutOfTheAppliedMembership) {
  grpc::ClientContext c;
  SetDeadline(&c);
  SubmitRequest submit;
  submit.mutable_spec()->set_num_ps(2);
  submit.mutable_spec()->set_max_ps(3);
  submit.mutable_spec()->set_num_workers(1);
  submit.mutable_spec()->set_batch_size(8);
  submit.mutable_spec()->set_epochs(1);
  SubmitResponse submitted;
  ASSERT_TRUE(stub_->Submit(&c, submit, &submitted).ok());
  const std::string id = submitted.job_id();
  ASSERT_TRUE(Register(id, ROLE_PS, 0, "p0:7000").ok());
  ASSERT_TRUE(Register(id, ROLE_PS, 1, "p1:7000").ok());
  ASSERT_TRUE(Register(id, ROLE_WORKER, 0, "w0:7001").ok());
  auto layout = [&] {
    grpc::ClientContext wc;
    SetDeadline(&wc);
    JobRequest r;
    r.set_job_id(id);
    ClusterLayout out;
    const grpc::Status s = stub_->WaitForLayout(&wc, r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return absl::StrCat(absl::StrJoin(out.ps_addresses(), ","), " | ",
                        absl::StrJoin(out.worker_addresses(), ","));
  };
  auto heartbeat = [&](TaskRole role, int index,
                       const MembershipApplied* applied) {
    grpc::ClientContext hc;
    SetDeadline(&hc);
    HeartbeatRequest hb;
    hb.mutable_task()->set_job_id(id);
    hb.mutable_task()->set_role(role);
    hb.mutable_task()->set_index(index);
    if (applied != nullptr) *hb.mutable_membership_applied() = *applied;
    HeartbeatResponse hr;
    const grpc::Status s = stub_->Heartbeat(&hc, hb, &hr);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return hr;
  };
  auto scale = [&](int num_ps, ScaleResponse* response) {
    grpc::ClientContext sc;
    SetDeadline(&sc);
    ScaleRequest r;
    r.set_job_id(id);
    r.set_num_ps(num_ps);
    return stub_->Scale(&sc, r, response);
  };
  EXPECT_EQ(layout(), "p0:7000,p1:7000 | w0:7001");

  ScaleResponse scaled;
  ASSERT_TRUE(scale(3, &scaled).ok());
  EXPECT_EQ(scaled.membership().num_ps(), 3);
  EXPECT_FALSE(scaled.membership().ready());
  ASSERT_TRUE(Register(id, ROLE_PS, 2, "p2:7000").ok());
  // Ready, with the shards' addresses for worker 0; the layout is still
  // the applied membership's.
  HeartbeatResponse hr = heartbeat(ROLE_WORKER, 0, nullptr);
  EXPECT_TRUE(hr.membership().ready());
  EXPECT_EQ(absl::StrJoin(hr.membership().ps_addresses(), ","),
            "p0:7000,p1:7000,p2:7000");
  EXPECT_EQ(layout(), "p0:7000,p1:7000 | w0:7001");
  MembershipApplied applied;
  applied.set_epoch(1);
  applied.set_old_workers(1);
  applied.set_new_workers(1);
  applied.set_old_ps(2);
  applied.set_new_ps(3);
  heartbeat(ROLE_WORKER, 0, &applied);
  EXPECT_EQ(layout(), "p0:7000,p1:7000,p2:7000 | w0:7001");

  // Back to 2: shard 2 is told to leave once applied.
  ASSERT_TRUE(scale(2, &scaled).ok());
  EXPECT_FALSE(heartbeat(ROLE_PS, 2, nullptr).removed());
  applied.set_epoch(2);
  applied.set_old_ps(3);
  applied.set_new_ps(2);
  heartbeat(ROLE_WORKER, 0, &applied);
  EXPECT_TRUE(heartbeat(ROLE_PS, 2, nullptr).removed());
  EXPECT_FALSE(heartbeat(ROLE_PS, 1, nullptr).removed());
  EXPECT_EQ(layout(), "p0:7000,p1:7000 | w0:7001");
  // Out of range: INVALID_ARGUMENT naming the job.
  const grpc::Status s = scale(4, &scaled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            id + ": scale to 4 shards; expected 1 to 3 (max_ps)");
}

}  // namespace
}  // namespace pstrain
