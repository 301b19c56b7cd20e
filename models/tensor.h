// Host tensors: dense fp32, row-major, NCHW for images and NC for feature
// vectors (input batches, logits). Tensors in a backend's memory are
// DeviceTensor (backend.h).
//
// Thread-compatible: a Tensor is a value; concurrent reads are safe.
#ifndef PSTRAIN_MODELS_TENSOR_H_
#define PSTRAIN_MODELS_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pstrain {

using Shape = std::vector<int64_t>;

inline int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape);

struct Tensor {
  Shape shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(Shape s) : shape(std::move(s)), data(NumElements(shape)) {}
  // Resizes to `s` (contents unspecified when the size changes).
  void Resize(const Shape& s) {
    shape = s;
    data.resize(NumElements(s));
  }
  int64_t size() const { return static_cast<int64_t>(data.size()); }
};

// The ignore index of PyTorch's cross-entropy, which MLM labels use for
// positions that are not predicted (models/backend.h
// SoftmaxCrossEntropyIgnoring).
inline constexpr int32_t kIgnoreLabel = -100;

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_TENSOR_H_
