#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/nonfinite.h"

namespace pstrain {

absl::string_view OptimizerName(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adam";
}

double ScheduledLr(const OptimizerOptions& options, int64_t step) {
  const double lr = options.lr;
  const LrSchedule& s = options.schedule;
  if (step < 0) step = 0;
  if (step < s.warmup_steps) {
    const double f = s.warmup_start_factor;
    return lr * (f + (1.0 - f) * static_cast<double>(step) /
                         static_cast<double>(s.warmup_steps));
  }
  const int64_t t = step - s.warmup_steps;
  switch (s.decay) {
    case LrDecay::kConstant:
      return lr;
    case LrDecay::kStep:
      return lr * std::pow(s.gamma, static_cast<double>(
                                        t / std::max<int64_t>(1, s.step_size)));
    case LrDecay::kCosine: {
      const int64_t t_max =
          std::max<int64_t>(1, s.total_steps - s.warmup_steps);
      if (t >= t_max) return s.min_lr;
      return s.min_lr + (lr - s.min_lr) *
                            (1.0 + std::cos(M_PI * static_cast<double>(t) /
                                            static_cast<double>(t_max))) /
                            2.0;
    }
  }
  return lr;
}

namespace {

struct SgdConstants {
  float neg_lr, weight_decay, momentum, one_minus_dampening;
  bool first, use_momentum, nesterov;
};

SgdConstants SgdConstantsFor(const OptimizerOptions& o, float lr,
                             int64_t step) {
  SgdConstants c;
  c.neg_lr = -lr;
  c.weight_decay = o.weight_decay;
  c.momentum = o.momentum;
  c.one_minus_dampening = 1.0f - o.dampening;
  c.first = step <= 1;
  c.use_momentum = o.momentum != 0.0f;
  c.nesterov = o.nesterov;
  return c;
}

// One element, in torch's order of operations; shared by the loops. m and
// m_out are the momentum buffer's (unused without momentum). Returns
// NonFiniteBit() of the new weight (as AdamElement).
inline uint32_t SgdElement(const SgdConstants& c, float w, float g, float m,
                           float* w_out, float* m_out) {
  float d = c.weight_decay != 0.0f ? g + c.weight_decay * w : g;
  if (c.use_momentum) {
    const float buf = c.first ? d : c.momentum * m + c.one_minus_dampening * d;
    *m_out = buf;
    d = c.nesterov ? d + c.momentum * buf : buf;
  }
  const float out = w + c.neg_lr * d;
  *w_out = out;
  return NonFiniteBit(out);
}

AdamOptions AtLr(const OptimizerOptions& options, float lr) {
  AdamOptions adam = options;
  adam.lr = lr;
  return adam;
}

}  // namespace

void SgdUpdate(const OptimizerOptions& options, float lr, int64_t step,
               float* __restrict w, const float* __restrict g,
               float* __restrict m, int64_t n) {
  const SgdConstants c = SgdConstantsFor(options, lr, step);
  if (!c.use_momentum) {
    float unused;
    for (int64_t i = 0; i < n; ++i) {
      SgdElement(c, w[i], g[i], 0.0f, &w[i], &unused);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    SgdElement(c, w[i], g[i], m[i], &w[i], &m[i]);
  }
}

bool SgdUpdateInto(const OptimizerOptions& options, float lr, int64_t step,
                   const float* __restrict w_in, const float* __restrict g,
                   const float* __restrict m_in, float* __restrict w_out,
                   float* __restrict m_out, int64_t n) {
  const SgdConstants c = SgdConstantsFor(options, lr, step);
  uint32_t nonfinite = 0;
  if (!c.use_momentum) {
    float unused;
    for (int64_t i = 0; i < n; ++i) {
      nonfinite |= SgdElement(c, w_in[i], g[i], 0.0f, &w_out[i], &unused);
    }
    return nonfinite == 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    nonfinite |= SgdElement(c, w_in[i], g[i], m_in[i], &w_out[i], &m_out[i]);
  }
  return nonfinite == 0;
}

void OptimizerUpdate(const OptimizerOptions& options, int64_t step, float* w,
                     const float* g, float* m, float* v, int64_t n) {
  const float lr = static_cast<float>(ScheduledLr(options, step - 1));
  if (options.kind == OptimizerKind::kSgd) {
    SgdUpdate(options, lr, step, w, g, m, n);
  } else {
    AdamUpdate(AtLr(options, lr), step, w, g, m, v, n);
  }
}

bool UpdatesFirstMoment(const OptimizerOptions& options) {
  return options.kind == OptimizerKind::kAdam || options.momentum != 0.0f;
}

bool UpdatesSecondMoment(const OptimizerOptions& options) {
  return options.kind == OptimizerKind::kAdam;
}

bool OptimizerUpdateInto(const OptimizerOptions& options, int64_t step,
                         const float* w_in, const float* g, const float* m_in,
                         const float* v_in, float* w_out, float* m_out,
                         float* v_out, int64_t n) {
  return OptimizerUpdateAtInto(options, step, step - 1, w_in, g, m_in, v_in,
                               w_out, m_out, v_out, n);
}

bool OptimizerUpdateAtInto(const OptimizerOptions& options, int64_t step,
                           int64_t lr_step, const float* w_in, const float* g,
                           const float* m_in, const float* v_in, float* w_out,
                           float* m_out, float* v_out, int64_t n) {
  const float lr = static_cast<float>(ScheduledLr(options, lr_step));
  if (options.kind == OptimizerKind::kSgd) {
    return SgdUpdateInto(options, lr, step, w_in, g, m_in, w_out, m_out, n);
  }
  return AdamUpdateInto(AtLr(options, lr), step, w_in, g, m_in, v_in, w_out,
                        m_out, v_out, n);
}

}  // namespace pstrain
