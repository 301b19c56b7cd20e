// The PushPull stream's hot path: messages that carry one tensor chunk,
// moved as grpc::ByteBuffer with a single copy of the payload on each side.
//
// On the wire these are ordinary protobuf messages (PushPullRequest with a
// `push`, PushPullResponse with a `chunk`; proto/ps.proto), so any protobuf
// client can talk to a shard. What differs is how pstrain builds and reads
// them. Through protobuf, a payload is copied into the message's `bytes`
// field, then into gRPC's slice on serialisation; on the other side from
// the slices into the `bytes` field, then into its destination: four
// user-space copies per chunk. Here the sender copies the tensor once into
// a gRPC slice that goes to the socket as is, and the receiver parses every
// field except the payload and copies the payload once, straight from the
// received slices into the memory it belongs in (a shard's pending slot, a
// worker's weights).
//
// Layout: as TensorChunk (`num_elements` elements of `dtype`, little-endian,
// or a sparse chunk's values at its indices):
// fp32 (4 bytes each), or a 16-bit wire format (bfloat16, float16 with its
// scale exponent; common/wire_dtype.h), converted from and to fp32 here, in
// the same single pass as the copy.
//
// Thread-safety: EncodeChunkMessage is stateless; a ReceivedChunkMessage is
// thread-compatible (one reader at a time).
#ifndef PSTRAIN_COMMON_CHUNK_MESSAGE_H_
#define PSTRAIN_COMMON_CHUNK_MESSAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire_dtype.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/ps.pb.h"

namespace pstrain {

// The PushPull method's full name (proto/ps.proto), for a client that
// opens it with ByteBuffer messages.
inline constexpr char kPushPullMethod[] = "/pstrain.ParameterServer/PushPull";

// Field numbers of the chunk inside the two stream messages.
inline constexpr int kPushChunkField = PushPullRequest::kPushFieldNumber;
inline constexpr int kPullChunkField = PushPullResponse::kChunkFieldNumber;

// Lends caller memory to gRPC as slices (no copy) and tells when gRPC has
// let go of every one: until then the memory must neither change nor go
// away. Must outlive every slice it lent (wait for WaitReleased first).
//
// Thread-safe.
class PayloadLease {
 public:
  PayloadLease() = default;
  PayloadLease(const PayloadLease&) = delete;
  PayloadLease& operator=(const PayloadLease&) = delete;

  // A slice over `bytes` bytes at `data`, counted until gRPC releases it.
  grpc::Slice Lend(const void* data, size_t bytes);
  // Blocks until every lent slice is released (true) or `deadline` passes
  // (false).
  bool WaitReleased(absl::Time deadline);

 private:
  static void Release(void* lease);

  absl::Mutex mu_;
  int64_t lent_ ABSL_GUARDED_BY(mu_) = 0;
};

// Serialises `envelope` (the message's other fields, e.g. a PushPullRequest
// holding only its header; it must not set field `chunk_field`) followed by
// field `chunk_field`: a TensorChunk of key (param_id, chunk_index), dtype
// `wire`, `values.size()` elements, `version`, and `values` as its data.
// The payload is copied once, into a gRPC slice; fp32 with a `lease`, it is
// not copied at all but lent (see PayloadLease); a 16-bit `wire`
// (DTYPE_BFLOAT16, DTYPE_FLOAT16) is converted while copied (`lease`
// unused), at half the bytes.
grpc::ByteBuffer EncodeChunkMessage(const google::protobuf::Message& envelope,
                                    int chunk_field, int32_t param_id,
                                    int32_t chunk_index, int64_t version,
                                    absl::Span<const float> values,
                                    PayloadLease* lease = nullptr,
                                    DType wire = DTYPE_FLOAT32);

// As EncodeChunkMessage in fp32, with the payload `values` lent to gRPC
// rather than copied: `owner` (non-null) keeps that memory alive and
// unchanged until gRPC releases the slice, when this message's reference
// to it is dropped (on whichever thread gRPC releases it). A shard's pull
// replies send a chunk's weights so (server/shared_floats.h).
grpc::ByteBuffer EncodeSharedChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    absl::Span<const float> values, std::shared_ptr<const void> owner);

// As EncodeSharedChunkMessage, values converted to a 16-bit wire dtype
// already (`halves`, non-null: common/wire_dtype.h), lent to gRPC without
// a copy and held until gRPC releases them: the same bytes as
// EncodeChunkMessage of the fp32 values in halves->dtype. A shard converts
// a chunk's weights once per update for every worker's pull reply so.
grpc::ByteBuffer EncodeSharedChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    std::shared_ptr<const EncodedHalves> halves);

// As EncodeChunkMessage, a sparse chunk (TensorChunk.sparse): a chunk of
// `num_elements` elements of which only `values` at `indices` (strictly
// ascending, each below num_elements, as many as `values`) are nonzero.
// The values are converted to `wire` as above and copied once.
//
// With `row_elements` D > 1, a row-sparse chunk (TensorChunk.row_elements:
// an embedding table's rows): `indices` are row offsets in the chunk
// (strictly ascending, below num_elements / D) and `values` holds D values
// per index, row-major.
grpc::ByteBuffer EncodeSparseChunkMessage(
    const google::protobuf::Message& envelope, int chunk_field,
    int32_t param_id, int32_t chunk_index, int64_t version,
    int64_t num_elements, absl::Span<const uint32_t> indices,
    absl::Span<const float> values, DType wire = DTYPE_FLOAT32,
    int64_t row_elements = 1);

// Serialises a message that carries no payload (a pull request, the end of
// a pull) into a ByteBuffer.
grpc::ByteBuffer EncodeSmallMessage(const google::protobuf::Message& message);

// One received message of the form above, parsed except for the payload.
class ReceivedChunkMessage {
 public:
  // Takes `buffer` over (it is left empty) and parses it: every field
  // outside `chunk_field` into `envelope`; the chunk's key, dtype,
  // element count and version into chunk(); the payload's place is
  // remembered, not copied. A message without the chunk field parses with
  // has_chunk() false.
  //
  // Errors: INVALID_ARGUMENT ("malformed ...") when the bytes are not a
  // valid protobuf message of this shape (truncated, the chunk twice, a
  // deprecated group).
  absl::Status Parse(grpc::ByteBuffer* buffer, int chunk_field,
                     google::protobuf::Message* envelope);

  bool has_chunk() const { return has_chunk_; }
  // The chunk without its data (data() is empty; see payload_bytes()).
  const TensorChunk& chunk() const { return chunk_; }
  int64_t payload_bytes() const { return payload_bytes_; }

  // INVALID_ARGUMENT naming the chunk unless its dtype is FLOAT32,
  // BFLOAT16 or FLOAT16 (scale exponent within -200 to 200) with that
  // dtype's bytes per element times num_elements payload bytes, and
  // num_elements == `num_elements`.
  absl::Status CheckFloat(int64_t num_elements) const;

  // A sparse chunk (TensorChunk.sparse) passes where its values are
  // row_elements (D; 0 counts as 1) per index, D divides `num_elements`,
  // and its indices (the running sums of index_gaps) are strictly
  // ascending and below num_elements / D (so no index repeats).
  //
  // CheckFloat(out.size()), then copies the payload into `out` (one copy,
  // from the received slices; a 16-bit payload converted to fp32 on the
  // way; a sparse chunk densified: zeros but at its indices' elements or
  // rows).
  absl::Status CopyFloatPayload(absl::Span<float> out);
  // As CopyFloatPayload, and also returns the index of the first NaN or
  // infinity written to `out`, or -1 if every value is finite
  // (FindNonFinite()'s answer, common/nonfinite.h). A dense payload is
  // scanned block by block right after each block's copy, while it is in
  // the core's cache, instead of in a second pass over `out`; a sparse
  // one's values only, not the zeros around them (a shard checks every
  // pushed gradient this way).
  absl::StatusOr<int64_t> CopyFloatPayloadFindNonFinite(absl::Span<float> out);
  // As CopyFloatPayload, but a sparse chunk writes only its indices'
  // elements or rows and leaves the rest of `out` as it was (a row-sparse
  // pull: the rows the worker asked for, into its copy of the table).
  absl::Status ScatterFloatPayload(absl::Span<float> out);
  // A row-sparse push, kept sparse (the shard's lazy update): CheckFloat
  // (num_elements), INVALID_ARGUMENT unless the chunk is sparse with
  // TensorChunk.row_elements == `row_elements` (> 1), then the row
  // offsets into `rows` and their values (fp32, row-major) into `values`.
  absl::Status CopyRowsPayload(int64_t num_elements, int64_t row_elements,
                               std::vector<uint32_t>* rows,
                               std::vector<float>* values);

 private:
  absl::Status CheckSparse(int64_t num_elements, int width) const;
  // Elements per index of a sparse chunk: row_elements, or 1.
  int64_t IndexWidth() const {
    return chunk_.row_elements() > 1 ? chunk_.row_elements() : 1;
  }
  // Reads a checked sparse chunk's values into a per-thread buffer and
  // calls `put(index, values of that index)` for each index in order; with
  // `nonfinite`, also the element (index times the row width, plus the
  // value's place in its row) of the first NaN or infinity among the
  // values (-1: none).
  template <typename Put>
  absl::Status ForEachSparseIndex(Put put, int64_t* nonfinite = nullptr);
  // CopyFloatPayload; with `nonfinite`, also where the first NaN or
  // infinity written to `out` is (-1: none).
  absl::Status CopyFloatPayloadInto(absl::Span<float> out, int64_t* nonfinite);
  // Reads the payload's values (as many as `out` holds) into `out`; with
  // `nonfinite`, also the index of the first NaN or infinity among them
  // (-1: none).
  absl::Status ReadValues(absl::Span<float> out, int64_t* nonfinite = nullptr);

  grpc::ByteBuffer buffer_;
  bool has_chunk_ = false;
  TensorChunk chunk_;
  // Offset of the payload's first byte in buffer_, and its length.
  int64_t payload_offset_ = 0;
  int64_t payload_bytes_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CHUNK_MESSAGE_H_
