// The partition plan: how the model's parameter tensors are cut into chunks
// and which parameter-server shard owns each chunk.
//
// Every process derives the same plan from the model's ordered list of
// parameter sizes, the chunk size bound and the number of shards, with no
// lookup (as BytePS does, Jiang et al., OSDI 2020): each tensor is cut into
// chunks of at most `partition_bytes` bytes (the last chunk of a tensor may
// be smaller), then chunks are assigned, largest first, to the shard holding
// the fewest bytes so far (ties to the lower shard index, so the result is
// deterministic). A chunk is keyed by (param_id, chunk_index).
//
// Row-sparse tensors (embedding tables pushed and pulled by row id; issue
// 41, server/parameter_shard.h): a tensor of R rows of D elements is cut on
// row boundaries, into chunks of max(1, partition_bytes / (4 D)) whole rows,
// each a contiguous range of row ids (range partitioning), balanced over
// the shards as any chunk; so a table larger than one shard's memory is
// spread over every shard.
//
// Thread-safety: immutable after Create(); const methods may be called from
// any thread.
#ifndef PSTRAIN_COMMON_PARTITION_H_
#define PSTRAIN_COMMON_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pstrain {

struct ChunkSpec {
  int32_t param_id = 0;
  int32_t chunk_index = 0;
  // Offset of the chunk's first element in its tensor, in elements.
  int64_t offset = 0;
  // Number of fp32 elements in the chunk.
  int64_t num_elements = 0;
  // Index of the shard that owns the chunk.
  int32_t shard = 0;
  // A row-sparse tensor's chunk: elements per row (D), and the chunk holds
  // rows offset / D to (offset + num_elements) / D - 1. 0: dense.
  int64_t row_elements = 0;
};

// The bytes of a sparse chunk's offsets on the wire (TensorChunk.index_gaps:
// the first offset, then each minus the one before, one varint each, 1 to 5
// bytes). `indices` strictly ascending.
int64_t IndexGapBytes(absl::Span<const uint32_t> indices);

// Whether the pairs at `indices` of a chunk of `n` entries (the offsets as
// above, a value of `value_bytes` each: TensorChunk.sparse) take at least
// the bytes of the `n` values sent whole. A sender that may send either (a
// worker's top-k push, a shard's delta pull) sends the whole chunk then.
bool SparseAtLeastDense(absl::Span<const uint32_t> indices, int64_t n,
                        int value_bytes);
// The same for `k` pairs whose offsets take `index_bytes` (IndexGapBytes,
// counted once by a sender that sends the same pairs again).
bool PairsAtLeastDense(int64_t index_bytes, int64_t k, int64_t n,
                       int value_bytes);

class PartitionPlan {
 public:
  // Default chunk bound: 4 MiB, as in BytePS.
  static constexpr int64_t kDefaultPartitionBytes = 4 << 20;
  // Default chunk bound with priority pulls (JobSpec.priority_pulls):
  // 256 KiB, near P3's 50,000-parameter slices (Jayarajan et al.,
  // "Priority-based Parameter Propagation for Distributed DNN Training",
  // SysML 2019), so that the next forward can start on a layer's first
  // chunks. On emulated 1 Gbit/s links with ResNet-18 priority pulls gave
  // 1.15x at this size and 1.04-1.09x at 4 MiB (BENCHMARKS.md).
  static constexpr int64_t kPriorityPartitionBytes = 256 << 10;
  // Bounds on a layout (INVALID_ARGUMENT past them), so that a plan made
  // from an untrusted layout cannot allocate without limit: shards, chunks
  // in all (32 bytes of ChunkSpec each), and fp32 elements in all (2^40:
  // 4 TiB of weights).
  static constexpr int kMaxShards = 4096;
  static constexpr int64_t kMaxChunks = int64_t{1} << 22;
  static constexpr int64_t kMaxElements = int64_t{1} << 40;

  // `param_num_elements`: element count of each parameter tensor (fp32), in
  // model order; each must be > 0. `partition_bytes` must be a positive
  // multiple of 4 bytes (one fp32). At most kMaxShards shards, kMaxChunks
  // chunks and kMaxElements elements. The last `num_buffers` tensors are
  // buffers (BatchNorm running statistics): the PS averages them over
  // workers instead of applying the optimizer. `param_row_elements`: empty
  // (every tensor dense), or one entry per tensor: 0 for a dense one, D > 0
  // for a row-sparse one (D divides its element count; not a buffer).
  // Returns INVALID_ARGUMENT otherwise.
  static absl::StatusOr<PartitionPlan> Create(
      const std::vector<int64_t>& param_num_elements, int64_t partition_bytes,
      int num_shards, int num_buffers = 0,
      const std::vector<int64_t>& param_row_elements = {});

  int num_shards() const { return num_shards_; }
  int64_t partition_bytes() const { return partition_bytes_; }
  const std::vector<int64_t>& param_num_elements() const {
    return param_num_elements_;
  }
  int num_buffers() const { return num_buffers_; }
  // As given to Create() (empty: every tensor dense).
  const std::vector<int64_t>& param_row_elements() const {
    return param_row_elements_;
  }
  // Elements per row of tensor `param_id` if it is row-sparse, else 0.
  int64_t row_elements(int32_t param_id) const {
    return param_row_elements_.empty() ? 0 : param_row_elements_[param_id];
  }
  // Whether tensor `param_id` is a buffer (one of the last num_buffers()).
  bool is_buffer(int32_t param_id) const {
    return param_id >=
           static_cast<int32_t>(param_num_elements_.size()) - num_buffers_;
  }
  // Every chunk, ordered by (param_id, chunk_index).
  const std::vector<ChunkSpec>& chunks() const { return chunks_; }
  // The chunks owned by `shard`, ordered by (param_id, chunk_index).
  std::vector<ChunkSpec> ChunksOfShard(int shard) const;
  // Index into chunks() of (param_id, chunk_index), or -1 if there is none.
  int FindChunk(int32_t param_id, int32_t chunk_index) const;
  // Bytes owned by each shard.
  std::vector<int64_t> BytesPerShard() const;

 private:
  int num_shards_ = 0;
  int64_t partition_bytes_ = 0;
  int num_buffers_ = 0;
  std::vector<int64_t> param_num_elements_;
  std::vector<int64_t> param_row_elements_;
  std::vector<ChunkSpec> chunks_;
  // first_chunk_[p] = index in chunks_ of (p, 0).
  std::vector<int> first_chunk_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_PARTITION_H_
