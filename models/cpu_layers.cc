// The CPU backend's CNN layers (cpu_layers.h): oneDNN 2.6 primitives on
// host memory.
//
// Activations with a channel count that is a multiple of the CPU's block (16
// with AVX-512, else 8) stay in oneDNN's channel-blocked layout (nChw16c /
// nChw8c) from the convolution that writes them to the flatten that ends the
// feature extractor, so convolutions and batch normalisation run oneDNN's
// direct JIT kernels without reordering activations (PyTorch on NCHW
// tensors reorders around every convolution). Parameters stay dense (OIHW);
// convolutions reorder weights into their preferred layout each step and
// weight gradients back.
//
// Primitives are created for the first input shape and layout a layer sees
// and again whenever they or the training flag change.
#include "models/cpu_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "models/backend.h"
#include "models/cpu_dnnl.h"
#include "models/cpu_dropout.h"
#include "models/cpu_inner_product.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

using cpu_dnnl::Converted;
using cpu_dnnl::CopyIf;
using cpu_dnnl::CpuEngine;
using cpu_dnnl::CpuStream;
using cpu_dnnl::CreationMutex;
using cpu_dnnl::MakeReorder;
using cpu_dnnl::Run;
using cpu_dnnl::WithType;
using cpu_dnnl::Wrap;

memory::dims Dims(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::desc Nchw(const Shape& s) {
  return memory::desc(Dims(s), dt::f32, tag::nchw);
}

// Channel block of the blocked activation layout for this CPU.
int Block() {
  static const int block =
      dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core ? 16 : 8;
  return block;
}

// The layout a layer producing `channels` channels writes.
int PreferredLayout(int64_t channels) {
  return channels % Block() == 0 ? Block() : 0;
}

// The oneDNN descriptor of a tensor of shape `s` in `layout`, of type `type`
// (f32 for every DeviceTensor; bf16 for a layer's converted copy).
memory::desc Md(const Shape& s, int layout, dt type = dt::f32) {
  if (s.size() == 4) {
    if (layout == 16) return memory::desc(Dims(s), type, tag::nChw16c);
    if (layout == 8) return memory::desc(Dims(s), type, tag::nChw8c);
    return memory::desc(Dims(s), type, tag::nchw);
  }
  if (s.size() == 2) return memory::desc(Dims(s), type, tag::nc);
  return memory::desc({NumElements(s)}, type, tag::x);
}

// Copies `src` (shape `s`, layout `from`) into `dst` in layout `to`.
void Reorder(const Shape& s, int from, const float* src, int to, float* dst) {
  if (from == to) {
    if (src != dst) std::memcpy(dst, src, sizeof(float) * NumElements(s));
    return;
  }
  memory a = Wrap(Md(s, from), src);
  memory b = Wrap(Md(s, to), dst);
  MakeReorder(a, b).execute(CpuStream(), a, b);
}

memory::desc Flat(int64_t n) { return memory::desc({n}, dt::f32, tag::x); }

// Convolution. Under bf16 precision (Backend::SetPrecision) the primitives
// take bf16 source, weights and output gradient (oneDNN's bf16 JIT kernels,
// fp32 accumulation) and write fp32 output, input gradient and weight and
// bias gradients; the fp32 tensors are converted at the edge (the weights
// by the reorder into the primitive's layout that fp32 runs anyway).
class Conv2d final : public Layer {
 public:
  Conv2d(const LayerSpec& spec, std::vector<Param*> params, bool bf16)
      : spec_(spec),
        weight_(params[0]),
        bias_(spec.bias ? params[1] : nullptr),
        bf16_(bf16) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    return Run(spec_, [&] {
      Prepare(in[0]->shape(), in[0]->layout());
      memory weights = Wrap(wei_md_, weight_->value.data());
      if (fwd_wei_.get(true) != nullptr) {
        MakeReorder(weights, fwd_wei_).execute(CpuStream(), weights, fwd_wei_);
        weights = fwd_wei_;
      }
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, Converted(Wrap(src_md_, in[0]->data()), src_c_)},
          {DNNL_ARG_WEIGHTS, weights},
          {DNNL_ARG_DST, Wrap(dst_md_, out->data())}};
      if (bias_ != nullptr) {
        args[DNNL_ARG_BIAS] = Wrap(bias_md_, bias_->value.data());
      }
      fwd_.execute(CpuStream(), args);
      out->set_layout(out_layout_);
    });
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    return Run(spec_, [&] {
      Prepare(in[0]->shape(), in[0]->layout());
      // The backward primitives that have no JIT kernel for the blocked
      // gradient take it dense (plain_dout_md_).
      memory blocked_dout = Wrap(dst_md_, dout.data());
      memory plain_dout;
      if (plain_dout_for_weights_ || plain_dout_for_data_) {
        plain_dout_.resize(dout.size());
        plain_dout = Wrap(plain_dout_md_, plain_dout_.data());
        MakeReorder(blocked_dout, plain_dout)
            .execute(CpuStream(), blocked_dout, plain_dout);
        plain_dout = Converted(plain_dout, plain_dout_c_);
      }
      if (!plain_dout_for_weights_ || !plain_dout_for_data_) {
        blocked_dout = Converted(blocked_dout, dout_c_);
      }
      memory grad = Wrap(wei_md_, weight_->grad.data());
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, Converted(Wrap(src_md_, in[0]->data()), src_c_)},
          {DNNL_ARG_DIFF_DST,
           plain_dout_for_weights_ ? plain_dout : blocked_dout},
          {DNNL_ARG_DIFF_WEIGHTS,
           diff_wei_.get(true) != nullptr ? diff_wei_ : grad}};
      if (bias_ != nullptr) {
        args[DNNL_ARG_DIFF_BIAS] = Wrap(bias_md_, bias_->grad.data());
      }
      bwd_weights_.execute(CpuStream(), args);
      if (diff_wei_.get(true) != nullptr) {
        MakeReorder(diff_wei_, grad).execute(CpuStream(), diff_wei_, grad);
      }
      if (din[0] != nullptr) {
        memory weights = Wrap(wei_md_, weight_->value.data());
        if (bwd_wei_.get(true) != nullptr) {
          MakeReorder(weights, bwd_wei_)
              .execute(CpuStream(), weights, bwd_wei_);
          weights = bwd_wei_;
        }
        bwd_data_.execute(CpuStream(),
                          {{DNNL_ARG_DIFF_DST,
                            plain_dout_for_data_ ? plain_dout : blocked_dout},
                           {DNNL_ARG_WEIGHTS, weights},
                           {DNNL_ARG_DIFF_SRC, Wrap(src_md_, din[0]->data())}});
        din[0]->set_layout(in[0]->layout());
      }
    });
  }

 private:
  void Prepare(const Shape& in, int layout) {
    if (in == in_shape_ && layout == in_layout_) return;
    absl::MutexLock lock(&CreationMutex());
    in_shape_ = in;
    in_layout_ = layout;
    const Shape out = *OutputShape(spec_, {in});
    out_layout_ = PreferredLayout(spec_.out_channels);
    // What the primitives read: bf16 copies under bf16 precision.
    const dt compute = bf16_ ? dt::bf16 : dt::f32;
    src_md_ = Md(in, layout);
    const memory::desc src_c_md = WithType(src_md_, compute);
    src_c_ = CopyIf(bf16_, src_c_md);
    wei_md_ = memory::desc(Dims(weight_->value.shape()), dt::f32, tag::oihw);
    const memory::desc wei_any(Dims(weight_->value.shape()), compute, tag::any);
    const memory::desc diff_wei_any(Dims(weight_->value.shape()), dt::f32,
                                    tag::any);
    bias_md_ = Flat(spec_.out_channels);
    dst_md_ = Md(out, out_layout_);
    const memory::desc dout_c_md = WithType(dst_md_, compute);
    dout_c_ = CopyIf(bf16_, dout_c_md);
    const memory::dims strides = {spec_.stride, spec_.stride};
    const memory::dims padding = {spec_.padding, spec_.padding};
    const auto fwd_desc =
        bias_ != nullptr
            ? dnnl::convolution_forward::desc(
                  prop_kind::forward_training, algorithm::convolution_direct,
                  src_c_md, wei_any, bias_md_, dst_md_, strides, padding,
                  padding)
            : dnnl::convolution_forward::desc(
                  prop_kind::forward_training, algorithm::convolution_direct,
                  src_c_md, wei_any, dst_md_, strides, padding, padding);
    dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, CpuEngine());
    fwd_ = dnnl::convolution_forward(fwd_pd);
    fwd_wei_ = fwd_pd.weights_desc() == wei_md_
                   ? memory()
                   : memory(fwd_pd.weights_desc(), CpuEngine());
    // oneDNN has no JIT backward kernels for a dense source with fewer
    // channels than a block and a blocked output (LeNet's second conv);
    // those fall back to the reference kernel, ~100x slower. Such backward
    // primitives take the output gradient dense instead.
    plain_dout_md_ = Nchw(out);
    const memory::desc plain_dout_c_md = WithType(plain_dout_md_, compute);
    auto is_reference = [](const auto& pd) {
      return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
    };
    auto make_data_pd = [&](const memory::desc& dst) {
      return dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(algorithm::convolution_direct,
                                                src_md_, wei_any, dst, strides,
                                                padding, padding),
          CpuEngine(), fwd_pd);
    };
    auto data_pd = make_data_pd(dout_c_md);
    plain_dout_for_data_ = out_layout_ != 0 && is_reference(data_pd);
    if (plain_dout_for_data_) data_pd = make_data_pd(plain_dout_c_md);
    bwd_data_ = dnnl::convolution_backward_data(data_pd);
    bwd_wei_ = data_pd.weights_desc() == wei_md_
                   ? memory()
                   : memory(data_pd.weights_desc(), CpuEngine());
    auto make_weights_pd = [&](const memory::desc& dst) {
      const auto desc =
          bias_ != nullptr
              ? dnnl::convolution_backward_weights::desc(
                    algorithm::convolution_direct, src_c_md, diff_wei_any,
                    bias_md_, dst, strides, padding, padding)
              : dnnl::convolution_backward_weights::desc(
                    algorithm::convolution_direct, src_c_md, diff_wei_any, dst,
                    strides, padding, padding);
      return dnnl::convolution_backward_weights::primitive_desc(
          desc, CpuEngine(), fwd_pd);
    };
    auto weights_pd = make_weights_pd(dout_c_md);
    plain_dout_for_weights_ = out_layout_ != 0 && is_reference(weights_pd);
    if (plain_dout_for_weights_) weights_pd = make_weights_pd(plain_dout_c_md);
    bwd_weights_ = dnnl::convolution_backward_weights(weights_pd);
    diff_wei_ = weights_pd.diff_weights_desc() == wei_md_
                    ? memory()
                    : memory(weights_pd.diff_weights_desc(), CpuEngine());
    plain_dout_c_ =
        CopyIf(bf16_ && (plain_dout_for_data_ || plain_dout_for_weights_),
               plain_dout_c_md);
  }

  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  const bool bf16_;
  Shape in_shape_;
  int in_layout_ = -1;
  int out_layout_ = 0;
  memory::desc src_md_, wei_md_, bias_md_, dst_md_;
  // Weights and weight gradients in the primitives' layouts (empty when the
  // primitive takes OIHW fp32).
  memory fwd_wei_, bwd_wei_, diff_wei_;
  // bf16: the source's and the output gradient's bf16 copies (empty in
  // fp32).
  memory src_c_, dout_c_, plain_dout_c_;
  memory::desc plain_dout_md_;
  bool plain_dout_for_data_ = false;
  bool plain_dout_for_weights_ = false;
  std::vector<float> plain_dout_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_weights_;
};

// y = x W^T + b on oneDNN's inner product (InnerProductOp; bf16 precision
// as Conv2d's: bf16 source, weights and output gradient, fp32 accumulation
// and outputs), per sample [N, I] or per token [N, S, I].
class Linear final : public Layer {
 public:
  Linear(const LayerSpec& spec, std::vector<Param*> params, bool bf16)
      : spec_(spec),
        weight_(params[0]),
        bias_(params[1]),
        op_(LayerName(spec), spec.in_channels, spec.out_channels, bf16) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    if (in[0]->layout() != 0) {
      return absl::InternalError(
          absl::StrCat(LayerName(spec_), ": input in blocked layout"));
    }
    out->set_layout(0);
    return op_.Forward(in[0]->data(), Rows(*in[0]), weight_->value.data(),
                       bias_->value.data(), out->data());
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    float* dx = din[0] != nullptr ? din[0]->data() : nullptr;
    if (din[0] != nullptr) din[0]->set_layout(0);
    return op_.Backward(in[0]->data(), Rows(*in[0]), weight_->value.data(),
                        dout.data(), dx, weight_->grad.data(),
                        bias_->grad.data());
  }

 private:
  // Samples, or tokens for a per-token [N, S, I] input.
  int64_t Rows(const DeviceTensor& x) const {
    return x.size() / spec_.in_channels;
  }

  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  InnerProductOp op_;
};

// BatchNorm2d on oneDNN's batch_normalization with separate scale and shift.
// oneDNN returns the batch mean and biased variance; the running statistics
// are updated here as PyTorch does (unbiased variance, momentum).
class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(const LayerSpec& spec, std::vector<Param*> params,
              std::vector<Buffer*> buffers)
      : spec_(spec),
        weight_(params[0]),
        bias_(params[1]),
        running_mean_(buffers[0]),
        running_var_(buffers[1]),
        mean_(spec.in_channels),
        var_(spec.in_channels) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    const Shape& shape = in[0]->shape();
    out->set_layout(in[0]->layout());
    absl::Status status = Run(spec_, [&] {
      Prepare(shape, in[0]->layout(), training);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, Wrap(data_md_, in[0]->data())},
          {DNNL_ARG_DST, Wrap(data_md_, out->data())},
          {DNNL_ARG_SCALE, Wrap(c_md_, weight_->value.data())},
          {DNNL_ARG_SHIFT, Wrap(c_md_, bias_->value.data())}};
      if (training) {
        args[DNNL_ARG_MEAN] = Wrap(c_md_, mean_.data());
        args[DNNL_ARG_VARIANCE] = Wrap(c_md_, var_.data());
      } else {
        args[DNNL_ARG_MEAN] = Wrap(c_md_, running_mean_->value.data());
        args[DNNL_ARG_VARIANCE] = Wrap(c_md_, running_var_->value.data());
      }
      fwd_.execute(CpuStream(), args);
    });
    if (!status.ok() || !training) return status;
    const int64_t count = shape[0] * shape[2] * shape[3];
    const float unbias =
        count > 1 ? static_cast<float>(count) / static_cast<float>(count - 1)
                  : 1.0f;
    const float m = spec_.momentum;
    float* rm = running_mean_->value.data();
    float* rv = running_var_->value.data();
    for (int64_t c = 0; c < spec_.in_channels; ++c) {
      rm[c] = (1 - m) * rm[c] + m * mean_[c];
      rv[c] = (1 - m) * rv[c] + m * var_[c] * unbias;
    }
    return absl::OkStatus();
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    // oneDNN's backward always writes diff_src; use a scratch tensor when
    // the caller needs none.
    std::vector<float> scratch;
    float* diff_src = nullptr;
    if (din[0] != nullptr) {
      diff_src = din[0]->data();
    } else {
      scratch.resize(in[0]->size());
      diff_src = scratch.data();
    }
    if (din[0] != nullptr) din[0]->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Prepare(in[0]->shape(), in[0]->layout(), true);
      bwd_.execute(CpuStream(),
                   {{DNNL_ARG_SRC, Wrap(data_md_, in[0]->data())},
                    {DNNL_ARG_MEAN, Wrap(c_md_, mean_.data())},
                    {DNNL_ARG_VARIANCE, Wrap(c_md_, var_.data())},
                    {DNNL_ARG_DIFF_DST, Wrap(data_md_, dout.data())},
                    {DNNL_ARG_SCALE, Wrap(c_md_, weight_->value.data())},
                    {DNNL_ARG_SHIFT, Wrap(c_md_, bias_->value.data())},
                    {DNNL_ARG_DIFF_SRC, Wrap(data_md_, diff_src)},
                    {DNNL_ARG_DIFF_SCALE, Wrap(c_md_, weight_->grad.data())},
                    {DNNL_ARG_DIFF_SHIFT, Wrap(c_md_, bias_->grad.data())}});
    });
  }

 private:
  void Prepare(const Shape& shape, int layout, bool training) {
    if (shape == shape_ && layout == layout_ && training == training_) return;
    absl::MutexLock lock(&CreationMutex());
    shape_ = shape;
    layout_ = layout;
    training_ = training;
    data_md_ = Md(shape, layout);
    c_md_ = Flat(spec_.in_channels);
    auto flags = dnnl::normalization_flags::use_scale |
                 dnnl::normalization_flags::use_shift;
    if (!training) flags |= dnnl::normalization_flags::use_global_stats;
    dnnl::batch_normalization_forward::primitive_desc fwd_pd(
        dnnl::batch_normalization_forward::desc(
            training ? prop_kind::forward_training
                     : prop_kind::forward_inference,
            data_md_, spec_.epsilon, flags),
        CpuEngine());
    fwd_ = dnnl::batch_normalization_forward(fwd_pd);
    if (training) {
      bwd_ = dnnl::batch_normalization_backward(
          dnnl::batch_normalization_backward::primitive_desc(
              dnnl::batch_normalization_backward::desc(prop_kind::backward,
                                                       data_md_, data_md_,
                                                       spec_.epsilon, flags),
              CpuEngine(), fwd_pd));
    }
  }

  const LayerSpec spec_;
  Param* weight_;
  Param* bias_;
  Buffer* running_mean_;
  Buffer* running_var_;
  // Batch statistics of the last training forward.
  std::vector<float> mean_, var_;
  Shape shape_;
  int layout_ = -1;
  bool training_ = false;
  memory::desc data_md_, c_md_;
  dnnl::batch_normalization_forward fwd_;
  dnnl::batch_normalization_backward bwd_;
};

// Elementwise ReLU over the tensor as one flat vector. The backward reads
// the output (dx = dy where y > 0, eltwise_relu_use_dst_for_bwd; the same
// values as from x, since y > 0 exactly where x > 0), so the forward may run
// in place and the backward with dx over dy (oneDNN's eltwise allows both).
class Relu final : public Layer {
 public:
  explicit Relu(const LayerSpec& spec) : spec_(spec) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Prepare(in[0]->size());
      fwd_.execute(CpuStream(), {{DNNL_ARG_SRC, Wrap(md_, in[0]->data())},
                                 {DNNL_ARG_DST, Wrap(md_, out->data())}});
    });
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Prepare(in[0]->size());
      bwd_.execute(CpuStream(),
                   {{DNNL_ARG_DST, Wrap(md_, out.data())},
                    {DNNL_ARG_DIFF_DST, Wrap(md_, dout.data())},
                    {DNNL_ARG_DIFF_SRC, Wrap(md_, din[0]->data())}});
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
                                    algorithm::eltwise_relu_use_dst_for_bwd,
                                    md_, 0.0f),
        CpuEngine());
    fwd_ = dnnl::eltwise_forward(fwd_pd);
    bwd_ = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd,
                                     md_, md_, 0.0f),
        CpuEngine(), fwd_pd));
  }

  const LayerSpec spec_;
  int64_t n_ = -1;
  memory::desc md_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

// Max, average and global average pooling. Max pooling keeps the workspace
// of the last training forward for its backward.
class Pool2d final : public Layer {
 public:
  explicit Pool2d(const LayerSpec& spec) : spec_(spec) {}

  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Prepare(in[0]->shape(), in[0]->layout(), training);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, Wrap(src_md_, in[0]->data())},
          {DNNL_ARG_DST, Wrap(dst_md_, out->data())}};
      if (training && max()) args[DNNL_ARG_WORKSPACE] = workspace_;
      fwd_.execute(CpuStream(), args);
    });
  }

  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Prepare(in[0]->shape(), in[0]->layout(), true);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data())},
          {DNNL_ARG_DIFF_SRC, Wrap(src_md_, din[0]->data())}};
      if (max()) args[DNNL_ARG_WORKSPACE] = workspace_;
      bwd_.execute(CpuStream(), args);
    });
  }

 private:
  bool max() const { return spec_.type == LayerType::kMaxPool2d; }

  void Prepare(const Shape& in, int layout, bool training) {
    if (in == in_shape_ && layout == layout_ && training == training_) return;
    absl::MutexLock lock(&CreationMutex());
    in_shape_ = in;
    layout_ = layout;
    training_ = training;
    const Shape out = *OutputShape(spec_, {in});
    src_md_ = Md(in, layout);
    dst_md_ = Md(out, layout);
    memory::dims kernel = {spec_.kernel, spec_.kernel};
    memory::dims strides = {spec_.stride, spec_.stride};
    memory::dims padding = {spec_.padding, spec_.padding};
    if (spec_.type == LayerType::kGlobalAvgPool) {
      kernel = {in[2], in[3]};
      strides = {1, 1};
      padding = {0, 0};
    }
    const algorithm alg =
        max() ? algorithm::pooling_max : algorithm::pooling_avg_include_padding;
    dnnl::pooling_forward::primitive_desc fwd_pd(
        dnnl::pooling_forward::desc(training ? prop_kind::forward_training
                                             : prop_kind::forward_inference,
                                    alg, src_md_, dst_md_, strides, kernel,
                                    padding, padding),
        CpuEngine());
    fwd_ = dnnl::pooling_forward(fwd_pd);
    if (training) {
      if (max()) workspace_ = memory(fwd_pd.workspace_desc(), CpuEngine());
      bwd_ = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(alg, src_md_, dst_md_, strides, kernel,
                                       padding, padding),
          CpuEngine(), fwd_pd));
    }
  }

  const LayerSpec spec_;
  Shape in_shape_;
  int layout_ = -1;
  bool training_ = false;
  memory::desc src_md_, dst_md_;
  memory workspace_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
};

// Residual add on oneDNN's binary primitive; its gradient goes unchanged to
// both inputs. With spec.relu, an eltwise ReLU post-op on the sum (the
// same rounding as a separate ReLU: max of the rounded sum and 0) and the
// gradient dY where Y > 0 (as the ReLU's, dY * 0 elsewhere).
class Add final : public Layer {
 public:
  explicit Add(const LayerSpec& spec) : spec_(spec) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      const int64_t n = in[0]->size();
      // Both operands in the first one's layout.
      const float* b = in[1]->data();
      if (in[1]->layout() != in[0]->layout()) {
        converted_.resize(n);
        Reorder(in[1]->shape(), in[1]->layout(), b, in[0]->layout(),
                converted_.data());
        b = converted_.data();
      }
      if (n != n_) {
        n_ = n;
        md_ = Flat(n);
        absl::MutexLock lock(&CreationMutex());
        dnnl::post_ops ops;
        if (spec_.relu) {
          ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
        }
        dnnl::primitive_attr attr;
        attr.set_post_ops(ops);
        fwd_ = dnnl::binary(dnnl::binary::primitive_desc(
            dnnl::binary::desc(algorithm::binary_add, md_, md_, md_), attr,
            CpuEngine()));
      }
      fwd_.execute(CpuStream(), {{DNNL_ARG_SRC_0, Wrap(md_, in[0]->data())},
                                 {DNNL_ARG_SRC_1, Wrap(md_, b)},
                                 {DNNL_ARG_DST, Wrap(md_, out->data())}});
    });
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    const float* dy = dout.data();
    // With the ReLU: dY where Y > 0, written into the first input gradient
    // in dY's layout (else a temporary), then copied to the others.
    std::vector<float> masked;
    if (spec_.relu) {
      float* m = nullptr;
      for (size_t i = 0; i < din.size() && m == nullptr; ++i) {
        if (din[i] != nullptr && in[i]->layout() == dout.layout()) {
          m = din[i]->data();
        }
      }
      if (m == nullptr) {
        masked.resize(dout.size());
        m = masked.data();
      }
      const float* y = out.data();
      for (int64_t j = 0; j < dout.size(); ++j) {
        m[j] = y[j] > 0.0f ? dy[j] : dy[j] * 0.0f;
      }
      dy = m;
    }
    return Run(spec_, [&] {
      for (size_t i = 0; i < din.size(); ++i) {
        if (din[i] == nullptr) continue;
        Reorder(dout.shape(), dout.layout(), dy, in[i]->layout(),
                din[i]->data());
        din[i]->set_layout(in[i]->layout());
      }
    });
  }

 private:
  const LayerSpec spec_;
  std::vector<float> converted_;
  int64_t n_ = -1;
  memory::desc md_;
  dnnl::binary fwd_;
};

// Flatten: a dense [N, C*H*W] copy of the input, reordered out of the
// blocked layout when the input has one.
class Flatten final : public Layer {
 public:
  explicit Flatten(const LayerSpec& spec) : spec_(spec) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    out->set_layout(0);
    return Run(spec_, [&] {
      Reorder(in[0]->shape(), in[0]->layout(), in[0]->data(), 0, out->data());
    });
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    din[0]->set_layout(in[0]->layout());
    return Run(spec_, [&] {
      Reorder(in[0]->shape(), 0, dout.data(), in[0]->layout(), din[0]->data());
    });
  }

 private:
  const LayerSpec spec_;
};

// Inverted dropout (as nn.Dropout): in training each element is zeroed with
// probability p and the rest scaled by 1 / (1 - p); identity in eval.
class Dropout final : public Layer {
 public:
  Dropout(const LayerSpec& spec, uint64_t seed)
      : spec_(spec), dropout_(spec.dropout, seed) {}
  absl::Status Forward(absl::Span<const DeviceTensor* const> in,
                       DeviceTensor* out, bool training) override {
    const int64_t n = in[0]->size();
    const float* x = in[0]->data();
    float* y = out->data();
    out->set_layout(in[0]->layout());
    if (!training) {
      std::memcpy(y, x, sizeof(float) * n);
      return absl::OkStatus();
    }
    dropout_.Forward(x, n, y);
    return absl::OkStatus();
  }
  absl::Status Backward(absl::Span<const DeviceTensor* const> in,
                        const DeviceTensor& out, const DeviceTensor& dout,
                        absl::Span<DeviceTensor* const> din) override {
    if (din[0] == nullptr) return absl::OkStatus();
    const int64_t n = dout.size();
    if (dropout_.mask_size() != n) {
      return absl::FailedPreconditionError(
          "dropout: backward without a training forward of this shape");
    }
    dropout_.Backward(dout.data(), n, din[0]->data());
    din[0]->set_layout(in[0]->layout());
    return absl::OkStatus();
  }

 private:
  const LayerSpec spec_;
  CpuDropout dropout_;
};

// CpuBf16Available's probe: oneDNN 2.6 runs bf16 convolutions on AVX-512
// (avx512_core: emulated with fp32 FMAs; avx512_core_bf16 and AMX:
// native); elsewhere it creates no bf16 primitive, not even a reference
// one. Tries a small convolution and inner product.
}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> NewCpuCnnLayer(
    const LayerSpec& spec, std::vector<Param*> params,
    std::vector<Buffer*> buffers, uint64_t seed, bool bf16) {
  switch (spec.type) {
    case LayerType::kConv2d:
      return std::unique_ptr<Layer>(new Conv2d(spec, std::move(params), bf16));
    case LayerType::kLinear:
      return std::unique_ptr<Layer>(new Linear(spec, std::move(params), bf16));
    case LayerType::kBatchNorm2d:
      return std::unique_ptr<Layer>(
          new BatchNorm2d(spec, std::move(params), std::move(buffers)));
    case LayerType::kRelu:
      return std::unique_ptr<Layer>(new Relu(spec));
    case LayerType::kMaxPool2d:
    case LayerType::kAvgPool2d:
    case LayerType::kGlobalAvgPool:
      return std::unique_ptr<Layer>(new Pool2d(spec));
    case LayerType::kAdd:
      return std::unique_ptr<Layer>(new Add(spec));
    case LayerType::kFlatten:
      return std::unique_ptr<Layer>(new Flatten(spec));
    case LayerType::kDropout:
      return std::unique_ptr<Layer>(new Dropout(spec, seed));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layer type ", static_cast<int>(spec.type),
                       " is not a CNN layer of the cpu backend"));
  }
}

}  // namespace pstrain
