// Fuzzes the checkpoint reader: the input is a file on disk read as a
// safetensors file (common/safetensors.h: header length, JSON header,
// buffer), then as a PS shard's checkpoint file (ReadShardCheckpoint), whose
// chunks are joined into whole tensors (Assemble) as a restore does.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "fuzz/fuzz_util.h"
#include "server/shard_checkpoint.h"

namespace st = pstrain::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pstrain::fuzz::ScratchDir() + "/file.safetensors";
  pstrain::fuzz::WriteFileOrDie(
      path, absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<st::File> file = st::File::Read(path);
  if (file.ok()) {
    FUZZ_CHECK(file->size_bytes() == size);
    uint64_t covered = 0;
    for (const st::Tensor& t : file->tensors()) {
      FUZZ_CHECK(static_cast<uint64_t>(t.num_elements) *
                     st::DtypeSize(t.dtype) ==
                 t.bytes.size());
      FUZZ_CHECK(t.bytes.size() <= size);
      covered += t.bytes.size();
      FUZZ_CHECK(file->Find(t.name) != nullptr);
      absl::StatusOr<const st::Tensor*> got =
          file->Get(t.name, t.dtype, t.shape);
      FUZZ_CHECK(got.ok() && *got == file->Find(t.name));
      std::vector<int64_t> other = t.shape;
      other.push_back(1);
      FUZZ_CHECK(!file->Get(t.name, t.dtype, other).ok());
    }
    FUZZ_CHECK(covered <= size);
    // The size and crc32 a manifest would hold are checked.
    st::ReadOptions wrong;
    wrong.size_bytes = size + 1;
    FUZZ_CHECK(st::File::Read(path, wrong).status().code() ==
               absl::StatusCode::kDataLoss);
  } else {
    FUZZ_CHECK(file.status().code() == absl::StatusCode::kDataLoss);
  }
  absl::StatusOr<std::vector<pstrain::ChunkSnapshot>> chunks =
      pstrain::ReadShardCheckpoint(path);
  if (!chunks.ok()) return 0;
  FUZZ_CHECK(file.ok());
  // Join them as a restore would, into tensors just big enough.
  std::map<int32_t, int64_t> extent;
  for (const pstrain::ChunkSnapshot& c : *chunks) {
    FUZZ_CHECK(c.spec.param_id >= 0 && c.spec.offset >= 0 &&
               c.spec.num_elements >= 0);
    FUZZ_CHECK(static_cast<int64_t>(c.weights.size()) == c.spec.num_elements);
    int64_t& e = extent[c.spec.param_id];
    e = std::max(e, c.spec.offset + c.spec.num_elements);
  }
  // (A restore takes the sizes from the model, not from the file.)
  if (extent.empty() || extent.rbegin()->first >= 64) return 0;
  for (const auto& [param, n] : extent) {
    if (n > (1 << 20)) return 0;
  }
  std::vector<int64_t> tensor_sizes(extent.rbegin()->first + 1, 1);
  for (const auto& [param, n] : extent) tensor_sizes[param] = n;
  std::vector<std::pair<std::string, std::vector<pstrain::ChunkSnapshot>>>
      files = {{path, *std::move(chunks)}};
  absl::StatusOr<pstrain::ModelState> state =
      pstrain::Assemble(tensor_sizes, files);
  if (state.ok()) {
    FUZZ_CHECK(state->weights.size() == tensor_sizes.size());
    for (size_t t = 0; t < tensor_sizes.size(); ++t) {
      FUZZ_CHECK(static_cast<int64_t>(state->weights[t].size()) ==
                 tensor_sizes[t]);
    }
  }
  return 0;
}
