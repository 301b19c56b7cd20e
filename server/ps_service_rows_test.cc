// Row-sparse tables through the gRPC service (issue 41), spoken by a plain
// protobuf client: the layout's row widths in Init and WaitReady, row
// pushes, pulls of the rows asked for (fp32 and bf16), and malformed row
// pushes and pulls refused with INVALID_ARGUMENT.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/grpc_server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "optim/sparse_adam.h"
#include "server/ps_service.h"

namespace pstrain {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A table of 8 rows of 2 (param 0, one chunk) and a dense tensor of 2; one
// sync worker; Adam lr 0.1.
class PsServiceRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions options;
    options.job_id = "job";
    options.num_workers = 1;
    options.mode = SyncMode::kSync;
    options.adam.lr = 0.1f;
    shard_ = std::make_unique<ParameterShard>(options);
    service_ = std::make_unique<PsService>(shard_.get(), absl::Seconds(5));
    absl::StatusOr<ListeningServer> listening =
        StartGrpcServer("127.0.0.1:0", service_.get(), "");
    ASSERT_TRUE(listening.ok()) << listening.status();
    server_ = std::move(listening->server);
    stub_ = ParameterServer::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(listening->port),
                            grpc::InsecureChannelCredentials()));
    // Init over the wire, with the layout's row widths.
    grpc::ClientContext context;
    InitResponse response;
    auto writer = stub_->Init(&context, &response);
    InitRequest first;
    *first.mutable_header() = Header();
    for (int64_t n : {16, 2}) first.mutable_layout()->add_param_num_elements(n);
    for (int64_t d : {2, 0}) first.mutable_layout()->add_param_row_elements(d);
    first.mutable_layout()->set_partition_bytes(64);
    ASSERT_TRUE(writer->Write(first));
    for (int p = 0; p < 2; ++p) {
      InitRequest chunk;
      *chunk.mutable_header() = Header();
      TensorChunk* c = chunk.mutable_chunk();
      c->mutable_key()->set_param_id(p);
      c->set_dtype(DTYPE_FLOAT32);
      const std::vector<float>& values = p == 0 ? table_ : dense_;
      c->set_num_elements(static_cast<int64_t>(values.size()));
      c->set_data(Bytes(values));
      ASSERT_TRUE(writer->Write(chunk));
    }
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  static RequestHeader Header() {
    RequestHeader header;
    header.set_job_id("job");
    header.set_worker_id(0);
    return header;
  }
  static std::string Bytes(const std::vector<float>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
  }
  static std::string Ids(const std::vector<uint32_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()),
                       ids.size() * sizeof(uint32_t));
  }
  // Row offsets as the wire's gaps (TensorChunk.index_gaps).
  static std::vector<uint32_t> Gaps(const std::vector<uint32_t>& rows) {
    std::vector<uint32_t> gaps;
    uint32_t before = 0;
    for (uint32_t row : rows) {
      gaps.push_back(row - before);
      before = row;
    }
    return gaps;
  }
  static PushPullRequest RowPush(const std::vector<uint32_t>& rows,
                                 const std::vector<float>& values) {
    PushPullRequest request;
    *request.mutable_header() = Header();
    TensorChunk* chunk = request.mutable_push();
    chunk->mutable_key()->set_param_id(0);
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(16);
    chunk->set_sparse(true);
    chunk->set_row_elements(2);
    for (uint32_t gap : Gaps(rows)) chunk->add_index_gaps(gap);
    chunk->set_data(Bytes(values));
    return request;
  }
  static PushPullRequest DensePush() {
    PushPullRequest request;
    *request.mutable_header() = Header();
    TensorChunk* chunk = request.mutable_push();
    chunk->mutable_key()->set_param_id(1);
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(2);
    chunk->set_data(Bytes({1, 1}));
    return request;
  }
  static PushPullRequest End() {
    PushPullRequest request;
    *request.mutable_header() = Header();
    request.mutable_step_end()->set_step(0);
    return request;
  }
  static PushPullRequest PullOf(const std::vector<uint32_t>& rows,
                                int64_t min_version = 1) {
    PushPullRequest request;
    *request.mutable_header() = Header();
    request.mutable_pull()->set_min_version(min_version);
    PullRows* entry = request.mutable_pull()->add_rows();
    entry->set_param_id(0);
    entry->set_row_ids(Ids(rows));
    return request;
  }

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

  const std::vector<float> table_ = {0, 1, 2,  3,  4,  5,  6,  7,
                                     8, 9, 10, 11, 12, 13, 14, 15};
  const std::vector<float> dense_ = {-1, -2};
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(PsServiceRowsTest, WaitReadyReturnsTheRowWidths) {
  grpc::ClientContext context;
  WaitReadyRequest request;
  *request.mutable_header() = Header();
  WaitReadyResponse response;
  ASSERT_TRUE(stub_->WaitReady(&context, request, &response).ok());
  EXPECT_THAT(response.layout().param_row_elements(),
              ::testing::ElementsAre(2, 0));
}

TEST_F(PsServiceRowsTest, PushesRowsAndPullsTheRowsAskedFor) {
  std::vector<PushPullResponse> replies;
  const std::vector<float> g = {0.5f, -1.0f, 2.0f, 0.25f};
  ASSERT_TRUE(
      Exchange({RowPush({1, 5}, g), DensePush(), End(), PullOf({0, 5, 7})},
               &replies)
          .ok());
  // The table's chunk with rows 0, 5, 7; the dense tensor whole; the end.
  ASSERT_EQ(replies.size(), 3u);
  const TensorChunk* rows = nullptr;
  for (const PushPullResponse& r : replies) {
    if (r.has_chunk() && r.chunk().key().param_id() == 0) rows = &r.chunk();
  }
  ASSERT_NE(rows, nullptr);
  EXPECT_TRUE(rows->sparse());
  EXPECT_EQ(rows->row_elements(), 2);
  EXPECT_EQ(rows->version(), 1);
  EXPECT_THAT(rows->index_gaps(), ElementsAreArray(Gaps({0, 5, 7})));
  std::vector<float> w = table_, m(16, 0.0f), v(16, 0.0f);
  AdamOptions adam;
  adam.lr = 0.1f;
  const std::vector<uint32_t> touched = {1, 5};
  SparseAdamRows(adam, 1, 2, touched, g.data(), w.data(), m.data(), v.data());
  EXPECT_EQ(rows->data(), Bytes({w[0], w[1], w[10], w[11], w[14], w[15]}));
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_NE(w[10], 10.0f);

  // bf16: 2 bytes a value, the same rows.
  replies.clear();
  PushPullRequest bf16 = PullOf({5}, 0);
  bf16.mutable_pull()->set_wire_dtype(DTYPE_BFLOAT16);
  ASSERT_TRUE(Exchange({bf16}, &replies).ok());
  for (const PushPullResponse& r : replies) {
    if (!r.has_chunk() || r.chunk().key().param_id() != 0) continue;
    EXPECT_EQ(r.chunk().dtype(), DTYPE_BFLOAT16);
    EXPECT_EQ(r.chunk().data().size(), 4u);
    EXPECT_THAT(r.chunk().index_gaps(), ElementsAreArray(Gaps({5})));
  }
}

TEST_F(PsServiceRowsTest, MalformedRowPushesAndPullsAreInvalidArgument) {
  struct Case {
    PushPullRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({RowPush({1, 1}, {1, 2, 3, 4}), "strictly ascending"});
  cases.push_back({RowPush({8}, {1, 2}), "below 8"});
  cases.push_back({RowPush({1}, {1, 2, 3}), "value bytes"});
  PushPullRequest wrong_width = RowPush({1}, {1, 2, 3, 4});
  wrong_width.mutable_push()->set_row_elements(4);
  cases.push_back({wrong_width, "expected a sparse chunk of rows of 2"});
  cases.push_back({PullOf({3, 3}), "strictly ascending ids below 8"});
  cases.push_back({PullOf({8}), "strictly ascending ids below 8"});
  PushPullRequest dense_rows = PullOf({0});
  dense_rows.mutable_pull()->mutable_rows(0)->set_param_id(1);
  cases.push_back({dense_rows, "expected a row-sparse tensor"});
  PushPullRequest twice = PullOf({0});
  *twice.mutable_pull()->add_rows() = twice.pull().rows(0);
  cases.push_back({twice, "twice"});
  PushPullRequest three = twice;
  *three.mutable_pull()->add_rows() = twice.pull().rows(0);
  cases.push_back({three, "the layout has 2 tensors"});
  PushPullRequest odd = PullOf({0});
  odd.mutable_pull()->mutable_rows(0)->mutable_row_ids()->push_back('x');
  cases.push_back({odd, "4 per row id"});
  for (const Case& c : cases) {
    std::vector<PushPullResponse> replies;
    const grpc::Status status = Exchange({c.request}, &replies);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.message;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // Nothing changed: the shard is still at version 0 with its weights.
  std::vector<PushPullResponse> replies;
  ASSERT_TRUE(Exchange({PullOf({0, 1, 2, 3, 4, 5, 6, 7}, 0)}, &replies).ok());
  ASSERT_FALSE(replies.empty());
  for (const PushPullResponse& r : replies) {
    if (r.has_chunk() && r.chunk().key().param_id() == 0) {
      EXPECT_EQ(r.chunk().data(), Bytes(table_));
      EXPECT_EQ(r.chunk().version(), 0);
    }
  }
}

}  // namespace
}  // namespace pstrain
