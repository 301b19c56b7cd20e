// The outsider's list of issue 21, tried against a live job on a
// pstrain_coordinator with its tasks (all over mutual TLS, through
// PSTRAIN_TLS_DIR): cancel the job, report a worker finished with a
// made-up accuracy, tell the shard a worker is done, pull the model, push
// gradients, initialise the shard again, take the PS slot, write into the
// job's log, fill the key-value store, submit a job. Each is tried from
// clients without the job's keys (plaintext, another CA's certificates) and
// with another role's keys of the same CA: every try is refused, and the
// job finishes SUCCEEDED with the accuracy of the same job run untouched,
// its log free of the attackers' lines.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/cli_test_util.h"

namespace pstrain {
namespace {

using testing::CoordinatorProcess;
using testing::HaveFashionMnist;
using testing::Process;
using testing::RunCommand;
using testing::TempDir;
using testing::WriteTextFile;

std::unique_ptr<Process> StartTask(const std::string& role, int index,
                                   const CoordinatorProcess& coordinator,
                                   const std::string& job) {
  std::vector<std::string> argv = {
      role == "ps" ? "server/pstrain_ps" : "worker/pstrain_worker",
      "--coordinator=" + coordinator.address(),
      "--job=" + job,
      "--advertise=127.0.0.1",
      "--heartbeat_interval_s=0.5",
      "--task_index=" + std::to_string(index)};
  if (role == "ps") argv.push_back("--bind=127.0.0.1");
  return std::make_unique<Process>(
      argv, TempDir() + "/" + job + role + std::to_string(index) + ".log",
      std::vector<std::string>{"OMP_NUM_THREADS=1"});
}

std::shared_ptr<grpc::Channel> ChannelTo(
    const std::string& address, const TlsIdentity& server,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  SetPeerServerName(server, &args);
  return grpc::CreateCustomChannel(address, credentials, args);
}

std::shared_ptr<grpc::ChannelCredentials> As(const std::string& dir,
                                             const TlsIdentity& id) {
  TlsOptions o;
  o.dir = dir;
  auto c = ChannelCredentials(o, id);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

void Deadline(grpc::ClientContext* c) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
}

// The admin's view of a job (the test's own certificate).
JobInfo Get(Coordinator::Stub* admin, const std::string& job) {
  grpc::ClientContext c;
  Deadline(&c);
  JobRequest r;
  r.set_job_id(job);
  JobInfo info;
  EXPECT_TRUE(admin->GetJob(&c, r, &info).ok());
  return info;
}

TEST(OutsiderTest, EveryTryIsRefusedAndTheJobEndsAsIfUntouched) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
  CoordinatorProcess coordinator(TempDir() + "/jobs.pb", 30);
  ASSERT_TRUE(coordinator.up());
  const std::string tls = std::getenv("PSTRAIN_TLS_DIR");
  const std::string foreign = TempDir() + "/foreign-ca";
  ASSERT_TRUE(MakeCertificates(foreign, {TlsIdentity{TlsRole::kAdmin},
                                         TlsIdentity{TlsRole::kWorker, 0}})
                  .ok());
  auto admin = Coordinator::NewStub(
      ChannelTo(coordinator.address(), TlsIdentity{TlsRole::kCoordinator},
                As(tls, TlsIdentity{TlsRole::kAdmin})));

  const std::string spec = TempDir() + "/job.pbtxt";
  WriteTextFile(spec,
                "model: \"lenet5\" num_ps: 1 num_workers: 2 batch_size: 64 "
                "epochs: 1 max_steps_per_epoch: 300 log_every_steps: 100\n");
  // The job nobody touches, then the same job under attack.
  double untouched_accuracy = -1;
  for (const std::string job : {"job-1", "job-2"}) {
    auto r = RunCommand("tools/pstrain submit " + spec + coordinator.flag());
    ASSERT_EQ(r.output, job + "\n") << r.output;
    std::vector<std::unique_ptr<Process>> tasks;
    tasks.push_back(StartTask("ps", 0, coordinator, job));
    tasks.push_back(StartTask("worker", 0, coordinator, job));
    tasks.push_back(StartTask("worker", 1, coordinator, job));
    if (job == "job-2") {
      // Training: worker 1 reports steps.
      bool training = false;
      for (int i = 0; i < 600 && !training; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const JobInfo info = Get(admin.get(), job);
        training = info.state() == JOB_RUNNING && info.tasks(2).steps() > 0;
      }
      ASSERT_TRUE(training);
      const std::string ps_address = Get(admin.get(), job).tasks(0).address();

      struct Attacker {
        std::string name;
        std::shared_ptr<grpc::ChannelCredentials> credentials;
        bool of_this_ca;
      };
      const std::vector<Attacker> attackers = {
          {"plaintext", grpc::InsecureChannelCredentials(), false},
          {"another CA's admin", As(foreign, TlsIdentity{TlsRole::kAdmin}),
           false},
          {"another CA's worker 0",
           As(foreign, TlsIdentity{TlsRole::kWorker, 0}), false},
          {"this job's worker 1 (another role's keys)",
           As(tls, TlsIdentity{TlsRole::kWorker, 1}), true},
          {"this job's ps 0 (another role's keys)",
           As(tls, TlsIdentity{TlsRole::kPs, 0}), true},
      };
      auto worker0 = [&](RequestHeader* h) {
        h->set_job_id(job);
        h->set_worker_id(0);
      };
      auto as_worker0 = [&](TaskRef* t) {
        t->set_job_id(job);
        t->set_role(ROLE_WORKER);
        t->set_index(0);
      };
      using Try = std::function<grpc::Status(Coordinator::Stub*,
                                             ParameterServer::Stub*)>;
      const std::vector<std::pair<std::string, Try>> tries = {
          {"cancel the job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             JobRequest r;
             r.set_job_id(job);
             CancelResponse out;
             return c->Cancel(&ctx, r, &out);
           }},
          {"report worker 0 finished with accuracy 0.99",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             TaskFinishedRequest r;
             as_worker0(r.mutable_task());
             r.set_ok(true);
             r.mutable_result()->set_test_accuracy(0.99);
             TaskFinishedResponse out;
             return c->TaskFinished(&ctx, r, &out);
           }},
          {"write into the job's log",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             HeartbeatRequest r;
             as_worker0(r.mutable_task());
             r.add_log_lines("ATTACKER WAS HERE");
             HeartbeatResponse out;
             return c->Heartbeat(&ctx, r, &out);
           }},
          {"take the PS slot",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             RegisterRequest r;
             r.mutable_task()->set_job_id(job);
             r.mutable_task()->set_role(ROLE_PS);
             r.mutable_task()->set_index(0);
             r.set_address("10.66.6.6:6666");
             RegisterResponse out;
             return c->Register(&ctx, r, &out);
           }},
          {"submit a job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             SubmitRequest r;
             r.mutable_spec()->set_model("lenet5");
             r.mutable_spec()->set_num_ps(1);
             r.mutable_spec()->set_num_workers(1);
             r.mutable_spec()->set_batch_size(64);
             r.mutable_spec()->set_epochs(1);
             SubmitResponse out;
             return c->Submit(&ctx, r, &out);
           }},
          {"tell the shard worker 0 is done",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             WorkerDoneRequest r;
             worker0(r.mutable_header());
             WorkerDoneResponse out;
             return ps->WorkerDone(&ctx, r, &out);
           }},
          {"pull the model",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             auto stream = ps->PushPull(&ctx);
             PushPullRequest r;
             worker0(r.mutable_header());
             r.mutable_pull()->set_min_version(0);
             stream->Write(r);
             stream->WritesDone();
             PushPullResponse out;
             int chunks = 0;
             while (stream->Read(&out)) chunks += out.has_chunk() ? 1 : 0;
             EXPECT_EQ(chunks, 0) << "the model leaked";
             return stream->Finish();
           }},
          {"push a gradient",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             auto stream = ps->PushPull(&ctx);
             PushPullRequest r;
             worker0(r.mutable_header());
             TensorChunk* chunk = r.mutable_push();
             chunk->mutable_key()->set_param_id(0);
             chunk->set_dtype(DTYPE_FLOAT32);
             chunk->set_num_elements(1);
             chunk->set_data(std::string(4, '\x7f'));
             stream->Write(r);
             stream->WritesDone();
             PushPullResponse out;
             while (stream->Read(&out)) {
             }
             return stream->Finish();
           }},
          {"initialise the shard again",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             InitResponse out;
             auto writer = ps->Init(&ctx, &out);
             InitRequest r;
             worker0(r.mutable_header());
             r.set_generation(99);
             r.mutable_layout()->add_param_num_elements(1);
             writer->Write(r);
             writer->WritesDone();
             return writer->Finish();
           }},
      };
      int refused = 0;
      for (const Attacker& a : attackers) {
        auto c = Coordinator::NewStub(
            ChannelTo(coordinator.address(), TlsIdentity{TlsRole::kCoordinator},
                      a.credentials));
        auto ps = ParameterServer::NewStub(
            ChannelTo(ps_address, TlsIdentity{TlsRole::kPs, 0}, a.credentials));
        for (const auto& [what, attempt] : tries) {
          const grpc::Status s = attempt(c.get(), ps.get());
          const std::string where =
              absl::StrCat(a.name, " tried to ", what, ": ", s.error_code(),
                           " ", s.error_message());
          EXPECT_FALSE(s.ok()) << where;
          if (a.of_this_ca) {
            // Shard 0's own keys may register shard 0, and the table
            // refuses a second address for it.
            const bool own_slot = what == "take the PS slot" &&
                                  a.name.find("ps 0") != std::string::npos;
            EXPECT_EQ(s.error_code(), own_slot
                                          ? grpc::StatusCode::ALREADY_EXISTS
                                          : grpc::StatusCode::PERMISSION_DENIED)
                << where;
          } else {
            EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
                << where;
          }
          ++refused;
        }
      }
      EXPECT_EQ(refused, static_cast<int>(attackers.size() * tries.size()));
      std::printf("%d tries refused\n", refused);
      EXPECT_EQ(Get(admin.get(), job).state(), JOB_RUNNING);
    }
    r = RunCommand("tools/pstrain wait " + job + " --wait_poll_ms=200" +
                   coordinator.flag());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const JobInfo done = Get(admin.get(), job);
    EXPECT_EQ(done.state(), JOB_SUCCEEDED) << done.message();
    for (const LogLine& line : done.log()) {
      EXPECT_EQ(line.text().find("ATTACKER"), std::string::npos);
    }
    if (job == "job-1") {
      untouched_accuracy = done.result().test_accuracy();
      ASSERT_GT(untouched_accuracy, 0.5);
    } else {
      EXPECT_EQ(done.result().test_accuracy(), untouched_accuracy);
    }
    for (auto& t : tasks) EXPECT_EQ(t->Wait(30), 0);
  }
  // The attackers' job was never submitted.
  EXPECT_EQ(
      RunCommand("tools/pstrain status job-3" + coordinator.flag()).exit_code !=
          0,
      true);
}

}  // namespace
}  // namespace pstrain
