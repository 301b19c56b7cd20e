// y[rows, out] = x[rows, in] W^T + b on oneDNN 2.6's inner product
// (torch.nn.Linear; W [out, in] row-major, b [out]), forward and backward:
// the CPU backend's Linear layer (cpu_layers.cc) and the transformer
// layers' projections (cpu_transformer.cc: the attention's q/k/v and output
// projections, the feed-forward's two). Internal to models/.
//
// Precision (Backend::SetPrecision): fp32, or bf16 as torch.autocast casts
// a linear layer: bf16 copies of the input, weights and output gradient
// (oneDNN reorders), fp32 accumulation, and fp32 outputs, gradients and
// bias. bf16 needs a CPU oneDNN makes bf16 primitives on (AVX-512:
// CpuBf16Available, backend.h); elsewhere the first call fails INTERNAL.
//
// Every pointer is caller-owned dense fp32 (layout 0); the primitives are
// made for the first row count and again when it changes. Errors: INTERNAL
// naming the op for a oneDNN failure.
//
// Thread-safety: one thread at a time (a layer's training thread).
#ifndef PSTRAIN_MODELS_CPU_INNER_PRODUCT_H_
#define PSTRAIN_MODELS_CPU_INNER_PRODUCT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {

class InnerProductOp {
 public:
  // `name` names the op in errors (the layer's name).
  InnerProductOp(std::string name, int64_t in, int64_t out, bool bf16);

  // y = x W^T + b over `rows` rows.
  absl::Status Forward(const float* x, int64_t rows, const float* w,
                       const float* b, float* y);

  // dW = dy^T x and db = the column sums of dy (both overwritten); dx (when
  // not null) = dy W.
  absl::Status Backward(const float* x, int64_t rows, const float* w,
                        const float* dy, float* dx, float* dw, float* db);

 private:
  void Prepare(int64_t rows);

  const std::string name_;
  const int64_t in_, out_;
  const bool bf16_;
  int64_t rows_ = -1;
  dnnl::memory::desc src_md_, wei_md_, bias_md_, dst_md_;
  // bf16: the source's, weights' and output gradient's bf16 copies (empty
  // under fp32).
  dnnl::memory src_c_, wei_c_, dout_c_;
  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_data bwd_data_;
  dnnl::inner_product_backward_weights bwd_weights_;
};

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CPU_INNER_PRODUCT_H_
