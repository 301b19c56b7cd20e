#include "common/chunk_message.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/nonfinite.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/wire_dtype.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace pstrain {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

static_assert(sizeof(float) == 4, "fp32 must be 4 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; big-endian hosts need a swap");

// Protobuf wire types (protobuf's encoding guide).
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

constexpr uint32_t Tag(int field, uint32_t wire_type) {
  return (static_cast<uint32_t>(field) << 3) | wire_type;
}
constexpr uint32_t kDataTag =
    Tag(TensorChunk::kDataFieldNumber, kLengthDelimited);

// Copies one field whose tag was just read from `in` to `out`, tag
// included. False on a truncated field or a group (deprecated, not used by
// ps.proto).
bool CopyField(uint32_t tag, CodedInputStream* in, CodedOutputStream* out) {
  out->WriteTag(tag);
  switch (tag & 7) {
    case kVarint: {
      uint64_t v;
      if (!in->ReadVarint64(&v)) return false;
      out->WriteVarint64(v);
      return true;
    }
    case kFixed64: {
      uint64_t v;
      if (!in->ReadLittleEndian64(&v)) return false;
      out->WriteLittleEndian64(v);
      return true;
    }
    case kLengthDelimited: {
      uint32_t n;
      std::string bytes;
      if (!in->ReadVarint32(&n) ||
          !in->ReadString(&bytes, static_cast<int>(n))) {
        return false;
      }
      out->WriteVarint32(n);
      out->WriteString(bytes);
      return true;
    }
    case kFixed32: {
      uint32_t v;
      if (!in->ReadLittleEndian32(&v)) return false;
      out->WriteLittleEndian32(v);
      return true;
    }
    default:
      return false;
  }
}

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed push/pull message: ", what));
}

std::string ChunkName(const TensorChunk& chunk) {
  return absl::StrCat("chunk (", chunk.key().param_id(), ", ",
                      chunk.key().chunk_index(), ")");
}

}  // namespace

grpc::Slice PayloadLease::Lend(const void* data, size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    ++lent_;
  }
  // gRPC only reads a slice it is given; the constructor's pointer is
  // non-const because slices may also own writable memory.
  return grpc::Slice(const_cast<void*>(data), bytes, &PayloadLease::Release,
                     this);
}

void PayloadLease::Release(void* lease) {
  PayloadLease* self = static_cast<PayloadLease*>(lease);
  absl::MutexLock lock(&self->mu_);
  --self->lent_;
}

bool PayloadLease::WaitReleased(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto released = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lent_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&released), deadline);
}

namespace {

// The slices' destroy callback for EncodeSharedChunkMessage: drops the
// payload owner's reference.
void DropOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

// The message up to its payload: `envelope`, then field `chunk_field`'s
// tag and length, `meta` (the chunk without its data) and the data's tag
// and length, for `payload` bytes of data.
grpc::Slice EncodeHead(const google::protobuf::Message& envelope,
                       int chunk_field, const TensorChunk& meta,
                       uint64_t payload) {
  const std::string meta_bytes = meta.SerializeAsString();
  std::string head = envelope.SerializeAsString();
  {
    StringOutputStream stream(&head);
    CodedOutputStream out(&stream);
    out.WriteTag(Tag(chunk_field, kLengthDelimited));
    out.WriteVarint64(meta_bytes.size() +
                      CodedOutputStream::VarintSize32(kDataTag) +
                      CodedOutputStream::VarintSize64(payload) + payload);
    out.WriteString(meta_bytes);
    out.WriteTag(kDataTag);
    out.WriteVarint64(payload);
  }  // `out` flushes and trims `head` here.
  return grpc::Slice(head);
}

// A slice over `bytes` bytes at `data` that holds `owner` (a reference to
// that memory) until gRPC releases it. gRPC only reads the slice (the
// pointer is non-const in its API).
grpc::Slice OwnedSlice(const void* data, size_t bytes,
                       const std::shared_ptr<const void>& owner) {
  return grpc::Slice(const_cast<void*>(data), bytes, &DropOwner,
                     new std::shared_ptr<const void>(owner));
}

// A chunk's fields but its payload's: key, element count and version.
TensorChunk ChunkMeta(int32_t param_id, int32_t chunk_index,
                      int64_t num_elements, int64_t version) {
  TensorChunk meta;
  meta.mutable_key()->set_param_id(param_id);
  meta.mutable_key()->set_chunk_index(chunk_index);
  meta.set_num_elements(num_elements);
  meta.set_version(version);
  return meta;
}

// EncodeChunkMessage and EncodeSparseChunkMessage: `meta` is the chunk
// without its data; `values` its payload, converted to `wire`.
grpc::ByteBuffer EncodeChunk(
    const google::protobuf::Message& envelope, int chunk_field,
    TensorChunk& meta, absl::Span<const float> values, PayloadLease* lease,
    DType wire, const std::shared_ptr<const void>* owner = nullptr) {
  const bool half = WireBytesPerElement(wire) == 2;
  meta.set_dtype(half ? wire : DTYPE_FLOAT32);
  const int scale_exponent = wire == DTYPE_FLOAT16 ? ScaleExponent(values) : 0;
  if (scale_exponent != 0) meta.set_scale_exponent(scale_exponent);
  const uint64_t payload =
      values.size() * (half ? sizeof(uint16_t) : sizeof(float));
  grpc::Slice slices[2] = {EncodeHead(envelope, chunk_field, meta, payload),
                           grpc::Slice()};
  if (payload == 0) return grpc::ByteBuffer(slices, 1);
  if (half) {
    // (grpc_slice_malloc keeps a small payload inside the slice itself, at
    // an odd address: the uint16_t stores were misaligned, which the
    // fuzzer's UBSan build caught. A large slice is heap memory, aligned.)
    grpc_slice data = grpc_slice_malloc_large(payload);
    EncodeHalves(values, wire, scale_exponent,
                 reinterpret_cast<uint16_t*>(GRPC_SLICE_START_PTR(data)));
    slices[1] = grpc::Slice(data, grpc::Slice::STEAL_REF);
    return grpc::ByteBuffer(slices, 2);
  }
  if (lease != nullptr) {
    slices[1] = lease->Lend(values.data(), payload);
    return grpc::ByteBuffer(slices, 2);
  }
  if (owner != nullptr) {
    slices[1] = OwnedSlice(values.data(), payload, *owner);
    return grpc::ByteBuffer(slices, 2);
  }
  grpc_slice data = grpc_slice_malloc(payload);
  std::memcpy(GRPC_SLICE_START_PTR(data), values.data(), payload);
  slices[1] = grpc::Slice(data, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

grpc::ByteBuffer EncodeChunkMessage(const google::protobuf::Message& envelope,
                                    int chunk_field, int32_t param_id,
                                    int32_t chunk_index, int64_t version,
                                    absl::Span<const float> values,
                                    PayloadLease* lease, DType wire) {
  TensorChunk meta = ChunkMeta(param_id, chunk_index,
                               static_cast<int64_t>(values.size()), version);
  return EncodeChunk(envelope, chunk_field, meta, values, lease, wire);
}

grpc::ByteBuffer EncodeSharedChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    absl::Span<const float> values, std::shared_ptr<const void> owner) {
  TensorChunk meta = ChunkMeta(param_id, chunk_index,
                               static_cast<int64_t>(values.size()), version);
  return EncodeChunk(envelope, chunk_field, meta, values, /*lease=*/nullptr,
                     DTYPE_FLOAT32, &owner);
}

grpc::ByteBuffer EncodeSharedChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    std::shared_ptr<const EncodedHalves> halves) {
  TensorChunk meta =
      ChunkMeta(param_id, chunk_index,
                static_cast<int64_t>(halves->bits().size()), version);
  meta.set_dtype(halves->dtype);
  if (halves->scale_exponent != 0) {
    meta.set_scale_exponent(halves->scale_exponent);
  }
  const uint64_t payload = halves->bits().size() * sizeof(uint16_t);
  grpc::Slice slices[2] = {EncodeHead(envelope, chunk_field, meta, payload),
                           grpc::Slice()};
  if (payload == 0) return grpc::ByteBuffer(slices, 1);
  slices[1] = OwnedSlice(halves->bits().data(), payload, halves);
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeSparseChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    int64_t num_elements, absl::Span<const uint32_t> indices,
    absl::Span<const float> values, DType wire, int64_t row_elements) {
  TensorChunk meta = ChunkMeta(param_id, chunk_index, num_elements, version);
  meta.set_sparse(true);
  if (row_elements > 1) meta.set_row_elements(row_elements);
  google::protobuf::RepeatedField<uint32_t>* gaps = meta.mutable_index_gaps();
  gaps->Reserve(static_cast<int>(indices.size()));
  uint32_t before = 0;
  for (const uint32_t at : indices) {
    gaps->AddAlreadyReserved(at - before);
    before = at;
  }
  return EncodeChunk(envelope, chunk_field, meta, values, nullptr, wire);
}

grpc::ByteBuffer EncodeSmallMessage(const google::protobuf::Message& message) {
  const grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ReceivedChunkMessage::Parse(grpc::ByteBuffer* buffer,
                                         int chunk_field,
                                         google::protobuf::Message* envelope) {
  buffer_.Clear();
  buffer_.Swap(buffer);
  has_chunk_ = false;
  chunk_.Clear();
  payload_offset_ = 0;
  payload_bytes_ = 0;
  if (buffer_.Length() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Malformed(absl::StrCat(buffer_.Length(), " bytes"));
  }
  std::string envelope_bytes;
  std::string meta_bytes;
  {
    grpc::ProtoBufferReader reader(&buffer_);
    CodedInputStream in(&reader);
    StringOutputStream envelope_stream(&envelope_bytes);
    CodedOutputStream envelope_out(&envelope_stream);
    StringOutputStream meta_stream(&meta_bytes);
    CodedOutputStream meta_out(&meta_stream);
    const uint32_t chunk_tag = Tag(chunk_field, kLengthDelimited);
    while (const uint32_t tag = in.ReadTag()) {
      if (tag != chunk_tag) {
        if (!CopyField(tag, &in, &envelope_out)) {
          return Malformed(absl::StrCat("bad field ", tag >> 3));
        }
        continue;
      }
      if (has_chunk_) return Malformed("two chunks in one message");
      has_chunk_ = true;
      uint32_t length;
      if (!in.ReadVarint32(&length)) return Malformed("truncated chunk");
      const CodedInputStream::Limit limit =
          in.PushLimit(static_cast<int>(length));
      while (const uint32_t field = in.ReadTag()) {
        if (field == kDataTag) {
          uint32_t n;
          if (!in.ReadVarint32(&n)) return Malformed("truncated data");
          payload_offset_ = in.CurrentPosition();
          payload_bytes_ = n;
          if (!in.Skip(static_cast<int>(n))) return Malformed("truncated data");
        } else if (!CopyField(field, &in, &meta_out)) {
          return Malformed(absl::StrCat("bad chunk field ", field >> 3));
        }
      }
      if (!in.ConsumedEntireMessage() || in.BytesUntilLimit() != 0) {
        return Malformed("truncated chunk");
      }
      in.PopLimit(limit);
    }
    if (!in.ConsumedEntireMessage()) return Malformed("truncated message");
  }  // the output streams flush here
  if (!envelope->ParseFromString(envelope_bytes)) {
    return Malformed(absl::StrCat("bad ", envelope->GetTypeName()));
  }
  if (has_chunk_ && !chunk_.ParseFromString(meta_bytes)) {
    return Malformed("bad chunk");
  }
  return absl::OkStatus();
}

absl::Status ReceivedChunkMessage::CheckFloat(int64_t num_elements) const {
  if (!has_chunk_) return Malformed("no chunk");
  const int width = WireBytesPerElement(chunk_.dtype());
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " has dtype ", DTypeName(chunk_.dtype()),
        "; expected DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16"));
  }
  if (chunk_.scale_exponent() < -200 || chunk_.scale_exponent() > 200 ||
      (chunk_.dtype() != DTYPE_FLOAT16 && chunk_.scale_exponent() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " has scale exponent ", chunk_.scale_exponent(),
        "; expected -200 to 200 with DTYPE_FLOAT16, else 0"));
  }
  // (num_elements * width could overflow: a pushed count near 2^62 wrapped
  // to 0 and passed with no payload. Divide the byte count instead.)
  const int64_t n = chunk_.num_elements();
  if (chunk_.sparse()) return CheckSparse(num_elements, width);
  if (chunk_.index_gaps_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ChunkName(chunk_), " carries indices but is not sparse"));
  }
  if (n < 0 || payload_bytes_ % width != 0 || payload_bytes_ / width != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " carries ", payload_bytes_, " bytes for ", n, " ",
        width == 4 ? "fp32" : WireDtypeSpelling(chunk_.dtype()),
        " elements; expected ",
        n >= 0 && n <= std::numeric_limits<int64_t>::max() / width
            ? absl::StrCat(n * width, " bytes")
            : absl::StrCat(width, " bytes per element")));
  }
  if (chunk_.num_elements() != num_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(ChunkName(chunk_), " has ", chunk_.num_elements(),
                     " elements; expected ", num_elements));
  }
  return absl::OkStatus();
}

absl::Status ReceivedChunkMessage::CheckSparse(int64_t num_elements,
                                               int width) const {
  const int64_t n = chunk_.num_elements();
  if (n != num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " has ", n, " elements; expected ", num_elements));
  }
  const int64_t row = IndexWidth();
  if (chunk_.row_elements() < 0 || n % row != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ChunkName(chunk_), " (sparse) has ", chunk_.row_elements(),
                     " elements per row; expected 0, 1 or a divisor of its ", n,
                     " elements"));
  }
  const int64_t rows = n / row;
  const int64_t k = chunk_.index_gaps_size();
  if (k > rows || payload_bytes_ % width != 0 ||
      payload_bytes_ / width / row != k || payload_bytes_ / width % row != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " (sparse) carries ", k, " indices and ",
        payload_bytes_, " value bytes; expected at most ", rows,
        " indices, and ", row == 1 ? "one" : absl::StrCat(row), " ", width,
        "-byte value", row == 1 ? "" : "s", " per index"));
  }
  // The offsets are the gaps' running sums (64-bit: no wrap).
  int64_t at = 0;
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t gap = chunk_.index_gaps(static_cast<int>(i));
    at += gap;
    if (at >= rows || (i > 0 && gap == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ChunkName(chunk_), " (sparse): index ", i, " is ", at,
                       "; expected strictly ascending ", row > 1 ? "row " : "",
                       "indices below ", rows));
    }
  }
  return absl::OkStatus();
}

template <typename Put>
absl::Status ReceivedChunkMessage::ForEachSparseIndex(Put put,
                                                      int64_t* nonfinite) {
  const int64_t row = IndexWidth();
  const int64_t k = chunk_.index_gaps_size();
  thread_local std::vector<float> values;
  values.resize(k * row);
  int64_t bad = -1;  // the first non-finite value's place in `values`
  RETURN_IF_ERROR(ReadValues(absl::MakeSpan(values),
                             nonfinite != nullptr ? &bad : nullptr));
  if (nonfinite != nullptr) *nonfinite = -1;
  uint32_t at = 0;  // checked by CheckSparse: ascending, below the rows
  for (int64_t i = 0; i < k; ++i) {
    at += chunk_.index_gaps(static_cast<int>(i));
    put(at, values.data() + i * row);
    // Ascending indices: the first bad value is the lowest bad element.
    if (bad >= 0 && i == bad / row) *nonfinite = int64_t{at} * row + bad % row;
  }
  return absl::OkStatus();
}

absl::Status ReceivedChunkMessage::CopyFloatPayloadInto(absl::Span<float> out,
                                                        int64_t* nonfinite) {
  RETURN_IF_ERROR(CheckFloat(static_cast<int64_t>(out.size())));
  if (!chunk_.sparse()) return ReadValues(out, nonfinite);
  // Densified: zeros, then the K values (or rows) at their indices; only
  // those values are scanned.
  std::fill(out.begin(), out.end(), 0.0f);
  const int64_t row = IndexWidth();
  return ForEachSparseIndex(
      [&](uint32_t at, const float* v) {
        std::copy(v, v + row, out.begin() + int64_t{at} * row);
      },
      nonfinite);
}

absl::Status ReceivedChunkMessage::CopyFloatPayload(absl::Span<float> out) {
  return CopyFloatPayloadInto(out, nullptr);
}

absl::StatusOr<int64_t> ReceivedChunkMessage::CopyFloatPayloadFindNonFinite(
    absl::Span<float> out) {
  int64_t nonfinite = -1;
  RETURN_IF_ERROR(CopyFloatPayloadInto(out, &nonfinite));
  return nonfinite;
}

absl::Status ReceivedChunkMessage::ScatterFloatPayload(absl::Span<float> out) {
  RETURN_IF_ERROR(CheckFloat(static_cast<int64_t>(out.size())));
  if (!chunk_.sparse()) return ReadValues(out);
  const int64_t row = IndexWidth();
  return ForEachSparseIndex([&](uint32_t at, const float* v) {
    std::copy(v, v + row, out.begin() + int64_t{at} * row);
  });
}

absl::Status ReceivedChunkMessage::CopyRowsPayload(int64_t num_elements,
                                                   int64_t row_elements,
                                                   std::vector<uint32_t>* rows,
                                                   std::vector<float>* values) {
  RETURN_IF_ERROR(CheckFloat(num_elements));
  if (!chunk_.sparse() || chunk_.row_elements() != row_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        ChunkName(chunk_), " is ",
        chunk_.sparse() ? absl::StrCat("sparse with ", chunk_.row_elements(),
                                       " elements per row")
                        : "dense",
        "; the tensor is row-sparse: expected a sparse chunk of rows of ",
        row_elements, " elements"));
  }
  const int64_t k = chunk_.index_gaps_size();
  rows->resize(k);
  uint32_t at = 0;  // checked by CheckFloat
  for (int64_t i = 0; i < k; ++i) {
    at += chunk_.index_gaps(static_cast<int>(i));
    (*rows)[i] = at;
  }
  values->resize(k * row_elements);
  return ReadValues(absl::MakeSpan(*values));
}

absl::Status ReceivedChunkMessage::ReadValues(absl::Span<float> out,
                                              int64_t* nonfinite) {
  if (nonfinite != nullptr) *nonfinite = -1;
  if (payload_bytes_ == 0) return absl::OkStatus();
  const bool half = chunk_.dtype() != DTYPE_FLOAT32;
  const int64_t width = half ? 2 : 4;
  const int64_t n = static_cast<int64_t>(out.size());
  if (n * width != payload_bytes_) {
    return absl::InternalError(
        absl::StrCat(ChunkName(chunk_), ": ", payload_bytes_,
                     " payload bytes for ", n, " values of ", width, " bytes"));
  }
  grpc::ProtoBufferReader reader(&buffer_);
  CodedInputStream in(&reader);
  if (!in.Skip(static_cast<int>(payload_offset_))) {
    return absl::InternalError(
        absl::StrCat(ChunkName(chunk_), ": payload not where it was parsed"));
  }
  // A 16-bit payload goes through a per-thread buffer (an element may
  // straddle two received slices), then is widened into `out`. With a
  // scan, blocks of 16 KiB of fp32 (L1-sized) are copied, widened and
  // scanned in turn; without, the payload is one block.
  constexpr int64_t kScanBlock = 4096;
  const int64_t block = nonfinite != nullptr ? kScanBlock : n;
  thread_local std::vector<uint16_t> halves;
  if (half) halves.resize(std::min(block, n));
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t count = std::min(block, n - begin);
    void* into = half ? static_cast<void*>(halves.data())
                      : static_cast<void*>(out.data() + begin);
    if (!in.ReadRaw(into, static_cast<int>(count * width))) {
      return absl::InternalError(
          absl::StrCat(ChunkName(chunk_), ": payload not where it was parsed"));
    }
    const absl::Span<float> values = out.subspan(begin, count);
    if (half) {
      DecodeHalves(halves.data(), chunk_.dtype(), chunk_.scale_exponent(),
                   values);
    }
    if (nonfinite != nullptr && *nonfinite < 0) {
      const int64_t at = FindNonFinite(values);
      if (at >= 0) *nonfinite = begin + at;
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
