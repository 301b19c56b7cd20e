#include "models/cuda/cuda_transformer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/attention_weights.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/kernels.h"
#include "models/cuda/transformer_kernels.h"
#include "models/dropout_mask.h"

namespace pstrain {
namespace {

absl::Status NoTrainingForward(const LayerSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat(
      LayerName(spec), ": backward without a training forward of this shape"));
}

// A device scratch tensor of at least `n` elements (kept between calls).
absl::StatusOr<float*> Scratch(const CudaLayerContext& c, DeviceTensor* t,
                               int64_t n) {
  if (t->backend() == nullptr) *t = DeviceTensor(c.backend);
  if (t->size() != n) RETURN_IF_ERROR(t->Resize({std::max<int64_t>(n, 1)}));
  return t->data();
}

// out[c] = sum_r a[r, c] over a row-major [rows, cols]: cuBLAS's gemv of
// the column-major [cols, rows] view with ones (a bias gradient).
absl::Status ColumnSums(const CudaLayerContext& c, const float* a, int64_t rows,
                        int64_t cols, float* out) {
  ASSIGN_OR_RETURN(const float* ones, c.pool->Ones(rows));
  const float one = 1.0f, zero = 0.0f;
  CUDA_RETURN_IF_ERROR(cublasSgemv(
      c.cublas, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(rows),
      &one, a, static_cast<int>(cols), ones, 1, &zero, out, 1));
  return absl::OkStatus();
}

// Device values copied to the host (a synchronisation of the stream).
absl::Status ToHost(const CudaLayerContext& c, const float* device, int64_t n,
                    std::vector<float>* host) {
  host->resize(n);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host->data(), device, sizeof(float) * n,
                                       cudaMemcpyDeviceToHost, c.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(c.stream));
  return absl::OkStatus();
}

// Host integers to a device scratch tensor (4-byte elements) and its data.
absl::StatusOr<int32_t*> IntsToDevice(const CudaLayerContext& c,
                                      const std::vector<int32_t>& host,
                                      DeviceTensor* t) {
  ASSIGN_OR_RETURN(float* data,
                   Scratch(c, t, static_cast<int64_t>(host.size())));
  int32_t* ints = reinterpret_cast<int32_t*>(data);
  // Pageable memory: the copy completes before cudaMemcpyAsync returns
  // for the source, so `host` may change afterwards.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ints, host.data(),
                                       sizeof(int32_t) * host.size(),
                                       cudaMemcpyHostToDevice, c.stream));
  return ints;
}

absl::Status Zero(const CudaLayerContext& c, float* data, int64_t n) {
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, sizeof(float) * n, c.stream));
  return absl::OkStatus();
}

// C (m x n, row-major) = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x
// n, for `batch` matrices `stride_*` elements apart. cuBLAS is column-major,
// so this computes C^T = op(B)^T op(A)^T on the row-major storage.
absl::Status RowGemm(const CudaLayerContext& c, bool ta, bool tb, int64_t m,
                     int64_t n, int64_t k, float alpha, const float* a,
                     int64_t stride_a, const float* b, int64_t stride_b,
                     float beta, float* out, int64_t stride_out,
                     int64_t batch = 1) {
  const int lda = static_cast<int>(ta ? m : k);
  const int ldb = static_cast<int>(tb ? k : n);
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    CUDA_RETURN_IF_ERROR(cublasSgemm(c.cublas, op_b, op_a, static_cast<int>(n),
                                     static_cast<int>(m), static_cast<int>(k),
                                     &alpha, b, ldb, a, lda, &beta, out,
                                     static_cast<int>(n)));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(cublasSgemmStridedBatched(
      c.cublas, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &alpha, b, ldb, stride_b, a, lda, stride_a, &beta,
      out, static_cast<int>(n), stride_out, static_cast<int>(batch)));
  return absl::OkStatus();
}

// RowGemm's C (fp32) = alpha op(A) op(B) + beta C for one pair of 16-bit
// matrices of `type` (CUDA_R_16BF or CUDA_R_16F), with fp32 accumulation on
// tensor cores (cublasGemmEx, CUBLAS_COMPUTE_32F).
absl::Status RowGemm16(const CudaLayerContext& c, cudaDataType_t type, bool ta,
                       bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, const uint16_t* b, float beta,
                       float* out) {
  const int lda = static_cast<int>(ta ? m : k);
  const int ldb = static_cast<int>(tb ? k : n);
  CUDA_RETURN_IF_ERROR(cublasGemmEx(
      c.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      type, ldb, a, type, lda, &beta, out, CUDA_R_32F, static_cast<int>(n),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// `n` fp32 values at `x` converted to the 16-bit type into the pool's
// `slot` (bf16 when `bf16`, else fp16).
absl::StatusOr<const uint16_t*> To16(const CudaLayerContext& c,
                                     CudaScratchPool::Slot slot, const float* x,
                                     int64_t n, bool bf16) {
  ASSIGN_OR_RETURN(uint16_t * y, c.pool->Get16(slot, n));
  CUDA_RETURN_IF_ERROR(cuda::LaunchTo16(x, n, bf16, y, c.stream));
  return y;
}

// Inverted dropout on the device with models/dropout_mask.h's masks: call
// c's mask is the CPU backend's CpuDropout's for the same seed.
class DeviceDropout {
 public:
  DeviceDropout(float p, uint64_t seed) : p_(p), seed_(seed) {}
  bool active(bool training) const { return training && p_ > 0; }

  // y = x * the next call's mask (y may be x).
  absl::Status Forward(const CudaLayerContext& c, const float* x, int64_t n,
                       float* y) {
    ASSIGN_OR_RETURN(float* mask, Scratch(c, &mask_, n));
    CUDA_RETURN_IF_ERROR(cuda::LaunchDropout(
        x, n, 1.0f - p_, DropoutCallSeed(seed_, ++calls_), mask, y, c.stream));
    return absl::OkStatus();
  }
  // dx = dy * the last mask (dx may be dy).
  absl::Status Backward(const CudaLayerContext& c, const float* dy, int64_t n,
                        float* dx) const {
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchMultiply(dy, mask_.data(), n, dx, c.stream));
    return absl::OkStatus();
  }

 private:
  const float p_;
  const uint64_t seed_;
  uint64_t calls_ = 0;
  DeviceTensor mask_;
};

// y = x W^T + b over `rows` rows (torch.nn.Linear). Under bf16 or fp16
// precision x, W and dy are multiplied as 16-bit copies (the pool's kA16
// and kB16, reused by the next projection: the stream orders the
// conversions after the products that read them); outputs, gradients and
// the bias stay fp32.
class LinearOp {
 public:
  LinearOp(int64_t in, int64_t out, PrecisionKind precision)
      : in_(in),
        out_(out),
        sixteen_(precision == PRECISION_BF16 || precision == PRECISION_FP16),
        bf16_(precision == PRECISION_BF16) {}

  absl::Status Forward(const CudaLayerContext& c, const float* x, int64_t rows,
                       const float* w, const float* b, float* y) const {
    CUDA_RETURN_IF_ERROR(cuda::LaunchBroadcastRows(b, rows, out_, y, c.stream));
    if (!sixteen_) {
      return RowGemm(c, false, true, rows, out_, in_, 1.0f, x, 0, w, 0, 1.0f, y,
                     0);
    }
    ASSIGN_OR_RETURN(const uint16_t* x16,
                     To16(c, CudaScratchPool::kA16, x, rows * in_, bf16_));
    ASSIGN_OR_RETURN(const uint16_t* w16,
                     To16(c, CudaScratchPool::kB16, w, out_ * in_, bf16_));
    return RowGemm16(c, Type16(), false, true, rows, out_, in_, 1.0f, x16, w16,
                     1.0f, y);
  }

  // dW = dy^T x, db = the column sums of dy; dx (when not null) = dy W.
  absl::Status Backward(const CudaLayerContext& c, const float* x, int64_t rows,
                        const float* w, const float* dy, float* dx, float* dw,
                        float* db) const {
    RETURN_IF_ERROR(ColumnSums(c, dy, rows, out_, db));
    if (!sixteen_) {
      RETURN_IF_ERROR(RowGemm(c, true, false, out_, in_, rows, 1.0f, dy, 0, x,
                              0, 0.0f, dw, 0));
      if (dx == nullptr) return absl::OkStatus();
      return RowGemm(c, false, false, rows, in_, out_, 1.0f, dy, 0, w, 0, 0.0f,
                     dx, 0);
    }
    ASSIGN_OR_RETURN(const uint16_t* dy16,
                     To16(c, CudaScratchPool::kA16, dy, rows * out_, bf16_));
    ASSIGN_OR_RETURN(const uint16_t* x16,
                     To16(c, CudaScratchPool::kB16, x, rows * in_, bf16_));
    RETURN_IF_ERROR(RowGemm16(c, Type16(), true, false, out_, in_, rows, 1.0f,
                              dy16, x16, 0.0f, dw));
    if (dx == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(const uint16_t* w16,
                     To16(c, CudaScratchPool::kB16, w, out_ * in_, bf16_));
    return RowGemm16(c, Type16(), false, false, rows, in_, out_, 1.0f, dy16,
                     w16, 0.0f, dx);
  }

 private:
  cudaDataType_t Type16() const { return bf16_ ? CUDA_R_16BF : CUDA_R_16F; }

  const int64_t in_, out_;
  const bool sixteen_, bf16_;
};

// LayerNorm over rows of the spec's hidden size, the row statistics kept
// for the backward.
class LayerNormOp {
 public:
  explicit LayerNormOp(const LayerSpec& spec) : spec_(spec) {}

  absl::Status Forward(const CudaLayerContext& c, const float* x, int64_t rows,
                       const float* weight, const float* bias, float* y) {
    ASSIGN_OR_RETURN(float* mean, Scratch(c, &mean_, rows));
    ASSIGN_OR_RETURN(float* rstd, Scratch(c, &rstd_, rows));
    rows_ = rows;
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchLayerNormForward(x, rows, spec_.in_channels, spec_.epsilon,
                                     weight, bias, y, mean, rstd, c.stream));
    return absl::OkStatus();
  }

  // dx (null: not needed), dweight and dbias from the last Forward's
  // statistics.
  absl::Status Backward(const CudaLayerContext& c, const float* x, int64_t rows,
                        const float* weight, const float* dy, float* dx,
                        float* dweight, float* dbias) const {
    if (rows != rows_) return NoTrainingForward(spec_);
    const int64_t cols = spec_.in_channels;
    ASSIGN_OR_RETURN(float* dy_xhat,
                     c.pool->Get(CudaScratchPool::kDyXhat, rows * cols));
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchLayerNormBackward(x, dy, mean_.data(), rstd_.data(), weight,
                                      rows, cols, dx, dy_xhat, c.stream));
    RETURN_IF_ERROR(ColumnSums(c, dy_xhat, rows, cols, dweight));
    return ColumnSums(c, dy, rows, cols, dbias);
  }

 private:
  const LayerSpec spec_;
  int64_t rows_ = -1;
  DeviceTensor mean_, rstd_;
};

// Multi-head self-attention as the CPU backend's AttentionOp
// (torch.nn.MultiheadAttention, batch_first): [q k v] = x W_in^T + b_in;
// per (sample, head) A = softmax(q k^T / sqrt(d)) over unmasked keys,
// dropout(A), ctx = A v; y = ctx W_out^T + b_out.
//
// Saved for the backward: the per-head q/k/v [3, N, H, S, d], the softmax
// [N, H, S, S], the dropped weights when dropout ran, and ctx [N, S, E].
class AttentionOp {
 public:
  AttentionOp(const LayerSpec& spec, uint64_t seed, PrecisionKind precision)
      : spec_(spec),
        e_(spec.in_channels),
        heads_(spec.heads),
        d_(spec.in_channels / spec.heads),
        in_proj_(e_, 3 * e_, precision),
        out_proj_(e_, e_, precision),
        dropout_(spec.dropout, seed) {}

  // x [n, s, E]; pad [n, s] (nonzero: padding key); y [n, s, E].
  absl::Status Forward(const CudaLayerContext& c, const float* x,
                       const float* pad, int64_t n, int64_t s,
                       const AttentionWeights& w, float* y, bool training) {
    trained_ = false;
    RETURN_IF_ERROR(ToHost(c, pad, n * s, &host_pad_));
    for (int64_t b = 0; b < n; ++b) {
      const float* p = host_pad_.data() + b * s;
      if (std::all_of(p, p + s, [](float v) { return v != 0.0f; })) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(spec_), ": every key of sample ", b,
                         " is padding (key padding mask all nonzero)"));
      }
    }
    const int64_t rows = n * s, block = n * heads_ * s * d_;
    const int64_t attn_size = n * heads_ * s * s;
    ASSIGN_OR_RETURN(float* qkv,
                     c.pool->Get(CudaScratchPool::kQkv, rows * 3 * e_));
    ASSIGN_OR_RETURN(float* heads, Scratch(c, &heads_qkv_, 3 * block));
    ASSIGN_OR_RETURN(float* probs, Scratch(c, &probs_, attn_size));
    ASSIGN_OR_RETURN(float* ctx_heads,
                     c.pool->Get(CudaScratchPool::kCtxHeads, block));
    ASSIGN_OR_RETURN(float* ctx, Scratch(c, &ctx_, rows * e_));
    RETURN_IF_ERROR(in_proj_.Forward(c, x, rows, w.in_w, w.in_b, qkv));
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchSplitHeads(qkv, n, s, 3, heads_, d_, heads, c.stream));
    const float* q = heads;
    const float* k = heads + block;
    const float* v = heads + 2 * block;
    const int64_t batch = n * heads_;
    RETURN_IF_ERROR(RowGemm(c, false, true, s, s, d_, Scale(), q, s * d_, k,
                            s * d_, 0.0f, probs, s * s, batch));
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchMaskedSoftmax(pad, n, heads_, s, probs, c.stream));
    dropped_now_ = dropout_.active(training);
    const float* attn = probs;
    if (dropped_now_) {
      ASSIGN_OR_RETURN(float* dropped, Scratch(c, &dropped_, attn_size));
      RETURN_IF_ERROR(dropout_.Forward(c, probs, attn_size, dropped));
      attn = dropped;
    }
    RETURN_IF_ERROR(RowGemm(c, false, false, s, d_, s, 1.0f, attn, s * s, v,
                            s * d_, 0.0f, ctx_heads, s * d_, batch));
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchMergeHeads(ctx_heads, n, s, 1, heads_, d_, ctx, c.stream));
    RETURN_IF_ERROR(out_proj_.Forward(c, ctx, rows, w.out_w, w.out_b, y));
    n_ = n;
    s_ = s;
    trained_ = training;
    return absl::OkStatus();
  }

  // dx (null: not needed) and every parameter gradient (overwritten).
  absl::Status Backward(const CudaLayerContext& c, const float* x, int64_t n,
                        int64_t s, const AttentionWeights& w, const float* dy,
                        float* dx, const AttentionGrads& g) {
    if (!trained_ || n != n_ || s != s_) return NoTrainingForward(spec_);
    const int64_t rows = n * s, block = n * heads_ * s * d_;
    const int64_t attn_size = n * heads_ * s * s, batch = n * heads_;
    ASSIGN_OR_RETURN(float* dctx,
                     c.pool->Get(CudaScratchPool::kDctx, rows * e_));
    ASSIGN_OR_RETURN(float* dctx_heads,
                     c.pool->Get(CudaScratchPool::kDctxHeads, block));
    ASSIGN_OR_RETURN(float* dattn,
                     c.pool->Get(CudaScratchPool::kDattn, attn_size));
    ASSIGN_OR_RETURN(float* dheads,
                     c.pool->Get(CudaScratchPool::kDheads, 3 * block));
    ASSIGN_OR_RETURN(float* dqkv,
                     c.pool->Get(CudaScratchPool::kDqkv, rows * 3 * e_));
    RETURN_IF_ERROR(out_proj_.Backward(c, ctx_.data(), rows, w.out_w, dy, dctx,
                                       g.out_w, g.out_b));
    CUDA_RETURN_IF_ERROR(cuda::LaunchSplitHeads(dctx, n, s, 1, heads_, d_,
                                                dctx_heads, c.stream));
    const float* q = heads_qkv_.data();
    const float* k = q + block;
    const float* v = q + 2 * block;
    const float* attn = dropped_now_ ? dropped_.data() : probs_.data();
    // dA = dctx v^T; dv = A^T dctx.
    RETURN_IF_ERROR(RowGemm(c, false, true, s, s, d_, 1.0f, dctx_heads, s * d_,
                            v, s * d_, 0.0f, dattn, s * s, batch));
    RETURN_IF_ERROR(RowGemm(c, true, false, s, d_, s, 1.0f, attn, s * s,
                            dctx_heads, s * d_, 0.0f, dheads + 2 * block,
                            s * d_, batch));
    if (dropped_now_) {
      RETURN_IF_ERROR(dropout_.Backward(c, dattn, attn_size, dattn));
    }
    CUDA_RETURN_IF_ERROR(cuda::LaunchSoftmaxBackward(
        probs_.data(), batch * s, s, Scale(), dattn, c.stream));
    // dq = dS k; dk = dS^T q.
    RETURN_IF_ERROR(RowGemm(c, false, false, s, d_, s, 1.0f, dattn, s * s, k,
                            s * d_, 0.0f, dheads, s * d_, batch));
    RETURN_IF_ERROR(RowGemm(c, true, false, s, d_, s, 1.0f, dattn, s * s, q,
                            s * d_, 0.0f, dheads + block, s * d_, batch));
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchMergeHeads(dheads, n, s, 3, heads_, d_, dqkv, c.stream));
    return in_proj_.Backward(c, x, rows, w.in_w, dqkv, dx, g.in_w, g.in_b);
  }

 private:
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(d_)); }

  const LayerSpec spec_;
  const int64_t e_, heads_, d_;
  LinearOp in_proj_, out_proj_;
  DeviceDropout dropout_;
  int64_t n_ = -1, s_ = -1;
  bool trained_ = false;
  bool dropped_now_ = false;
  std::vector<float> host_pad_;
  DeviceTensor heads_qkv_, probs_, dropped_, ctx_;
};

// ---- Layers over the ops ----

class LayerNorm final : public Layer {
 public:
  LayerNorm(const CudaLayerContext& c, const LayerSpec& spec,
            std::vector<Param*> params)
      : c_(c), spec_(spec), op_(spec), weight_(params[0]), bias_(params[1]) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(0);
    return op_.Forward(c_, in[0]->data(), in[0]->size() / spec_.in_channels,
                       weight_->value.data(), bias_->value.data(), out->data());
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    if (din[0] != nullptr) din[0]->set_layout(0);
    return op_.Backward(c_, in[0]->data(), in[0]->size() / spec_.in_channels,
                        weight_->value.data(), dout.data(), dx,
                        weight_->grad.data(), bias_->grad.data());
  }

 private:
  const CudaLayerContext c_;
  const LayerSpec spec_;
  LayerNormOp op_;
  Param* weight_;
  Param* bias_;
};

class Gelu final : public Layer {
 public:
  explicit Gelu(const CudaLayerContext& c) : c_(c) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(0);
    CUDA_RETURN_IF_ERROR(cuda::LaunchGeluForward(in[0]->data(), in[0]->size(),
                                                 out->data(), c_.stream));
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(0);
    CUDA_RETURN_IF_ERROR(cuda::LaunchGeluBackward(
        in[0]->data(), dout.data(), in[0]->size(), din[0]->data(), c_.stream));
    return absl::OkStatus();
  }

 private:
  const CudaLayerContext c_;
};

// out[b, t] = token[ids[b, t]] + position[t]; the backward zeroes both
// tables' gradients, then scatter-adds each row into its token's row and
// sums the batch into each position's (torch.nn.Embedding's dense
// gradient). The ids have no gradient: din[0], when asked for, is zeros.
class Embedding final : public Layer {
 public:
  Embedding(const CudaLayerContext& c, const LayerSpec& spec,
            std::vector<Param*> params)
      : c_(c), spec_(spec), token_(params[0]), position_(params[1]) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    const int64_t n = in[0]->shape()[0], s = in[0]->shape()[1];
    RETURN_IF_ERROR(ToHost(c_, in[0]->data(), in[0]->size(), &host_));
    std::vector<int32_t> ids(host_.size());
    for (size_t i = 0; i < host_.size(); ++i) {
      const float id = host_[i];
      if (!(id >= 0.0f && id < static_cast<float>(spec_.in_channels)) ||
          id != std::floor(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(spec_), ": token id ", id, " at [", i / s, ", ", i % s,
            "] is not an integer in [0, ", spec_.in_channels, ")"));
      }
      ids[i] = static_cast<int32_t>(id);
    }
    ASSIGN_OR_RETURN(const int32_t* device_ids, IntsToDevice(c_, ids, &ids_));
    rows_ = n * s;
    out->set_layout(0);
    CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingForward(
        device_ids, rows_, s, spec_.out_channels, token_->value.data(),
        position_->value.data(), out->data(), c_.stream));
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const int64_t n = in[0]->shape()[0], s = in[0]->shape()[1];
    if (n * s != rows_) return NoTrainingForward(spec_);
    const int64_t e = spec_.out_channels;
    RETURN_IF_ERROR(Zero(c_, token_->grad.data(), token_->grad.size()));
    CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingTokenGrad(
        reinterpret_cast<const int32_t*>(ids_.data()), rows_, e, dout.data(),
        token_->grad.data(), c_.stream));
    CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingPositionGrad(
        n, s, e, dout.data(), position_->grad.data(), c_.stream));
    // Positions past s get no gradient.
    const int64_t used = s * e;
    if (position_->grad.size() > used) {
      RETURN_IF_ERROR(Zero(c_, position_->grad.data() + used,
                           position_->grad.size() - used));
    }
    if (din[0] != nullptr) {
      din[0]->set_layout(0);
      RETURN_IF_ERROR(Zero(c_, din[0]->data(), din[0]->size()));
    }
    return absl::OkStatus();
  }

 private:
  const CudaLayerContext c_;
  const LayerSpec spec_;
  Param* token_;
  Param* position_;
  int64_t rows_ = -1;
  std::vector<float> host_;
  DeviceTensor ids_;  // int32 values in 4-byte elements.
};

// LayerSpec::GatherRows: out row p = x's row positions[p]; the backward
// zeroes dx and adds each dout row into the row it came from.
class GatherRows final : public Layer {
 public:
  GatherRows(const CudaLayerContext& c, const LayerSpec& spec)
      : c_(c), spec_(spec) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    const int64_t e = spec_.in_channels;
    const int64_t rows = in[0]->size() / e;
    RETURN_IF_ERROR(ToHost(c_, in[1]->data(), in[1]->size(), &host_));
    std::vector<int32_t> positions(host_.size());
    for (size_t i = 0; i < host_.size(); ++i) {
      const float at = host_[i];
      if (!(at >= 0.0f && at < static_cast<float>(rows)) ||
          at != std::floor(at)) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(spec_), ": position ", at, " at [", i,
                         "] is not a row index in [0, ", rows, ")"));
      }
      positions[i] = static_cast<int32_t>(at);
    }
    ASSIGN_OR_RETURN(const int32_t* device_rows,
                     IntsToDevice(c_, positions, &rows_));
    count_ = static_cast<int64_t>(positions.size());
    out->set_layout(0);
    CUDA_RETURN_IF_ERROR(cuda::LaunchGatherRows(
        in[0]->data(), device_rows, count_, e, out->data(), c_.stream));
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const int64_t e = spec_.in_channels;
    if (count_ < 0 || count_ * e != dout.size()) {
      return NoTrainingForward(spec_);
    }
    // The positions have no gradient.
    if (din.size() > 1 && din[1] != nullptr) {
      RETURN_IF_ERROR(Zero(c_, din[1]->data(), din[1]->size()));
    }
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(0);
    RETURN_IF_ERROR(Zero(c_, din[0]->data(), din[0]->size()));
    CUDA_RETURN_IF_ERROR(cuda::LaunchScatterAddRows(
        dout.data(), reinterpret_cast<const int32_t*>(rows_.data()), count_, e,
        din[0]->data(), c_.stream));
    return absl::OkStatus();
  }

 private:
  const CudaLayerContext c_;
  const LayerSpec spec_;
  int64_t count_ = -1;
  std::vector<float> host_;
  DeviceTensor rows_;  // int32 values in 4-byte elements.
};

class MultiheadAttention final : public Layer {
 public:
  MultiheadAttention(const CudaLayerContext& c, const LayerSpec& spec,
                     std::vector<Param*> params, uint64_t seed)
      : c_(c), op_(spec, seed, c.precision), p_(std::move(params)) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    const Shape& shape = in[0]->shape();
    out->set_layout(0);
    return op_.Forward(c_, in[0]->data(), in[1]->data(), shape[0], shape[1],
                       Weights(), out->data(), training);
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const Shape& shape = in[0]->shape();
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    RETURN_IF_ERROR(op_.Backward(c_, in[0]->data(), shape[0], shape[1],
                                 Weights(), dout.data(), dx,
                                 {p_[0]->grad.data(), p_[1]->grad.data(),
                                  p_[2]->grad.data(), p_[3]->grad.data()}));
    for (DeviceTensor* d : din) {
      if (d != nullptr) d->set_layout(0);
    }
    // The mask has no gradient.
    if (din.size() > 1 && din[1] != nullptr) {
      RETURN_IF_ERROR(Zero(c_, din[1]->data(), din[1]->size()));
    }
    return absl::OkStatus();
  }

 private:
  AttentionWeights Weights() const {
    return {p_[0]->value.data(), p_[1]->value.data(), p_[2]->value.data(),
            p_[3]->value.data()};
  }

  const CudaLayerContext c_;
  AttentionOp op_;
  std::vector<Param*> p_;
};

// torch.nn.TransformerEncoderLayer (gelu, batch_first, post-LN), as the CPU
// backend's:
//   a  = dropout1(attn(x));      h1 = x + a;   y1 = norm1(h1)
//   g  = dropout(gelu(linear1(y1)));  f = dropout2(linear2(g))
//   h2 = y1 + f;                 out = norm2(h2)
// Parameters in ParamSpecs() order: self_attn (4), linear1 (2), linear2
// (2), norm1 (2), norm2 (2).
class TransformerEncoderLayer final : public Layer {
 public:
  TransformerEncoderLayer(const CudaLayerContext& c, const LayerSpec& spec,
                          std::vector<Param*> params, uint64_t seed)
      : c_(c),
        spec_(spec),
        e_(spec.in_channels),
        f_(spec.feedforward),
        attention_(spec, EncoderDropoutSeed(seed, 0), c.precision),
        norm1_(spec),
        norm2_(spec),
        linear1_(e_, f_, c.precision),
        linear2_(f_, e_, c.precision),
        dropout1_(spec.dropout, EncoderDropoutSeed(seed, 1)),
        dropout_(spec.dropout, EncoderDropoutSeed(seed, 2)),
        dropout2_(spec.dropout, EncoderDropoutSeed(seed, 3)),
        p_(std::move(params)) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    trained_ = false;
    out->set_layout(0);
    const Shape& shape = in[0]->shape();
    const int64_t n = shape[0], s = shape[1], rows = n * s;
    const int64_t ne = rows * e_, nf = rows * f_;
    const float* x = in[0]->data();
    ASSIGN_OR_RETURN(float* h1, Scratch(c_, &h1_, ne));
    ASSIGN_OR_RETURN(float* y1, Scratch(c_, &y1_, ne));
    ASSIGN_OR_RETURN(float* f1, Scratch(c_, &f1_, nf));
    ASSIGN_OR_RETURN(float* g, Scratch(c_, &g_, nf));
    ASSIGN_OR_RETURN(float* h2, Scratch(c_, &h2_, ne));
    dropped_ = dropout1_.active(training);
    RETURN_IF_ERROR(attention_.Forward(c_, x, in[1]->data(), n, s,
                                       AttentionParams(), h1, training));
    if (dropped_) RETURN_IF_ERROR(dropout1_.Forward(c_, h1, ne, h1));
    CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(h1, x, ne, h1, c_.stream));
    RETURN_IF_ERROR(norm1_.Forward(c_, h1, rows, Value(8), Value(9), y1));
    RETURN_IF_ERROR(linear1_.Forward(c_, y1, rows, Value(4), Value(5), f1));
    CUDA_RETURN_IF_ERROR(cuda::LaunchGeluForward(f1, nf, g, c_.stream));
    if (dropped_) RETURN_IF_ERROR(dropout_.Forward(c_, g, nf, g));
    RETURN_IF_ERROR(linear2_.Forward(c_, g, rows, Value(6), Value(7), h2));
    if (dropped_) RETURN_IF_ERROR(dropout2_.Forward(c_, h2, ne, h2));
    CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(h2, y1, ne, h2, c_.stream));
    RETURN_IF_ERROR(
        norm2_.Forward(c_, h2, rows, Value(10), Value(11), out->data()));
    trained_ = training;
    rows_ = rows;
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const Shape& shape = in[0]->shape();
    const int64_t n = shape[0], s = shape[1], rows = n * s;
    if (!trained_ || rows != rows_) return NoTrainingForward(spec_);
    const int64_t ne = rows * e_, nf = rows * f_;
    ASSIGN_OR_RETURN(float* dh2, c_.pool->Get(CudaScratchPool::kDh2, ne));
    ASSIGN_OR_RETURN(float* df, c_.pool->Get(CudaScratchPool::kDf, ne));
    ASSIGN_OR_RETURN(float* dg, c_.pool->Get(CudaScratchPool::kDg, nf));
    ASSIGN_OR_RETURN(float* dy1, c_.pool->Get(CudaScratchPool::kDy1, ne));
    ASSIGN_OR_RETURN(float* dh1, c_.pool->Get(CudaScratchPool::kDh1, ne));
    // out = norm2(h2); h2 = y1 + f.
    RETURN_IF_ERROR(norm2_.Backward(c_, h2_.data(), rows, Value(10),
                                    dout.data(), dh2, Grad(10), Grad(11)));
    const float* dfp = dh2;
    if (dropped_) {
      RETURN_IF_ERROR(dropout2_.Backward(c_, dh2, ne, df));
      dfp = df;
    }
    RETURN_IF_ERROR(linear2_.Backward(c_, g_.data(), rows, Value(6), dfp, dg,
                                      Grad(6), Grad(7)));
    if (dropped_) RETURN_IF_ERROR(dropout_.Backward(c_, dg, nf, dg));
    // gelu's backward reads linear1's output; dg becomes dLoss/dF1.
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchGeluBackward(f1_.data(), dg, nf, dg, c_.stream));
    RETURN_IF_ERROR(linear1_.Backward(c_, y1_.data(), rows, Value(4), dg, dy1,
                                      Grad(4), Grad(5)));
    CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(dy1, dh2, ne, dy1, c_.stream));
    // y1 = norm1(h1); h1 = x + a.
    RETURN_IF_ERROR(norm1_.Backward(c_, h1_.data(), rows, Value(8), dy1, dh1,
                                    Grad(8), Grad(9)));
    const float* da = dh1;
    if (dropped_) {
      RETURN_IF_ERROR(dropout1_.Backward(c_, dh1, ne, df));
      da = df;
    }
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    RETURN_IF_ERROR(attention_.Backward(c_, in[0]->data(), n, s,
                                        AttentionParams(), da, dx,
                                        {Grad(0), Grad(1), Grad(2), Grad(3)}));
    if (dx != nullptr) {
      CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(dx, dh1, ne, dx, c_.stream));
      din[0]->set_layout(0);
    }
    if (din.size() > 1 && din[1] != nullptr) {
      RETURN_IF_ERROR(Zero(c_, din[1]->data(), din[1]->size()));
      din[1]->set_layout(0);
    }
    return absl::OkStatus();
  }

 private:
  const float* Value(int i) const { return p_[i]->value.data(); }
  float* Grad(int i) const { return p_[i]->grad.data(); }
  AttentionWeights AttentionParams() const {
    return {Value(0), Value(1), Value(2), Value(3)};
  }

  const CudaLayerContext c_;
  const LayerSpec spec_;
  const int64_t e_, f_;
  AttentionOp attention_;
  LayerNormOp norm1_, norm2_;
  LinearOp linear1_, linear2_;
  DeviceDropout dropout1_, dropout_, dropout2_;
  std::vector<Param*> p_;
  int64_t rows_ = -1;
  bool trained_ = false;
  bool dropped_ = false;
  DeviceTensor h1_, y1_, f1_, g_, h2_;
};

}  // namespace

absl::StatusOr<float*> CudaScratchPool::Get(Slot slot, int64_t n) {
  DeviceTensor& t = slots_[slot];
  if (t.backend() == nullptr) t = DeviceTensor(backend_);
  if (t.size() < n) RETURN_IF_ERROR(t.Resize({n}));
  return t.data();
}

absl::StatusOr<uint16_t*> CudaScratchPool::Get16(Slot slot, int64_t n) {
  // Two 16-bit values a float element.
  ASSIGN_OR_RETURN(float* data, Get(slot, (n + 1) / 2));
  return reinterpret_cast<uint16_t*>(data);
}

void CudaScratchPool::Clear() {
  for (DeviceTensor& t : slots_) t = DeviceTensor();
  ones_ = DeviceTensor();
}

absl::StatusOr<const float*> CudaScratchPool::Ones(int64_t n) {
  if (ones_.backend() == nullptr) ones_ = DeviceTensor(backend_);
  if (ones_.size() < n) {
    RETURN_IF_ERROR(ones_.Resize({n}));
    const std::vector<float> host(n, 1.0f);
    RETURN_IF_ERROR(backend_->CopyToDevice(host.data(), n, ones_.data()));
    RETURN_IF_ERROR(backend_->Synchronize());
  }
  return ones_.data();
}

absl::StatusOr<std::unique_ptr<Layer>> NewCudaTransformerLayer(
    const CudaLayerContext& context, const LayerSpec& spec,
    std::vector<Param*> params, uint64_t seed) {
  RETURN_IF_ERROR(CheckTransformerLayer(spec, params.size()));
  switch (spec.type) {
    case LayerType::kEmbedding:
      return std::unique_ptr<Layer>(
          new Embedding(context, spec, std::move(params)));
    case LayerType::kLayerNorm:
      return std::unique_ptr<Layer>(
          new LayerNorm(context, spec, std::move(params)));
    case LayerType::kGelu:
      return std::unique_ptr<Layer>(new Gelu(context));
    case LayerType::kGatherRows:
      return std::unique_ptr<Layer>(new GatherRows(context, spec));
    case LayerType::kMultiheadAttention:
      return std::unique_ptr<Layer>(
          new MultiheadAttention(context, spec, std::move(params), seed));
    case LayerType::kTransformerEncoderLayer:
      return std::unique_ptr<Layer>(
          new TransformerEncoderLayer(context, spec, std::move(params), seed));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(LayerName(spec), ": not a transformer layer"));
  }
}

}  // namespace pstrain
