// Adam and AdamW updates for the parameter server's fp32 master weights.
//
// Formula: Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR
// 2015, Algorithm 1, with bias correction, computed in the same order as
// PyTorch 1.13's `torch.optim.Adam` (single-tensor path):
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   w = w - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// With weight_decay > 0 the decay is decoupled (AdamW, Loshchilov & Hutter,
// "Decoupled Weight Decay Regularization", ICLR 2019), applied first as in
// `torch.optim.AdamW`: w = w * (1 - lr * weight_decay).
//
// The update reads w, g, m, v and writes w, m, v: it is memory-bound, written
// as one pass the compiler vectorises (server/BUILD gives it the flags that
// allow that; 25.6M elements take ~36 ms on one core instead of ~65 ms).
#ifndef PSTRAIN_OPTIM_ADAM_H_
#define PSTRAIN_OPTIM_ADAM_H_

#include <cstdint>

namespace pstrain {

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  // Decoupled weight decay (AdamW); 0 gives plain Adam.
  float weight_decay = 0.0f;
  // > 0: the second moment v stops at update number freeze_variance_after
  // (later updates keep v and its bias correction 1 - beta2^F), as 1-bit
  // Adam's compression stage (Tang et al., ICML 2021): the update is then
  // linear in g, which error feedback needs (worker/topk_compression.h).
  // 0: never. The PS shards' update only (the CUDA kernel ignores it).
  int64_t freeze_variance_after = 0;
};

// The per-step scalars of the update above, computed in double and rounded
// to float once (as PyTorch does on the host): shared by AdamUpdate() and
// the CUDA backend's kernel so both round alike.
struct AdamStepConstants {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;                  // lr / (1 - beta1^t)
  float inv_bias_correction2_sqrt;  // 1 / sqrt(1 - beta2^t)
  float epsilon;
  float decay;  // 1 - lr * weight_decay; applied only when decoupled.
  bool decoupled;
  bool variance_frozen;  // v kept (AdamOptions::freeze_variance_after)
};
AdamStepConstants AdamConstantsFor(const AdamOptions& options, int64_t step);

// Applies update number `step` (1-based: the first update is step 1) to `n`
// elements. `w`, `m`, `v` are updated in place; `g` is read. The arrays must
// not overlap. Thread-compatible: callers serialise updates of one tensor.
void AdamUpdate(const AdamOptions& options, int64_t step, float* w,
                const float* g, float* m, float* v, int64_t n);

// The same update out of place: reads `w_in`, `m_in`, `v_in` and writes the
// results to `w_out`, `m_out`, `v_out` (bit-identical to AdamUpdate on the
// same inputs). A sync shard writes a step's update beside the state before
// it, so that a step skipped for a non-finite gradient can be undone
// (server/parameter_shard.h). No array may overlap another. Returns
// whether every new weight is finite (checked in the same loop).
bool AdamUpdateInto(const AdamOptions& options, int64_t step, const float* w_in,
                    const float* g, const float* m_in, const float* v_in,
                    float* w_out, float* m_out, float* v_out, int64_t n);

}  // namespace pstrain

#endif  // PSTRAIN_OPTIM_ADAM_H_
