#include "common/chunk_message.h"

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/nonfinite.h"
#include "common/tensor_codec.h"
#include "common/wire_dtype.h"
#include "gmock/gmock.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

// `bytes` as a received message arrives: in slices of `size` bytes (the
// last shorter).
grpc::ByteBuffer InSlices(const std::string& bytes, size_t size) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += size) {
    slices.emplace_back(bytes.substr(at, size));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer FromBytes(const std::string& bytes) {
  const grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

PushPullRequest PushEnvelope() {
  PushPullRequest request;
  request.mutable_header()->set_job_id("job-7");
  request.mutable_header()->set_worker_id(3);
  return request;
}

TEST(ChunkMessageTest, EncodedPushParsesAsTheProtobufMessage) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f};
  const grpc::ByteBuffer buffer =
      EncodeChunkMessage(PushEnvelope(), kPushChunkField, 4, 2, 17, values);
  PushPullRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.header().job_id(), "job-7");
  EXPECT_EQ(parsed.header().worker_id(), 3);
  ASSERT_TRUE(parsed.has_push());
  EXPECT_EQ(parsed.push().key().param_id(), 4);
  EXPECT_EQ(parsed.push().key().chunk_index(), 2);
  EXPECT_EQ(parsed.push().dtype(), DTYPE_FLOAT32);
  EXPECT_EQ(parsed.push().num_elements(), 5);
  EXPECT_EQ(parsed.push().version(), 17);
  ASSERT_EQ(parsed.push().data().size(), values.size() * 4);
  std::vector<float> decoded(values.size());
  std::memcpy(decoded.data(), parsed.push().data().data(), values.size() * 4);
  EXPECT_THAT(decoded, ElementsAreArray(values));
}

// A message serialised by protobuf itself (data before version, one slice
// per message) reads the same: the reader does not depend on field order.
TEST(ChunkMessageTest, SparseChunkDensifiesWithZerosElsewhere) {
  const std::vector<uint32_t> indices = {0, 3, 9};
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    grpc::ByteBuffer buffer = EncodeSparseChunkMessage(
        PushEnvelope(), kPushChunkField, 1, 0, 5, 10, indices, values, wire);
    PushPullRequest plain;
    ASSERT_TRUE(plain.ParseFromString(Flatten(buffer)));
    EXPECT_TRUE(plain.push().sparse());
    EXPECT_EQ(plain.push().num_elements(), 10);
    // Offsets 0, 3, 9 as gaps 0, 3, 6: one varint byte each.
    EXPECT_THAT(plain.push().index_gaps(), ElementsAreArray({0u, 3u, 6u}));
    ReceivedChunkMessage received;
    PushPullRequest envelope;
    ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
    std::vector<float> out(10, 7.0f);
    ASSERT_TRUE(received.CopyFloatPayload(absl::MakeSpan(out)).ok())
        << WireDtypeSpelling(wire);
    // The three values are exact in every format.
    EXPECT_THAT(out, ElementsAreArray({1.5f, 0.0f, 0.0f, -2.0f, 0.0f, 0.0f,
                                       0.0f, 0.0f, 0.0f, 3.25f}));
  }
}

// A delta pull (PullRequest.have_version) scatters its entries over the
// worker's copy and leaves the rest; one of no entries (an update that
// changed nothing) leaves it all.
TEST(ChunkMessageTest, DeltaPullScattersItsEntriesOnly) {
  const PushPullResponse no_fields;
  for (const std::vector<uint32_t>& indices :
       {std::vector<uint32_t>{2, 5}, std::vector<uint32_t>{}}) {
    const std::vector<float> values(indices.size(), -1.25f);
    grpc::ByteBuffer buffer =
        EncodeSparseChunkMessage(no_fields, kPullChunkField, 0, 0, 3, 8,
                                 indices, values, DTYPE_BFLOAT16);
    ReceivedChunkMessage received;
    PushPullResponse envelope;
    ASSERT_TRUE(received.Parse(&buffer, kPullChunkField, &envelope).ok());
    ASSERT_TRUE(received.has_chunk());
    std::vector<float> mine(8, 7.0f);
    ASSERT_TRUE(received.ScatterFloatPayload(absl::MakeSpan(mine)).ok());
    std::vector<float> expected(8, 7.0f);
    for (uint32_t i : indices) expected[i] = -1.25f;
    EXPECT_EQ(mine, expected);
  }
}

TEST(ChunkMessageTest, RejectsBadSparseChunks) {
  auto parse = [](const PushPullRequest& request, int64_t n) {
    grpc::ByteBuffer buffer = FromBytes(request.SerializeAsString());
    ReceivedChunkMessage received;
    PushPullRequest envelope;
    EXPECT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
    std::vector<float> out(n);
    return received.CopyFloatPayload(absl::MakeSpan(out));
  };
  // The offsets as the wire carries them: gaps (TensorChunk.index_gaps).
  auto sparse = [](std::vector<uint32_t> gaps, int values) {
    PushPullRequest request = PushEnvelope();
    TensorChunk* chunk = request.mutable_push();
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(8);
    chunk->set_sparse(true);
    for (uint32_t gap : gaps) chunk->add_index_gaps(gap);
    chunk->set_data(std::string(values * 4, '\0'));
    return request;
  };
  EXPECT_TRUE(parse(sparse({1, 1, 5}, 3), 8).ok());  // offsets 1, 2, 7
  // A repeated offset (a gap of 0 after the first).
  EXPECT_THAT(parse(sparse({1, 0}, 2), 8).message(),
              HasSubstr("strictly ascending"));
  EXPECT_THAT(parse(sparse({1, 7}, 2), 8).message(), HasSubstr("below 8"));
  // A gap that a 32-bit running sum would wrap back to offset 0.
  EXPECT_THAT(parse(sparse({1, 0xffffffffu}, 2), 8).message(),
              HasSubstr("is 4294967296; expected strictly ascending indices "
                        "below 8"));
  EXPECT_THAT(parse(sparse({1, 1}, 3), 8).message(),
              HasSubstr("one 4-byte value per index"));
  EXPECT_THAT(parse(sparse({1, 1}, 2), 9).message(), HasSubstr("expected 9"));
  EXPECT_THAT(parse(sparse({0, 1, 1, 1, 1, 1, 1, 1, 1}, 9), 8).message(),
              HasSubstr("at most 8 indices"));
  PushPullRequest dense_with_indices = sparse({1}, 8);
  dense_with_indices.mutable_push()->set_sparse(false);
  EXPECT_THAT(parse(dense_with_indices, 8).message(), HasSubstr("not sparse"));
}

// Row-sparse chunks (an embedding table's rows; issue 41): row offsets,
// D values per row, in every wire dtype; kept sparse for the shard, or
// scattered into a pulled table leaving the other rows.
TEST(ChunkMessageTest, RowSparseChunkRoundTrips) {
  const std::vector<uint32_t> rows = {0, 2};
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.5f, 0.0f, -1.0f};
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    grpc::ByteBuffer buffer =
        EncodeSparseChunkMessage(PushEnvelope(), kPushChunkField, 1, 0, 5, 12,
                                 rows, values, wire, /*row_elements=*/3);
    const std::string bytes = Flatten(buffer);
    PushPullRequest plain;
    ASSERT_TRUE(plain.ParseFromString(bytes));
    EXPECT_EQ(plain.push().row_elements(), 3);
    EXPECT_THAT(plain.push().index_gaps(), ElementsAreArray({0u, 2u}));
    ReceivedChunkMessage received;
    PushPullRequest envelope;
    ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
    std::vector<uint32_t> got_rows;
    std::vector<float> got_values;
    ASSERT_TRUE(received.CopyRowsPayload(12, 3, &got_rows, &got_values).ok());
    EXPECT_EQ(got_rows, rows);
    EXPECT_EQ(got_values, values);  // exact in every format
    std::vector<float> table(12, 7.0f);
    ASSERT_TRUE(received.ScatterFloatPayload(absl::MakeSpan(table)).ok());
    EXPECT_THAT(table, ElementsAreArray({1.5f, -2.0f, 3.25f, 7.0f, 7.0f, 7.0f,
                                         0.5f, 0.0f, -1.0f, 7.0f, 7.0f, 7.0f}));
    ASSERT_TRUE(received.CopyFloatPayload(absl::MakeSpan(table)).ok());
    EXPECT_THAT(table, ElementsAreArray({1.5f, -2.0f, 3.25f, 0.0f, 0.0f, 0.0f,
                                         0.5f, 0.0f, -1.0f, 0.0f, 0.0f, 0.0f}));
    // The shard's row path refuses another row width and a dense chunk.
    EXPECT_EQ(received.CopyRowsPayload(12, 4, &got_rows, &got_values).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ChunkMessageTest, RejectsBadRowSparseChunks) {
  auto rows_of = [](const PushPullRequest& request, int64_t n, int64_t d) {
    grpc::ByteBuffer buffer = FromBytes(request.SerializeAsString());
    ReceivedChunkMessage received;
    PushPullRequest envelope;
    EXPECT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
    std::vector<uint32_t> rows;
    std::vector<float> values;
    return received.CopyRowsPayload(n, d, &rows, &values);
  };
  // 4 rows of 3 elements.
  // The row offsets as the wire carries them: gaps (TensorChunk.index_gaps).
  auto sparse = [](std::vector<uint32_t> gaps, int values, int64_t d = 3) {
    PushPullRequest request = PushEnvelope();
    TensorChunk* chunk = request.mutable_push();
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(12);
    chunk->set_sparse(true);
    chunk->set_row_elements(d);
    for (uint32_t gap : gaps) chunk->add_index_gaps(gap);
    chunk->set_data(std::string(values * 4, '\0'));
    return request;
  };
  EXPECT_TRUE(rows_of(sparse({0, 3}, 6), 12, 3).ok());  // rows 0 and 3
  EXPECT_TRUE(rows_of(sparse({}, 0), 12, 3).ok());
  // A duplicate row, a row id past the chunk (directly, by the sum of the
  // gaps, or by a sum that 32 bits would wrap).
  EXPECT_THAT(rows_of(sparse({1, 0}, 6), 12, 3).message(),
              HasSubstr("strictly ascending row indices below 4"));
  EXPECT_THAT(rows_of(sparse({1, 3}, 6), 12, 3).message(),
              HasSubstr("below 4"));
  EXPECT_THAT(rows_of(sparse({0xffffffffu}, 3), 12, 3).message(),
              HasSubstr("below 4"));
  EXPECT_THAT(rows_of(sparse({2, 0xfffffffeu}, 6), 12, 3).message(),
              HasSubstr("below 4"));
  // Values not D per row; more rows than the chunk has.
  EXPECT_THAT(rows_of(sparse({1, 1}, 5), 12, 3).message(),
              HasSubstr("3 4-byte values per index"));
  EXPECT_THAT(rows_of(sparse({0, 1, 1, 1, 1}, 15), 12, 3).message(),
              HasSubstr("at most 4 indices"));
  // A row width that does not divide the chunk, or a negative one.
  EXPECT_THAT(rows_of(sparse({0}, 5, 5), 12, 5).message(),
              HasSubstr("5 elements per row"));
  EXPECT_EQ(rows_of(sparse({0}, 3, -3), 12, 3).code(),
            absl::StatusCode::kInvalidArgument);
  // Element offsets (top-k) or a dense chunk where rows are expected.
  EXPECT_THAT(rows_of(sparse({0, 5}, 2, 0), 12, 3).message(),
              HasSubstr("expected a sparse chunk of rows of 3 elements"));
}

TEST(ChunkMessageTest, ReadsMessagesSerialisedByProtobuf) {
  PushPullResponse response;
  TensorChunk* chunk = response.mutable_chunk();
  chunk->mutable_key()->set_param_id(1);
  chunk->mutable_key()->set_chunk_index(9);
  chunk->set_dtype(DTYPE_FLOAT32);
  chunk->set_num_elements(3);
  const float values[3] = {7.0f, 8.5f, -9.0f};
  chunk->set_data(reinterpret_cast<const char*>(values), sizeof(values));
  chunk->set_version(42);
  grpc::ByteBuffer buffer = FromBytes(response.SerializeAsString());

  ReceivedChunkMessage received;
  PushPullResponse envelope;
  ASSERT_TRUE(received.Parse(&buffer, kPullChunkField, &envelope).ok());
  EXPECT_FALSE(envelope.has_chunk());
  EXPECT_FALSE(envelope.last_of_pull());
  ASSERT_TRUE(received.has_chunk());
  EXPECT_EQ(received.chunk().key().param_id(), 1);
  EXPECT_EQ(received.chunk().key().chunk_index(), 9);
  EXPECT_EQ(received.chunk().version(), 42);
  EXPECT_TRUE(received.chunk().data().empty());
  EXPECT_EQ(received.payload_bytes(), 12);
  std::vector<float> out(3);
  ASSERT_TRUE(received.CopyFloatPayload(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAreArray(values));
}

// Round trip through the encoder with a payload spread over many slices on
// the receiving side (as gRPC delivers a large message).
TEST(ChunkMessageTest, RoundTripOverManySlices) {
  std::vector<float> values(10000);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(i) * 0.5f - 7.0f;
  }
  PushPullResponse last;
  const std::string bytes =
      Flatten(EncodeChunkMessage(last, kPullChunkField, 0, 5, 3, values));
  grpc::ByteBuffer buffer = InSlices(bytes, 1000);
  ReceivedChunkMessage received;
  PushPullResponse envelope;
  ASSERT_TRUE(received.Parse(&buffer, kPullChunkField, &envelope).ok());
  EXPECT_EQ(received.chunk().version(), 3);
  std::vector<float> out(values.size());
  ASSERT_TRUE(received.CopyFloatPayload(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAreArray(values));
}

TEST(ChunkMessageTest, MessageWithoutChunk) {
  PushPullRequest pull = PushEnvelope();
  pull.mutable_pull()->set_min_version(6);
  grpc::ByteBuffer buffer = EncodeSmallMessage(pull);
  ReceivedChunkMessage received;
  PushPullRequest envelope;
  ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
  EXPECT_FALSE(received.has_chunk());
  EXPECT_EQ(envelope.pull().min_version(), 6);
  EXPECT_EQ(envelope.header().worker_id(), 3);
  std::vector<float> out(1);
  EXPECT_FALSE(received.CopyFloatPayload(absl::MakeSpan(out)).ok());
}

TEST(ChunkMessageTest, RejectsWrongSizesAndDtypes) {
  const std::vector<float> values(4, 1.0f);
  PushPullRequest request = PushEnvelope();
  grpc::ByteBuffer buffer =
      EncodeChunkMessage(request, kPushChunkField, 0, 0, 0, values);
  ReceivedChunkMessage received;
  ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &request).ok());
  std::vector<float> out(5, -1.0f);
  const absl::Status status = received.CopyFloatPayload(absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("chunk (0, 0) has 4 elements"));
  EXPECT_THAT(out, ElementsAreArray(std::vector<float>(5, -1.0f)));

  // num_elements that does not match the payload.
  PushPullRequest lying = PushEnvelope();
  lying.mutable_push()->set_dtype(DTYPE_FLOAT32);
  lying.mutable_push()->set_num_elements(3);
  lying.mutable_push()->set_data(std::string(8, '\0'));
  buffer = FromBytes(lying.SerializeAsString());
  ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &request).ok());
  EXPECT_THAT(received.CheckFloat(3).message(),
              HasSubstr("carries 8 bytes for 3 fp32 elements"));

  PushPullRequest untyped = PushEnvelope();
  untyped.mutable_push()->set_num_elements(0);
  buffer = FromBytes(untyped.SerializeAsString());
  ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &request).ok());
  EXPECT_THAT(received.CheckFloat(0).message(),
              HasSubstr("dtype DTYPE_UNSPECIFIED; expected DTYPE_FLOAT32"));

  // A dtype number the protocol does not define is named by its number.
  PushPullRequest unknown = PushEnvelope();
  unknown.mutable_push()->set_dtype(static_cast<DType>(7));
  unknown.mutable_push()->set_num_elements(1);
  unknown.mutable_push()->set_data(std::string(4, '\0'));
  buffer = FromBytes(unknown.SerializeAsString());
  ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &request).ok());
  EXPECT_THAT(received.CheckFloat(1).message(),
              HasSubstr("has dtype unknown dtype 7; expected DTYPE_FLOAT32"));
  std::vector<float> decoded;
  EXPECT_THAT(DecodeFloatChunk(unknown.push(), &decoded).message(),
              HasSubstr("has dtype unknown dtype 7; expected DTYPE_FLOAT32"));
}

TEST(ChunkMessageTest, RejectsMalformedBytes) {
  const std::vector<float> values(64, 2.0f);
  const std::string bytes = Flatten(
      EncodeChunkMessage(PushEnvelope(), kPushChunkField, 1, 1, 1, values));
  ReceivedChunkMessage received;
  PushPullRequest envelope;
  // Every cut inside the chunk is an error, never a crash or a short copy.
  // (A cut right after the header is a valid message without a chunk.)
  for (size_t cut = PushEnvelope().ByteSizeLong() + 1; cut < bytes.size();
       cut += 7) {
    grpc::ByteBuffer buffer = FromBytes(bytes.substr(0, cut));
    const absl::Status status =
        received.Parse(&buffer, kPushChunkField, &envelope);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << cut;
    EXPECT_THAT(status.message(), HasSubstr("malformed push/pull message"));
  }
  grpc::ByteBuffer doubled = FromBytes(bytes + bytes);
  EXPECT_THAT(received.Parse(&doubled, kPushChunkField, &envelope).message(),
              HasSubstr("two chunks in one message"));
  grpc::ByteBuffer garbage = FromBytes(std::string("\xff\xff\xff\xff", 4));
  EXPECT_FALSE(received.Parse(&garbage, kPushChunkField, &envelope).ok());
}

// A lent payload is not copied: the buffer reads the caller's memory, and
// the lease counts the slice until the last buffer holding it is gone.
// The push a shard takes: copied and scanned for NaN and infinity in one
// pass. The payload arrives in 999-byte slices (values straddle them) and
// spans three 4096-value scan blocks; the first non-finite value is found
// wherever it is, in every wire format, as FindNonFinite finds it.
TEST(ChunkMessageTest, CopyFindsTheFirstNonFiniteValueAcrossBlocksAndSlices) {
  constexpr int64_t n = 10000;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<std::pair<int64_t, float>> bad;
    int64_t expected;
  };
  const std::vector<Case> cases = {
      {{}, -1},
      {{{0, nan}}, 0},
      {{{4095, inf}}, 4095},
      {{{4096, -inf}}, 4096},
      {{{9999, nan}}, 9999},
      {{{8200, inf}, {5000, nan}}, 5000},
  };
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    for (const Case& c : cases) {
      std::vector<float> values(n);
      for (int64_t i = 0; i < n; ++i) {
        values[i] = 0.25f * static_cast<float>(i % 17) - 2.0f;
      }
      for (const auto& [at, value] : c.bad) values[at] = value;
      const std::string bytes = Flatten(EncodeChunkMessage(
          PushEnvelope(), kPushChunkField, 1, 0, 3, values, nullptr, wire));
      grpc::ByteBuffer buffer = InSlices(bytes, 999);
      ReceivedChunkMessage received;
      PushPullRequest envelope;
      ASSERT_TRUE(received.Parse(&buffer, kPushChunkField, &envelope).ok());
      std::vector<float> out(n, 7.0f);
      const absl::StatusOr<int64_t> found =
          received.CopyFloatPayloadFindNonFinite(absl::MakeSpan(out));
      ASSERT_TRUE(found.ok()) << found.status();
      const std::string name =
          absl::StrCat(WireDtypeSpelling(wire), " bad at ",
                       c.bad.empty() ? -1 : c.bad[0].first);
      EXPECT_EQ(*found, c.expected) << name;
      EXPECT_EQ(*found, FindNonFinite(out)) << name;
      // The values are those CopyFloatPayload writes.
      std::vector<float> copied(n);
      grpc::ByteBuffer again = InSlices(bytes, 999);
      ReceivedChunkMessage second;
      ASSERT_TRUE(second.Parse(&again, kPushChunkField, &envelope).ok());
      ASSERT_TRUE(second.CopyFloatPayload(absl::MakeSpan(copied)).ok());
      EXPECT_EQ(std::memcmp(out.data(), copied.data(), n * sizeof(float)), 0)
          << name;
    }
  }
  // A sparse push: its values are scanned as well.
  const std::vector<uint32_t> indices = {2, 4097, 9000};
  const std::vector<float> sparse_values = {1.0f, nan, 2.0f};
  grpc::ByteBuffer sparse =
      EncodeSparseChunkMessage(PushEnvelope(), kPushChunkField, 1, 0, 3, n,
                               indices, sparse_values, DTYPE_FLOAT32);
  ReceivedChunkMessage received;
  PushPullRequest envelope;
  ASSERT_TRUE(received.Parse(&sparse, kPushChunkField, &envelope).ok());
  std::vector<float> out(n);
  const absl::StatusOr<int64_t> found =
      received.CopyFloatPayloadFindNonFinite(absl::MakeSpan(out));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 4097);
}

TEST(ChunkMessageTest, LentPayloadIsReleasedWithTheLastBuffer) {
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  PayloadLease lease;
  auto buffer = std::make_unique<grpc::ByteBuffer>(EncodeChunkMessage(
      PushEnvelope(), kPushChunkField, 0, 0, 0, values, &lease));
  auto copy = std::make_unique<grpc::ByteBuffer>(*buffer);
  values[1] = 5.0f;  // visible through the buffer: nothing was copied
  PushPullRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(*copy)));
  std::vector<float> sent(3);
  std::memcpy(sent.data(), parsed.push().data().data(), 12);
  EXPECT_THAT(sent, ElementsAreArray({1.0f, 5.0f, 3.0f}));

  EXPECT_FALSE(lease.WaitReleased(absl::Now() + absl::Milliseconds(10)));
  buffer.reset();
  EXPECT_FALSE(lease.WaitReleased(absl::Now() + absl::Milliseconds(10)));
  copy.reset();
  EXPECT_TRUE(lease.WaitReleased(absl::Now() + absl::Milliseconds(10)));
}

// A shard's shared pull replies: the fp32 weights lent, or their 16-bit
// form converted once and lent, each the same bytes as the copying
// encoder's and each held until the last buffer is gone.
TEST(ChunkMessageTest, SharedPayloadsEncodeAsCopiedOnesAndAreHeld) {
  std::vector<float> values(300);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.37f * static_cast<float>(i) - 41.0f;
  }
  PushPullResponse envelope;
  auto weights = std::make_shared<const std::vector<float>>(values);
  std::weak_ptr<const std::vector<float>> weights_alive = weights;
  auto buffer = std::make_unique<grpc::ByteBuffer>(EncodeSharedChunkMessage(
      envelope, kPullChunkField, 3, 1, 9, *weights, weights));
  weights.reset();
  EXPECT_FALSE(weights_alive.expired());  // held by the buffer
  EXPECT_EQ(Flatten(*buffer), Flatten(EncodeChunkMessage(
                                  envelope, kPullChunkField, 3, 1, 9, values)));
  buffer.reset();
  EXPECT_TRUE(weights_alive.expired());

  for (DType wire : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    auto halves =
        std::make_shared<const EncodedHalves>(EncodeHalvesOf(values, wire));
    std::weak_ptr<const EncodedHalves> alive = halves;
    auto shared = std::make_unique<grpc::ByteBuffer>(EncodeSharedChunkMessage(
        envelope, kPullChunkField, 3, 1, 9, std::move(halves)));
    auto copy = std::make_unique<grpc::ByteBuffer>(*shared);
    EXPECT_EQ(Flatten(*shared),
              Flatten(EncodeChunkMessage(envelope, kPullChunkField, 3, 1, 9,
                                         values, nullptr, wire)))
        << WireDtypeSpelling(wire);
    shared.reset();
    EXPECT_FALSE(alive.expired());
    copy.reset();
    EXPECT_TRUE(alive.expired());
  }
}

}  // namespace
}  // namespace pstrain
