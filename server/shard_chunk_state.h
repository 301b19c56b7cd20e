// ParameterShard's per-chunk state (ParameterShard::ChunkState) and the
// pushes of one chunk and step (ParameterShard::StepSlot), complete where
// parameter_shard.h names them: its lock annotations read a chunk's mutex
// (ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu)). Not an interface: only
// ParameterShard's own files (parameter_shard*.cc) touch these fields, each
// ABSL_GUARDED_BY(mu) field under the chunk's mutex.
#ifndef PSTRAIN_SERVER_SHARD_CHUNK_STATE_H_
#define PSTRAIN_SERVER_SHARD_CHUNK_STATE_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/partition.h"
#include "server/row_sparse.h"
#include "server/shard_types.h"
#include "server/shared_floats.h"

namespace pstrain {

// The pushes of one chunk and step: one gradient slot per worker; the
// barrier sums into pending[0].
struct ShardStepSlot {
  std::vector<std::vector<float>> pending;
  std::vector<bool> has_pending;
  int num_pending = 0;
  // A worker skipped its push of the step.
  bool skipped = false;
  // Clipping: pending[0] holds the step's average already (a row-sparse
  // chunk: row_average).
  bool averaged = false;
  // Row-sparse chunks: each worker's rows, and their average.
  std::vector<RowValues> row_pending;
  RowValues row_average;
};

struct ShardChunkState {
  ChunkSpec spec;
  mutable absl::Mutex mu;
  // Shared with pull replies in flight (server/shared_floats.h).
  SharedFloats weights ABSL_GUARDED_BY(mu);
  std::vector<float> m ABSL_GUARDED_BY(mu);
  std::vector<float> v ABSL_GUARDED_BY(mu);
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  // Sync mode: slots[step % (staleness + 1)] collects the pushes of
  // `step`, for steps version to version + staleness. Async mode:
  // slots[0] holds the buffers' latest values per worker.
  std::vector<ShardStepSlot> slots ABSL_GUARDED_BY(mu);
  // Async mode: the gradient being pushed.
  std::vector<float> incoming ABSL_GUARDED_BY(mu);
  // Buffers in async mode: which workers' latest values are in slots[0].
  int num_latest ABSL_GUARDED_BY(mu) = 0;
  // Sync mode: the state before the update of step `undo_step` (-1:
  // none kept), until that step is decided; swapped back if it is
  // skipped. Also the buffers the next update is written into.
  SharedFloats prev_weights ABSL_GUARDED_BY(mu);
  std::vector<float> prev_m ABSL_GUARDED_BY(mu);
  std::vector<float> prev_v ABSL_GUARDED_BY(mu);
  int64_t undo_step ABSL_GUARDED_BY(mu) = -1;
  // Delta pulls: prev_weights holds the weights of version prev_version
  // (== version - 1) bit for bit, from the swap of a dense update until
  // anything else changes them (-1: not kept); the entries that update
  // changed, once a pull asked (delta_version: the version they lead
  // to, -1: none computed; delta_dense: half or more changed;
  // delta_index_bytes: the offsets' bytes on the wire).
  int64_t prev_version ABSL_GUARDED_BY(mu) = -1;
  std::vector<uint32_t> delta_indices ABSL_GUARDED_BY(mu);
  int64_t delta_index_bytes ABSL_GUARDED_BY(mu) = 0;
  std::vector<float> delta_values ABSL_GUARDED_BY(mu);
  int64_t delta_version ABSL_GUARDED_BY(mu) = -1;
  bool delta_dense ABSL_GUARDED_BY(mu) = false;
  // Row-sparse chunks: the rows undo_step's update changed, as they were;
  // an async push's rows.
  RowUndo row_undo ABSL_GUARDED_BY(mu);
  RowValues incoming_rows ABSL_GUARDED_BY(mu);
  // A deferred snapshot (BeginDeferredSnapshot()) this chunk still owes:
  // where it copies itself when it is at snap_version; null: none.
  ChunkSnapshot* snap_into ABSL_GUARDED_BY(mu) = nullptr;
  int64_t snap_version ABSL_GUARDED_BY(mu) = -1;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SHARD_CHUNK_STATE_H_
