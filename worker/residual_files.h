// Each worker's error-feedback residuals in a checkpoint (top-k
// compression, worker/topk_compression.h):
// DIR/step-<S>/residual-<w>.safetensors beside the shard files
// (worker/checkpoint.h), one fp32 tensor per model parameter under its
// state_dict name, holding worker w's residual at the start of step S, with
// "__metadata__" {"format": "pstrain-residual-1", "step": S, "worker": w,
// "generation": G} (G: the shards' generation it was taken in, so that a file
// left by an abandoned timeline is not taken for this one's).
//
// Each worker writes its own file when it learns of checkpoint S (shard
// 0's PushPullResponse.checkpoint_step); worker 0 waits for every worker's
// file before it writes the manifest, so a checkpoint that becomes
// `latest` holds them all. The checkpoint folder must be shared by the
// workers, as it must be for a resume already.
//
// Files are read as hostile (common/safetensors.h): every tensor's name,
// dtype and shape and the metadata are checked. Errors: NOT_FOUND for a
// missing file; DATA_LOSS naming the file and the field for a wrong one;
// DEADLINE_EXCEEDED from WaitForResidualFiles naming the workers missing.
//
// Thread-safe (no shared state).
#ifndef PSTRAIN_WORKER_RESIDUAL_FILES_H_
#define PSTRAIN_WORKER_RESIDUAL_FILES_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/topk_compression.h"

namespace pstrain {

// "residual-<worker>.safetensors".
std::string ResidualFileName(int worker);

// Writes worker `worker`'s residuals (`residuals[t]`: parameter t, named
// `names[t]`) at the start of `step` durably into `step_dir`, creating the
// folder if needed.
absl::Status WriteResidualFile(
    const std::string& step_dir, int worker, int64_t step, int64_t generation,
    const std::vector<std::string>& names,
    const std::vector<absl::Span<const float>>& residuals);

// Reads worker `worker`'s residuals of `step` from `step_dir`, each
// tensor checked against `names` and `sizes`; any generation.
absl::StatusOr<std::vector<std::vector<float>>> ReadResidualFile(
    const std::string& step_dir, int worker, int64_t step,
    const std::vector<std::string>& names, const std::vector<int64_t>& sizes);

// Worker `worker`'s state of `step` (the compressor's num_state_tensors()
// tensors, named `names`) from `step_dir`'s file into `compressor`
// (TopKCompressor::Reset at `tag`, the step its residual is the start of:
// `step` in sync and allreduce jobs). False, and zeros from step 0, where
// `step_dir` is empty, the compressor keeps no residuals (no error
// feedback) or the folder holds no file of this worker. Other errors:
// ReadResidualFile's.
absl::StatusOr<bool> RestoreResidualFile(const std::string& step_dir,
                                         int worker, int64_t step, int64_t tag,
                                         const std::vector<std::string>& names,
                                         TopKCompressor* compressor);

// Waits (polling every 20 ms, until `deadline`, or until `abandoned` is
// set: CANCELLED) for the files of `workers` (ids; an elastic job's
// members at the cut) of `step`, each with metadata step `step` and
// generation `generation`.
absl::Status WaitForResidualFiles(const std::string& step_dir,
                                  absl::Span<const int> workers, int64_t step,
                                  int64_t generation, absl::Time deadline,
                                  const std::atomic<bool>* abandoned = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_RESIDUAL_FILES_H_
