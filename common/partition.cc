#include "common/partition.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pstrain {

int64_t IndexGapBytes(absl::Span<const uint32_t> indices) {
  int64_t bytes = 0;
  uint32_t before = 0;
  for (const uint32_t at : indices) {
    // A varint holds 7 bits a byte; 0 takes one byte.
    bytes +=
        std::max(1, (static_cast<int>(absl::bit_width(at - before)) + 6) / 7);
    before = at;
  }
  return bytes;
}

bool SparseAtLeastDense(absl::Span<const uint32_t> indices, int64_t n,
                        int value_bytes) {
  const int64_t k = static_cast<int64_t>(indices.size());
  // A varint takes 1 to 5 bytes: most chunks are decided without the
  // pass over the gaps.
  if (k * (1 + value_bytes) >= n * value_bytes) return true;
  if (k * (5 + value_bytes) < n * value_bytes) return false;
  return PairsAtLeastDense(IndexGapBytes(indices), k, n, value_bytes);
}

bool PairsAtLeastDense(int64_t index_bytes, int64_t k, int64_t n,
                       int value_bytes) {
  return index_bytes + k * value_bytes >= n * value_bytes;
}

namespace {

absl::Status CheckRowElements(const std::vector<int64_t>& param_num_elements,
                              int num_buffers,
                              const std::vector<int64_t>& row_elements) {
  if (row_elements.empty()) return absl::OkStatus();
  if (row_elements.size() != param_num_elements.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param_row_elements has ", row_elements.size(),
                     " entries; expected one per tensor (",
                     param_num_elements.size(), ") or none"));
  }
  const size_t first_buffer = param_num_elements.size() - num_buffers;
  for (size_t p = 0; p < row_elements.size(); ++p) {
    const int64_t d = row_elements[p];
    if (d == 0) continue;
    if (d < 0 || param_num_elements[p] <= 0 || p >= first_buffer ||
        param_num_elements[p] % d != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", p, " of ", param_num_elements[p], " elements has ", d,
          " elements per row; expected 0 (dense) or a divisor of its size "
          "(row-sparse tensors are parameters, not buffers)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PartitionPlan> PartitionPlan::Create(
    const std::vector<int64_t>& param_num_elements, int64_t partition_bytes,
    int num_shards, int num_buffers,
    const std::vector<int64_t>& param_row_elements) {
  if (num_shards <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be > 0, got ", num_shards));
  }
  if (partition_bytes < 4 || partition_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition_bytes must be a positive multiple of 4 bytes, got ",
        partition_bytes));
  }
  if (param_num_elements.empty()) {
    return absl::InvalidArgumentError("the model has no parameters");
  }
  if (num_buffers < 0 ||
      num_buffers >= static_cast<int>(param_num_elements.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_buffers ", num_buffers, "; expected in [0, ",
                     param_num_elements.size(), ") (at least one parameter)"));
  }
  if (num_shards > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_shards ", num_shards, "; expected at most ", kMaxShards));
  }
  RETURN_IF_ERROR(
      CheckRowElements(param_num_elements, num_buffers, param_row_elements));
  // The layout may come from the network (a worker's Init): bound what it
  // makes this process allocate before allocating anything.
  const int64_t partition_elements = partition_bytes / 4;
  // Chunk size of tensor p: whole rows for a row-sparse one.
  auto chunk_elements_of = [&](size_t p) {
    const int64_t d = param_row_elements.empty() ? 0 : param_row_elements[p];
    if (d == 0) return partition_elements;
    return std::max<int64_t>(1, partition_elements / d) * d;
  };
  int64_t total_elements = 0;
  int64_t total_chunks = 0;
  for (size_t p = 0; p < param_num_elements.size(); ++p) {
    const int64_t n = param_num_elements[p];
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p, " has ", n, " elements; expected > 0"));
    }
    if (n > kMaxElements - total_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", p, " has ", n, " elements; expected at most ",
          kMaxElements, " elements in all"));
    }
    total_elements += n;
    const int64_t chunk_elements = chunk_elements_of(p);
    total_chunks += n / chunk_elements + (n % chunk_elements != 0 ? 1 : 0);
    if (total_chunks > kMaxChunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the layout makes more than ", kMaxChunks, " chunks of at most ",
          partition_bytes, " bytes (parameter ", p, " of ", n,
          " elements); raise partition_bytes"));
    }
  }
  PartitionPlan plan;
  plan.num_buffers_ = num_buffers;
  plan.num_shards_ = num_shards;
  plan.partition_bytes_ = partition_bytes;
  plan.param_num_elements_ = param_num_elements;
  plan.param_row_elements_ = param_row_elements;
  for (size_t p = 0; p < param_num_elements.size(); ++p) {
    const int64_t n = param_num_elements[p];
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p, " has ", n, " elements; expected > 0"));
    }
    plan.first_chunk_.push_back(static_cast<int>(plan.chunks_.size()));
    int32_t index = 0;
    const int64_t chunk_elements = chunk_elements_of(p);
    for (int64_t offset = 0; offset < n; offset += chunk_elements) {
      ChunkSpec c;
      c.param_id = static_cast<int32_t>(p);
      c.row_elements = plan.row_elements(static_cast<int32_t>(p));
      c.chunk_index = index++;
      c.offset = offset;
      c.num_elements = std::min(chunk_elements, n - offset);
      plan.chunks_.push_back(c);
    }
  }
  // Greedy balancing: largest chunk first onto the least loaded shard.
  std::vector<int> order(plan.chunks_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return plan.chunks_[a].num_elements > plan.chunks_[b].num_elements;
  });
  // The least loaded shard (ties: the lowest index) from a min-heap of
  // (load, shard): O(log shards) per chunk, not O(shards).
  std::priority_queue<std::pair<int64_t, int>,
                      std::vector<std::pair<int64_t, int>>,
                      std::greater<std::pair<int64_t, int>>>
      load;
  for (int s = 0; s < num_shards; ++s) load.push({0, s});
  for (int i : order) {
    auto [bytes, shard] = load.top();
    load.pop();
    plan.chunks_[i].shard = shard;
    load.push({bytes + plan.chunks_[i].num_elements, shard});
  }
  return plan;
}

std::vector<ChunkSpec> PartitionPlan::ChunksOfShard(int shard) const {
  std::vector<ChunkSpec> out;
  for (const ChunkSpec& c : chunks_) {
    if (c.shard == shard) out.push_back(c);
  }
  return out;
}

int PartitionPlan::FindChunk(int32_t param_id, int32_t chunk_index) const {
  if (param_id < 0 || param_id >= static_cast<int32_t>(first_chunk_.size())) {
    return -1;
  }
  // In 64 bits: a chunk index from the network may be near INT32_MAX.
  const int64_t i = int64_t{first_chunk_[param_id]} + chunk_index;
  if (chunk_index < 0 || i >= static_cast<int64_t>(chunks_.size()) ||
      chunks_[i].param_id != param_id) {
    return -1;
  }
  return static_cast<int>(i);
}

std::vector<int64_t> PartitionPlan::BytesPerShard() const {
  std::vector<int64_t> bytes(num_shards_, 0);
  for (const ChunkSpec& c : chunks_) bytes[c.shard] += c.num_elements * 4;
  return bytes;
}

}  // namespace pstrain
