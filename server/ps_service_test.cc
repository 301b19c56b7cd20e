// PsService's PushPull over a real gRPC server, spoken to with the plain
// protobuf stub: the ByteBuffer path (common/chunk_message.h) must accept
// what any protobuf client sends, answer in messages protobuf parses, and
// reject malformed or wrong-shaped pushes with INVALID_ARGUMENT without
// touching the shard's state.
#include "server/ps_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/chunk_message.h"
#include "common/grpc_server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/adam.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// One parameter of 4 elements in one chunk; 2 sync workers.
class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions options;
    options.job_id = "job";
    options.num_workers = 2;
    options.mode = SyncMode::kSync;
    options.adam.lr = 0.1f;
    shard_ = std::make_unique<ParameterShard>(options);
    std::vector<InitChunk> chunks(1);
    chunks[0].values = {1, 2, 3, 4};
    ASSERT_TRUE(shard_->Initialize({4}, 16, std::move(chunks)).ok());
    service_ = std::make_unique<PsService>(shard_.get(), absl::Seconds(5));
    absl::StatusOr<ListeningServer> listening =
        StartGrpcServer("127.0.0.1:0", service_.get(), "");
    ASSERT_TRUE(listening.ok()) << listening.status();
    server_ = std::move(listening->server);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(listening->port),
                            grpc::InsecureChannelCredentials());
    stub_ = ParameterServer::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
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
