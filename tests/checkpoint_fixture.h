// A parameter-server job whose state at every step is known exactly, for
// the checkpoint crash test (tests/checkpoint_crash_test.cc) and the
// checkpoint benchmark (bench/checkpoint_bench.cc).
//
// CheckpointRig runs one sync worker against in-process shards
// (server/local_shards.h) through the real PsClient, PS exchange and
// CheckpointWriter (worker/checkpoint.h): update s pushes gradient
// GradientValue(s, t, i) for every parameter element and BufferValue(s, t, i)
// for every buffer element; the shards apply Adam. With one worker the shards
// use the pushed values unchanged (no averaging), and Adam is elementwise
// (optim/adam.h), so ExpectedState replays the shards bit for bit: after
// update S, weights, m and v are ExpectedState's at S and every buffer
// element is BufferValue(S, t, i). A resumed rig continues the same
// trajectory.
//
// Models: a zoo model (models/model.h, its model file written by
// models/model_file.h, as a training run does) or "synthetic": 1-D tensors of
// given sizes, the last `num_buffers` of them buffers, its model file written
// with the safetensors writer (tensors named as the PS tensors).
//
// Thread-compatible.
#ifndef PSTRAIN_TESTS_CHECKPOINT_FIXTURE_H_
#define PSTRAIN_TESTS_CHECKPOINT_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/backend.h"
#include "models/model.h"
#include "optim/adam.h"
#include "server/local_shards.h"
#include "server/shard_checkpoint.h"
#include "worker/checkpoint.h"
#include "worker/gradient_exchange.h"

namespace pstrain::testing {

// Values of the fixture's trajectory (t: PS tensor index, i: element).
float InitialValue(int t, int64_t i);
// The gradient of update `step` (1-based).
float GradientValue(int64_t step, int t, int64_t i);
// A buffer's value after update `step`: exact in fp32 (step < 2^17).
float BufferValue(int64_t step, int t, int64_t i);

// The PS tensors of a model, and how to write its model file.
class FixtureModel {
 public:
  // A zoo model ("lenet5", "resnet18", ...) on the CPU backend, for inputs
  // `input_chw` and `num_classes` outputs.
  static absl::StatusOr<std::unique_ptr<FixtureModel>> Zoo(
      const std::string& name, const Shape& input_chw, int num_classes);
  // 1-D tensors of `sizes` elements; the last `num_buffers` are buffers.
  static std::unique_ptr<FixtureModel> Synthetic(
      const std::vector<int64_t>& sizes, int num_buffers);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<std::vector<int64_t>>& shapes() const { return shapes_; }
  const std::vector<int64_t>& num_elements() const { return num_elements_; }
  int num_buffers() const { return num_buffers_; }
  int64_t total_elements() const;

  // Writes `weights` (PS tensors) as the model file `path`.
  absl::StatusOr<safetensors::WriteResult> SaveModelFile(
      const std::vector<absl::Span<float>>& weights, const std::string& path,
      int64_t step, const safetensors::WriteOptions& write_options = {}) const;
  // Checks the model file `file` of checkpoint folder `dir` (size and crc32
  // as the manifest says) holds exactly `weights`; DATA_LOSS naming the
  // first tensor that differs.
  absl::Status CheckModelFile(
      const std::string& dir, const CheckpointManifest::File& file,
      const std::vector<std::vector<float>>& weights) const;

 private:
  FixtureModel() = default;

  std::string name_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> num_elements_;
  int num_buffers_ = 0;
  int num_classes_ = 0;               // Zoo models only.
  std::unique_ptr<Backend> backend_;  // Zoo models only.
  std::unique_ptr<Model> model_;      // Zoo models only.
};

// The fixture's state after `step` updates, computed on the host as the
// shards compute it.
class ExpectedState {
 public:
  ExpectedState(const FixtureModel* model, const AdamOptions& adam);

  int64_t step() const { return step_; }
  // Applies updates step()+1 .. `step`. `step` >= step().
  void AdvanceTo(int64_t step);
  // Weights (parameters, then buffers), m and v (empty for buffers).
  const std::vector<std::vector<float>>& weights() const { return weights_; }

  // Whether `state` (a loaded checkpoint) is this state bit for bit, with
  // every element at version step(); OK or DATA_LOSS naming the first
  // tensor that differs.
  absl::Status Check(const ModelState& state) const;

 private:
  const FixtureModel* const model_;
  const AdamOptions adam_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> weights_, m_, v_;
};

// The data position the rig records for step `step` (7 steps an epoch).
DataPosition FixturePosition(int64_t step);

struct RigOptions {
  std::string checkpoint_dir;
  int keep_checkpoints = 3;
  int num_shards = 2;
  int64_t partition_bytes = 4 << 20;
  AdamOptions adam;
  // Continue from checkpoint_dir's latest checkpoint, if it has one.
  bool resume = false;
};

class CheckpointRig {
 public:
  // Starts the shards, initialises them (from the latest checkpoint when
  // resuming) and makes the checkpoint writer. `model` must outlive the rig.
  static absl::StatusOr<std::unique_ptr<CheckpointRig>> Create(
      const FixtureModel* model, const RigOptions& options);
  ~CheckpointRig();

  // Updates applied so far (the resumed checkpoint's step, then +1 a Step).
  int64_t step() const { return step_; }
  // One training step: pushes update step()+1 and pulls its weights.
  absl::Status Step();
  // CheckpointWriter::Begin at step() with this step's weights.
  absl::Status BeginCheckpoint();
  CheckpointWriter& writer() { return *writer_; }
  // The worker's weights, as pulled after the last step.
  const std::vector<absl::Span<float>>& weights() const { return weights_; }

 private:
  CheckpointRig() = default;

  const FixtureModel* model_ = nullptr;
  std::unique_ptr<LocalShards> shards_;
  std::unique_ptr<GradientExchange> exchange_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<std::vector<float>> weight_storage_, gradient_storage_;
  std::vector<absl::Span<float>> weights_;
  std::vector<absl::Span<const float>> gradients_;
  int64_t step_ = 0;
};

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_CHECKPOINT_FIXTURE_H_
