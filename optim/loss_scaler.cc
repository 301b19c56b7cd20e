#include "optim/loss_scaler.h"

#include <cmath>

namespace pstrain {

bool LossScaler::State::valid() const {
  return std::isfinite(scale) && scale > 0 && growth_tracker >= 0;
}

void LossScaler::Update(bool skipped) {
  if (skipped) {
    state_.scale *= options_.backoff_factor;
    state_.growth_tracker = 0;
    return;
  }
  if (++state_.growth_tracker < options_.growth_interval) return;
  // _amp_update_scale_: the grown scale only if it is finite.
  const float grown = state_.scale * options_.growth_factor;
  if (std::isfinite(grown)) state_.scale = grown;
  state_.growth_tracker = 0;
}

}  // namespace pstrain
