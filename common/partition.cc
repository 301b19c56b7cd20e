#include "common/partition.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<PartitionPlan> PartitionPlan::Create(
    const std::vector<int64_t>& param_num_elements, int64_t partition_bytes,
    int num_shards, int num_buffers) {
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
  // The layout may come from the network (a worker's Init): bound what it
  // makes this process allocate before allocating anything.
  const int64_t chunk_elements = partition_bytes / 4;
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
  for (size_t p = 0; p < param_num_elements.size(); ++p) {
    const int64_t n = param_num_elements[p];
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p, " has ", n, " elements; expected > 0"));
    }
    plan.first_chunk_.push_back(static_cast<int>(plan.chunks_.size()));
    int32_t index = 0;
    for (int64_t offset = 0; offset < n; offset += chunk_elements) {
      ChunkSpec c;
      c.param_id = static_cast<int32_t>(p);
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
