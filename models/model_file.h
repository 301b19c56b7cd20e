// The trained model as one file PyTorch loads: a safetensors file
// (common/safetensors.h) holding every parameter and BatchNorm buffer of a
// zoo model under the names and layouts of the equivalent PyTorch module
// (tools/torch/torch_models.py: "conv1.weight" [out, in, kH, kW] (OIHW),
// "fc1.weight" [out, in], "bn1.running_mean" [C], ...), plus one I64 scalar
// "<bn>.num_batches_tracked" per BatchNorm layer, as torch.nn.BatchNorm2d's
// state_dict has it, so that in PyTorch
//
//   model.load_state_dict(safetensors.torch.load_file(path))
//
// works with strict=True. The header's "__metadata__" says what the model is
// ("format": "pstrain.model/1", "model", "input_chw" as "C,H,W" ("S" for a
// sequence model), "num_classes", "steps", "dataset"), so a reader can
// rebuild it, and, for an image model, how its input was made:
// "input_mean" and "input_stddev", one per channel ("0.286,..."), the
// training set's statistics that worker/dataset.cc standardises pixels in
// [0, 1] with. The weights compute the trained function of
// (pixel / 255 - mean) / stddev, not of pixel / 255. A sequence model's tied
// decoder weight is stored once, as the token embedding
// (tools/torch/torch_models.py's Bert has one key).
//
// Thread-compatible: these functions touch the model (not thread-safe) and
// the file; call them from the model's thread.
#ifndef PSTRAIN_MODELS_MODEL_FILE_H_
#define PSTRAIN_MODELS_MODEL_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/safetensors.h"
#include "models/model.h"
#include "models/tensor.h"

namespace pstrain {

// What the file's metadata says about the model it holds.
struct ModelFileInfo {
  std::string model;  // Zoo name, "lenet5".
  Shape input_chw;    // {C, H, W}; {S} for a sequence model (model.h).
  int num_classes = 0;
  int64_t steps = 0;  // Training steps (per worker) behind these weights.
  std::string dataset;
  // Per-channel standardisation of the input (x - mean) / stddev, x in
  // [0, 1]; both empty for a sequence model and for files written before
  // these keys (or by another tool). Written with 9 significant digits.
  std::vector<double> input_mean;
  std::vector<double> input_stddev;
};

// Writes `weights` (one span per PS tensor of `model`, as
// Model::HostWeights(): parameters, then buffers) durably to `path` with the
// metadata of `info` (its model and input must be `model`'s). BatchNorm's
// num_batches_tracked is `info.steps`. Errors: INVALID_ARGUMENT if `weights`
// does not match the model's tensors; the safetensors writer's otherwise
// (NOT_FOUND for a missing folder, ...), each naming `path`. Returns the
// file's size and crc32 (for a checkpoint's manifest); `options` as
// safetensors::Write's.
absl::StatusOr<safetensors::WriteResult> SaveModelFile(
    const Model& model, absl::Span<const absl::Span<float>> weights,
    const ModelFileInfo& info, const std::string& path,
    const safetensors::WriteOptions& options = {});

// Reads the metadata of the model file `path` (validating the whole file).
// DATA_LOSS naming the file when it is not a pstrain model file (no or bad
// metadata) or not a valid safetensors file. Without `options`, `path` is a
// file a user named: a symbolic link at `path` is followed (the file must
// still be a regular one, common/regular_file.h); with them, as they say (a
// checkpoint's model file: its manifest's size and crc32, links refused).
// Text from the file is C-escaped in messages.
absl::StatusOr<ModelFileInfo> ReadModelFileInfo(const std::string& path);
absl::StatusOr<ModelFileInfo> ReadModelFileInfo(
    const std::string& path, const safetensors::ReadOptions& options);

// Loads the model file `path` into `model`'s weights and buffers (host
// staging, then the device): every parameter and buffer must be in the file
// as F32 with the model's shape, and the file may hold nothing else but
// num_batches_tracked scalars. Errors name the file and the tensor:
// NOT_FOUND (a tensor the model has is missing), INVALID_ARGUMENT (a shape
// or dtype that differs, a tensor the model does not have, a weight that is
// NaN or infinite: the tensor and the element named), DATA_LOSS (not a valid
// file). On error the model's weights are unchanged. `options` as
// ReadModelFileInfo's.
absl::Status LoadModelFile(const std::string& path, Model* model);
absl::Status LoadModelFile(const std::string& path, Model* model,
                           const safetensors::ReadOptions& options);

// `path` itself, or `path`/model.safetensors when `path` is a folder.
std::string ModelFilePath(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MODEL_FILE_H_
