// CoordinatorServer: the line it prints once a minute while a job's tasks
// have not all registered (WaitingReport); its bounds over real gRPC (the
// key-value store's limits, the message size, the thread cap), after which
// it keeps serving; its long polls, which end when their caller cancels
// them or the server stops.
#include "coordinator/coordinator_server.h"

#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tls.h"
#include "coordinator/job_spec.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"

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

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A plaintext coordinator on 127.0.0.1 with one job, and a client.
class BoundedCoordinatorTest : public ::testing::Test {
 protected:
  void Start(CoordinatorServerOptions options = {}) {
    options.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    JobSpec spec;
    spec.set_num_ps(1);
    spec.set_num_workers(1);
    job_ = *server_->table().Submit(spec, absl::Now());
    stub_ = Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                            grpc::InsecureChannelCredentials()));
  }
  grpc::Status Set(const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    KvSetRequest request;
    request.set_job_id(job_);
    request.set_key(key);
    request.set_value(value);
    KvSetResponse response;
    return stub_->KvSet(&context, request, &response);
  }
  grpc::Status Wait(const std::string& key, absl::Duration timeout) {
    grpc::ClientContext context;
    context.set_deadline(In(timeout));
    KvWaitRequest request;
    request.set_job_id(job_);
    request.set_key(key);
    KvWaitResponse response;
    return stub_->KvWait(&context, request, &response);
  }
  // Polls a key that is set until the caller's long polls in flight are
  // at its cap (RESOURCE_EXHAUSTED), for up to 10 s; false if never.
  bool PollsInFlightReachTheCap() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (absl::Now() < give_up) {
      const grpc::Status status = Wait("set", absl::Seconds(5));
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        return true;
      }
      EXPECT_TRUE(status.ok()) << status.error_message();
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  // The coordinator still answers.
  void ExpectServing() {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    JobRequest request;
    request.set_job_id(job_);
    JobInfo job;
    const grpc::Status status = stub_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(job.id(), job_);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string job_;
  std::unique_ptr<Coordinator::Stub> stub_;
};

TEST_F(BoundedCoordinatorTest, KeyValueLimitsAreResourceExhausted) {
  CoordinatorServerOptions options;
  options.table_limits.max_kv_keys_per_job = 8;
  Start(options);
  EXPECT_EQ(Set("", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status status = Set(std::string(257, 'k'), "v");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "kv: a key of 257 bytes; the limit is 256 bytes");
  status = Set("k", std::string((64 << 10) + 1, 'v'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(Set(absl::StrCat("k", i), "v").ok()) << i;
  }
  status = Set("k8", "v");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            job_ +
                ": kv: the job's store holds 8 keys, the limit; refusing "
                "new key \"k8\"");
  ExpectServing();
  EXPECT_TRUE(Set("k0", "again").ok());
  EXPECT_TRUE(Wait("k0", absl::Seconds(5)).ok());
}

TEST_F(BoundedCoordinatorTest, MessagesOverFourMiBAreRefusedBeforeReading) {
  Start();
  const grpc::Status status = Set("k", std::string(5 << 20, 'v'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  ExpectServing();
  EXPECT_TRUE(Set("k", "v").ok());
}

TEST_F(BoundedCoordinatorTest, PastTheThreadCapCallsAreRefusedNotQueued) {
  CoordinatorServerOptions options;
  options.server_limits.max_threads = 6;
  Start(options);
  // 10 waits for a key nobody sets, each holding a thread for 3 s.
  std::atomic<int> refused_at_once{0}, waited{0};
  std::vector<std::thread> waits;
  for (int i = 0; i < 10; ++i) {
    waits.emplace_back([&] {
      const absl::Time start = absl::Now();
      const grpc::Status status = Wait("never", absl::Seconds(3));
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          absl::Now() - start < absl::Seconds(2)) {
        ++refused_at_once;
      } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        ++waited;
      }
    });
  }
  for (std::thread& t : waits) t.join();
  EXPECT_GE(refused_at_once.load(), 4);
  EXPECT_GE(waited.load(), 1);
  EXPECT_EQ(refused_at_once.load() + waited.load(), 10);
  // The threads are free again (once gRPC has returned them to the quota).
  grpc::Status status;
  for (int i = 0; i < 50; ++i) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    JobRequest request;
    request.set_job_id(job_);
    JobInfo job;
    status = stub_->GetJob(&context, request, &job);
    if (status.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// SIGTERM: the server stops within its grace (2 s; a Kubernetes grace
// period is 30 s), not at max_wait: the long polls in flight, a rendezvous
// key's and a layout's, end UNAVAILABLE.
TEST_F(BoundedCoordinatorTest, StoppingEndsTheLongPollsInFlight) {
  CoordinatorServerOptions options;
  options.max_wait = absl::Seconds(600);
  options.max_long_polls_per_caller = 2;
  Start(options);
  ASSERT_TRUE(Set("set", "v").ok());
  grpc::Status key_status, layout_status;
  std::thread key_waiter(
      [&] { key_status = Wait("never", absl::Seconds(600)); });
  std::thread layout_waiter([&] {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(600)));
    JobRequest request;
    request.set_job_id(job_);
    ClusterLayout layout;
    layout_status = stub_->WaitForLayout(&context, request, &layout);
  });
  // Both wait once a third long poll is over the cap of 2.
  ASSERT_TRUE(PollsInFlightReachTheCap());

  JobTable* table = &server_->table();
  absl::Notification stopped;
  const absl::Time start = absl::Now();
  std::thread stopper([&] {
    server_.reset();
    stopped.Notify();
  });
  const bool in_time = stopped.WaitForNotificationWithTimeout(absl::Seconds(5));
  EXPECT_TRUE(in_time) << "the stop waited for the long polls";
  if (!stopped.HasBeenNotified()) {
    // Before the fix: the stop waits for the polls up to max_wait; end them
    // (the table lives until the stop ends).
    table->Cancel(job_, absl::Now()).IgnoreError();
  }
  stopper.join();
  key_waiter.join();
  layout_waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(key_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << key_status.error_message();
  EXPECT_EQ(key_status.error_message(),
            job_ + ": coordinator shutting down; key \"never\" is not set yet");
  EXPECT_EQ(layout_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << layout_status.error_message();
  EXPECT_EQ(layout_status.error_message(),
            job_ +
                ": coordinator shutting down; still waiting for ps 0, "
                "worker 0");
}

// A caller that cancels its long polls (or dies) has its places under the
// per-caller cap back within about JobTable::kCancelledCheckInterval, not
// at max_wait (600 s).
TEST_F(BoundedCoordinatorTest, CancelledLongPollsGiveTheirPlacesBack) {
  Start();
  ASSERT_TRUE(Set("set", "v").ok());
  grpc::CompletionQueue queue;
  struct Poll {
    grpc::ClientContext context;
    KvWaitResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<KvWaitResponse>> reader;
  };
  std::vector<std::unique_ptr<Poll>> polls;
  for (int i = 0; i < CoordinatorService::kMaxLongPollsPerCaller; ++i) {
    auto poll = std::make_unique<Poll>();
    poll->context.set_deadline(In(absl::Seconds(600)));
    KvWaitRequest request;
    request.set_job_id(job_);
    request.set_key("never");
    poll->reader = stub_->AsyncKvWait(&poll->context, request, &queue);
    poll->reader->Finish(&poll->response, &poll->status, poll.get());
    polls.push_back(std::move(poll));
  }
  ASSERT_TRUE(PollsInFlightReachTheCap());

  for (auto& poll : polls) poll->context.TryCancel();
  const absl::Time cancelled = absl::Now();
  grpc::Status status;
  while (absl::Now() - cancelled < absl::Seconds(5)) {
    status = Wait("set", absl::Seconds(5));
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration took = absl::Now() - cancelled;
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  EXPECT_LT(took, absl::Seconds(1));
  // Before the fix the polls still wait: end them, so that the server stops.
  EXPECT_TRUE(Set("never", "v").ok());
  for (size_t done = 0; done < polls.size(); ++done) {
    void* tag;
    bool ok;
    if (!queue.Next(&tag, &ok)) break;
    EXPECT_EQ(static_cast<Poll*>(tag)->status.error_code(),
              grpc::StatusCode::CANCELLED);
  }
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

TEST(CoordinatorServerTest, AMissingJobFileFolderIsCreatedPrivate) {
  const std::string root = testing::TempDir() + "/fresh-node";
  std::filesystem::remove_all(root);
  CoordinatorServerOptions options;
  options.address = "127.0.0.1:0";
  options.job_file = root + "/var/lib/pstrain/jobs.pb";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& folder :
       {root + "/var", root + "/var/lib", root + "/var/lib/pstrain"}) {
    struct stat st;
    ASSERT_EQ(stat(folder.c_str(), &st), 0) << folder;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << folder;
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(options.job_file));
  server->reset();
  // A folder that cannot be made: one line naming the job file.
  std::ofstream(root + "/a-file") << "x";
  options.job_file = root + "/a-file/sub/jobs.pb";
  server = CoordinatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_FALSE(absl::IsUnavailable(server.status()));
  EXPECT_EQ(server.status().message().rfind(
                absl::StrCat("job file ", options.job_file, ": "), 0),
            0u)
      << server.status();
  EXPECT_EQ(server.status().message().find('\n'), absl::string_view::npos);
}

const TlsIdentity kCoordinatorId{TlsRole::kCoordinator};
const TlsIdentity kJob1Worker0{TlsRole::kWorker, 0, "job-1"};
const TlsIdentity kJob1Worker1{TlsRole::kWorker, 1, "job-1"};
const TlsIdentity kJob2Ps0{TlsRole::kPs, 0, "job-2"};
const TlsIdentity kJob2Worker0{TlsRole::kWorker, 0, "job-2"};

// A TLS coordinator with job-1 (1 ps, 2 workers) and job-2 (1 ps, 1
// worker), and channels as each task of them.
class TlsCoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir() + "/coordinator-tls");
    std::filesystem::remove_all(*dir_);
    // One folder per job (files are named by role and index), one CA.
    ASSERT_TRUE(MakeCertificates(*dir_ + "/job-1",
                                 {kCoordinatorId, kJob1Worker0, kJob1Worker1})
                    .ok());
    std::filesystem::create_directories(*dir_ + "/job-2");
    for (const char* f : {"ca.pem", "ca.key"}) {
      std::filesystem::copy_file(*dir_ + "/job-1/" + f, *dir_ + "/job-2/" + f);
    }
    ASSERT_TRUE(
        MakeCertificates(*dir_ + "/job-2", {kJob2Ps0, kJob2Worker0}).ok());
  }

  void SetUp() override {
    TlsOptions tls;
    tls.dir = *dir_ + "/job-1";
    CoordinatorServerOptions options;
    options.address = "127.0.0.1:0";
    // Long polls wait up to the default max_wait (600 s): the server's
    // stop ends those still in flight (JobTable::StopWaits).
    auto credentials = ServerCredentials(tls, kCoordinatorId);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    options.credentials = *credentials;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    JobSpec spec;
    spec.set_num_ps(1);
    spec.set_num_workers(2);
    ASSERT_EQ(*server_->table().Submit(spec, absl::Now()), "job-1");
    spec.set_num_workers(1);
    ASSERT_EQ(*server_->table().Submit(spec, absl::Now()), "job-2");
  }

  // A stub as `id` on a connection of its own.
  std::unique_ptr<Coordinator::Stub> Stub(const TlsIdentity& id) {
    TlsOptions tls;
    tls.dir = *dir_ + "/" + id.job;
    auto credentials = ChannelCredentials(tls, id);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    grpc::ChannelArguments args;
    SetPeerServerName(kCoordinatorId, &args);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return Coordinator::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()), *credentials, args));
  }

  static grpc::Status Set(Coordinator::Stub* stub, const std::string& key) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    KvSetRequest request;
    request.set_job_id("job-1");
    request.set_key(key);
    request.set_value("v");
    KvSetResponse response;
    return stub->KvSet(&context, request, &response);
  }

  static std::string* dir_;
  std::unique_ptr<CoordinatorServer> server_;
};

std::string* TlsCoordinatorTest::dir_ = nullptr;

TEST_F(TlsCoordinatorTest, AWorkerSetsOnlyItsOwnKeys) {
  auto worker0 = Stub(kJob1Worker0);
  auto worker1 = Stub(kJob1Worker1);
  // The keys Gloo's and NCCL's rendezvous set (worker/collective.cc,
  // worker/nccl_collective.cc), each by its own rank.
  for (const char* key : {"gloo/1", "gloo/rank_1", "worker-1/x"}) {
    EXPECT_TRUE(Set(worker1.get(), key).ok()) << key;
  }
  for (const char* key :
       {"gloo/0", "gloo/rank_0", "nccl/nccl_id", "gloo-m2/world", "k"}) {
    const grpc::Status status = Set(worker1.get(), key);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << key;
  }
  EXPECT_EQ(Set(worker1.get(), "gloo/0").error_message(),
            "worker:1@job-1 may not call /pstrain.Coordinator/KvSet for key "
            "\"gloo/0\" of job job-1: it is "
            "worker 0's; a worker sets only its own keys (worker-<i>/..., "
            "<prefix>/<i>, <prefix>/rank_<i>; <prefix>/nccl_id, "
            "<prefix>/world: worker 0)");
  for (const char* key :
       {"gloo/0", "gloo/rank_0", "nccl/nccl_id", "gloo-m2/world"}) {
    EXPECT_TRUE(Set(worker0.get(), key).ok()) << key;
  }
  const JobInfo job = *server_->table().Get("job-1");
  EXPECT_EQ(job.kv().size(), 7u);
  EXPECT_FALSE(job.kv().contains("k"));
}

// 2,000 long polls from one worker key take at most its cap of the
// server's threads: another job registers, heartbeats and finishes.
TEST_F(TlsCoordinatorTest, OneKeysLongPollsDoNotStallAnotherJob) {
  constexpr int kPolls = 2000;
  constexpr int kConnections = 40;  // at most 100 streams each
  std::vector<std::unique_ptr<Coordinator::Stub>> flooders;
  for (int i = 0; i < kConnections; ++i) flooders.push_back(Stub(kJob1Worker0));
  grpc::CompletionQueue queue;
  struct Poll {
    grpc::ClientContext context;
    KvWaitResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<KvWaitResponse>> reader;
  };
  std::vector<std::unique_ptr<Poll>> polls;
  for (int i = 0; i < kPolls; ++i) {
    auto poll = std::make_unique<Poll>();
    poll->context.set_deadline(In(absl::Seconds(60)));
    KvWaitRequest request;
    request.set_job_id("job-1");
    request.set_key("never");
    poll->reader = flooders[i % kConnections]->AsyncKvWait(&poll->context,
                                                           request, &queue);
    poll->reader->Finish(&poll->response, &poll->status, poll.get());
    polls.push_back(std::move(poll));
  }
  // Wait until all but the cap's worth have been refused.
  int refused = 0;
  int done = 0;
  const int cap = CoordinatorService::kMaxLongPollsPerCaller;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (done < kPolls - cap && absl::Now() < give_up) {
    void* tag;
    bool ok;
    if (queue.AsyncNext(&tag, &ok, In(absl::Seconds(1))) !=
        grpc::CompletionQueue::GOT_EVENT) {
      continue;
    }
    ++done;
    const grpc::Status& status = static_cast<Poll*>(tag)->status;
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
    } else {
      ADD_FAILURE() << status.error_code() << " " << status.error_message();
    }
  }
  EXPECT_EQ(refused, kPolls - cap) << "done " << done;

  // job-2 runs to its end meanwhile.
  auto ps = Stub(kJob2Ps0);
  auto worker = Stub(kJob2Worker0);
  for (auto [stub, role] :
       {std::pair{ps.get(), ROLE_PS}, std::pair{worker.get(), ROLE_WORKER}}) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    RegisterRequest request;
    request.mutable_task()->set_job_id("job-2");
    request.mutable_task()->set_role(role);
    request.set_address(role == ROLE_PS ? "127.0.0.1:7000" : "127.0.0.1:7001");
    RegisterResponse response;
    const grpc::Status status = stub->Register(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    JobRequest request;
    request.set_job_id("job-2");
    ClusterLayout layout;
    const grpc::Status status =
        worker->WaitForLayout(&context, request, &layout);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(layout.worker_addresses(0), "127.0.0.1:7001");
  }
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    HeartbeatRequest request;
    request.mutable_task()->set_job_id("job-2");
    request.mutable_task()->set_role(ROLE_WORKER);
    request.add_log_lines("step 1");
    HeartbeatResponse response;
    const grpc::Status status = worker->Heartbeat(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    TaskFinishedRequest request;
    request.mutable_task()->set_job_id("job-2");
    request.mutable_task()->set_role(ROLE_WORKER);
    request.set_ok(true);
    TaskFinishedResponse response;
    const grpc::Status status =
        worker->TaskFinished(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(server_->table().Get("job-2")->state(), JOB_SUCCEEDED);

  // The polls still waiting are the cap's worth; end them.
  for (auto& poll : polls) poll->context.TryCancel();
  while (done < kPolls) {
    void* tag;
    bool ok;
    if (!queue.Next(&tag, &ok)) break;
    ++done;
  }
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

// Random job specs against the live coordinator (issue 22): every field of
// a valid JobSpec and its optimizer set, with probability 1/2 (or 3% for
// every 4th spec), to an edge value
// (0, -1, INT_MAX, inf, NaN, 1e300, long or binary strings, hosts lists of
// any length). Each Submit is accepted only if the spec is valid
// (ValidateJobSpec after the defaults), else INVALID_ARGUMENT naming a
// field; nothing else (no UNKNOWN, no crash), and the coordinator keeps
// serving throughout.
TEST_F(BoundedCoordinatorTest, RandomSpecsAreRefusedOrAcceptedNeverACrash) {
  Start();
  std::mt19937_64 random(22);
  auto coin = [&] { return random() % 2 == 0; };
  auto pick = [&](auto values) { return values[random() % values.size()]; };
  const std::vector<int64_t> ints = {
      0,    1,     -1,    2,       3,         7,         64,       4096,
      4097, 65535, 65536, 1 << 20, INT32_MAX, INT32_MIN, INT64_MAX};
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> doubles = {
      0,     1e-3,  -1, 1,  0.9,   0.999, 0.99999999, 1e-8,
      1e-30, 1e-45, 10, 11, 1e300, inf,   -inf,       std::nan("")};
  const std::vector<std::string> strings = {
      "",          "lenet5",   "resnet18",
      "sync",      "async",    "allreduce",
      "cpu",       "cuda",     "fashion_mnist",
      "synthetic", "model",    "gloo",
      "/tmp/x",    "\x01\n\t", std::string(5000, 'a'),
      "host-1"};
  double p = 0.5;  // the chance of each field being set
  auto fill = [&](google::protobuf::Message* m) {
    const google::protobuf::Descriptor* d = m->GetDescriptor();
    const google::protobuf::Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* f = d->field(i);
      if (std::uniform_real_distribution<double>(0, 1)(random) >= p) continue;
      using F = google::protobuf::FieldDescriptor;
      if (f->is_repeated()) {
        if (f->cpp_type() != F::CPPTYPE_MESSAGE) continue;
        const int n = static_cast<int>(random() % 4);
        for (int k = 0; k < n; ++k) {
          google::protobuf::Message* item = r->AddMessage(m, f);
          const google::protobuf::Descriptor* hd = item->GetDescriptor();
          for (int j = 0; j < hd->field_count(); ++j) {
            const F* hf = hd->field(j);
            if (hf->cpp_type() == F::CPPTYPE_STRING) {
              item->GetReflection()->SetString(item, hf, pick(strings));
            } else if (hf->cpp_type() == F::CPPTYPE_INT32) {
              item->GetReflection()->SetInt32(item, hf,
                                              static_cast<int32_t>(pick(ints)));
            }
          }
        }
        continue;
      }
      switch (f->cpp_type()) {
        case F::CPPTYPE_INT32:
          r->SetInt32(m, f, static_cast<int32_t>(pick(ints)));
          break;
        case F::CPPTYPE_INT64:
          r->SetInt64(m, f, pick(ints));
          break;
        case F::CPPTYPE_UINT32:
          r->SetUInt32(m, f, static_cast<uint32_t>(pick(ints)));
          break;
        case F::CPPTYPE_UINT64:
          r->SetUInt64(m, f, static_cast<uint64_t>(pick(ints)));
          break;
        case F::CPPTYPE_DOUBLE:
          r->SetDouble(m, f, pick(doubles));
          break;
        case F::CPPTYPE_FLOAT:
          r->SetFloat(m, f, static_cast<float>(pick(doubles)));
          break;
        case F::CPPTYPE_BOOL:
          r->SetBool(m, f, coin());
          break;
        case F::CPPTYPE_STRING:
          r->SetString(m, f, pick(strings));
          break;
        default:
          break;  // nested messages below; enums: none in JobSpec
      }
    }
  };
  int accepted = 0, refused = 0;
  for (int i = 0; i < 2000; ++i) {
    // From a valid spec: every 4th changes few fields (mostly accepted).
    SubmitRequest request;
    JobSpec* spec = request.mutable_spec();
    spec->set_num_ps(1);
    spec->set_num_workers(2);
    spec->set_batch_size(32);
    spec->set_epochs(1);
    p = i % 4 == 0 ? 0.03 : 0.5;
    fill(spec);
    if (coin()) fill(request.mutable_spec()->mutable_optimizer());
    JobSpec expected = request.spec();
    ApplyJobDefaults(&expected);
    const bool valid = ValidateJobSpec(expected).ok();
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    SubmitResponse response;
    const grpc::Status status = stub_->Submit(&context, request, &response);
    if (status.ok()) {
      ++accepted;
      EXPECT_TRUE(valid) << i << ": " << request.spec().ShortDebugString();
    } else {
      ++refused;
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << i << ": " << status.error_message();
      EXPECT_FALSE(valid) << i << ": " << status.error_message();
      EXPECT_EQ(status.error_message().find('\n'), std::string::npos);
    }
    if (i % 250 == 0) ExpectServing();
  }
  ExpectServing();
  // Bytes that are not UTF-8 in a text field (bytes on the wire, so the
  // request parses): INVALID_ARGUMENT naming the field, in any field, nested
  // ones too; still serving.
  for (const auto& [set, message] :
       std::vector<std::pair<std::function<void(JobSpec*)>, std::string>>{
           {[](JobSpec* s) { s->set_model("\xff\xfe"); },
            "model: \"\\xff\\xfe\" is not UTF-8; expected UTF-8 text"},
           {[](JobSpec* s) { s->set_data_dir("/data/\xc3"); },
            "data_dir: \"/data/\\xc3\" is not UTF-8; expected UTF-8 text"},
           {[](JobSpec* s) {
              s->add_worker_hosts()->set_host("a");
              s->add_worker_hosts()->set_host("b\x80");
            },
            "worker_hosts[1].host: \"b\\x80\" is not UTF-8; expected UTF-8 "
            "text"},
           {[](JobSpec* s) { s->mutable_optimizer()->set_name("sgd\xff"); },
            "optimizer.name: \"sgd\\xff\" is not UTF-8; expected UTF-8 "
            "text"}}) {
    SubmitRequest request;
    request.mutable_spec()->set_num_ps(1);
    request.mutable_spec()->set_num_workers(2);
    set(request.mutable_spec());
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    SubmitResponse response;
    const grpc::Status status = stub_->Submit(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_EQ(status.error_message(), message);
    ExpectServing();
  }
  // Both outcomes were exercised.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace pstrain
