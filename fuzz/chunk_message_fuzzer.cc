// Fuzzes what a shard and a worker parse off the PushPull stream: the input,
// cut into up to three slices (as gRPC may deliver it), is read as a push
// (PushPullRequest) and as a pull answer (PushPullResponse) by
// ReceivedChunkMessage, and as a TensorChunk by the tensor codec. A payload
// accepted is copied out and must round-trip through EncodeChunkMessage and
// EncodeFloatChunk bit for bit (a 16-bit payload widened to fp32 is
// re-encoded as fp32, which is lossless, and a bf16 one of finite values
// also as bf16: rounding a value bf16 holds exactly changes nothing).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/chunk_message.h"
#include "common/tensor_codec.h"
#include "common/wire_dtype.h"
#include "fuzz/fuzz_util.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/ps.pb.h"

namespace pstrain {
namespace {

grpc::ByteBuffer Slices(const std::string& bytes, size_t cut1, size_t cut2) {
  cut1 = std::min(cut1, bytes.size());
  cut2 = std::min(std::max(cut1, cut2), bytes.size());
  const grpc::Slice slices[3] = {
      grpc::Slice(bytes.substr(0, cut1)),
      grpc::Slice(bytes.substr(cut1, cut2 - cut1)),
      grpc::Slice(bytes.substr(cut2)),
  };
  return grpc::ByteBuffer(slices, 3);
}

// Encodes `values` as `chunk`'s key and version in `wire`, parses the
// message again and checks that every value reads back bit for bit.
template <typename Envelope>
void RoundTrip(const Envelope& envelope, int chunk_field,
               const TensorChunk& chunk, const std::vector<float>& values,
               DType wire) {
  const grpc::ByteBuffer again = EncodeChunkMessage(
      envelope, chunk_field, chunk.key().param_id(), chunk.key().chunk_index(),
      chunk.version(), values, nullptr, wire);
  grpc::ByteBuffer copy(again);
  ReceivedChunkMessage reparsed;
  Envelope envelope2;
  FUZZ_CHECK(reparsed.Parse(&copy, chunk_field, &envelope2).ok());
  FUZZ_CHECK(reparsed.has_chunk());
  FUZZ_CHECK(reparsed.chunk().key().param_id() == chunk.key().param_id());
  FUZZ_CHECK(reparsed.chunk().version() == chunk.version());
  std::vector<float> values2(values.size());
  FUZZ_CHECK(reparsed.CopyFloatPayload(absl::MakeSpan(values2)).ok());
  FUZZ_CHECK(values.empty() || std::memcmp(values.data(), values2.data(),
                                           values.size() * sizeof(float)) == 0);
}

// An accepted element-sparse chunk, densified into `dense`: re-encoded from
// its offsets (the running sums of its gaps) and values, it must carry the
// same gaps and densify to the same bits.
template <typename Envelope>
void SparseRoundTrip(const Envelope& envelope, int chunk_field,
                     const TensorChunk& chunk,
                     const std::vector<float>& dense) {
  std::vector<uint32_t> indices;
  std::vector<float> values;
  uint32_t at = 0;
  for (const uint32_t gap : chunk.index_gaps()) {
    at += gap;
    indices.push_back(at);
    values.push_back(dense[at]);
  }
  const grpc::ByteBuffer again = EncodeSparseChunkMessage(
      envelope, chunk_field, chunk.key().param_id(), chunk.key().chunk_index(),
      chunk.version(), chunk.num_elements(), indices, values);
  grpc::ByteBuffer copy(again);
  ReceivedChunkMessage reparsed;
  Envelope envelope2;
  FUZZ_CHECK(reparsed.Parse(&copy, chunk_field, &envelope2).ok());
  FUZZ_CHECK(reparsed.chunk().index_gaps_size() == chunk.index_gaps_size());
  FUZZ_CHECK(std::equal(chunk.index_gaps().begin(), chunk.index_gaps().end(),
                        reparsed.chunk().index_gaps().begin()));
  std::vector<float> dense2(dense.size());
  FUZZ_CHECK(reparsed.CopyFloatPayload(absl::MakeSpan(dense2)).ok());
  FUZZ_CHECK(dense.empty() || std::memcmp(dense.data(), dense2.data(),
                                          dense.size() * sizeof(float)) == 0);
}

// Parses `bytes` as a message whose chunk is field `chunk_field`; an
// accepted payload is copied out and re-encoded.
template <typename Envelope>
void ParseChunkMessage(const std::string& bytes, size_t cut1, size_t cut2,
                       int chunk_field) {
  grpc::ByteBuffer buffer = Slices(bytes, cut1, cut2);
  ReceivedChunkMessage received;
  Envelope envelope;
  if (!received.Parse(&buffer, chunk_field, &envelope).ok()) return;
  if (!received.has_chunk()) return;
  const TensorChunk& chunk = received.chunk();
  FUZZ_CHECK(chunk.data().empty());
  FUZZ_CHECK(received.payload_bytes() >= 0);
  FUZZ_CHECK(received.payload_bytes() <= static_cast<int64_t>(bytes.size()));
  // The element count is untrusted: nothing may be allocated from it
  // before CheckFloat has tied it to the bytes received.
  if (!received.CheckFloat(chunk.num_elements()).ok()) return;
  if (chunk.sparse()) {
    // A sparse chunk's indices are checked by the copies themselves
    // (CheckSparse): they may refuse what CheckFloat passed, but never
    // read or write out of bounds.
    if (chunk.num_elements() > (int64_t{1} << 20)) return;
    std::vector<float> dense(chunk.num_elements());
    const bool copied = received.CopyFloatPayload(absl::MakeSpan(dense)).ok();
    if (copied && chunk.row_elements() <= 1) {
      SparseRoundTrip<Envelope>(envelope, chunk_field, chunk, dense);
    }
    received.ScatterFloatPayload(absl::MakeSpan(dense)).IgnoreError();
    return;
  }
  // (A dense chunk of 16-bit elements carries 2 bytes each: the check
  // once assumed fp32's 4 and aborted on the first bf16 chunk CI's run
  // generated; crash-bf16-dense in the corpus.)
  FUZZ_CHECK(chunk.num_elements() * WireBytesPerElement(chunk.dtype()) ==
             received.payload_bytes());
  std::vector<float> values(chunk.num_elements());
  FUZZ_CHECK(received.CopyFloatPayload(absl::MakeSpan(values)).ok());
  RoundTrip<Envelope>(envelope, chunk_field, chunk, values, DTYPE_FLOAT32);
  const bool finite = std::all_of(values.begin(), values.end(),
                                  [](float v) { return std::isfinite(v); });
  if (chunk.dtype() == DTYPE_BFLOAT16 && finite) {
    RoundTrip<Envelope>(envelope, chunk_field, chunk, values, DTYPE_BFLOAT16);
  }
}

void DecodeTensorChunk(const std::string& bytes) {
  TensorChunk chunk;
  if (!chunk.ParseFromString(bytes)) return;
  std::vector<float> values;
  if (!DecodeFloatChunk(chunk, &values).ok()) return;
  FUZZ_CHECK(values.size() * 4 == chunk.data().size());
  std::vector<float> into(values.size());
  FUZZ_CHECK(DecodeFloatChunkInto(chunk, absl::MakeSpan(into)).ok());
  if (!into.empty()) {
    std::vector<float> wrong(into.size() - 1);
    FUZZ_CHECK(!DecodeFloatChunkInto(chunk, absl::MakeSpan(wrong)).ok());
  }
  TensorChunk encoded;
  EncodeFloatChunk(chunk.key().param_id(), chunk.key().chunk_index(),
                   chunk.version(), values, &encoded);
  FUZZ_CHECK(encoded.data() == chunk.data());
}

}  // namespace
}  // namespace pstrain

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstrain::fuzz::FuzzInput in(data, size);
  const size_t cut1 = in.Take<uint8_t>();
  const size_t cut2 = cut1 + in.Take<uint8_t>();
  const std::string bytes(in.Rest());
  pstrain::ParseChunkMessage<pstrain::PushPullRequest>(
      bytes, cut1, cut2, pstrain::kPushChunkField);
  pstrain::ParseChunkMessage<pstrain::PushPullResponse>(
      bytes, cut1, cut2, pstrain::kPullChunkField);
  pstrain::DecodeTensorChunk(bytes);
  return 0;
}
