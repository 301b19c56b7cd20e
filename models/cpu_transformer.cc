#include "models/cpu_transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "models/attention_weights.h"
#include "models/cpu_dnnl.h"
#include "models/cpu_dropout.h"
#include "models/cpu_inner_product.h"
#include "models/dropout_mask.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {
namespace {

using cpu_dnnl::CpuEngine;
using cpu_dnnl::CpuStream;
using cpu_dnnl::CreationMutex;
using cpu_dnnl::Run;
using cpu_dnnl::Wrap;
using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

memory::desc Flat(int64_t n) { return memory::desc({n}, dt::f32, tag::x); }
memory::desc Rows(int64_t rows, int64_t cols) {
  return memory::desc({rows, cols}, dt::f32, tag::ab);
}

absl::Status DenseOnly(const LayerSpec& spec, const DeviceTensor& t) {
  if (t.layout() == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(LayerName(spec), ": input in blocked layout"));
}

absl::Status NoTrainingForward(const LayerSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat(
      LayerName(spec), ": backward without a training forward of this shape"));
}

// LayerNorm over rows of `hidden` on oneDNN's layer_normalization: y = (x -
// mean) / sqrt(var + eps) * weight + bias, biased variance (Ba et al. 2016;
// torch.nn.LayerNorm). The forward keeps each row's mean and variance for
// the backward.
class LayerNormOp {
 public:
  explicit LayerNormOp(const LayerSpec& spec) : spec_(spec) {}

  absl::Status Forward(const float* x, int64_t rows, const float* weight,
                       const float* bias, float* y) {
    return Run(spec_, [&] {
      Prepare(rows);
      fwd_.execute(CpuStream(),
                   {{DNNL_ARG_SRC, Wrap(data_md_, x)},
                    {DNNL_ARG_DST, Wrap(data_md_, y)},
                    {DNNL_ARG_SCALE, Wrap(c_md_, weight)},
                    {DNNL_ARG_SHIFT, Wrap(c_md_, bias)},
                    {DNNL_ARG_MEAN, Wrap(stat_md_, mean_.data())},
                    {DNNL_ARG_VARIANCE, Wrap(stat_md_, var_.data())}});
    });
  }

  // dx (required), dweight and dbias from the last Forward's statistics.
  absl::Status Backward(const float* x, int64_t rows, const float* weight,
                        const float* bias, const float* dy, float* dx,
                        float* dweight, float* dbias) {
    if (rows != rows_) return NoTrainingForward(spec_);
    return Run(spec_, [&] {
      bwd_.execute(CpuStream(),
                   {{DNNL_ARG_SRC, Wrap(data_md_, x)},
                    {DNNL_ARG_MEAN, Wrap(stat_md_, mean_.data())},
                    {DNNL_ARG_VARIANCE, Wrap(stat_md_, var_.data())},
                    {DNNL_ARG_DIFF_DST, Wrap(data_md_, dy)},
                    {DNNL_ARG_SCALE, Wrap(c_md_, weight)},
                    {DNNL_ARG_SHIFT, Wrap(c_md_, bias)},
                    {DNNL_ARG_DIFF_SRC, Wrap(data_md_, dx)},
                    {DNNL_ARG_DIFF_SCALE, Wrap(c_md_, dweight)},
                    {DNNL_ARG_DIFF_SHIFT, Wrap(c_md_, dbias)}});
    });
  }

 private:
  void Prepare(int64_t rows) {
    if (rows == rows_) return;
    absl::MutexLock lock(&CreationMutex());
    rows_ = rows;
    mean_.resize(rows);
    var_.resize(rows);
    data_md_ = Rows(rows, spec_.in_channels);
    stat_md_ = Flat(rows);
    c_md_ = Flat(spec_.in_channels);
    const auto flags = dnnl::normalization_flags::use_scale |
                       dnnl::normalization_flags::use_shift;
    dnnl::layer_normalization_forward::primitive_desc fwd_pd(
        dnnl::layer_normalization_forward::desc(prop_kind::forward_training,
                                                data_md_, stat_md_,
                                                spec_.epsilon, flags),
        CpuEngine());
    fwd_ = dnnl::layer_normalization_forward(fwd_pd);
    bwd_ = dnnl::layer_normalization_backward(
        dnnl::layer_normalization_backward::primitive_desc(
            dnnl::layer_normalization_backward::desc(
                prop_kind::backward, data_md_, data_md_, stat_md_,
                spec_.epsilon, flags),
            CpuEngine(), fwd_pd));
  }

  const LayerSpec spec_;
  int64_t rows_ = -1;
  std::vector<float> mean_, var_;
  memory::desc data_md_, stat_md_, c_md_;
  dnnl::layer_normalization_forward fwd_;
  dnnl::layer_normalization_backward bwd_;
};

// GELU, erf form, on oneDNN's eltwise_gelu_erf: y = x Phi(x), dx = dy
// (Phi(x) + x phi(x)) (Hendrycks & Gimpel 2016; torch.nn.functional.gelu
// with approximate='none').
class GeluOp {
 public:
  explicit GeluOp(const LayerSpec& spec) : spec_(spec) {}

  absl::Status Forward(const float* x, int64_t n, float* y) {
    return Run(spec_, [&] {
      Prepare(n);
      fwd_.execute(CpuStream(), {{DNNL_ARG_SRC, Wrap(md_, x)},
                                 {DNNL_ARG_DST, Wrap(md_, y)}});
    });
  }

  absl::Status Backward(const float* x, int64_t n, const float* dy, float* dx) {
    return Run(spec_, [&] {
      Prepare(n);
      bwd_.execute(CpuStream(), {{DNNL_ARG_SRC, Wrap(md_, x)},
                                 {DNNL_ARG_DIFF_DST, Wrap(md_, dy)},
                                 {DNNL_ARG_DIFF_SRC, Wrap(md_, dx)}});
    });
  }

 private:
  void Prepare(int64_t n) {
    if (n == n_) return;
    absl::MutexLock lock(&CreationMutex());
    n_ = n;
    md_ = Flat(n);
    dnnl::eltwise_forward::primitive_desc fwd_pd(
        dnnl::eltwise_forward::desc(prop_kind::forward_training,
                                    algorithm::eltwise_gelu_erf, md_, 0.0f,
                                    0.0f),
        CpuEngine());
    fwd_ = dnnl::eltwise_forward(fwd_pd);
    bwd_ = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(algorithm::eltwise_gelu_erf, md_, md_,
                                     0.0f, 0.0f),
        CpuEngine(), fwd_pd));
  }

  const LayerSpec spec_;
  int64_t n_ = -1;
  memory::desc md_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

// Multi-head self-attention as torch.nn.MultiheadAttention (batch_first,
// bias, PyTorch 1.13's F.multi_head_attention_forward): [q k v] = x W_in^T +
// b_in; per head h (columns h*d .. h*d+d-1, d = E / heads), A = softmax(q
// k^T / sqrt(d)) over unmasked keys (masked keys get weight 0), dropout(A),
// ctx = A v; y = ctx W_out^T + b_out (Vaswani et al. 2017).
//
// Saved for the backward: the packed q/k/v [N, S, 3E], the softmax [N, H,
// S, S], the dropped weights when dropout ran, and ctx [N, S, E].
class AttentionOp {
 public:
  AttentionOp(const LayerSpec& spec, uint64_t seed, bool bf16)
      : spec_(spec),
        e_(spec.in_channels),
        heads_(spec.heads),
        d_(spec.in_channels / spec.heads),
        in_proj_(LayerName(spec), e_, 3 * e_, bf16),
        out_proj_(LayerName(spec), e_, e_, bf16),
        dropout_(spec.dropout, seed) {}

  // x [n, s, E]; pad [n, s] (nonzero: padding key); y [n, s, E].
  absl::Status Forward(const float* x, const float* pad, int64_t n, int64_t s,
                       const AttentionWeights& w, float* y, bool training) {
    trained_ = false;
    for (int64_t b = 0; b < n; ++b) {
      const float* p = pad + b * s;
      if (std::all_of(p, p + s, [](float v) { return v != 0.0f; })) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(spec_), ": every key of sample ", b,
                         " is padding (key padding mask all nonzero)"));
      }
    }
    const int64_t rows = n * s;
    qkv_.resize(rows * 3 * e_);
    probs_.resize(n * heads_ * s * s);
    ctx_.resize(rows * e_);
    absl::Status status =
        in_proj_.Forward(x, rows, w.in_w, w.in_b, qkv_.data());
    if (!status.ok()) return status;
    status = Run(spec_, [&] {
      Prepare(n, s);
      scores_.execute(CpuStream(),
                      {{DNNL_ARG_SRC, Wrap(q_md_, qkv_.data())},
                       {DNNL_ARG_WEIGHTS, Wrap(kt_md_, qkv_.data() + e_)},
                       {DNNL_ARG_DST, Wrap(att_md_, probs_.data())}});
    });
    if (!status.ok()) return status;
    MaskedSoftmax(pad, n, s);
    dropped_now_ = dropout_.active(training);
    const float* attn = probs_.data();
    if (dropped_now_) {
      dropped_.resize(probs_.size());
      dropout_.Forward(probs_.data(), probs_.size(), dropped_.data());
      attn = dropped_.data();
    }
    status = Run(spec_, [&] {
      context_.execute(CpuStream(),
                       {{DNNL_ARG_SRC, Wrap(att_md_, attn)},
                        {DNNL_ARG_WEIGHTS, Wrap(v_md_, qkv_.data() + 2 * e_)},
                        {DNNL_ARG_DST, Wrap(ctx_md_, ctx_.data())}});
    });
    if (!status.ok()) return status;
    status = out_proj_.Forward(ctx_.data(), rows, w.out_w, w.out_b, y);
    trained_ = status.ok() && training;
    return status;
  }

  // dx (null: not needed) and every parameter gradient (overwritten).
  absl::Status Backward(const float* x, int64_t n, int64_t s,
                        const AttentionWeights& w, const float* dy, float* dx,
                        const AttentionGrads& g) {
    if (!trained_ || n != n_ || s != s_) return NoTrainingForward(spec_);
    const int64_t rows = n * s;
    dctx_.resize(rows * e_);
    dattn_.resize(probs_.size());
    dqkv_.resize(qkv_.size());
    absl::Status status = out_proj_.Backward(ctx_.data(), rows, w.out_w, dy,
                                             dctx_.data(), g.out_w, g.out_b);
    if (!status.ok()) return status;
    const float* attn = dropped_now_ ? dropped_.data() : probs_.data();
    status = Run(spec_, [&] {
      // dA = dctx v^T; dv = A^T dctx.
      dattn_mm_.execute(CpuStream(),
                        {{DNNL_ARG_SRC, Wrap(ctx_md_, dctx_.data())},
                         {DNNL_ARG_WEIGHTS, Wrap(vt_md_, qkv_.data() + 2 * e_)},
                         {DNNL_ARG_DST, Wrap(att_md_, dattn_.data())}});
      dv_mm_.execute(CpuStream(),
                     {{DNNL_ARG_SRC, Wrap(att_t_md_, attn)},
                      {DNNL_ARG_WEIGHTS, Wrap(ctx_md_, dctx_.data())},
                      {DNNL_ARG_DST, Wrap(v_md_, dqkv_.data() + 2 * e_)}});
    });
    if (!status.ok()) return status;
    if (dropped_now_) {
      dropout_.Backward(dattn_.data(), dattn_.size(), dattn_.data());
    }
    SoftmaxBackward(s);
    status = Run(spec_, [&] {
      // dq = dScores k / sqrt(d); dk = dScores^T q / sqrt(d) (the scale is
      // in dattn_ now).
      dq_mm_.execute(CpuStream(),
                     {{DNNL_ARG_SRC, Wrap(att_md_, dattn_.data())},
                      {DNNL_ARG_WEIGHTS, Wrap(v_md_, qkv_.data() + e_)},
                      {DNNL_ARG_DST, Wrap(v_md_, dqkv_.data())}});
      dk_mm_.execute(CpuStream(),
                     {{DNNL_ARG_SRC, Wrap(att_t_md_, dattn_.data())},
                      {DNNL_ARG_WEIGHTS, Wrap(v_md_, qkv_.data())},
                      {DNNL_ARG_DST, Wrap(v_md_, dqkv_.data() + e_)}});
    });
    if (!status.ok()) return status;
    return in_proj_.Backward(x, rows, w.in_w, dqkv_.data(), dx, g.in_w, g.in_b);
  }

 private:
  // Softmax over each row of probs_ (holding the scaled scores) with the
  // padding keys left out: weight exactly 0 there, as PyTorch's -inf mask.
  void MaskedSoftmax(const float* pad, int64_t n, int64_t s) {
    const int64_t rows = heads_ * s;
#pragma omp parallel for collapse(2) schedule(static) if (n * rows * s >= 65536)
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* p = pad + b * s;
        float* row = probs_.data() + (b * rows + r) * s;
        float max = -INFINITY;
        for (int64_t j = 0; j < s; ++j) {
          if (p[j] == 0.0f) max = std::max(max, row[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < s; ++j) {
          row[j] = p[j] == 0.0f ? std::exp(row[j] - max) : 0.0f;
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < s; ++j) row[j] *= inv;
      }
    }
  }

  // dattn_ (dLoss/dA) becomes dLoss/d(q k^T): A (dA - sum_j A dA) / sqrt(d).
  void SoftmaxBackward(int64_t s) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
    const int64_t num_rows = static_cast<int64_t>(probs_.size()) / s;
#pragma omp parallel for schedule(static) if (num_rows * s >= 65536)
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* a = probs_.data() + r * s;
      float* da = dattn_.data() + r * s;
      float dot = 0.0f;
      for (int64_t j = 0; j < s; ++j) dot += a[j] * da[j];
      for (int64_t j = 0; j < s; ++j) da[j] = a[j] * (da[j] - dot) * scale;
    }
  }

  // Strided [N, H, rows, cols] views of the packed q/k/v and ctx, and the
  // six products over them, for batch n and sequence s.
  void Prepare(int64_t n, int64_t s) {
    if (n == n_ && s == s_) return;
    absl::MutexLock lock(&CreationMutex());
    n_ = n;
    s_ = s;
    const int64_t h = heads_, d = d_, e3 = 3 * e_;
    // q, k or v of head h at qkv + {0, E, 2E}: [N, H, S, d].
    q_md_ = memory::desc({n, h, s, d}, dt::f32, {s * e3, d, e3, 1});
    v_md_ = q_md_;
    // k^T and v^T: [N, H, d, S].
    kt_md_ = memory::desc({n, h, d, s}, dt::f32, {s * e3, d, 1, e3});
    vt_md_ = kt_md_;
    // Attention weights [N, H, S, S] and their transpose.
    att_md_ = memory::desc({n, h, s, s}, dt::f32, {h * s * s, s * s, s, 1});
    att_t_md_ = memory::desc({n, h, s, s}, dt::f32, {h * s * s, s * s, 1, s});
    // ctx (and dctx) per head: [N, H, S, d] inside [N, S, E].
    ctx_md_ = memory::desc({n, h, s, d}, dt::f32, {s * e_, d, e_, 1});
    auto make = [](const memory::desc& a, const memory::desc& b,
                   const memory::desc& c, float scale) {
      dnnl::primitive_attr attr;
      if (scale != 1.0f) attr.set_output_scales(0, {scale});
      return dnnl::matmul(dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(a, b, c), attr, CpuEngine()));
    };
    scores_ =
        make(q_md_, kt_md_, att_md_, 1.0f / std::sqrt(static_cast<float>(d_)));
    context_ = make(att_md_, v_md_, ctx_md_, 1.0f);
    dattn_mm_ = make(ctx_md_, vt_md_, att_md_, 1.0f);
    dv_mm_ = make(att_t_md_, ctx_md_, v_md_, 1.0f);
    dq_mm_ = make(att_md_, v_md_, v_md_, 1.0f);
    dk_mm_ = make(att_t_md_, v_md_, v_md_, 1.0f);
  }

  const LayerSpec spec_;
  const int64_t e_, heads_, d_;
  InnerProductOp in_proj_, out_proj_;
  CpuDropout dropout_;
  int64_t n_ = -1, s_ = -1;
  bool trained_ = false;
  bool dropped_now_ = false;
  std::vector<float> qkv_, probs_, dropped_, ctx_;
  std::vector<float> dctx_, dattn_, dqkv_;
  memory::desc q_md_, v_md_, kt_md_, vt_md_, att_md_, att_t_md_, ctx_md_;
  dnnl::matmul scores_, context_, dattn_mm_, dv_mm_, dq_mm_, dk_mm_;
};

// ---- Layers over the ops ----

class LayerNorm final : public Layer {
 public:
  LayerNorm(const LayerSpec& spec, std::vector<Param*> params)
      : spec_(spec), op_(spec), weight_(params[0]), bias_(params[1]) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status status = DenseOnly(spec_, *in[0]);
    if (!status.ok()) return status;
    out->set_layout(0);
    return op_.Forward(in[0]->data(), in[0]->size() / spec_.in_channels,
                       weight_->value.data(), bias_->value.data(), out->data());
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    // oneDNN's backward always writes dx.
    float* dx = nullptr;
    if (din[0] != nullptr) {
      dx = din[0]->data();
      din[0]->set_layout(0);
    } else {
      scratch_.resize(in[0]->size());
      dx = scratch_.data();
    }
    return op_.Backward(in[0]->data(), in[0]->size() / spec_.in_channels,
                        weight_->value.data(), bias_->value.data(), dout.data(),
                        dx, weight_->grad.data(), bias_->grad.data());
  }

 private:
  const LayerSpec spec_;
  LayerNormOp op_;
  Param* weight_;
  Param* bias_;
  std::vector<float> scratch_;
};

class Gelu final : public Layer {
 public:
  explicit Gelu(const LayerSpec& spec) : spec_(spec), op_(spec) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status status = DenseOnly(spec_, *in[0]);
    if (!status.ok()) return status;
    out->set_layout(0);
    return op_.Forward(in[0]->data(), in[0]->size(), out->data());
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(0);
    return op_.Backward(in[0]->data(), in[0]->size(), dout.data(),
                        din[0]->data());
  }

 private:
  const LayerSpec spec_;
  GeluOp op_;
};

// out[b, t] = token[ids[b, t]] + position[t]. Backward: the token table's
// gradient is zeroed, then each (b, t) adds dout[b, t] into row ids[b, t]
// (torch.nn.Embedding's dense gradient); position row t gets the sum over b.
// The ids have no gradient: din[0], when asked for, is zeros.
class Embedding final : public Layer {
 public:
  Embedding(const LayerSpec& spec, std::vector<Param*> params)
      : spec_(spec), token_(params[0]), position_(params[1]) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    absl::Status status = DenseOnly(spec_, *in[0]);
    if (!status.ok()) return status;
    const int64_t n = in[0]->shape()[0], s = in[0]->shape()[1];
    const int64_t e = spec_.out_channels;
    status = ReadIds(*in[0], &ids_);
    if (!status.ok()) return status;
    out->set_layout(0);
    const float* tok = token_->value.data();
    const float* pos = position_->value.data();
    float* y = out->data();
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t t = 0; t < s; ++t) {
        const float* a = tok + ids_[b * s + t] * e;
        const float* p = pos + t * e;
        float* row = y + (b * s + t) * e;
        for (int64_t j = 0; j < e; ++j) row[j] = a[j] + p[j];
      }
    }
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    absl::Status status = ReadIds(*in[0], &ids_);
    if (!status.ok()) return status;
    const int64_t n = in[0]->shape()[0], s = in[0]->shape()[1];
    const int64_t e = spec_.out_channels;
    float* dtok = token_->grad.data();
    float* dpos = position_->grad.data();
    std::fill(dtok, dtok + token_->grad.size(), 0.0f);
    std::fill(dpos, dpos + position_->grad.size(), 0.0f);
    const float* dy = dout.data();
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t t = 0; t < s; ++t) {
        const float* g = dy + (b * s + t) * e;
        float* a = dtok + ids_[b * s + t] * e;
        float* p = dpos + t * e;
        for (int64_t j = 0; j < e; ++j) {
          a[j] += g[j];
          p[j] += g[j];
        }
      }
    }
    if (din[0] != nullptr) {
      std::fill(din[0]->data(), din[0]->data() + din[0]->size(), 0.0f);
      din[0]->set_layout(0);
    }
    return absl::OkStatus();
  }

 private:
  // The ids as integers; INVALID_ARGUMENT naming the first bad one.
  absl::Status ReadIds(const DeviceTensor& t, std::vector<int64_t>* ids) {
    const int64_t s = t.shape()[1];
    const float* v = t.data();
    ids->resize(t.size());
    for (int64_t i = 0; i < t.size(); ++i) {
      const float id = v[i];
      if (!(id >= 0.0f && id < static_cast<float>(spec_.in_channels)) ||
          id != std::floor(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(spec_), ": token id ", id, " at [", i / s, ", ", i % s,
            "] is not an integer in [0, ", spec_.in_channels, ")"));
      }
      (*ids)[i] = static_cast<int64_t>(id);
    }
    return absl::OkStatus();
  }

  const LayerSpec spec_;
  Param* token_;
  Param* position_;
  std::vector<int64_t> ids_;
};

// LayerSpec::GatherRows: out row p = x's row positions[p]; the backward
// zeroes dx and adds each dout row into the row it came from.
class GatherRows final : public Layer {
 public:
  explicit GatherRows(const LayerSpec& spec) : spec_(spec) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    for (const DeviceTensor* t : in) {
      absl::Status status = DenseOnly(spec_, *t);
      if (!status.ok()) return status;
    }
    const int64_t e = spec_.in_channels;
    absl::Status status = ReadPositions(*in[1], in[0]->size() / e);
    if (!status.ok()) return status;
    out->set_layout(0);
    const float* x = in[0]->data();
    float* y = out->data();
    const int64_t p = static_cast<int64_t>(rows_.size());
#pragma omp parallel for schedule(static) if (p * e >= 65536)
    for (int64_t r = 0; r < p; ++r) {
      std::memcpy(y + r * e, x + rows_[r] * e, sizeof(float) * e);
    }
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const int64_t e = spec_.in_channels;
    if (static_cast<int64_t>(rows_.size()) * e != dout.size()) {
      return NoTrainingForward(spec_);
    }
    // The positions have no gradient.
    if (din.size() > 1 && din[1] != nullptr) {
      std::fill(din[1]->data(), din[1]->data() + din[1]->size(), 0.0f);
    }
    if (din[0] == nullptr) return absl::OkStatus();
    float* dx = din[0]->data();
    std::fill(dx, dx + din[0]->size(), 0.0f);
    din[0]->set_layout(0);
    for (size_t r = 0; r < rows_.size(); ++r) {
      const float* g = dout.data() + r * e;
      float* d = dx + rows_[r] * e;
      for (int64_t j = 0; j < e; ++j) d[j] += g[j];
    }
    return absl::OkStatus();
  }

 private:
  // The positions as row indices below `rows`; INVALID_ARGUMENT naming the
  // first bad one.
  absl::Status ReadPositions(const DeviceTensor& t, int64_t rows) {
    rows_.resize(t.size());
    for (int64_t i = 0; i < t.size(); ++i) {
      const float at = t.data()[i];
      if (!(at >= 0.0f && at < static_cast<float>(rows)) ||
          at != std::floor(at)) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(spec_), ": position ", at, " at [", i,
                         "] is not a row index in [0, ", rows, ")"));
      }
      rows_[i] = static_cast<int64_t>(at);
    }
    return absl::OkStatus();
  }

  const LayerSpec spec_;
  std::vector<int64_t> rows_;
};

class MultiheadAttention final : public Layer {
 public:
  MultiheadAttention(const LayerSpec& spec, std::vector<Param*> params,
                     uint64_t seed, bool bf16)
      : spec_(spec), op_(spec, seed, bf16), params_(std::move(params)) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    for (const DeviceTensor* t : in) {
      absl::Status status = DenseOnly(spec_, *t);
      if (!status.ok()) return status;
    }
    out->set_layout(0);
    const Shape& shape = in[0]->shape();
    return op_.Forward(in[0]->data(), in[1]->data(), shape[0], shape[1],
                       Weights(), out->data(), training);
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const Shape& shape = in[0]->shape();
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    absl::Status status = op_.Backward(
        in[0]->data(), shape[0], shape[1], Weights(), dout.data(), dx,
        {params_[0]->grad.data(), params_[1]->grad.data(),
         params_[2]->grad.data(), params_[3]->grad.data()});
    if (!status.ok()) return status;
    for (DeviceTensor* d : din) {
      if (d != nullptr) d->set_layout(0);
    }
    // The mask has no gradient.
    if (din.size() > 1 && din[1] != nullptr) {
      std::fill(din[1]->data(), din[1]->data() + din[1]->size(), 0.0f);
    }
    return absl::OkStatus();
  }

 private:
  AttentionWeights Weights() const {
    return {params_[0]->value.data(), params_[1]->value.data(),
            params_[2]->value.data(), params_[3]->value.data()};
  }

  const LayerSpec spec_;
  AttentionOp op_;
  std::vector<Param*> params_;
};

// Adds b into a (n elements).
void AddInto(const float* b, int64_t n, float* a) {
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

// torch.nn.TransformerEncoderLayer with activation "gelu", batch_first and
// norm_first=False, composed of the ops above:
//   a  = dropout1(attn(x));      h1 = x + a;   y1 = norm1(h1)
//   g  = dropout(gelu(linear1(y1)));  f = dropout2(linear2(g))
//   h2 = y1 + f;                 out = norm2(h2)
// Saved for the backward: h1, y1, linear1's output, g, h2 (and what the
// ops keep). Parameters in ParamSpecs() order: self_attn (4), linear1 (2),
// linear2 (2), norm1 (2), norm2 (2).
class TransformerEncoderLayer final : public Layer {
 public:
  TransformerEncoderLayer(const LayerSpec& spec, std::vector<Param*> params,
                          uint64_t seed, bool bf16)
      : spec_(spec),
        e_(spec.in_channels),
        f_(spec.feedforward),
        attention_(spec, EncoderDropoutSeed(seed, 0), bf16),
        norm1_(spec),
        norm2_(spec),
        linear1_(LayerName(spec), e_, f_, bf16),
        linear2_(LayerName(spec), f_, e_, bf16),
        gelu_(spec),
        dropout1_(spec.dropout, EncoderDropoutSeed(seed, 1)),
        dropout_(spec.dropout, EncoderDropoutSeed(seed, 2)),
        dropout2_(spec.dropout, EncoderDropoutSeed(seed, 3)),
        p_(std::move(params)) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    trained_ = false;
    for (const DeviceTensor* t : in) {
      absl::Status status = DenseOnly(spec_, *t);
      if (!status.ok()) return status;
    }
    out->set_layout(0);
    const Shape& shape = in[0]->shape();
    const int64_t n = shape[0], s = shape[1], rows = n * s;
    const int64_t ne = rows * e_, nf = rows * f_;
    const float* x = in[0]->data();
    h1_.resize(ne);
    y1_.resize(ne);
    f1_.resize(nf);
    g_.resize(nf);
    h2_.resize(ne);
    dropped_ = dropout1_.active(training);
    absl::Status status = attention_.Forward(
        x, in[1]->data(), n, s, AttentionParams(), h1_.data(), training);
    if (!status.ok()) return status;
    if (dropped_) dropout1_.Forward(h1_.data(), ne, h1_.data());
    AddInto(x, ne, h1_.data());
    status = norm1_.Forward(h1_.data(), rows, Value(8), Value(9), y1_.data());
    if (!status.ok()) return status;
    status = linear1_.Forward(y1_.data(), rows, Value(4), Value(5), f1_.data());
    if (!status.ok()) return status;
    status = gelu_.Forward(f1_.data(), nf, g_.data());
    if (!status.ok()) return status;
    if (dropped_) dropout_.Forward(g_.data(), nf, g_.data());
    status = linear2_.Forward(g_.data(), rows, Value(6), Value(7), h2_.data());
    if (!status.ok()) return status;
    if (dropped_) dropout2_.Forward(h2_.data(), ne, h2_.data());
    AddInto(y1_.data(), ne, h2_.data());
    status =
        norm2_.Forward(h2_.data(), rows, Value(10), Value(11), out->data());
    trained_ = status.ok() && training;
    rows_ = rows;
    return status;
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const Shape& shape = in[0]->shape();
    const int64_t n = shape[0], s = shape[1], rows = n * s;
    if (!trained_ || rows != rows_) return NoTrainingForward(spec_);
    const int64_t ne = rows * e_, nf = rows * f_;
    dh2_.resize(ne);
    df_.resize(ne);
    dg_.resize(nf);
    dy1_.resize(ne);
    dh1_.resize(ne);
    // out = norm2(h2); h2 = y1 + f.
    absl::Status status =
        norm2_.Backward(h2_.data(), rows, Value(10), Value(11), dout.data(),
                        dh2_.data(), Grad(10), Grad(11));
    if (!status.ok()) return status;
    const float* df = dh2_.data();
    if (dropped_) {
      dropout2_.Backward(dh2_.data(), ne, df_.data());
      df = df_.data();
    }
    status = linear2_.Backward(g_.data(), rows, Value(6), df, dg_.data(),
                               Grad(6), Grad(7));
    if (!status.ok()) return status;
    if (dropped_) dropout_.Backward(dg_.data(), nf, dg_.data());
    // gelu's backward reads linear1's output; dg_ becomes dLoss/dF1.
    status = gelu_.Backward(f1_.data(), nf, dg_.data(), dg_.data());
    if (!status.ok()) return status;
    status = linear1_.Backward(y1_.data(), rows, Value(4), dg_.data(),
                               dy1_.data(), Grad(4), Grad(5));
    if (!status.ok()) return status;
    AddInto(dh2_.data(), ne, dy1_.data());
    // y1 = norm1(h1); h1 = x + a.
    status = norm1_.Backward(h1_.data(), rows, Value(8), Value(9), dy1_.data(),
                             dh1_.data(), Grad(8), Grad(9));
    if (!status.ok()) return status;
    const float* da = dh1_.data();
    if (dropped_) {
      dropout1_.Backward(dh1_.data(), ne, df_.data());
      da = df_.data();
    }
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    status = attention_.Backward(in[0]->data(), n, s, AttentionParams(), da, dx,
                                 {Grad(0), Grad(1), Grad(2), Grad(3)});
    if (!status.ok()) return status;
    if (dx != nullptr) {
      AddInto(dh1_.data(), ne, dx);
      din[0]->set_layout(0);
    }
    if (din.size() > 1 && din[1] != nullptr) {
      std::fill(din[1]->data(), din[1]->data() + din[1]->size(), 0.0f);
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

  const LayerSpec spec_;
  const int64_t e_, f_;
  AttentionOp attention_;
  LayerNormOp norm1_, norm2_;
  InnerProductOp linear1_, linear2_;
  GeluOp gelu_;
  CpuDropout dropout1_, dropout_, dropout2_;
  std::vector<Param*> p_;
  int64_t rows_ = -1;
  bool trained_ = false;
  bool dropped_ = false;
  std::vector<float> h1_, y1_, f1_, g_, h2_;
  std::vector<float> dh2_, df_, dg_, dy1_, dh1_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> NewCpuTransformerLayer(
    const LayerSpec& spec, std::vector<Param*> params, uint64_t seed,
    bool bf16) {
  absl::Status status = CheckTransformerLayer(spec, params.size());
  if (!status.ok()) return status;
  switch (spec.type) {
    case LayerType::kEmbedding:
      return std::unique_ptr<Layer>(new Embedding(spec, std::move(params)));
    case LayerType::kLayerNorm:
      return std::unique_ptr<Layer>(new LayerNorm(spec, std::move(params)));
    case LayerType::kGelu:
      return std::unique_ptr<Layer>(new Gelu(spec));
    case LayerType::kGatherRows:
      return std::unique_ptr<Layer>(new GatherRows(spec));
    case LayerType::kMultiheadAttention:
      return std::unique_ptr<Layer>(
          new MultiheadAttention(spec, std::move(params), seed, bf16));
    case LayerType::kTransformerEncoderLayer:
      return std::unique_ptr<Layer>(
          new TransformerEncoderLayer(spec, std::move(params), seed, bf16));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(LayerName(spec), ": not a transformer layer"));
  }
}

}  // namespace pstrain
