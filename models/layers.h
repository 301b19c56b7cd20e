// Layers of the CPU backend, on oneDNN primitives (the library PyTorch uses
// on CPU): convolution, max pooling, ReLU, fully connected (inner product),
// flatten; and softmax cross-entropy, our own code since oneDNN has no such
// primitive.
//
// Shapes: images are NCHW fp32; Linear takes any input of N rows and treats
// the rest as features (NC after a flatten). Primitives are created for the
// first input shape seen and again whenever it changes (for example from the
// training batch to the evaluation batch).
//
// Thread-compatible: one layer object belongs to one training thread.
// Forward() caches nothing but primitives; Backward() gets the forward input
// and output back from the caller.
#ifndef PSTRAIN_MODELS_LAYERS_H_
#define PSTRAIN_MODELS_LAYERS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/tensor.h"

namespace pstrain {

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  // Output shape for input `in`; INVALID_ARGUMENT naming the layer and the
  // expected shape when `in` does not fit.
  virtual absl::StatusOr<Shape> OutputShape(const Shape& in) const = 0;
  // out = f(in). `out` is resized to OutputShape(in.shape).
  virtual void Forward(const Tensor& in, Tensor* out) = 0;
  // Given the forward input `in`, its output `out` and dLoss/dOut `dout`,
  // writes dLoss/dIn into `din` (resized to in.shape) and overwrites the
  // gradients of this layer's parameters. `din` may be null for the first
  // layer (no input gradient needed).
  virtual void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                        Tensor* din) = 0;
  // This layer's parameters, in a fixed order (weight, then bias).
  virtual std::vector<Param*> params() { return {}; }
  // Multiply-accumulates of one forward pass of one sample.
  virtual int64_t ForwardMacsPerSample(const Shape& in) const { return 0; }
};

// 2-D convolution with bias (groups = 1), square kernel, stride and zero
// padding. Weight OIHW [out_channels, in_channels, k, k], bias [out_channels].
// Initialised as PyTorch's nn.Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
std::unique_ptr<Layer> MakeConv2d(int64_t in_channels, int64_t out_channels,
                                  int64_t kernel, int64_t stride,
                                  int64_t padding, std::mt19937_64& rng);

// Fully connected: out[N, out_features] = in[N, in_features] W^T + b, with
// W [out_features, in_features] as PyTorch's nn.Linear and its init.
std::unique_ptr<Layer> MakeLinear(int64_t in_features, int64_t out_features,
                                  std::mt19937_64& rng);

std::unique_ptr<Layer> MakeRelu();

// Max pooling over square windows of `kernel` with `stride`, no padding.
std::unique_ptr<Layer> MakeMaxPool2d(int64_t kernel, int64_t stride);

// NCHW -> N x (C*H*W); the data is not moved.
std::unique_ptr<Layer> MakeFlatten();

// Softmax cross-entropy averaged over the batch, as PyTorch's
// nn.CrossEntropyLoss(reduction='mean'). `logits` is [N, K]; labels in
// [0, K). Returns the loss and writes dLoss/dLogits into `dlogits`
// (softmax - onehot) / N. INVALID_ARGUMENT for a label out of range or a
// shape mismatch.
absl::StatusOr<float> SoftmaxCrossEntropy(const Tensor& logits,
                                          const std::vector<int32_t>& labels,
                                          Tensor* dlogits);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_LAYERS_H_
