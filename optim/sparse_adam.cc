#include "optim/sparse_adam.h"

#include <cmath>
#include <cstdint>

#include "common/nonfinite.h"

namespace pstrain {

SparseAdamConstants SparseAdamConstantsFor(const AdamOptions& options,
                                           int64_t step) {
  // As sparse_adam in torch/optim/_functional.py: Python doubles.
  const double beta1 = options.beta1;
  const double beta2 = options.beta2;
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const double step_size = static_cast<double>(options.lr) *
                           std::sqrt(bias_correction2) / bias_correction1;
  SparseAdamConstants c;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.neg_step_size = static_cast<float>(-step_size);
  c.epsilon = options.epsilon;
  return c;
}

bool SparseAdamRows(const AdamOptions& options, int64_t step,
                    int64_t row_elements, absl::Span<const uint32_t> rows,
                    const float* __restrict values, float* __restrict w,
                    float* __restrict m, float* __restrict v) {
  const SparseAdamConstants c = SparseAdamConstantsFor(options, step);
  uint32_t nonfinite = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t base = static_cast<int64_t>(rows[k]) * row_elements;
    const float* __restrict g = values + static_cast<int64_t>(k) * row_elements;
    float* __restrict wr = w + base;
    float* __restrict mr = m + base;
    float* __restrict vr = v + base;
    for (int64_t j = 0; j < row_elements; ++j) {
      const float m_old = mr[j];
      const float m_new = m_old + (g[j] - m_old) * c.one_minus_beta1;
      const float v_old = vr[j];
      const float v_new = v_old + (g[j] * g[j] - v_old) * c.one_minus_beta2;
      mr[j] = m_new;
      vr[j] = v_new;
      const float out =
          wr[j] + c.neg_step_size * (m_new / (std::sqrt(v_new) + c.epsilon));
      wr[j] = out;
      nonfinite |= NonFiniteBit(out);
    }
  }
  return nonfinite == 0;
}

}  // namespace pstrain
