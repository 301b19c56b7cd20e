#include "models/cpu_dropout.h"

#include "models/dropout_mask.h"

namespace pstrain {

void CpuDropout::Forward(const float* x, int64_t n, float* y) {
  mask_.resize(n);
  const float keep = 1.0f - p_;
  const float scale = keep > 0 ? 1.0f / keep : 0.0f;
  const uint64_t call_seed = DropoutCallSeed(seed_, ++calls_);
  float* mask = mask_.data();
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = DropoutMaskValue(call_seed, i, keep, scale);
    y[i] = x[i] * mask[i];
  }
}

void CpuDropout::Backward(const float* dy, int64_t n, float* dx) const {
  const float* mask = mask_.data();
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * mask[i];
}

}  // namespace pstrain
