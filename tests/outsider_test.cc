// The outsider's list of issues 21 and 35, tried against a live job on a
// pstrain_coordinator with its tasks (all over mutual TLS, through
// PSTRAIN_TLS_DIR): every RPC of both services (checked against the
// service descriptors, so a new RPC needs a try here) is called against the
// running job as worker 0 or the administrator would call it, by clients
// without the job's keys (plaintext, TLS without a certificate, another
// CA's certificates), with another job's worker and shard keys, and with
// another role's keys of the same job. Every call that must be refused is
// refused, and nothing changed: the job finishes SUCCEEDED with the
// accuracy of the same job run untouched, its log free of the attackers'
// lines, no task restarted, the key-value store and the job list as they
// were, no checkpoint file written.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
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
    auto r = RunCommand("cli/pstrain submit " + spec + coordinator.flag());
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

      // Keys of job-1 (the job before), from the same CA: another job's.
      const std::string other_job = TempDir() + "/other-job-keys";
      std::filesystem::create_directories(other_job);
      for (const char* f : {"ca.pem", "ca.key"}) {
        std::filesystem::copy_file(
            tls + "/" + f, other_job + "/" + f,
            std::filesystem::copy_options::overwrite_existing);
      }
      ASSERT_TRUE(MakeCertificates(other_job,
                                   {TlsIdentity{TlsRole::kWorker, 0, "job-1"},
                                    TlsIdentity{TlsRole::kPs, 0, "job-1"}})
                      .ok());
      struct Attacker {
        std::string name;
        std::shared_ptr<grpc::ChannelCredentials> credentials;
        bool of_this_ca;
      };
      grpc::SslCredentialsOptions no_certificate;
      no_certificate.pem_root_certs = testing::ReadTextFile(tls + "/ca.pem");
      const std::vector<Attacker> attackers = {
          {"plaintext", grpc::InsecureChannelCredentials(), false},
          {"TLS without a certificate", grpc::SslCredentials(no_certificate),
           false},
          {"another CA's admin", As(foreign, TlsIdentity{TlsRole::kAdmin}),
           false},
          {"another CA's worker 0",
           As(foreign, TlsIdentity{TlsRole::kWorker, 0}), false},
          {"job-1's worker 0 (another job's worker key)",
           As(other_job, TlsIdentity{TlsRole::kWorker, 0, "job-1"}), true},
          {"job-1's ps 0 (another job's shard key)",
           As(other_job, TlsIdentity{TlsRole::kPs, 0, "job-1"}), true},
          {"this job's worker 1 (another role's keys)",
           As(tls, TlsIdentity{TlsRole::kWorker, 1}), true},
          {"this job's ps 0 (another role's keys)",
           As(tls, TlsIdentity{TlsRole::kPs, 0}), true},
      };
      const std::string worker1 = "this job's worker 1 (another role's keys)";
      const std::string ps0 = "this job's ps 0 (another role's keys)";
      auto worker0 = [&](RequestHeader* h) {
        h->set_job_id(job);
        h->set_worker_id(0);
      };
      auto as_worker0 = [&](TaskRef* t) {
        t->set_job_id(job);
        t->set_role(ROLE_WORKER);
        t->set_index(0);
      };
      using Call = std::function<grpc::Status(Coordinator::Stub*,
                                              ParameterServer::Stub*)>;
      // A try: the method, what it would do, the call, and the attackers
      // the table serves it to (their own read of their own job), with the
      // code they get; everyone else of this CA gets PERMISSION_DENIED.
      struct Try {
        std::string method;
        std::string what;
        Call call;
        std::map<std::string, grpc::StatusCode> served = {};
      };
      const std::string checkpoint_dir = TempDir() + "/attacker-checkpoints";
      const std::vector<Try> tries = {
          {"Cancel", "cancel the job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             JobRequest r;
             r.set_job_id(job);
             CancelResponse out;
             return c->Cancel(&ctx, r, &out);
           }},
          {"Scale", "scale the job to one worker",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             ScaleRequest r;
             r.set_job_id(job);
             r.set_num_workers(1);
             ScaleResponse out;
             return c->Scale(&ctx, r, &out);
           }},
          {"TaskFinished", "report worker 0 finished with accuracy 0.99",
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
          {"Heartbeat", "write into the job's log",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             HeartbeatRequest r;
             as_worker0(r.mutable_task());
             r.add_log_lines("ATTACKER WAS HERE");
             HeartbeatResponse out;
             return c->Heartbeat(&ctx, r, &out);
           }},
          {"RestartTask", "restart worker 0",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             RestartTaskRequest r;
             as_worker0(r.mutable_task());
             r.set_why("ATTACKER restarts it");
             RestartTaskResponse out;
             return c->RestartTask(&ctx, r, &out);
           }},
          {"Register",
           "take the PS slot",
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
           },
           // Shard 0's own keys may register shard 0; the table refuses a
           // second address for it.
           {{ps0, grpc::StatusCode::ALREADY_EXISTS}}},
          {"Submit", "submit a job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             SubmitRequest r;
             r.mutable_spec()->set_model("lenet5");
             r.mutable_spec()->set_num_ps(1);
             r.mutable_spec()->set_num_workers(1);
             r.mutable_spec()->set_batch_size(64);
             r.mutable_spec()->set_epochs(1);
             r.mutable_spec()->set_checkpoint_dir(checkpoint_dir);
             SubmitResponse out;
             return c->Submit(&ctx, r, &out);
           }},
          {"ListJobs", "list every job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             ListJobsResponse out;
             return c->ListJobs(&ctx, ListJobsRequest(), &out);
           }},
          {"GetJob",
           "read the job",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             JobRequest r;
             r.set_job_id(job);
             JobInfo out;
             return c->GetJob(&ctx, r, &out);
           },
           {{worker1, grpc::StatusCode::OK}, {ps0, grpc::StatusCode::OK}}},
          {"WaitForLayout",
           "read the cluster's addresses",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             JobRequest r;
             r.set_job_id(job);
             ClusterLayout out;
             return c->WaitForLayout(&ctx, r, &out);
           },
           {{worker1, grpc::StatusCode::OK}, {ps0, grpc::StatusCode::OK}}},
          {"KvSet", "set worker 0's rendezvous key",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             KvSetRequest r;
             r.set_job_id(job);
             r.set_key("worker-0/address");
             r.set_value("ATTACKER");
             KvSetResponse out;
             return c->KvSet(&ctx, r, &out);
           }},
          {"KvWait",
           "read a rendezvous key",
           [&](Coordinator::Stub* c, ParameterServer::Stub*) {
             grpc::ClientContext ctx;
             ctx.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::milliseconds(300));
             KvWaitRequest r;
             r.set_job_id(job);
             r.set_key("worker-0/address");
             KvWaitResponse out;
             return c->KvWait(&ctx, r, &out);
           },
           // A worker of the job may wait for any key of it: the key was
           // never set, so its wait ends at its deadline.
           {{worker1, grpc::StatusCode::DEADLINE_EXCEEDED}}},
          {"WorkerDone", "tell the shard worker 0 is done",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             WorkerDoneRequest r;
             worker0(r.mutable_header());
             WorkerDoneResponse out;
             return ps->WorkerDone(&ctx, r, &out);
           }},
          {"PushPull", "pull the model",
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
          {"PushPull", "push a gradient",
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
          {"Init", "initialise the shard again",
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
          {"WaitReady", "learn the shard's layout",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             WaitReadyRequest r;
             worker0(r.mutable_header());
             WaitReadyResponse out;
             return ps->WaitReady(&ctx, r, &out);
           }},
          {"Stats", "read the shard's counters",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             StatsRequest r;
             worker0(r.mutable_header());
             StatsResponse out;
             return ps->Stats(&ctx, r, &out);
           }},
          {"Export", "read the shard's whole state and close it",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             ExportRequest r;
             worker0(r.mutable_header());
             r.set_generation(99);
             auto reader = ps->Export(&ctx, r);
             ExportResponse out;
             while (reader->Read(&out)) {
             }
             return reader->Finish();
           }},
          {"Checkpoint", "make the shard write a checkpoint",
           [&](Coordinator::Stub*, ParameterServer::Stub* ps) {
             grpc::ClientContext ctx;
             Deadline(&ctx);
             CheckpointRequest r;
             worker0(r.mutable_header());
             r.set_step(1);
             CheckpointResponse out;
             return ps->Checkpoint(&ctx, r, &out);
           }},
      };
      // Every method of both services is tried.
      std::set<std::string> tried;
      for (const Try& t : tries) tried.insert(t.method);
      for (const char* name :
           {"pstrain.Coordinator", "pstrain.ParameterServer"}) {
        const google::protobuf::ServiceDescriptor* service =
            google::protobuf::DescriptorPool::generated_pool()
                ->FindServiceByName(name);
        ASSERT_NE(service, nullptr) << name;
        for (int m = 0; m < service->method_count(); ++m) {
          EXPECT_TRUE(tried.count(service->method(m)->name()))
              << name << "/" << service->method(m)->name() << " has no try";
        }
      }

      int refused = 0, served = 0;
      for (const Attacker& a : attackers) {
        auto c = Coordinator::NewStub(
            ChannelTo(coordinator.address(), TlsIdentity{TlsRole::kCoordinator},
                      a.credentials));
        auto ps = ParameterServer::NewStub(ChannelTo(
            ps_address, TlsIdentity{TlsRole::kPs, 0, job}, a.credentials));
        for (const Try& t : tries) {
          const grpc::Status s = t.call(c.get(), ps.get());
          const std::string where =
              absl::StrCat(a.name, " tried to ", t.what, " (", t.method,
                           "): ", s.error_code(), " ", s.error_message());
          if (!a.of_this_ca) {
            // The handshake fails: no call reaches a handler.
            EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
                << where;
            ++refused;
          } else if (auto it = t.served.find(a.name); it != t.served.end()) {
            EXPECT_EQ(s.error_code(), it->second) << where;
            ++served;
          } else {
            EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
                << where;
            ++refused;
          }
        }
      }
      std::printf("%d tries refused, %d served reads of the caller's own job\n",
                  refused, served);
      EXPECT_EQ(served, 6);
      const JobInfo after = Get(admin.get(), job);
      EXPECT_EQ(after.state(), JOB_RUNNING);
      for (const TaskInfo& t : after.tasks()) EXPECT_EQ(t.restarts(), 0);
      EXPECT_FALSE(std::filesystem::exists(checkpoint_dir));
      {
        // worker-0/address was never set by anyone.
        auto w0 = Coordinator::NewStub(
            ChannelTo(coordinator.address(), TlsIdentity{TlsRole::kCoordinator},
                      As(tls, TlsIdentity{TlsRole::kWorker, 0})));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(300));
        KvWaitRequest r;
        r.set_job_id(job);
        r.set_key("worker-0/address");
        KvWaitResponse out;
        EXPECT_EQ(w0->KvWait(&ctx, r, &out).error_code(),
                  grpc::StatusCode::DEADLINE_EXCEEDED);
        grpc::ClientContext list_ctx;
        Deadline(&list_ctx);
        ListJobsResponse jobs;
        ASSERT_TRUE(admin->ListJobs(&list_ctx, ListJobsRequest(), &jobs).ok());
        EXPECT_EQ(jobs.jobs_size(), 2);
      }
    }
    r = RunCommand("cli/pstrain wait " + job + " --wait_poll_ms=200" +
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
      RunCommand("cli/pstrain status job-3" + coordinator.flag()).exit_code !=
          0,
      true);
}

}  // namespace
}  // namespace pstrain
