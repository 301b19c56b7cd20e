// The four parameters of multi-head self-attention as both backends'
// attention code takes them (models/cpu_transformer.cc,
// models/cuda/cuda_transformer.cc): ParamSpecs() order and PyTorch's
// torch.nn.MultiheadAttention layouts, in the backend's memory. Plain
// pointers, not owned.
#ifndef PSTRAIN_MODELS_ATTENTION_WEIGHTS_H_
#define PSTRAIN_MODELS_ATTENTION_WEIGHTS_H_

namespace pstrain {

struct AttentionWeights {
  const float* in_w;   // [3E, E]: q, k, v rows.
  const float* in_b;   // [3E]
  const float* out_w;  // [E, E]
  const float* out_b;  // [E]
};

// Their gradients, overwritten by a backward.
struct AttentionGrads {
  float* in_w;
  float* in_b;
  float* out_w;
  float* out_b;
};

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_ATTENTION_WEIGHTS_H_
