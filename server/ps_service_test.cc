// PsService's PushPull over a real gRPC server, spoken to with the plain
// protobuf stub: the ByteBuffer path (common/chunk_message.h) must accept
// what any protobuf client sends, answer in messages protobuf parses, and
// reject malformed or wrong-shaped pushes with INVALID_ARGUMENT without
// touching the shard's state.
#include "server/ps_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chunk_message.h"
#include "common/grpc_server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "server/shard_checkpoint.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One parameter of 4 elements in one chunk; 2 sync workers.
class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_root_ =
        ::testing::TempDir() + "/ps_service_test_ckpt/" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(checkpoint_root_);
    std::filesystem::create_directories(checkpoint_root_);
    ASSERT_NO_FATAL_FAILURE(Serve(BaseOptions(), absl::Seconds(5)));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // 2 sync workers, Adam at lr 0.1, checkpoints under checkpoint_root_.
  ShardOptions BaseOptions() const {
    ShardOptions options;
    options.job_id = "job";
    options.num_workers = 2;
    options.mode = SyncMode::kSync;
    options.adam.lr = 0.1f;
    options.checkpoint_dir = checkpoint_root_;
    return options;
  }
  // (Re)starts the shard (initialised with the one chunk {1, 2, 3, 4}),
  // its service with `pull_timeout`, and its server.
  void Serve(const ShardOptions& options, absl::Duration pull_timeout) {
    if (server_) server_->Shutdown();
    stub_.reset();
    server_.reset();
    service_.reset();
    shard_ = std::make_unique<ParameterShard>(options);
    std::vector<InitChunk> chunks(1);
    chunks[0].values = {1, 2, 3, 4};
    ASSERT_TRUE(shard_->Initialize({4}, 16, std::move(chunks)).ok());
    service_ = std::make_unique<PsService>(shard_.get(), pull_timeout);
    absl::StatusOr<ListeningServer> listening =
        StartGrpcServer("127.0.0.1:0", service_.get(), "");
    ASSERT_TRUE(listening.ok()) << listening.status();
    server_ = std::move(listening->server);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(listening->port),
                            grpc::InsecureChannelCredentials());
    stub_ = ParameterServer::NewStub(channel_);
  }

  static PushPullRequest Push(int worker, const std::string& data,
                              int64_t num_elements) {
    PushPullRequest request;
    request.mutable_header()->set_job_id("job");
    request.mutable_header()->set_worker_id(worker);
    TensorChunk* chunk = request.mutable_push();
    chunk->mutable_key()->set_param_id(0);
    chunk->mutable_key()->set_chunk_index(0);
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(num_elements);
    chunk->set_data(data);
    chunk->set_version(0);
    return request;
  }
  // Worker `worker`'s end of sync step `step` (every value finite).
  static PushPullRequest End(int worker, int64_t step) {
    PushPullRequest request;
    request.mutable_header()->set_job_id("job");
    request.mutable_header()->set_worker_id(worker);
    request.mutable_step_end()->set_step(step);
    return request;
  }
  static std::string Bytes(const std::vector<float>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
  }

  // Sends `requests` on one stream, half-closes, reads every reply.
  grpc::Status Exchange(const std::vector<PushPullRequest>& requests,
                        std::vector<PushPullResponse>* replies) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    auto stream = stub_->PushPull(&context);
    for (const PushPullRequest& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
    PushPullResponse reply;
    while (stream->Read(&reply)) replies->push_back(reply);
    return stream->Finish();
  }

  // Sends `bytes` as one PushPull message, half-closes, drains the replies.
  grpc::Status ExchangeBytes(const std::string& bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    const grpc::internal::RpcMethod method(
        kPushPullMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           method, &context));
    const grpc::Slice slice(bytes);
    stream->Write(grpc::ByteBuffer(&slice, 1));
    stream->WritesDone();
    grpc::ByteBuffer reply;
    while (stream->Read(&reply)) {
    }
    return stream->Finish();
  }

  // Worker 0's Checkpoint call for `step` (`wait` as in proto/ps.proto),
  // with a deadline `timeout` ahead (InfiniteDuration: none).
  grpc::Status Checkpoint(const CheckpointRequest& request,
                          CheckpointResponse* response = nullptr,
                          absl::Duration timeout = absl::Seconds(10)) {
    grpc::ClientContext context;
    if (timeout != absl::InfiniteDuration()) {
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    }
    CheckpointResponse ignored;
    return stub_->Checkpoint(&context, request, response ? response : &ignored);
  }
  static CheckpointRequest CheckpointOf(int64_t step, bool wait) {
    CheckpointRequest request;
    request.mutable_header()->set_job_id("job");
    request.mutable_header()->set_worker_id(0);
    request.set_step(step);
    request.set_wait(wait);
    return request;
  }

  // Worker `worker`'s WorkerDone call (proto/ps.proto).
  grpc::Status WorkerDone(int worker, int64_t generation, bool steps_ended,
                          WorkerDoneResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    WorkerDoneRequest request;
    request.mutable_header()->set_job_id("job");
    request.mutable_header()->set_worker_id(worker);
    request.mutable_header()->set_generation(generation);
    request.set_steps_ended(steps_ended);
    return stub_->WorkerDone(&context, request, response);
  }

  // Worker 0 reopens the shard in place at `generation`.
  void Reopen(int64_t generation) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    InitResponse response;
    auto writer = stub_->Init(&context, &response);
    InitRequest reopen;
    reopen.mutable_header()->set_job_id("job");
    reopen.mutable_header()->set_worker_id(0);
    reopen.mutable_header()->set_generation(generation - 1);
    reopen.mutable_layout()->add_param_num_elements(4);
    reopen.mutable_layout()->set_partition_bytes(16);
    reopen.set_generation(generation);
    reopen.set_reopen(true);
    reopen.set_reopen_version(-1);
    writer->Write(reopen);
    writer->WritesDone();
    const grpc::Status reopened = writer->Finish();
    ASSERT_TRUE(reopened.ok()) << reopened.error_message();
    ASSERT_EQ(shard_->generation(), generation);
  }

  std::string checkpoint_root_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(PsServiceTest, ProtobufClientPushesAndPulls) {
  const std::vector<float> g0 = {0.5f, -1.0f, 2.0f, 0.0f};
  const std::vector<float> g1 = {1.5f, 1.0f, -2.0f, 4.0f};
  std::vector<PushPullResponse> replies;
  ASSERT_TRUE(Exchange({Push(0, Bytes(g0), 4), End(0, 0)}, &replies).ok());
  PushPullRequest pull = Push(1, Bytes(g1), 4);
  std::vector<PushPullRequest> requests = {pull, End(1, 0)};
  pull.mutable_pull()->set_min_version(1);  // replaces the push (oneof)
  requests.push_back(pull);
  ASSERT_TRUE(Exchange(requests, &replies).ok());

  // One chunk at version 1, then the end of the pull.
  ASSERT_EQ(replies.size(), 2u);
  ASSERT_TRUE(replies[0].has_chunk());
  const TensorChunk& chunk = replies[0].chunk();
  EXPECT_EQ(chunk.version(), 1);
  EXPECT_EQ(chunk.num_elements(), 4);
  EXPECT_EQ(chunk.dtype(), DTYPE_FLOAT32);
  EXPECT_TRUE(replies[1].last_of_pull());
  EXPECT_FALSE(replies[1].has_chunk());

  // The shard applied one Adam step to the workers' average gradient.
  std::vector<float> weights = {1, 2, 3, 4}, m(4, 0), v(4, 0), mean(4);
  for (int i = 0; i < 4; ++i) mean[i] = (g0[i] + g1[i]) / 2;
  AdamOptions adam;
  adam.lr = 0.1f;
  AdamUpdate(adam, 1, weights.data(), mean.data(), m.data(), v.data(), 4);
  ASSERT_EQ(chunk.data().size(), 16u);
  std::vector<float> pulled(4);
  std::memcpy(pulled.data(), chunk.data().data(), 16);
  EXPECT_EQ(pulled, weights);
}

// A worker's non-finite value is echoed to every worker in its first 16
// bytes: cut on a character boundary, so the reply is still a message
// protobuf parses (a proto3 string holds UTF-8 only).
TEST_F(PsServiceTest, ANonFiniteValueIsCutOnACharacterBoundary) {
  const std::vector<float> g = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<PushPullResponse> replies;
  PushPullRequest end0 = End(0, 0);
  end0.mutable_step_end()->mutable_nonfinite()->set_value(
      std::string(15, 'a') + "\xc3\xa9");  // 15 'a', then U+00E9 in 2 bytes
  ASSERT_TRUE(Exchange({Push(0, Bytes(g), 4), end0}, &replies).ok());
  PushPullRequest pull = Push(1, Bytes(g), 4);
  std::vector<PushPullRequest> requests = {pull, End(1, 0)};
  pull.mutable_pull()->set_min_version(1);
  requests.push_back(pull);
  const grpc::Status status = Exchange(requests, &replies);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(replies.empty());
  const PushPullResponse& last = replies.back();
  EXPECT_TRUE(last.last_of_pull());
  ASSERT_TRUE(last.has_skipped_step());
  EXPECT_EQ(last.skipped_step().worker_id(), 0);
  EXPECT_EQ(last.skipped_step().nonfinite().value(), std::string(15, 'a'));
}

TEST_F(PsServiceTest, WrongShapedPushesAreRejectedAndChangeNothing) {
  struct Case {
    PushPullRequest request;
    std::string message;
    grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  };
  std::vector<Case> cases;
  cases.push_back({Push(0, Bytes({1, 2, 3}), 3),
                   "chunk (0, 0) push has 3 elements; expected 4"});
  cases.push_back(
      {Push(0, Bytes({1, 2, 3}), 4), "carries 12 bytes for 4 fp32 elements"});
  PushPullRequest untyped = Push(0, Bytes({1, 2, 3, 4}), 4);
  untyped.mutable_push()->set_dtype(DTYPE_UNSPECIFIED);
  cases.push_back({untyped, "has dtype DTYPE_UNSPECIFIED"});
  PushPullRequest stranger = Push(0, Bytes({1, 2, 3, 4}), 4);
  stranger.mutable_push()->mutable_key()->set_param_id(7);
  cases.push_back({stranger, "chunk (7, 0) is not owned by shard 0"});
  PushPullRequest late = Push(0, Bytes({1, 2, 3, 4}), 4);
  late.mutable_push()->set_version(3);
  cases.push_back({late, "for step 3 but the chunk is at version 0",
                   grpc::StatusCode::FAILED_PRECONDITION});

  for (const Case& c : cases) {
    std::vector<PushPullResponse> replies;
    const grpc::Status status = Exchange({c.request}, &replies);
    EXPECT_EQ(status.error_code(), c.code) << c.message;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // Bytes that are no PushPullRequest: the message cut inside its chunk.
  const std::string whole = Push(0, Bytes({1, 2, 3, 4}), 4).SerializeAsString();
  const grpc::Status cut = ExchangeBytes(whole.substr(0, whole.size() - 3));
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(cut.error_message(),
              HasSubstr("malformed push/pull message: truncated"));

  const ShardStats stats = shard_->Stats();
  EXPECT_EQ(stats.pushes, 0);
  EXPECT_EQ(stats.min_version, 0);
  // Worker 0's slot is still free: a good push of step 0 is taken.
  std::vector<PushPullResponse> replies;
  EXPECT_TRUE(Exchange({Push(0, Bytes({1, 1, 1, 1}), 4)}, &replies).ok());
  EXPECT_EQ(shard_->Stats().pushes, 1);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// A request names only the step: the shard writes under its own
// checkpoint_dir. A client that still sends the old `path` field (3) as
// bytes gets it ignored, and nothing appears at that path.
TEST_F(PsServiceTest, CheckpointGoesUnderTheShardsOwnFolderWhateverTheCaller) {
  const std::string target = ::testing::TempDir() + "/ps_service_test_victim";
  std::filesystem::remove(target);
  CheckpointRequest begin = CheckpointOf(0, /*wait=*/false);
  begin.GetReflection()->MutableUnknownFields(&begin)->AddLengthDelimited(
      3, target);
  ASSERT_TRUE(Checkpoint(begin).ok());
  CheckpointResponse done;
  const grpc::Status waited = Checkpoint(CheckpointOf(0, true), &done);
  ASSERT_TRUE(waited.ok()) << waited.error_message();
  const std::string file = checkpoint_root_ + "/step-0/shard-0.safetensors";
  EXPECT_TRUE(std::filesystem::is_regular_file(file));
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(file)),
            done.size_bytes());
  EXPECT_FALSE(std::filesystem::exists(target));
}

// Whatever steps a worker 0 key names, a shard keeps its files of the
// newest keep_checkpoints cuts before the one it wrote, and that one:
// files of later steps (an abandoned timeline) and older ones go, a folder
// left empty goes, a folder with worker 0's files stays, and a step folder
// that is a link is not followed.
TEST_F(PsServiceTest, AShardKeepsKeepPlusOneFilesOfItsState) {
  ShardOptions options = BaseOptions();
  options.mode = SyncMode::kAsync;  // any step from the last one on
  options.keep_checkpoints = 2;
  ASSERT_NO_FATAL_FAILURE(Serve(options, absl::Seconds(5)));
  namespace fs = std::filesystem;
  const std::string root = checkpoint_root_;
  auto shard_file = [&](int step) {
    return absl::StrCat(root, "/step-", step, "/shard-0.safetensors");
  };
  auto write = [&](int step) {
    ASSERT_TRUE(Checkpoint(CheckpointOf(step, false)).ok()) << step;
    const grpc::Status waited = Checkpoint(CheckpointOf(step, true));
    ASSERT_TRUE(waited.ok()) << step << ": " << waited.error_message();
  };
  // An abandoned timeline's file, worker 0's model file beside one of the
  // shard's, and a linked step folder holding a file of the same name.
  fs::create_directories(root + "/step-100");
  std::ofstream(shard_file(100)) << "abandoned";
  const std::string elsewhere = ::testing::TempDir() + "/ps_service_kept";
  fs::remove_all(elsewhere);
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere + "/shard-0.safetensors") << "not ours";
  fs::create_directory_symlink(elsewhere, root + "/step-1");
  for (int step : {0, 5, 10}) ASSERT_NO_FATAL_FAILURE(write(step));
  std::ofstream(root + "/step-5/model.safetensors") << "worker 0's";
  for (int step : {15, 20, 25, 30, 35}) ASSERT_NO_FATAL_FAILURE(write(step));

  std::vector<int> kept;
  for (int step = 0; step <= 100; ++step) {
    if (fs::exists(shard_file(step)) && step != 1) kept.push_back(step);
  }
  EXPECT_EQ(kept, (std::vector<int>{25, 30, 35}));
  EXPECT_FALSE(fs::exists(root + "/step-100"));
  EXPECT_FALSE(fs::exists(root + "/step-0"));
  EXPECT_TRUE(fs::exists(root + "/step-5/model.safetensors"));
  EXPECT_TRUE(fs::exists(elsewhere + "/shard-0.safetensors"));
}

// With worker 0's newest complete checkpoint in the request, the shard
// keeps that one and removes the cuts after it that never completed (a
// worker died after the shard's write, and the job went back): keeping the
// newest file alone would have removed the one the job can restore.
TEST_F(PsServiceTest, AShardRemovesTheCutsThatNeverCompleted) {
  ShardOptions options = BaseOptions();
  options.mode = SyncMode::kAsync;
  options.keep_checkpoints = 1;
  ASSERT_NO_FATAL_FAILURE(Serve(options, absl::Seconds(5)));
  auto write = [&](int step, int latest) {
    CheckpointRequest begin = CheckpointOf(step, false);
    if (latest >= 0) begin.set_latest_step(latest);
    ASSERT_TRUE(Checkpoint(begin).ok()) << step;
    const grpc::Status waited = Checkpoint(CheckpointOf(step, true));
    ASSERT_TRUE(waited.ok()) << step << ": " << waited.error_message();
  };
  auto kept = [&] {
    std::vector<int> steps;
    for (int step = 0; step <= 400; step += 10) {
      if (std::filesystem::exists(absl::StrCat(checkpoint_root_, "/step-", step,
                                               "/shard-0.safetensors"))) {
        steps.push_back(step);
      }
    }
    return steps;
  };
  ASSERT_NO_FATAL_FAILURE(write(200, -1));
  ASSERT_NO_FATAL_FAILURE(write(300, 200));  // its manifest never came
  EXPECT_EQ(kept(), (std::vector<int>{200, 300}));
  ASSERT_NO_FATAL_FAILURE(write(320, 200));
  EXPECT_EQ(kept(), (std::vector<int>{200, 320}));
  // A latest at or past the written step says nothing: the newest before
  // it is kept.
  ASSERT_NO_FATAL_FAILURE(write(340, 900));
  EXPECT_EQ(kept(), (std::vector<int>{320, 340}));
}

// ROOT/step-N as a symbolic link to a folder elsewhere: refused, and the
// folder it points to gets nothing.
TEST_F(PsServiceTest, CheckpointRefusesAStepFolderThatLinksOutside) {
  const std::string elsewhere = ::testing::TempDir() + "/ps_service_elsewhere";
  std::filesystem::remove_all(elsewhere);
  std::filesystem::create_directories(elsewhere);
  std::filesystem::create_directory_symlink(elsewhere,
                                            checkpoint_root_ + "/step-0");
  const grpc::Status status = Checkpoint(CheckpointOf(0, false));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("symbolic link"));
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
}

// A job without a checkpoint_dir: no checkpoint at all.
// A hold of shard 0's admissions (CheckpointRequest.hold_only, before an
// elastic change with backup workers) is of the step the shard picks, and
// only a job with backup workers has admissions to hold; nothing else is
// asked of the shard.
TEST_F(PsServiceTest, CheckpointHoldOnlyIsCheckedAndWritesNothing) {
  CheckpointRequest request = CheckpointOf(0, false);
  request.set_hold_only(true);
  grpc::Status status = Checkpoint(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "checkpoint hold_only without pick_step: a hold is of the step "
            "shard 0 picks");
  request.set_pick_step(true);
  status = Checkpoint(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("only shard 0 of an initialised job "
                                        "with backup workers holds them"),
            std::string::npos)
      << status.error_message();
  EXPECT_FALSE(std::filesystem::exists(checkpoint_root_ + "/step-0"));
}

TEST_F(PsServiceTest, CheckpointWithoutAFolderIsAFailedPrecondition) {
  ShardOptions options = shard_->options();
  options.checkpoint_dir.clear();
  ParameterShard shard(options);
  std::vector<InitChunk> chunks(1);
  chunks[0].values = {1, 2, 3, 4};
  ASSERT_TRUE(shard.Initialize({4}, 16, std::move(chunks)).ok());
  PsService service(&shard, absl::Seconds(5));
  absl::StatusOr<ListeningServer> listening =
      StartGrpcServer("127.0.0.1:0", &service, "");
  ASSERT_TRUE(listening.ok()) << listening.status();
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(listening->port),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  CheckpointResponse response;
  const grpc::Status status =
      stub->Checkpoint(&context, CheckpointOf(0, false), &response);
  listening->server->Shutdown();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint_dir"));
}

// Concurrent Checkpoint calls (begin and wait mixed) each get an answer and
// the shard process survives: before, two calls could join the same writer
// thread, and std::thread::join threw out of the handler (terminate).
TEST_F(PsServiceTest, ConcurrentCheckpointCallsDoNotTerminateTheShard) {
  std::vector<std::thread> callers;
  std::atomic<int> answered{0};
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        Checkpoint(CheckpointOf(0, /*wait=*/(t + i) % 3 == 0));
        answered.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(answered.load(), 80);
  ASSERT_TRUE(Checkpoint(CheckpointOf(0, false)).ok());
  const grpc::Status waited = Checkpoint(CheckpointOf(0, true));
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_TRUE(std::filesystem::is_regular_file(checkpoint_root_ +
                                               "/step-0/shard-0.safetensors"));
}

// Init is checked chunk by chunk as it arrives: a restore (generation 1)
// that repeats one chunk is refused at the repeat, naming it, rather than
// after the whole stream has been held in memory; the shard keeps its
// weights.
TEST_F(PsServiceTest, InitRefusesEachBadChunkAsItArrives) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  InitResponse response;
  auto writer = stub_->Init(&context, &response);
  InitRequest first;
  first.mutable_header()->set_job_id("job");
  first.mutable_header()->set_worker_id(0);
  first.mutable_layout()->add_param_num_elements(4);
  first.mutable_layout()->set_partition_bytes(16);
  first.set_generation(1);
  ASSERT_TRUE(writer->Write(first));
  InitRequest chunk;
  chunk.mutable_header()->set_job_id("job");
  chunk.mutable_header()->set_worker_id(0);
  chunk.mutable_chunk()->set_dtype(DTYPE_FLOAT32);
  chunk.mutable_chunk()->set_num_elements(4);
  chunk.mutable_chunk()->set_data(Bytes({9, 9, 9, 9}));
  for (int i = 0; i < 100; ++i) {
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("(0, 0) sent twice"));

  // A chunk of another size than the layout's is refused before decoding.
  grpc::ClientContext context2;
  context2.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(10));
  auto writer2 = stub_->Init(&context2, &response);
  ASSERT_TRUE(writer2->Write(first));
  chunk.mutable_chunk()->set_num_elements(1 << 20);
  writer2->Write(chunk);
  writer2->WritesDone();
  const grpc::Status status2 = writer2->Finish();
  EXPECT_EQ(status2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status2.error_message(), HasSubstr("the layout says 4"));

  std::vector<PushPullResponse> replies;
  PushPullRequest pull;
  pull.mutable_header()->set_job_id("job");
  pull.mutable_header()->set_worker_id(0);
  pull.mutable_pull()->set_min_version(0);
  ASSERT_TRUE(Exchange({pull}, &replies).ok());
  ASSERT_FALSE(replies.empty());
  ASSERT_TRUE(replies[0].has_chunk());
  EXPECT_EQ(replies[0].chunk().data(), Bytes({1, 2, 3, 4}));
}

// An elastic change planned for a step's decision
// (InitRequest.reopen_at_decision): its fields are checked (a membership,
// with worker 0; the next generation; the step being collected; worker 0
// only), and once the step is decided every member's pull of the next
// version ends with the generation taken.
TEST_F(PsServiceTest, APlannedChangeIsCheckedAndNamedAtThePullsEnd) {
  auto plan = [&](int worker, int64_t generation, int64_t version,
                  std::vector<int> workers) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    InitResponse response;
    auto writer = stub_->Init(&context, &response);
    InitRequest first;
    first.mutable_header()->set_job_id("job");
    first.mutable_header()->set_worker_id(worker);
    first.mutable_layout()->add_param_num_elements(4);
    first.mutable_layout()->set_partition_bytes(16);
    first.set_generation(generation);
    first.set_reopen(true);
    first.set_reopen_at_decision(true);
    first.set_reopen_version(version);
    if (!workers.empty()) {
      for (int w : workers) first.mutable_membership()->add_workers(w);
      first.mutable_membership()->set_epoch(1);
    }
    writer->Write(first);
    writer->WritesDone();
    return writer->Finish();
  };
  EXPECT_EQ(plan(0, 1, 1, {}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(plan(0, 1, 1, {1}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(plan(1, 1, 1, {0, 1}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(plan(0, 2, 1, {0, 1}).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(plan(0, 1, 5, {0, 1}).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(shard_->generation(), 0);
  ASSERT_TRUE(plan(0, 1, 1, {0, 1}).ok());
  EXPECT_EQ(shard_->generation(), 0);

  auto step = [&](int worker, std::vector<PushPullResponse>* replies) {
    PushPullRequest pull;
    pull.mutable_header()->set_job_id("job");
    pull.mutable_header()->set_worker_id(worker);
    pull.mutable_pull()->set_min_version(1);
    return Exchange(
        {Push(worker, Bytes({1, 1, 1, 1}), 4), End(worker, 0), pull}, replies);
  };
  std::vector<PushPullResponse> replies0, replies1;
  grpc::Status status0;
  std::thread worker0([&] { status0 = step(0, &replies0); });
  const grpc::Status status1 = step(1, &replies1);
  worker0.join();
  ASSERT_TRUE(status0.ok()) << status0.error_message();
  ASSERT_TRUE(status1.ok()) << status1.error_message();
  for (const std::vector<PushPullResponse>* replies : {&replies0, &replies1}) {
    ASSERT_FALSE(replies->empty());
    EXPECT_TRUE(replies->back().last_of_pull());
    ASSERT_TRUE(replies->back().has_generation());
    EXPECT_EQ(replies->back().generation(), 1);
  }
  EXPECT_EQ(shard_->generation(), 1);
  EXPECT_EQ(shard_->membership().epoch, 1);
}

// A pull's last message announces the newest checkpoint begun, in the
// generation it was begun in only: after a reopen (or a restore) the cut
// of a checkpoint the dead generation abandoned is not announced, or the
// workers would write residual files for it that worker 0's next
// checkpoint of that step clears (composition_test's top-k jobs, killed
// mid-checkpoint, failed on the missing file).
TEST_F(PsServiceTest, ACheckpointCutIsAnnouncedInItsGenerationOnly) {
  auto pull = [&](int64_t generation) -> std::optional<int64_t> {
    PushPullRequest request;
    request.mutable_header()->set_job_id("job");
    request.mutable_header()->set_worker_id(1);
    request.mutable_header()->set_generation(generation);
    request.mutable_pull()->set_min_version(0);
    std::vector<PushPullResponse> replies;
    const grpc::Status status = Exchange({request}, &replies);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (replies.empty() || !replies.back().last_of_pull()) return -2;
    if (!replies.back().has_checkpoint_step()) return std::nullopt;
    return replies.back().checkpoint_step();
  };
  EXPECT_EQ(pull(0), std::nullopt);
  ASSERT_TRUE(Checkpoint(CheckpointOf(0, /*wait=*/false)).ok());
  ASSERT_TRUE(Checkpoint(CheckpointOf(0, /*wait=*/true)).ok());
  EXPECT_EQ(pull(0), 0);

  ASSERT_NO_FATAL_FAILURE(Reopen(1));
  EXPECT_EQ(pull(1), std::nullopt);
  CheckpointRequest again = CheckpointOf(0, /*wait=*/false);
  again.mutable_header()->set_generation(1);
  ASSERT_TRUE(Checkpoint(again).ok());
  again.set_wait(true);
  ASSERT_TRUE(Checkpoint(again).ok());
  EXPECT_EQ(pull(1), 0);
}

// WorkerDone with steps_ended (the async final weights' wait): a worker's
// steps count as ended in the generation it said so in; a restore or a
// reopen forgets it, and a worker saying so in an older generation is
// ABORTED (it recovers). Done counts as ended in any generation.
TEST_F(PsServiceTest, StepsEndedCountInTheirGenerationOnly) {
  WorkerDoneResponse r;
  ASSERT_TRUE(WorkerDone(1, /*generation=*/0, /*steps_ended=*/true, &r).ok());
  EXPECT_THAT(r.training_ids(), ElementsAre(0));
  EXPECT_EQ(r.workers_remaining(), 2);
  ASSERT_TRUE(WorkerDone(0, /*generation=*/0, /*steps_ended=*/true, &r).ok());
  EXPECT_EQ(r.training_ids_size(), 0);

  ASSERT_NO_FATAL_FAILURE(Reopen(1));
  const grpc::Status stale =
      WorkerDone(1, /*generation=*/0, /*steps_ended=*/true, &r);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(stale.error_message(), HasSubstr("is at generation 1"));
  ASSERT_TRUE(WorkerDone(1, /*generation=*/1, /*steps_ended=*/true, &r).ok());
  EXPECT_THAT(r.training_ids(), ElementsAre(0));  // said in generation 0
  ASSERT_TRUE(WorkerDone(0, /*generation=*/1, /*steps_ended=*/false, &r).ok());
  EXPECT_EQ(r.training_ids_size(), 0);
  EXPECT_EQ(r.workers_remaining(), 1);
  EXPECT_FALSE(service_->all_workers_done().HasBeenNotified());
}

// A worker removed after its death never ends its steps: the others do not
// wait for it (its done is still waited for by the shard's exit).
TEST_F(PsServiceTest, StepsEndedLeaveOutWorkersRemovedAfterTheirDeath) {
  WorkerDoneResponse r;
  ASSERT_TRUE(WorkerDone(1, /*generation=*/0, /*steps_ended=*/true, &r).ok());
  EXPECT_THAT(r.training_ids(), ElementsAre(0));
  service_->SetRemovedWorkers({0, 7, -1});  // out of range: ignored
  ASSERT_TRUE(WorkerDone(1, /*generation=*/0, /*steps_ended=*/true, &r).ok());
  EXPECT_EQ(r.training_ids_size(), 0);
  EXPECT_EQ(r.workers_remaining(), 2);
}

// A stream that sends pulls for a version that never comes, without
// reading, is refused once its queue is full (RESOURCE_EXHAUSTED) instead
// of growing it without bound.
TEST_F(PsServiceTest, PullsWaitingOnOneStreamAreCapped) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  auto stream = stub_->PushPull(&context);
  PushPullRequest pull;
  pull.mutable_header()->set_job_id("job");
  pull.mutable_header()->set_worker_id(1);
  pull.mutable_pull()->set_min_version(5);
  int written = 0;
  for (; written < 3000; ++written) {
    if (!stream->Write(pull)) break;
  }
  stream->WritesDone();
  PushPullResponse reply;
  while (stream->Read(&reply)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message() << " after " << written << " pulls";
  EXPECT_THAT(status.error_message(), HasSubstr("pulls waiting"));
}

// Bounded staleness 1: a checkpoint's cut is deferred until every chunk
// reaches it. Cut 1 needs both workers' pushes of step 0, which never come
// here. Every wait on it ends by its call's deadline with a status that
// names it, and the shard still shuts down at once: a Checkpoint handler
// once parked past its deadline (holding a layout use) behind a writer
// that only the service's destructor, after the server's Shutdown, would
// stop, so the shard's process never exited.
TEST_F(PsServiceTest, CheckpointWaitsForACutThatNeverComesEndByTheirDeadline) {
  ShardOptions options = BaseOptions();
  options.staleness = 1;
  ASSERT_NO_FATAL_FAILURE(Serve(options, absl::Seconds(10)));
  ASSERT_TRUE(Checkpoint(CheckpointOf(1, /*wait=*/false)).ok());

  absl::Time start = absl::Now();
  const grpc::Status waited =
      Checkpoint(CheckpointOf(1, /*wait=*/true), nullptr, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(waited.error_message(),
            "shard 0: checkpoint of step 1 is still being written");

  // The next checkpoint does not park behind it past its own deadline.
  start = absl::Now();
  const grpc::Status again =
      Checkpoint(CheckpointOf(1, /*wait=*/false), nullptr, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(again.error_message(),
              HasSubstr("shard 0: checkpoint of step 1 is still being "
                        "written"));

  // Shutdown: Close() (pstrain_ps calls it first) ends a call still
  // waiting and the writer's wait, so the server's Shutdown, which waits
  // for every handler, ends at once.
  grpc::Status closed;
  std::thread waiting([&] {
    closed =
        Checkpoint(CheckpointOf(1, /*wait=*/true), nullptr, absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(300));
  service_->Close();
  absl::Notification shut_down;
  std::thread shutdown([&] {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    shut_down.Notify();
  });
  const bool ended = shut_down.WaitForNotificationWithTimeout(absl::Seconds(4));
  EXPECT_TRUE(ended) << "the server's Shutdown still waits for a handler";
  if (!ended) {
    // Leaked: their destructors would wait for the stuck handler too.
    shutdown.detach();
    waiting.detach();
    server_.release();
    service_.release();
    shard_.release();
    return;
  }
  shutdown.join();
  waiting.join();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(closed.error_message(),
            "shard 0 is shutting down: it takes no more checkpoints");
}

// A wait without a deadline ends too: the shard's pull timeout caps every
// checkpoint wait, and the writer gives a cut that has not come by then up
// (DEADLINE_EXCEEDED naming the chunks short of it), so that the next
// checkpoint can begin.
TEST_F(PsServiceTest, ACheckpointWaitWithoutADeadlineEndsWithinThePullTimeout) {
  ShardOptions options = BaseOptions();
  options.staleness = 1;
  ASSERT_NO_FATAL_FAILURE(Serve(options, absl::Seconds(1)));
  ASSERT_TRUE(Checkpoint(CheckpointOf(1, /*wait=*/false)).ok());
  grpc::Status waited;
  absl::Notification answered;
  const absl::Time start = absl::Now();
  std::thread caller([&] {
    waited = Checkpoint(CheckpointOf(1, /*wait=*/true), nullptr,
                        absl::InfiniteDuration());
    answered.Notify();
  });
  const bool ended = answered.WaitForNotificationWithTimeout(absl::Seconds(4));
  EXPECT_TRUE(ended) << "a wait without a deadline waits on";
  if (!ended) service_->Close();  // ends it, so that it can be joined
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << waited.error_message();
  // The writer gave the cut up: a new checkpoint begins at once.
  absl::SleepFor(absl::Milliseconds(300));
  const grpc::Status begun =
      Checkpoint(CheckpointOf(1, /*wait=*/false), nullptr, absl::Seconds(1));
  EXPECT_TRUE(begun.ok()) << begun.error_message();
}

// A refused checkpoint makes nothing on the shard's host: the step folder
// is made only for a cut the shard writes. Refused: a step the chunks are
// not at (sync), a deferred cut far ahead of every chunk (staleness), a
// step behind the last one begun in the generation (async).
TEST_F(PsServiceTest, ARefusedCheckpointLeavesNoFolder) {
  auto folder = [&](int64_t step) {
    return std::filesystem::exists(checkpoint_root_ + "/step-" +
                                   std::to_string(step));
  };
  grpc::Status status = Checkpoint(CheckpointOf(5, /*wait=*/false));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("is at version 0"));
  EXPECT_FALSE(folder(5));
  CheckpointRequest other = CheckpointOf(6, /*wait=*/false);
  other.mutable_header()->set_worker_id(1);
  EXPECT_EQ(Checkpoint(other).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(folder(6));
  ASSERT_TRUE(Checkpoint(CheckpointOf(0, /*wait=*/false)).ok());
  EXPECT_TRUE(folder(0));

  ShardOptions staleness = BaseOptions();
  staleness.staleness = 1;
  ASSERT_NO_FATAL_FAILURE(Serve(staleness, absl::Seconds(5)));
  status = Checkpoint(CheckpointOf(1000000, /*wait=*/false));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "checkpoint of step 1000000 on shard 0: chunk (0, 0) is at "
            "version 0, more than 3 steps behind it (a cut is at most that "
            "far ahead of the shard)");
  EXPECT_FALSE(folder(1000000));
  // As far ahead as a worker 0 can ask for: registered.
  ASSERT_TRUE(Checkpoint(CheckpointOf(3, /*wait=*/false)).ok());
  EXPECT_TRUE(folder(3));

  ShardOptions async = BaseOptions();
  async.mode = SyncMode::kAsync;
  ASSERT_NO_FATAL_FAILURE(Serve(async, absl::Seconds(5)));
  ASSERT_TRUE(Checkpoint(CheckpointOf(20, /*wait=*/false)).ok());
  ASSERT_TRUE(Checkpoint(CheckpointOf(20, /*wait=*/true)).ok());
  status = Checkpoint(CheckpointOf(10, /*wait=*/false));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "shard 0 began a checkpoint of step 20 in generation 0 already; "
            "a checkpoint of step 10 is behind it");
  EXPECT_FALSE(folder(10));
  EXPECT_TRUE(Checkpoint(CheckpointOf(20, /*wait=*/false)).ok());  // again
}

// A cosine schedule's horizon (InitRequest.lr_total_steps) changes only
// with an Init the shard takes: a refused one (a repeated chunk, a restore
// at a generation not above the shard's, a reopen carrying chunks or at
// an older generation) leaves it as it was.
TEST_F(PsServiceTest, ARefusedInitLeavesTheLrHorizon) {
  ShardOptions options = BaseOptions();
  options.adam.schedule.decay = LrDecay::kCosine;
  options.adam.schedule.total_steps = 0;  // worker 0's count
  ASSERT_NO_FATAL_FAILURE(Serve(options, absl::Seconds(5)));
  ASSERT_TRUE(shard_->SetLrHorizon(10).ok());  // as the first Init's

  auto init = [&](int64_t generation, bool reopen, int num_chunks) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    InitResponse response;
    auto writer = stub_->Init(&context, &response);
    InitRequest first;
    first.mutable_header()->set_job_id("job");
    first.mutable_header()->set_worker_id(0);
    first.mutable_layout()->add_param_num_elements(4);
    first.mutable_layout()->set_partition_bytes(16);
    first.set_generation(generation);
    first.set_lr_total_steps(50);
    first.set_reopen(reopen);
    first.set_reopen_version(-1);
    writer->Write(first);
    InitRequest chunk;
    chunk.mutable_header()->set_job_id("job");
    chunk.mutable_header()->set_worker_id(0);
    chunk.mutable_chunk()->set_dtype(DTYPE_FLOAT32);
    chunk.mutable_chunk()->set_num_elements(4);
    chunk.mutable_chunk()->set_data(Bytes({9, 9, 9, 9}));
    for (int i = 0; i < num_chunks; ++i) writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  struct Refused {
    int64_t generation;
    bool reopen;
    int num_chunks;
    grpc::StatusCode code;
  };
  for (const Refused& r : {
           Refused{1, false, 2, grpc::StatusCode::INVALID_ARGUMENT},
           Refused{0, false, 1, grpc::StatusCode::FAILED_PRECONDITION},
           Refused{1, true, 1, grpc::StatusCode::INVALID_ARGUMENT},
           Refused{0, true, 0, grpc::StatusCode::FAILED_PRECONDITION},
       }) {
    const grpc::Status status = init(r.generation, r.reopen, r.num_chunks);
    EXPECT_EQ(status.error_code(), r.code) << status.error_message();
    EXPECT_EQ(shard_->lr_horizon(), 10) << status.error_message();
  }
  const grpc::Status reopened = init(1, /*reopen=*/true, 0);
  ASSERT_TRUE(reopened.ok()) << reopened.error_message();
  EXPECT_EQ(shard_->lr_horizon(), 50);
}

TEST(ShardCheckpointPathTest, BuildsTheFileUnderRootAndMakesTheStepFolder) {
  const std::string root = ::testing::TempDir() + "/shard_path_root";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  absl::StatusOr<std::string> path = ShardCheckpointPath(root, 200, 3);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, root + "/step-200/shard-3.safetensors");
  EXPECT_TRUE(std::filesystem::is_directory(root + "/step-200"));
}

TEST(ShardCheckpointPathTest, RefusesWhatIsNotAFolderInsideRoot) {
  const std::string root = ::testing::TempDir() + "/shard_path_refuse";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/real");
  // A plain file where the step folder goes.
  {
    std::FILE* f = std::fopen((root + "/step-1").c_str(), "w");
    std::fclose(f);
  }
  EXPECT_EQ(ShardCheckpointPath(root, 1, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A link to a folder inside ROOT still resolves elsewhere than step-2.
  std::filesystem::create_directory_symlink(root + "/real", root + "/step-2");
  EXPECT_EQ(ShardCheckpointPath(root, 2, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A dangling link (to a path the shard would create) is refused too.
  std::filesystem::create_symlink("/nonexistent/x", root + "/step-3");
  EXPECT_EQ(ShardCheckpointPath(root, 3, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ShardCheckpointPath(root, -1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardCheckpointPath("", 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShardCheckpointPath(root + "/missing", 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pstrain
