// A model: an ordered chain of layers ending in logits, trained with softmax
// cross-entropy; and the model zoo.
//
// Zoo (input NCHW fp32, output [N, num_classes] logits):
//  - "mlp":    flatten, fc(C*H*W)-256, ReLU, fc256-128, ReLU, fc128-K.
//  - "lenet5": conv5x5-6 (padding 2), ReLU, maxpool2, conv5x5-16, ReLU,
//              maxpool2, flatten, fc400-120, ReLU, fc120-84, ReLU, fc84-10
//              (LeCun et al. 1998 with ReLU and max pooling, as in the usual
//              PyTorch version; 61,706 parameters for 28x28x1, 10 classes).
//
// Thread-compatible: one Model per training thread.
#ifndef PSTRAIN_MODELS_MODEL_H_
#define PSTRAIN_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/layers.h"
#include "models/tensor.h"

namespace pstrain {

class Model {
 public:
  // Builds zoo model `name` for inputs of `input_chw` = {C, H, W} and
  // `num_classes` outputs, with weights drawn from `seed`. INVALID_ARGUMENT
  // naming the known models for an unknown name, or naming the layer whose
  // input shape does not fit.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const std::string& name,
                                                       const Shape& input_chw,
                                                       int num_classes,
                                                       uint64_t seed);

  // "lenet5, mlp".
  static std::string KnownModels();
  static bool IsKnown(const std::string& name);

  const std::string& name() const { return name_; }
  // Every parameter tensor in model order (layer by layer, weight then bias).
  const std::vector<Param*>& params() const { return params_; }
  std::vector<int64_t> ParamNumElements() const;
  int64_t NumParameters() const;
  // Forward multiply-accumulates per sample.
  int64_t ForwardMacsPerSample() const;

  // Forward pass; returns the logits [N, num_classes] (valid until the next
  // call). INVALID_ARGUMENT if `input` is not [N, C, H, W] of this model.
  absl::StatusOr<const Tensor*> Forward(const Tensor& input);

  // Forward and backward on one batch: fills every Param::grad with
  // d(mean cross-entropy)/d(param) and returns the loss.
  absl::StatusOr<float> ForwardBackward(const Tensor& input,
                                        const std::vector<int32_t>& labels);

 private:
  Model() = default;

  std::string name_;
  Shape input_chw_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Param*> params_;
  // activations_[i] is the input of layer i; the last is the logits.
  std::vector<Tensor> activations_;
  std::vector<Tensor> grads_;
  Tensor dlogits_;
};

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MODEL_H_
