// A PS shard's part of a checkpoint, as a safetensors file
// (common/safetensors.h), and the whole model's PS state put back together
// from every shard's file.
//
// A shard file holds, for each chunk the shard owned, the tensors
//   "<param_id>:<offset>:<num_elements>:w"   fp32 weights
//   "<param_id>:<offset>:<num_elements>:m"   Adam's first moment (parameters)
//   "<param_id>:<offset>:<num_elements>:v"   Adam's second moment
// (offset and num_elements in elements of the PS tensor `param_id`: a chunk
// is stored by what it is, not by the shard layout that held it) and one
// I64 tensor "chunks" [num_chunks, 5] of (param_id, offset, num_elements,
// version, is_buffer) rows, with metadata "format" =
// "pstrain-shard-checkpoint/1", "shard", "num_shards" and "step".
//
// Assemble() joins the chunks of all shard files into whole PS tensors, so
// that a checkpoint loads into a job with any number of shards and any
// partition size (resharding on load, as PyTorch's distributed checkpoint).
//
// Errors are one line naming the file and the problem: DATA_LOSS for a file
// that is not a valid shard file (bad layout, missing tensor, ranges that
// overlap, leave a gap or pass the tensor's end), INVALID_ARGUMENT for a
// checkpoint that does not fit the model (tensor count or sizes).
// Thread-compatible.
#ifndef PSTRAIN_SERVER_SHARD_CHECKPOINT_H_
#define PSTRAIN_SERVER_SHARD_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "server/parameter_shard.h"

namespace pstrain {

inline constexpr char kShardCheckpointFormat[] = "pstrain-shard-checkpoint/1";

// The file shard `shard_index` writes for checkpoint `step`:
// ROOT/step-<step>/shard-<shard_index>.safetensors, where ROOT is the job's
// checkpoint folder from the shard's own configuration
// (ShardOptions::checkpoint_dir), never from a request: a Checkpoint request
// names only the step, so no caller chooses a path on the shard's host.
// Creates the step folder (mode 0777 less the umask) when it is missing.
// Errors: FAILED_PRECONDITION when `root` is empty (the job has no
// checkpoint_dir) or is not a folder; INVALID_ARGUMENT for a negative step
// or shard index; PERMISSION_DENIED when ROOT/step-<step> exists as anything
// but a folder (a symbolic link included) or resolves outside ROOT; the
// errno of a failed mkdir/lstat/realpath as INTERNAL. The check and the
// later write are separate system calls: a local user who can replace the
// step folder between them is outside the model (docs/SECURITY.md).
absl::StatusOr<std::string> ShardCheckpointPath(const std::string& root,
                                                int64_t step, int shard_index);

// ShardCheckpointPath's checks, creating nothing: a missing step folder is
// fine (ShardCheckpointPath makes it). A shard runs them before it takes a
// checkpoint's snapshot, and makes the folder only for a cut it will write
// (PsService::Checkpoint), so that a refused request leaves no folder.
absl::Status CheckShardCheckpointPath(const std::string& root, int64_t step,
                                      int shard_index);

// Writes `chunks` (ParameterShard::Snapshot()) durably to `path`
// (safetensors::Write with `options`).
absl::StatusOr<safetensors::WriteResult> WriteShardCheckpoint(
    const std::string& path, const std::vector<ChunkSnapshot>& chunks,
    int shard_index, int num_shards, int64_t step,
    const safetensors::WriteOptions& options = {});

// The shard's own retention, run just before it writes its file of
// checkpoint `written_step` under `root`, as worker 0 keeps its own
// (worker/checkpoint.h): of the files of shard `shard_index` in
// ROOT/step-<N> folders (real folders, not links), it removes those of
// steps after `written_step` (an abandoned timeline: within a generation a
// shard's cuts only grow, and a restore goes back to an older one); with
// `latest_step` (worker 0's newest complete checkpoint, below
// `written_step`; else -1) those of steps between the two (cuts that never
// completed), keeping the newest `keep` at or below it; without, the
// newest `keep` before `written_step` (the one just begun may yet fail).
// Then each step folder left empty. So a shard holds at most keep + 1 files of
// its state whatever a worker 0 key asks for (docs/SECURITY.md), and the files
// on a shard host that worker 0 cannot reach are kept as worker 0 keeps
// its own. `keep` <= 0: nothing is removed. Best effort: the files it
// could not remove, as one INTERNAL status naming the first.
absl::Status RemoveOldShardCheckpoints(const std::string& root, int shard_index,
                                       int64_t written_step,
                                       int64_t latest_step, int keep);

// Reads a shard file back; `options` carries the manifest's size and crc32.
// Only spec.param_id, spec.offset and spec.num_elements of each chunk are
// set (the shard layout it had is not needed to load it).
absl::StatusOr<std::vector<ChunkSnapshot>> ReadShardCheckpoint(
    const std::string& path, const safetensors::ReadOptions& options = {});

// The PS state of a whole model: per PS tensor (parameters, then buffers),
// its weights, Adam state (empty for buffers) and, per element range, the
// version of the chunk it came from.
struct ModelState {
  std::vector<std::vector<float>> weights, m, v;
  struct Range {
    int64_t offset = 0, num_elements = 0, version = 0;
  };
  std::vector<std::vector<Range>> versions;  // Sorted by offset.

  // The version of elements [offset, offset + n) of tensor `t`: the
  // smallest of the ranges they overlap (sync checkpoints have one).
  int64_t VersionOf(int t, int64_t offset, int64_t n) const;
};

// Joins the chunks of every shard file (`files`: path -> its chunks, for
// the error messages) into whole tensors of `tensor_num_elements` each
// (PS tensor order). Every element must come exactly once.
absl::StatusOr<ModelState> Assemble(
    const std::vector<int64_t>& tensor_num_elements,
    const std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>>&
        files);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SHARD_CHECKPOINT_H_
