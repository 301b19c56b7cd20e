#include "common/tensor_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

static_assert(sizeof(float) == 4, "fp32 must be 4 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; big-endian hosts need a swap");

absl::Status CheckChunk(const TensorChunk& chunk) {
  if (chunk.dtype() != DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk (", chunk.key().param_id(), ", ", chunk.key().chunk_index(),
        ") has dtype ", DTypeName(chunk.dtype()), "; expected DTYPE_FLOAT32"));
  }
  // (num_elements * 4 could overflow: divide the byte count instead.)
  if (chunk.num_elements() < 0 || chunk.data().size() % 4 != 0 ||
      static_cast<int64_t>(chunk.data().size() / 4) != chunk.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk (", chunk.key().param_id(), ", ", chunk.key().chunk_index(),
        ") carries ", chunk.data().size(), " bytes for ", chunk.num_elements(),
        " fp32 elements; expected ",
        static_cast<uint64_t>(chunk.num_elements()) * 4, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DTypeName(int dtype) {
  if (DType_IsValid(dtype)) return DType_Name(static_cast<DType>(dtype));
  return absl::StrCat("unknown dtype ", dtype);
}

void EncodeFloatChunk(int32_t param_id, int32_t chunk_index, int64_t version,
                      absl::Span<const float> values, TensorChunk* chunk) {
  chunk->mutable_key()->set_param_id(param_id);
  chunk->mutable_key()->set_chunk_index(chunk_index);
  chunk->set_dtype(DTYPE_FLOAT32);
  chunk->set_num_elements(static_cast<int64_t>(values.size()));
  chunk->set_version(version);
  chunk->mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
}

absl::Status DecodeFloatChunk(const TensorChunk& chunk,
                              std::vector<float>* values) {
  absl::Status status = CheckChunk(chunk);
  if (!status.ok()) return status;
  values->resize(chunk.num_elements());
  // (memcpy from or to a null pointer is undefined even for 0 bytes.)
  if (!chunk.data().empty()) {
    std::memcpy(values->data(), chunk.data().data(), chunk.data().size());
  }
  return absl::OkStatus();
}

absl::Status CheckFloatChunk(const TensorChunk& chunk,
                             int64_t expected_elements) {
  absl::Status status = CheckChunk(chunk);
  if (!status.ok()) return status;
  if (chunk.num_elements() != expected_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk (", chunk.key().param_id(), ", ",
                     chunk.key().chunk_index(), ") has ", chunk.num_elements(),
                     " elements; expected ", expected_elements));
  }
  return absl::OkStatus();
}

absl::Status DecodeFloatChunkInto(const TensorChunk& chunk,
                                  absl::Span<float> out) {
  absl::Status status =
      CheckFloatChunk(chunk, static_cast<int64_t>(out.size()));
  if (!status.ok()) return status;
  if (!out.empty()) {
    std::memcpy(out.data(), chunk.data().data(), chunk.data().size());
  }
  return absl::OkStatus();
}

}  // namespace pstrain
