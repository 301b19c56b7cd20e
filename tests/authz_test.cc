// Every method of every pstrain gRPC service, called over real mutual TLS
// by every kind of caller: the right identity is served, a certificate of
// the wrong role, task or job gets PERMISSION_DENIED, and a caller without
// a certificate of the cluster's CA (none at all, another CA's, plaintext)
// is refused at the handshake. The lists of methods come from the service
// descriptors, so a new RPC fails this test until it has a rule
// (common/authz.cc) and a case here.
#include "common/authz.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/tls.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_table.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "tests/cli_test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

const TlsIdentity kAdmin{TlsRole::kAdmin};
const TlsIdentity kCoordinatorId{TlsRole::kCoordinator};
const TlsIdentity kPs0{TlsRole::kPs, 0, "job-1"};
const TlsIdentity kWorker0{TlsRole::kWorker, 0, "job-1"};
const TlsIdentity kWorker1{TlsRole::kWorker, 1, "job-1"};
const TlsIdentity kOtherJobWorker1{TlsRole::kWorker, 1, "job-2"};

// A caller: its credentials, or none.
struct Client {
  std::string name;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  bool of_this_cluster = true;  // holds a certificate of the cluster's CA
};

class AuthzTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = testing::TempDir() + "/authz";
    fs::remove_all(root);
    cluster_ = root + "/cluster";
    ASSERT_TRUE(MakeCertificates(cluster_, {kCoordinatorId, kAdmin, kPs0,
                                            kWorker0, kWorker1})
                    .ok());
    // Another job's worker, signed by the same CA.
    other_job_ = root + "/other-job";
    fs::create_directories(other_job_);
    for (const char* f : {"ca.pem", "ca.key"}) {
      fs::copy_file(cluster_ + "/" + f, other_job_ + "/" + f);
    }
    ASSERT_TRUE(MakeCertificates(other_job_, {kOtherJobWorker1}).ok());
    // An administrator of another cluster (another CA).
    foreign_ = root + "/foreign";
    ASSERT_TRUE(MakeCertificates(foreign_, {kAdmin, kWorker1}).ok());
  }

  void SetUp() override {
    TlsOptions tls;
    tls.dir = cluster_;
    JobSpec spec;
    spec.set_num_ps(1);
    spec.set_num_workers(2);
    spec.set_max_restarts(3);
    ASSERT_EQ(*table_.Submit(spec, absl::Now()), "job-1");
    coordinator_ = std::make_unique<CoordinatorService>(
        &table_, absl::Seconds(5), /*authorize=*/true);
    auto coordinator_credentials = ServerCredentials(tls, kCoordinatorId);
    ASSERT_TRUE(coordinator_credentials.ok());
    auto coordinator = StartGrpcServer("127.0.0.1:0", coordinator_.get(), "",
                                       *coordinator_credentials);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_server_ = std::move(coordinator->server);
    coordinator_address_ = absl::StrCat("127.0.0.1:", coordinator->port);

    ShardOptions options;
    options.job_id = "job-1";
    options.num_workers = 2;
    shard_ = std::make_unique<ParameterShard>(options);
    ps_ = std::make_unique<PsService>(shard_.get(), absl::Seconds(5),
                                      /*authorize=*/true);
    auto ps_credentials = ServerCredentials(tls, kPs0);
    ASSERT_TRUE(ps_credentials.ok());
    auto ps = StartGrpcServer("127.0.0.1:0", ps_.get(), "", *ps_credentials);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_server_ = std::move(ps->server);
    ps_address_ = absl::StrCat("127.0.0.1:", ps->port);

    auto with = [](const std::string& dir, const TlsIdentity& id) {
      TlsOptions o;
      o.dir = dir;
      auto c = ChannelCredentials(o, id);
      EXPECT_TRUE(c.ok()) << c.status();
      return *c;
    };
    clients_ = {
        {"admin", with(cluster_, kAdmin)},
        // A server's key (serverAuth only) cannot act as a client at all.
        {"coordinator", with(cluster_, kCoordinatorId), false},
        {"ps:0@job-1", with(cluster_, kPs0)},
        {"worker:0@job-1", with(cluster_, kWorker0)},
        {"worker:1@job-1", with(cluster_, kWorker1)},
        {"worker:1@job-2", with(other_job_, kOtherJobWorker1)},
        {"another CA's admin", with(foreign_, kAdmin), false},
        {"another CA's worker:1@job-1", with(foreign_, kWorker1), false},
        {"TLS without a certificate",
         [this] {
           grpc::SslCredentialsOptions o;
           o.pem_root_certs = testing::ReadTextFile(cluster_ + "/ca.pem");
           return grpc::SslCredentials(o);
         }(),
         false},
        {"plaintext", grpc::InsecureChannelCredentials(), false},
    };
  }

  void TearDown() override {
    coordinator_server_->Shutdown();
    ps_server_->Shutdown();
  }

  // A channel of `client` to the coordinator or the shard, expecting the
  // server to prove its name.
  std::shared_ptr<grpc::Channel> Channel(const Client& client,
                                         bool to_shard) const {
    grpc::ChannelArguments args;
    SetPeerServerName(to_shard ? kPs0 : kCoordinatorId, &args);
    return grpc::CreateCustomChannel(
        to_shard ? ps_address_ : coordinator_address_, client.credentials,
        args);
  }

  static void Deadline(grpc::ClientContext* c, int ms = 2000) {
    c->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(ms));
  }

  static inline std::string cluster_, other_job_, foreign_;
  JobTable table_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<grpc::Server> coordinator_server_;
  std::string coordinator_address_;
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<PsService> ps_;
  std::unique_ptr<grpc::Server> ps_server_;
  std::string ps_address_;
  std::vector<Client> clients_;
};

// One call of a method: the request is about job-1; calls that name a task
// name worker 1 of job-1 (worker 0 for worker-0-only methods).
struct Case {
  std::set<std::string> allowed;
  std::function<grpc::Status(grpc::Channel*)> call;
};

TEST_F(AuthzTest, EveryMethodServesItsCallersAndRefusesEveryoneElse) {
  const std::set<std::string> tasks = {"ps:0@job-1", "worker:0@job-1",
                                       "worker:1@job-1"};
  std::map<std::string, Case> cases;
  auto coordinator = [](grpc::Channel* ch) {
    return Coordinator::NewStub(
        std::shared_ptr<grpc::Channel>(ch, [](grpc::Channel*) {}));
  };
  auto shard = [](grpc::Channel* ch) {
    return ParameterServer::NewStub(
        std::shared_ptr<grpc::Channel>(ch, [](grpc::Channel*) {}));
  };
  auto task_ref = [](TaskRef* t) {
    t->set_job_id("job-1");
    t->set_role(ROLE_WORKER);
    t->set_index(1);
  };
  cases["/pstrain.Coordinator/Submit"] = {
      {"admin"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        SubmitRequest r;
        r.mutable_spec()->set_model("lenet5");
        SubmitResponse out;
        return coordinator(ch)->Submit(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/GetJob"] = {
      {"admin", "ps:0@job-1", "worker:0@job-1", "worker:1@job-1"},
      [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        JobRequest r;
        r.set_job_id("job-1");
        JobInfo out;
        return coordinator(ch)->GetJob(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/ListJobs"] = {{"admin"}, [&](grpc::Channel* ch) {
                                              grpc::ClientContext c;
                                              Deadline(&c);
                                              ListJobsResponse out;
                                              return coordinator(ch)->ListJobs(
                                                  &c, ListJobsRequest(), &out);
                                            }};
  cases["/pstrain.Coordinator/Cancel"] = {
      {"admin"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        JobRequest r;
        r.set_job_id("job-9");  // none: the admin is served NOT_FOUND
        CancelResponse out;
        return coordinator(ch)->Cancel(&c, r, &out);
      }};
  // Issue 40: only the administrator scales a job, its workers or its
  // shards (a worker or shard key is PERMISSION_DENIED).
  cases["/pstrain.Coordinator/Scale"] = {
      {"admin"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        ScaleRequest r;
        r.set_job_id("job-9");  // none: the admin is served NOT_FOUND
        r.set_num_workers(2);
        r.set_num_ps(2);
        ScaleResponse out;
        return coordinator(ch)->Scale(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/Register"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        RegisterRequest r;
        task_ref(r.mutable_task());
        r.set_address("127.0.0.1:1");
        RegisterResponse out;
        return coordinator(ch)->Register(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/WaitForLayout"] = {
      tasks, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c, 500);
        JobRequest r;
        r.set_job_id("job-1");
        ClusterLayout out;
        return coordinator(ch)->WaitForLayout(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/Heartbeat"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        HeartbeatRequest r;
        task_ref(r.mutable_task());
        r.add_log_lines("a heartbeat's line");
        HeartbeatResponse out;
        return coordinator(ch)->Heartbeat(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/TaskFinished"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        TaskFinishedRequest r;
        task_ref(r.mutable_task());
        r.set_ok(true);
        TaskFinishedResponse out;
        return coordinator(ch)->TaskFinished(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/RestartTask"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        RestartTaskRequest r;
        task_ref(r.mutable_task());
        r.set_why("died (signal 9)");
        RestartTaskResponse out;
        return coordinator(ch)->RestartTask(&c, r, &out);
      }};
  // A worker sets only its own keys (KvKeyOwner): worker 0's here.
  cases["/pstrain.Coordinator/KvSet"] = {
      {"worker:0@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        KvSetRequest r;
        r.set_job_id("job-1");
        r.set_key("worker-0/k");
        r.set_value("v");
        KvSetResponse out;
        return coordinator(ch)->KvSet(&c, r, &out);
      }};
  cases["/pstrain.Coordinator/KvWait"] = {
      {"worker:0@job-1", "worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c, 500);
        KvWaitRequest r;
        r.set_job_id("job-1");
        r.set_key("k");
        KvWaitResponse out;
        return coordinator(ch)->KvWait(&c, r, &out);
      }};
  auto header = [](RequestHeader* h, int worker) {
    h->set_job_id("job-1");
    h->set_worker_id(worker);
  };
  cases["/pstrain.ParameterServer/Init"] = {
      {"worker:0@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        InitResponse out;
        auto writer = shard(ch)->Init(&c, &out);
        InitRequest r;
        header(r.mutable_header(), 0);
        writer->Write(r);  // no layout: the served caller gets its error
        writer->WritesDone();
        return writer->Finish();
      }};
  cases["/pstrain.ParameterServer/WaitReady"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c, 500);
        WaitReadyRequest r;
        header(r.mutable_header(), 1);
        WaitReadyResponse out;
        return shard(ch)->WaitReady(&c, r, &out);
      }};
  cases["/pstrain.ParameterServer/PushPull"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        auto stream = shard(ch)->PushPull(&c);
        PushPullRequest r;
        header(r.mutable_header(), 1);
        r.mutable_pull()->set_min_version(0);
        stream->Write(r);
        stream->WritesDone();
        PushPullResponse out;
        while (stream->Read(&out)) {
        }
        return stream->Finish();
      }};
  cases["/pstrain.ParameterServer/Stats"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        StatsRequest r;
        header(r.mutable_header(), 1);
        StatsResponse out;
        return shard(ch)->Stats(&c, r, &out);
      }};
  cases["/pstrain.ParameterServer/Checkpoint"] = {
      {"worker:0@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        CheckpointRequest r;
        header(r.mutable_header(), 0);
        CheckpointResponse out;
        return shard(ch)->Checkpoint(&c, r, &out);
      }};
  cases["/pstrain.ParameterServer/Export"] = {
      {"worker:0@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        ExportRequest r;
        header(r.mutable_header(), 0);
        r.set_generation(1);
        auto reader = shard(ch)->Export(&c, r);
        ExportResponse out;
        while (reader->Read(&out)) {
        }
        // Served: the shard holds no state to export (FAILED_PRECONDITION).
        return reader->Finish();
      }};
  cases["/pstrain.ParameterServer/WorkerDone"] = {
      {"worker:1@job-1"}, [&](grpc::Channel* ch) {
        grpc::ClientContext c;
        Deadline(&c);
        WorkerDoneRequest r;
        header(r.mutable_header(), 1);
        WorkerDoneResponse out;
        return shard(ch)->WorkerDone(&c, r, &out);
      }};

  // Every method of every service has a rule and a case.
  std::set<std::string> ruled;
  for (const MethodRule& r : AuthorizationTable()) ruled.insert(r.method);
  int methods = 0;
  for (const char* name : {"pstrain.Coordinator", "pstrain.ParameterServer"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            name);
    ASSERT_NE(service, nullptr) << name;
    for (int m = 0; m < service->method_count(); ++m) {
      const std::string method =
          absl::StrCat("/", name, "/", service->method(m)->name());
      EXPECT_TRUE(ruled.count(method)) << method << " has no rule";
      EXPECT_TRUE(cases.count(method)) << method << " has no case here";
      ++methods;
    }
  }
  EXPECT_EQ(methods, 19);
  EXPECT_EQ(cases.size(), 19u);

  int served = 0, denied = 0, refused = 0;
  for (const auto& [method, c] : cases) {
    const bool to_shard = method.rfind("/pstrain.ParameterServer/", 0) == 0;
    for (const Client& client : clients_) {
      std::shared_ptr<grpc::Channel> channel = Channel(client, to_shard);
      const grpc::Status s = c.call(channel.get());
      const std::string where =
          absl::StrCat(method, " by ", client.name, ": ", s.error_code(), " ",
                       s.error_message());
      if (!client.of_this_cluster) {
        // The handshake fails: no call reaches a handler.
        EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
            << where;
        ++refused;
      } else if (c.allowed.count(client.name)) {
        EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
        EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << where;
        EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE) << where;
        ++served;
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
        EXPECT_NE(s.error_message().find(" may not call " + method),
                  std::string::npos)
            << where;
        ++denied;
      }
    }
  }
  std::printf("%d calls served, %d denied, %d refused at the handshake\n",
              served, denied, refused);
  // Nothing a refused or denied caller sent changed any state: still one
  // job (the admin's submit, of an incomplete spec, was served and refused
  // by validation), the log holds the served heartbeat's line and the
  // served restart's only, and the shard took no push and no init.
  EXPECT_EQ(table_.List().size(), 1u);
  auto job = table_.Get("job-1");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->log_size(), 2);
  EXPECT_FALSE(shard_->initialized());
  EXPECT_EQ(shard_->Stats().pushes, 0);
}

// The shard's streams whose messages can be large (PushPull's pushes,
// Init's layout) check the caller before reading a message: bytes that are
// no message at all get PERMISSION_DENIED from every caller that may not
// call the method, so such a caller costs the shard no parsing; a caller
// that may is told the message is malformed.
TEST_F(AuthzTest, ShardStreamsCheckTheCallerBeforeReadingAMessage) {
  // Field 1 (the header), length-delimited, 2^28 bytes long, then nothing.
  const std::string garbage("\x0a\x80\x80\x80\x80\x01", 6);
  for (const auto& [method, allowed] :
       std::vector<std::pair<std::string, std::set<std::string>>>{
           {"/pstrain.ParameterServer/PushPull",
            {"worker:0@job-1", "worker:1@job-1"}},
           {"/pstrain.ParameterServer/Init", {"worker:0@job-1"}}}) {
    for (const Client& client : clients_) {
      if (!client.of_this_cluster) continue;
      std::shared_ptr<grpc::Channel> channel = Channel(client, true);
      grpc::ClientContext context;
      Deadline(&context);
      const grpc::internal::RpcMethod rpc(
          method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING);
      std::unique_ptr<
          grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
          stream(grpc::internal::ClientReaderWriterFactory<
                 grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), rpc,
                                                             &context));
      const grpc::Slice slice(garbage);
      stream->Write(grpc::ByteBuffer(&slice, 1));
      stream->WritesDone();
      grpc::ByteBuffer reply;
      while (stream->Read(&reply)) {
      }
      const grpc::Status s = stream->Finish();
      const std::string where =
          absl::StrCat(method, " by ", client.name, ": ", s.error_code(), " ",
                       s.error_message());
      if (allowed.count(client.name)) {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << where;
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
        EXPECT_NE(s.error_message().find(" may not call " + method),
                  std::string::npos)
            << where;
      }
    }
  }
  EXPECT_FALSE(shard_->initialized());
  EXPECT_EQ(shard_->Stats().pushes, 0);
}

}  // namespace
}  // namespace pstrain
