// The values a ParameterShard's callers pass and receive
// (server/parameter_shard.h): admission claims, pull subsets and orders,
// delta chunks, initial chunks, snapshots and statistics. Plain values;
// thread-safety as any struct's (a PullOrder's callbacks are called on the
// pulling thread).
#ifndef PSTRAIN_SERVER_SHARD_TYPES_H_
#define PSTRAIN_SERVER_SHARD_TYPES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/partition.h"
#include "server/shared_floats.h"

namespace pstrain {

// Backup workers: what a worker's step end says about its admission.
enum class AdmissionClaim {
  kDecide,    // to shard 0, which admits or refuses
  kAdmitted,  // to another shard: shard 0 admitted the worker to the step
  kLate,      // to another shard: shard 0 refused it (late)
};

// A part of a shard's chunks that one pull asks for (PullRequest.channel and
// channels): those whose index i among the shard's chunks in plan order has
// i % count == index.
struct PullSubset {
  int index = 0;
  int count = 1;
};

// The entries of a chunk at version v + 1 that differ, bit for bit, from
// its weights at version v (element offsets into the chunk, strictly
// ascending, and their values at v + 1), fewer than half of its elements.
// Valid only during the visit (the chunk's lock is held).
struct ChunkDelta {
  absl::Span<const uint32_t> indices;
  absl::Span<const float> values;
  // The offsets' bytes on the wire (IndexGapBytes of `indices`).
  int64_t index_bytes = 0;
};

// How one pull hands out its chunks (PullRequest.priority,
// announce_decision and have_version; P3, Jayarajan et al. MLSys 2019).
struct PullOrder {
  // Among the chunks ready together, the lowest (param_id, chunk_index)
  // first, chosen again after every chunk: a front layer's chunk that gets
  // ready while another is written passes the later layers' chunks still
  // waiting. false: one pass in plan order per round.
  bool front_first = false;
  // Sync, min_version >= 1 (optional): called once, as soon as step
  // min_version - 1 is decided and was not skipped, before the chunks still
  // unsent; false stops the pull with CANCELLED.
  std::function<bool(int64_t step)> decided;
  // Delta pulls (PullRequest.have_version): the puller holds every chunk
  // of the pull at version `have_version` (>= 0; -1: none). A chunk at
  // have_version + 1 whose update changed fewer than half of its entries
  // (sync mode, a dense parameter chunk, not a buffer nor a row-sparse
  // table's, with its weights before that update still kept) goes to
  // `visit_delta` instead of the pull's visitor, with those entries
  // (ChunkDelta; computed once per chunk and version, whichever worker
  // asks first), where its offsets (varint gaps) and values of
  // `wire_bytes` bytes each take fewer bytes than the whole chunk
  // (SparseAtLeastDense, common/partition.h). Both must be set
  // for either to count.
  int64_t have_version = -1;
  int wire_bytes = 4;
  std::function<void(const ChunkSpec& chunk, int64_t version,
                     const ChunkDelta& delta)>
      visit_delta;
  // Optional: a dense chunk's whole weights (not a row-sparse table's)
  // go here instead of to the pull's visitor, as the chunk's SharedFloats
  // (server/shared_floats.h), under the chunk's lock: the visitor may take
  // a reference that keeps them alive and unchanged until it is released
  // (Share(): the shard's next write to that storage goes elsewhere) or
  // their 16-bit form, converted once per update for every puller
  // (ShareHalves()), so that a server writes them to the stream without a
  // copy.
  std::function<void(const ChunkSpec& chunk, int64_t version,
                     SharedFloats& weights)>
      visit_shared;
};

// Initial values of one chunk, as sent by worker 0. A fresh job sends only
// `values`; a job resumed from a checkpoint also sends the Adam state `m`
// and `v` (empty: zeros; buffers have none) and the chunk's `version` (the
// updates applied so far, which is also Adam's step count).
struct InitChunk {
  int32_t param_id = 0;
  int32_t chunk_index = 0;
  std::vector<float> values;
  std::vector<float> m, v;
  int64_t version = 0;
};

// One chunk's state as Snapshot() copied it.
struct ChunkSnapshot {
  ChunkSpec spec;
  bool is_buffer = false;
  int64_t version = 0;
  std::vector<float> weights, m, v;  // m and v empty for buffers.
};

struct ShardStats {
  bool initialized = false;
  int64_t generation = 0;
  int64_t samples = 0;
  int64_t min_version = 0;
  // Sync: the last step decided (-1: none); what a reopen starts after
  // (Reopen()). Async: -1.
  int64_t decided_step = -1;
  // Sync: the generation's barrier is broken (a member's stream broke
  // mid-step, or worker 0 is reopening the shards): no step of it can
  // complete until a reopen or restore starts the next generation.
  bool barrier_broken = false;
  int64_t pushes = 0;
  int64_t pulls = 0;
  // Sync: steps skipped (non-finite values); async: pushes dropped.
  int64_t skipped = 0;
  // Chunk updates applied (one per chunk per completed barrier in sync
  // mode, per push in async mode), and the time spent in the optimizer for
  // them, ns (steady clock around each chunk's update; the averaging of
  // the workers' gradients is not counted).
  int64_t updates = 0;
  int64_t optimizer_ns = 0;
  // Backup workers: pushes of a step already decided, dropped; step ends
  // refused (shard 0) or reported late (the others).
  int64_t late_pushes = 0;
  int64_t late_steps = 0;
  // Chunk updates not applied because their result was not finite
  // (finite gradients whose sum, or optimizer state, left float's range):
  // the chunk kept its weights for that step (sync: while the step's other
  // chunks were updated; async: the push is dropped). The last one's
  // description ("update of chunk (p, c) for step s overflowed to inf at
  // element i; not applied"), empty if none.
  int64_t overflowed = 0;
  std::string last_overflow;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SHARD_TYPES_H_
