// The optimizers the shards and the allreduce workers apply, and the
// learning-rate schedule: the one place an update is computed.
//
//  - Adam, and AdamW when weight_decay > 0 (optim/adam.h: the kernels).
//  - SGD with momentum and Nesterov momentum, as PyTorch 1.13's
//    `torch.optim.SGD` (single-tensor path), weight decay coupled as there:
//      d = g + weight_decay * w
//      buf = d                                   at the first update (t = 1)
//      buf = momentum * buf + (1 - dampening) * d    after it
//      d = nesterov ? d + momentum * buf : buf    (momentum > 0 only)
//      w = w - lr * d
//    The momentum buffer lives where Adam's m lives (per chunk on a shard,
//    per tensor in allreduce, and in checkpoints); v is unused and stays as
//    it was given (zeros). With momentum 0 no buffer is kept (m unchanged).
//
// The learning rate of update number t + 1 (t updates applied before it, the
// global step t) is ScheduledLr(options, t): a pure function of the spec and
// the step, so every shard, every allreduce worker and the console agree. It
// follows torch.optim.lr_scheduler stepped once per optimizer step:
//  - constant: lr.
//  - warmup (warmup_steps W > 0, combinable with a decay), LinearLR's
//    closed form: lr * (f + (1 - f) * t / W) for t < W, f the start factor.
//  - step (StepLR): lr * gamma^floor(t' / step_size).
//  - cosine (CosineAnnealingLR, T_max = total_steps - W):
//    lr_min + (lr - lr_min) * (1 + cos(pi * t' / T_max)) / 2, held at
//    lr_min past T_max (torch's would rise again).
//  where t' = t - W: the decay starts when the warmup ends, as SequentialLR
//  with milestones [W] does.
//
// Thread-compatible: callers serialise updates of one tensor.
#ifndef PSTRAIN_OPTIM_OPTIMIZER_H_
#define PSTRAIN_OPTIM_OPTIMIZER_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "optim/adam.h"

namespace pstrain {

enum class OptimizerKind { kAdam, kSgd };

enum class LrDecay { kConstant, kStep, kCosine };

struct LrSchedule {
  LrDecay decay = LrDecay::kConstant;
  // Linear warmup over the first `warmup_steps` steps (0: none), from
  // lr * warmup_start_factor.
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.0;
  // kStep: the lr is multiplied by `gamma` every `step_size` steps.
  int64_t step_size = 1;
  double gamma = 0.1;
  // kCosine: the job's total steps (warmup included) and the final lr.
  // 0: not known yet (needs_horizon()); the schedule reads it as 1.
  int64_t total_steps = 1;
  double min_lr = 0.0;

  // A cosine schedule whose horizon is the job's steps as the workers
  // count them (JobSpec optimizer.lr_total_steps 0): the worker sets
  // total_steps, and worker 0 gives it to the shards
  // (ParameterShard::SetLrHorizon).
  bool needs_horizon() const {
    return decay == LrDecay::kCosine && total_steps == 0;
  }
  // The largest horizon a job may name, steps (JobSpec's bound on steps).
  static constexpr int64_t kMaxHorizon = 1000000000;
};

// The optimizer and its hyperparameters. The Adam fields and `lr` and
// `weight_decay` (AdamW's decoupled decay; SGD's coupled L2 term) come from
// AdamOptions, so that code written for Adam alone keeps working: an
// AdamOptions converts to Adam with a constant lr.
struct OptimizerOptions : AdamOptions {
  OptimizerOptions() = default;
  OptimizerOptions(const AdamOptions& adam)  // NOLINT: implicit on purpose.
      : AdamOptions(adam) {}

  OptimizerKind kind = OptimizerKind::kAdam;
  // SGD only.
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  LrSchedule schedule;
};

// "adam" or "sgd" (checkpoints' manifests record it).
absl::string_view OptimizerName(OptimizerKind kind);

// The learning rate of the update applied at global step `step` (0-based:
// `step` updates were applied before it). Constant schedules give
// options.lr exactly.
double ScheduledLr(const OptimizerOptions& options, int64_t step);

// SGD as above, `step` 1-based (as AdamUpdate's): in place, and out of place
// (bit-identical; no array may overlap another; returns whether every new
// weight is finite). `m` is the momentum buffer, neither read nor written
// without momentum (then it may be null).
void SgdUpdate(const OptimizerOptions& options, float lr, int64_t step,
               float* w, const float* g, float* m, int64_t n);
bool SgdUpdateInto(const OptimizerOptions& options, float lr, int64_t step,
                   const float* w_in, const float* g, const float* m_in,
                   float* w_out, float* m_out, int64_t n);

// Whether options' update reads and writes the first moment m (Adam's, or
// SGD's momentum buffer: not without momentum), and the second moment v
// (Adam's; SGD leaves v alone).
bool UpdatesFirstMoment(const OptimizerOptions& options);
bool UpdatesSecondMoment(const OptimizerOptions& options);

// Update number `step` (1-based) with options.kind's optimizer at the
// scheduled lr (ScheduledLr(options, step - 1)). In place: w, m, v; out of
// place: reads *_in, writes *_out, as AdamUpdateInto, for the shard's
// update written beside its state; the out-of-place form returns whether
// every new weight is finite. Neither form touches m where
// !UpdatesFirstMoment(options), nor v where !UpdatesSecondMoment(options)
// (those pointers may then be null): a caller swapping its state with
// *_out keeps them.
void OptimizerUpdate(const OptimizerOptions& options, int64_t step, float* w,
                     const float* g, float* m, float* v, int64_t n);
bool OptimizerUpdateInto(const OptimizerOptions& options, int64_t step,
                         const float* w_in, const float* g, const float* m_in,
                         const float* v_in, float* w_out, float* m_out,
                         float* v_out, int64_t n);

// OptimizerUpdateInto at the scheduled lr of global step `lr_step`
// (0-based, ScheduledLr(options, lr_step)) rather than step - 1: an async
// shard's update, where `step` counts the updates this state has taken
// (Adam's bias correction and frozen variance, SGD's first momentum step)
// and the schedule follows the pushing worker's step.
bool OptimizerUpdateAtInto(const OptimizerOptions& options, int64_t step,
                           int64_t lr_step, const float* w_in, const float* g,
                           const float* m_in, const float* v_in, float* w_out,
                           float* m_out, float* v_out, int64_t n);

}  // namespace pstrain

#endif  // PSTRAIN_OPTIM_OPTIMIZER_H_
