#include "server/adam.h"

#include <cmath>

namespace pstrain {

AdamStepConstants AdamConstantsFor(const AdamOptions& options, int64_t step) {
  const double t = static_cast<double>(step);
  AdamStepConstants c;
  c.beta1 = options.beta1;
  c.beta2 = options.beta2;
  c.one_minus_beta1 = 1.0f - options.beta1;
  c.one_minus_beta2 = 1.0f - options.beta2;
  c.step_size =
      static_cast<float>(options.lr / (1.0 - std::pow(options.beta1, t)));
  c.inv_bias_correction2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(options.beta2, t)));
  c.epsilon = options.epsilon;
  c.decay = 1.0f - options.lr * options.weight_decay;
  c.decoupled = options.weight_decay != 0.0f;
  return c;
}

void AdamUpdate(const AdamOptions& options, int64_t step, float* __restrict w,
                const float* __restrict g, float* __restrict m,
                float* __restrict v, int64_t n) {
  const AdamStepConstants c = AdamConstantsFor(options, step);
  const float beta1 = c.beta1, beta2 = c.beta2;
  const float one_minus_beta1 = c.one_minus_beta1;
  const float one_minus_beta2 = c.one_minus_beta2;
  const float step_size = c.step_size;
  const float inv_bias_correction2_sqrt = c.inv_bias_correction2_sqrt;
  const float eps = c.epsilon;
  const float decay = c.decay;
  const bool decoupled = c.decoupled;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * gi;
    const float vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float wi = decoupled ? w[i] * decay : w[i];
    const float denom = std::sqrt(vi) * inv_bias_correction2_sqrt + eps;
    w[i] = wi - step_size * mi / denom;
  }
}

}  // namespace pstrain
