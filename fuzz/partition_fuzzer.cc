// Fuzzes the partition plan a shard derives from the model layout that
// worker 0's Init sends (PartitionPlan::Create): parameter sizes, chunk
// bound, shard and buffer counts all come from the input. An accepted plan
// must cut every tensor into contiguous chunks of at most partition_bytes,
// give each to a shard in range, and answer FindChunk for each.
#include <cstdint>
#include <vector>

#include "common/partition.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstrain::fuzz::FuzzInput in(data, size);
  const int num_shards = in.Take<int16_t>();
  const int num_buffers = in.Take<int8_t>();
  // Mostly small chunk bounds, sometimes any 64-bit value.
  const uint8_t kind = in.Take<uint8_t>();
  int64_t partition_bytes = (kind & 1)
                                ? in.Take<int64_t>()
                                : 4 * static_cast<int64_t>(in.Take<uint16_t>());
  // Not a multiple of 4; wraps past INT64_MAX (modulo 2^64, not UB).
  if (kind & 2) {
    partition_bytes = static_cast<int64_t>(
        static_cast<uint64_t>(partition_bytes) + in.Take<uint8_t>() % 4);
  }
  std::vector<int64_t> sizes;
  while (!in.empty() && sizes.size() < 64) {
    const uint8_t k = in.Take<uint8_t>();
    sizes.push_back((k & 1) ? in.Take<int64_t>() : in.Take<uint16_t>());
  }
  // Work per input: a valid plan of up to kMaxChunks (2^22) chunks takes
  // seconds under ASan (libFuzzer reported such inputs as slow units, and
  // the target ran at about 20 inputs/s). Plans of more than 2^15 chunks up
  // to that limit are left to partition_test; layouts past the limit are
  // still fed, as they are refused before anything is allocated.
  constexpr int64_t kMaxFuzzedChunks = int64_t{1} << 15;
  if (partition_bytes >= 4) {
    const int64_t bound = partition_bytes / 4;
    int64_t chunks = 0;
    for (int64_t n : sizes) {
      if (n <= 0) continue;
      const int64_t c = n / bound + (n % bound != 0 ? 1 : 0);
      if (c > pstrain::PartitionPlan::kMaxChunks - chunks) {
        chunks = pstrain::PartitionPlan::kMaxChunks + 1;
        break;
      }
      chunks += c;
    }
    if (chunks > kMaxFuzzedChunks &&
        chunks <= pstrain::PartitionPlan::kMaxChunks) {
      return 0;
    }
  }
  absl::StatusOr<pstrain::PartitionPlan> plan = pstrain::PartitionPlan::Create(
      sizes, partition_bytes, num_shards, num_buffers);
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const int64_t bound = partition_bytes / 4;
  size_t i = 0;
  int64_t total = 0;
  for (size_t p = 0; p < sizes.size(); ++p) {
    int64_t offset = 0;
    for (int32_t c = 0; offset < sizes[p]; ++c, ++i) {
      FUZZ_CHECK(i < plan->chunks().size());
      const pstrain::ChunkSpec& chunk = plan->chunks()[i];
      FUZZ_CHECK(chunk.param_id == static_cast<int32_t>(p));
      FUZZ_CHECK(chunk.chunk_index == c);
      FUZZ_CHECK(chunk.offset == offset);
      FUZZ_CHECK(chunk.num_elements > 0 && chunk.num_elements <= bound);
      FUZZ_CHECK(chunk.shard >= 0 && chunk.shard < num_shards);
      FUZZ_CHECK(plan->FindChunk(chunk.param_id, c) == static_cast<int>(i));
      offset += chunk.num_elements;
    }
    FUZZ_CHECK(offset == sizes[p]);
    FUZZ_CHECK(plan->FindChunk(static_cast<int32_t>(p), -1) == -1);
    total += sizes[p];
  }
  FUZZ_CHECK(i == plan->chunks().size());
  FUZZ_CHECK(plan->FindChunk(-1, 0) == -1);
  FUZZ_CHECK(plan->FindChunk(static_cast<int32_t>(sizes.size()), 0) == -1);
  int64_t bytes = 0;
  for (int64_t b : plan->BytesPerShard()) bytes += b;
  FUZZ_CHECK(bytes == total * 4);
  size_t owned = 0;
  for (int s = 0; s < num_shards && s < 8; ++s) {
    owned += plan->ChunksOfShard(s).size();
  }
  if (num_shards <= 8) FUZZ_CHECK(owned == plan->chunks().size());
  return 0;
}
