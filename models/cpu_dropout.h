// Inverted dropout on the CPU (as torch.nn.Dropout): in training each
// element is zeroed with probability p and the rest scaled by 1 / (1 - p),
// with the mask kept for the backward. The masks are models/dropout_mask.h's
// counter-based draws (the CUDA backend's), filled on every OpenMP thread:
// the same mask whatever the thread count. Internal to models/: the CPU
// backend's kDropout layer and the transformer layers' dropouts.
//
// Thread-safety: one training thread per object (as a layer).
#ifndef PSTRAIN_MODELS_CPU_DROPOUT_H_
#define PSTRAIN_MODELS_CPU_DROPOUT_H_

#include <cstdint>
#include <vector>

namespace pstrain {

class CpuDropout {
 public:
  // p in [0, 1]; `seed` is the layer's (models/dropout_mask.h).
  CpuDropout(float p, uint64_t seed) : p_(p), seed_(seed) {}

  // Whether a forward in this mode drops anything.
  bool active(bool training) const { return training && p_ > 0; }

  // Draws the next call's mask of `n` elements; y = x * mask (y may be x).
  void Forward(const float* x, int64_t n, float* y);

  // Elements of the last Forward's mask (0 before the first).
  int64_t mask_size() const { return static_cast<int64_t>(mask_.size()); }

  // dx = dy * the last Forward's mask (dx may be dy); n == mask_size().
  void Backward(const float* dy, int64_t n, float* dx) const;

 private:
  const float p_;
  const uint64_t seed_;
  uint64_t calls_ = 0;
  std::vector<float> mask_;
};

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CPU_DROPOUT_H_
