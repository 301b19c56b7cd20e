// What a worker computes each step (a part of RunWorker, worker/trainer.h):
// the real model, forward and backward on its batches (ModelWorkload), or
// a stand-in for a GPU that sleeps compute_ms and offers model-sized
// gradients (SyntheticWorkload, for emulated-link runs). Also the input
// pipeline options of a streamed split and the evaluation.
//
// Tensors: the model's PS tensors, parameters then num_buffers()
// BatchNorm buffers, fp32 host memory. Thread-compatible: one worker
// thread uses a workload.
#ifndef PSTRAIN_WORKER_WORKLOAD_H_
#define PSTRAIN_WORKER_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/safetensors.h"
#include "models/backend.h"
#include "worker/dataset.h"
#include "worker/step_loop.h"
#include "worker/trainer.h"

namespace pstrain {

// What a worker computes each step: the real model (forward and backward
// on its batches), or a stand-in for a GPU that sleeps compute_ms and
// offers model-sized gradients (emulated-link runs, see trainer.h).
class Workload : public StepCompute {
 public:
  // PS tensors: parameters, then num_buffers() BatchNorm buffers.
  virtual const std::vector<absl::Span<float>>& weights() = 0;
  virtual int num_buffers() const = 0;
  virtual std::vector<int64_t> TensorNumElements() const = 0;
  // Row-sparse PS tensors (issue 41; Model::PsTensorRowElements): elements
  // per row of each tensor whose gradient touches only the batch's rows,
  // else 0; empty where there are none to know of (synthetic compute).
  virtual std::vector<int64_t> TensorRowElements() const { return {}; }
  // PS tensors' names and shapes, for checkpoints.
  virtual std::vector<std::string> TensorNames() const = 0;
  virtual std::vector<std::vector<int64_t>> TensorShapes() const = 0;
  // The training split's samples (an epoch's permutation,
  // worker/data_position.h); 0 for synthetic compute (no dataset).
  virtual int64_t samples_per_epoch() const = 0;
  // Whether Evaluate() has a test split to run: false for synthetic
  // compute and for a dataset without one (an image folder of class
  // folders only, records without test.records).
  virtual bool can_evaluate() const = 0;
  virtual absl::StatusOr<Evaluation> Evaluate() = 0;
  virtual int64_t num_parameters() const = 0;
  // "model lenet5 on cpu: ..." for worker 0's first line.
  virtual std::string Describe() const = 0;
  // The model's weights from / to a model file (models/model_file.h); the
  // saved file records `steps`.
  virtual absl::Status LoadModel(const std::string& path) = 0;
  virtual absl::Status SaveModel(const std::string& path, int64_t steps) = 0;
  // As SaveModel, with `weights` (PS tensors) in place of the model's own;
  // the file's size and crc32.
  virtual absl::StatusOr<safetensors::WriteResult> SaveWeights(
      const std::vector<absl::Span<float>>& weights, const std::string& path,
      int64_t steps, const safetensors::WriteOptions& write_options) = 0;
  // Whether Step()'s forward can ask a WeightsGate per tensor (a model, on
  // any backend: Model::set_weights_gate; the synthetic compute), and the
  // gate it asks from then on.
  virtual bool can_gate_weights() const { return false; }
  virtual void SetWeightsGate(WeightsGate* gate) {}
};

// The real model of `options` on `dataset` (INVALID_ARGUMENT for a split
// too large for 32-bit sample indices or a streamed split's augmentation
// it cannot apply).
absl::StatusOr<std::unique_ptr<Workload>> CreateModelWorkload(
    const TrainerOptions& options, const Dataset& dataset);
// Synthetic compute of `options` (compute_ms, model_bytes,
// backward_fraction; INVALID_ARGUMENT naming a bad one).
absl::StatusOr<std::unique_ptr<Workload>> CreateSyntheticWorkload(
    const TrainerOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_WORKLOAD_H_
