// Conversion between fp32 arrays and the wire's TensorChunk (raw
// little-endian bytes with dtype and element count beside them).
//
// Thread-safety: stateless functions.
#ifndef PSTRAIN_COMMON_TENSOR_CODEC_H_
#define PSTRAIN_COMMON_TENSOR_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace pstrain {

// "DTYPE_FLOAT32"; "unknown dtype 7" for a number the protocol does not
// define (proto3 keeps unknown enum values, whose DType_Name is "").
std::string DTypeName(int dtype);

// Fills `chunk` with key, dtype FLOAT32, element count, `version` and the
// bytes of `values` (one copy into the message).
void EncodeFloatChunk(int32_t param_id, int32_t chunk_index, int64_t version,
                      absl::Span<const float> values, TensorChunk* chunk);

// Checks dtype FLOAT32 and data.size() == 4 * num_elements, then copies the
// payload into `values`. INVALID_ARGUMENT naming the chunk otherwise.
absl::Status DecodeFloatChunk(const TensorChunk& chunk,
                              std::vector<float>* values);

// DecodeFloatChunk's checks, and num_elements == `expected_elements`
// (INVALID_ARGUMENT naming the chunk otherwise), without copying: for a
// chunk passed on as it is.
absl::Status CheckFloatChunk(const TensorChunk& chunk,
                             int64_t expected_elements);

// As DecodeFloatChunk, into caller memory of exactly `out.size()` elements.
absl::Status DecodeFloatChunkInto(const TensorChunk& chunk,
                                  absl::Span<float> out);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TENSOR_CODEC_H_
