#include "optim/adam.h"

#include <cmath>
#include <cstdint>

#include "common/nonfinite.h"

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
  c.variance_frozen =
      options.freeze_variance_after > 0 && step > options.freeze_variance_after;
  const double t2 = c.variance_frozen
                        ? static_cast<double>(options.freeze_variance_after)
                        : t;
  c.inv_bias_correction2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(options.beta2, t2)));
  c.epsilon = options.epsilon;
  c.decay = 1.0f - options.lr * options.weight_decay;
  c.decoupled = options.weight_decay != 0.0f;
  return c;
}

namespace {

// One element of the update; shared by the in-place and out-of-place loops
// so that both round alike. Returns NonFiniteBit() of the new weight.
inline uint32_t AdamElement(const AdamStepConstants& c, float w, float g,
                            float m, float v, float* w_out, float* m_out,
                            float* v_out) {
  const float mi = c.beta1 * m + c.one_minus_beta1 * g;
  const float vi =
      c.variance_frozen ? v : c.beta2 * v + c.one_minus_beta2 * g * g;
  *m_out = mi;
  *v_out = vi;
  const float wi = c.decoupled ? w * c.decay : w;
  const float denom = std::sqrt(vi) * c.inv_bias_correction2_sqrt + c.epsilon;
  const float out = wi - c.step_size * mi / denom;
  *w_out = out;
  return NonFiniteBit(out);
}

}  // namespace

void AdamUpdate(const AdamOptions& options, int64_t step, float* __restrict w,
                const float* __restrict g, float* __restrict m,
                float* __restrict v, int64_t n) {
  const AdamStepConstants c = AdamConstantsFor(options, step);
  for (int64_t i = 0; i < n; ++i) {
    AdamElement(c, w[i], g[i], m[i], v[i], &w[i], &m[i], &v[i]);
  }
}

bool AdamUpdateInto(const AdamOptions& options, int64_t step,
                    const float* __restrict w_in, const float* __restrict g,
                    const float* __restrict m_in, const float* __restrict v_in,
                    float* __restrict w_out, float* __restrict m_out,
                    float* __restrict v_out, int64_t n) {
  const AdamStepConstants c = AdamConstantsFor(options, step);
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    nonfinite |= AdamElement(c, w_in[i], g[i], m_in[i], v_in[i], &w_out[i],
                             &m_out[i], &v_out[i]);
  }
  return nonfinite == 0;
}

}  // namespace pstrain
