// Dynamic loss scaling for fp16 precision (JobSpec.precision "fp16";
// README "Mixed precision"), as PyTorch's torch.cuda.amp.GradScaler
// (torch/cuda/amp/grad_scaler.py and its update kernel
// _amp_update_scale_, PyTorch 1.13) with its defaults: the loss is
// multiplied by the scale before backward (Model::set_loss_scale), every
// gradient divided by it before anything reads them (GradScaler.unscale_:
// so clipping and the optimizer see the true gradient), and a step whose
// gradients hold a NaN or an infinity is skipped. After each step:
//   - a skipped step (overflow): scale *= backoff_factor (0.5), and the
//     count of good steps restarts;
//   - otherwise, after growth_interval (2000) good steps in a row:
//     scale *= growth_factor (2), unless that is not finite.
// fp16's largest value is 65504: without scaling, gradients under 2^-24
// vanish; the scale lifts them while the backoff keeps overflow rare.
//
// Thread-compatible: one scaler per training loop.
#ifndef PSTRAIN_OPTIM_LOSS_SCALER_H_
#define PSTRAIN_OPTIM_LOSS_SCALER_H_

#include <cstdint>

namespace pstrain {

class LossScaler {
 public:
  struct Options {
    float init_scale = 65536.0f;  // 2^16
    float growth_factor = 2.0f;
    float backoff_factor = 0.5f;
    int64_t growth_interval = 2000;  // good steps
  };
  // What a checkpoint saves and a resume restores.
  struct State {
    float scale = 65536.0f;
    // Good steps since the last change of the scale.
    int64_t growth_tracker = 0;
    // A finite scale > 0 and a tracker >= 0 (what a checkpoint or a
    // message from another process must hold before Restore()).
    bool valid() const;
  };

  LossScaler() : LossScaler(Options()) {}
  explicit LossScaler(const Options& options)
      : options_(options), state_{options.init_scale, 0} {}

  float scale() const { return state_.scale; }
  // After a step: `skipped` when its gradients (any worker's) were not
  // finite and the step changed nothing.
  void Update(bool skipped);

  const State& state() const { return state_; }
  void Restore(const State& state) { state_ = state; }

 private:
  Options options_;
  State state_;
};

}  // namespace pstrain

#endif  // PSTRAIN_OPTIM_LOSS_SCALER_H_
