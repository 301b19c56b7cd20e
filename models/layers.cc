#include "models/layers.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

dnnl::engine& CpuEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& CpuStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

// A memory object over caller-owned fp32 data (oneDNN does not copy).
memory Wrap(const memory::desc& md, const float* data) {
  return memory(md, CpuEngine(), const_cast<float*>(data));
}

memory::dims Dims(const Shape& s) { return memory::dims(s.begin(), s.end()); }

void FillUniform(Tensor* t, float bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  for (float& x : t->data) x = dist(rng);
}

class Conv2d final : public Layer {
 public:
  Conv2d(int64_t in_c, int64_t out_c, int64_t k, int64_t stride,
         int64_t padding, std::mt19937_64& rng)
      : in_c_(in_c), out_c_(out_c), k_(k), stride_(stride), pad_(padding) {
    weight_.name = "weight";
    weight_.value = Tensor({out_c, in_c, k, k});
    weight_.grad = Tensor(weight_.value.shape);
    bias_.name = "bias";
    bias_.value = Tensor({out_c});
    bias_.grad = Tensor({out_c});
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_c * k * k));
    FillUniform(&weight_.value, bound, rng);
    FillUniform(&bias_.value, bound, rng);
  }

  std::string name() const override {
    return absl::StrCat("conv", k_, "x", k_, "-", out_c_);
  }

  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    if (in.size() != 4 || in[1] != in_c_) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": input ", ShapeToString(in), "; expected [N, ",
                       in_c_, ", H, W]"));
    }
    const int64_t oh = (in[2] + 2 * pad_ - k_) / stride_ + 1;
    const int64_t ow = (in[3] + 2 * pad_ - k_) / stride_ + 1;
    if (oh <= 0 || ow <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": input ", ShapeToString(in),
                       " is smaller than the kernel"));
    }
    return Shape{in[0], out_c_, oh, ow};
  }

  void Forward(const Tensor& in, Tensor* out) override {
    Prepare(in.shape);
    out->Resize(out_shape_);
    fwd_.execute(CpuStream(),
                 {{DNNL_ARG_SRC, Wrap(src_md_, in.data.data())},
                  {DNNL_ARG_WEIGHTS, Wrap(wei_md_, weight_.value.data.data())},
                  {DNNL_ARG_BIAS, Wrap(bias_md_, bias_.value.data.data())},
                  {DNNL_ARG_DST, Wrap(dst_md_, out->data.data())}});
    CpuStream().wait();
  }

  void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                Tensor* din) override {
    Prepare(in.shape);
    bwd_weights_.execute(
        CpuStream(),
        {{DNNL_ARG_SRC, Wrap(src_md_, in.data.data())},
         {DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data.data())},
         {DNNL_ARG_DIFF_WEIGHTS, Wrap(wei_md_, weight_.grad.data.data())},
         {DNNL_ARG_DIFF_BIAS, Wrap(bias_md_, bias_.grad.data.data())}});
    if (din != nullptr) {
      din->Resize(in.shape);
      bwd_data_.execute(
          CpuStream(),
          {{DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data.data())},
           {DNNL_ARG_WEIGHTS, Wrap(wei_md_, weight_.value.data.data())},
           {DNNL_ARG_DIFF_SRC, Wrap(src_md_, din->data.data())}});
    }
    CpuStream().wait();
  }

  std::vector<Param*> params() override { return {&weight_, &bias_}; }

  int64_t ForwardMacsPerSample(const Shape& in) const override {
    auto out = OutputShape(in);
    if (!out.ok()) return 0;
    return (*out)[1] * (*out)[2] * (*out)[3] * in_c_ * k_ * k_;
  }

 private:
  void Prepare(const Shape& in) {
    if (in == in_shape_) return;
    in_shape_ = in;
    out_shape_ = *OutputShape(in);
    src_md_ = memory::desc(Dims(in), dt::f32, tag::nchw);
    wei_md_ = memory::desc(Dims(weight_.value.shape), dt::f32, tag::oihw);
    bias_md_ = memory::desc({out_c_}, dt::f32, tag::x);
    dst_md_ = memory::desc(Dims(out_shape_), dt::f32, tag::nchw);
    const memory::dims strides = {stride_, stride_};
    const memory::dims padding = {pad_, pad_};
    dnnl::convolution_forward::primitive_desc fwd_pd(
        dnnl::convolution_forward::desc(
            prop_kind::forward_training, algorithm::convolution_direct, src_md_,
            wei_md_, bias_md_, dst_md_, strides, padding, padding),
        CpuEngine());
    fwd_ = dnnl::convolution_forward(fwd_pd);
    bwd_data_ = dnnl::convolution_backward_data(
        dnnl::convolution_backward_data::primitive_desc(
            dnnl::convolution_backward_data::desc(algorithm::convolution_direct,
                                                  src_md_, wei_md_, dst_md_,
                                                  strides, padding, padding),
            CpuEngine(), fwd_pd));
    bwd_weights_ = dnnl::convolution_backward_weights(
        dnnl::convolution_backward_weights::primitive_desc(
            dnnl::convolution_backward_weights::desc(
                algorithm::convolution_direct, src_md_, wei_md_, bias_md_,
                dst_md_, strides, padding, padding),
            CpuEngine(), fwd_pd));
  }

  const int64_t in_c_, out_c_, k_, stride_, pad_;
  Param weight_, bias_;
  Shape in_shape_, out_shape_;
  memory::desc src_md_, wei_md_, bias_md_, dst_md_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_weights_;
};

class Linear final : public Layer {
 public:
  Linear(int64_t in_f, int64_t out_f, std::mt19937_64& rng)
      : in_f_(in_f), out_f_(out_f) {
    weight_.name = "weight";
    weight_.value = Tensor({out_f, in_f});
    weight_.grad = Tensor({out_f, in_f});
    bias_.name = "bias";
    bias_.value = Tensor({out_f});
    bias_.grad = Tensor({out_f});
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_f));
    FillUniform(&weight_.value, bound, rng);
    FillUniform(&bias_.value, bound, rng);
  }

  std::string name() const override {
    return absl::StrCat("fc", in_f_, "-", out_f_);
  }

  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    if (in.empty() || NumElements(in) != in[0] * in_f_) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": input ", ShapeToString(in), "; expected [N, ",
                       in_f_, "] (", in_f_, " features per sample)"));
    }
    return Shape{in[0], out_f_};
  }

  void Forward(const Tensor& in, Tensor* out) override {
    Prepare(in.shape);
    out->Resize({in.shape[0], out_f_});
    fwd_.execute(CpuStream(),
                 {{DNNL_ARG_SRC, Wrap(src_md_, in.data.data())},
                  {DNNL_ARG_WEIGHTS, Wrap(wei_md_, weight_.value.data.data())},
                  {DNNL_ARG_BIAS, Wrap(bias_md_, bias_.value.data.data())},
                  {DNNL_ARG_DST, Wrap(dst_md_, out->data.data())}});
    CpuStream().wait();
  }

  void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                Tensor* din) override {
    Prepare(in.shape);
    bwd_weights_.execute(
        CpuStream(),
        {{DNNL_ARG_SRC, Wrap(src_md_, in.data.data())},
         {DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data.data())},
         {DNNL_ARG_DIFF_WEIGHTS, Wrap(wei_md_, weight_.grad.data.data())},
         {DNNL_ARG_DIFF_BIAS, Wrap(bias_md_, bias_.grad.data.data())}});
    if (din != nullptr) {
      din->Resize(in.shape);
      bwd_data_.execute(
          CpuStream(),
          {{DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data.data())},
           {DNNL_ARG_WEIGHTS, Wrap(wei_md_, weight_.value.data.data())},
           {DNNL_ARG_DIFF_SRC, Wrap(src_md_, din->data.data())}});
    }
    CpuStream().wait();
  }

  std::vector<Param*> params() override { return {&weight_, &bias_}; }

  int64_t ForwardMacsPerSample(const Shape& in) const override {
    return in_f_ * out_f_;
  }

 private:
  void Prepare(const Shape& in) {
    if (!in.empty() && !in_shape_.empty() && in[0] == in_shape_[0]) return;
    in_shape_ = in;
    const int64_t n = in[0];
    src_md_ = memory::desc({n, in_f_}, dt::f32, tag::nc);
    wei_md_ = memory::desc({out_f_, in_f_}, dt::f32, tag::oi);
    bias_md_ = memory::desc({out_f_}, dt::f32, tag::x);
    dst_md_ = memory::desc({n, out_f_}, dt::f32, tag::nc);
    dnnl::inner_product_forward::primitive_desc fwd_pd(
        dnnl::inner_product_forward::desc(prop_kind::forward_training, src_md_,
                                          wei_md_, bias_md_, dst_md_),
        CpuEngine());
    fwd_ = dnnl::inner_product_forward(fwd_pd);
    bwd_data_ = dnnl::inner_product_backward_data(
        dnnl::inner_product_backward_data::primitive_desc(
            dnnl::inner_product_backward_data::desc(src_md_, wei_md_, dst_md_),
            CpuEngine(), fwd_pd));
    bwd_weights_ = dnnl::inner_product_backward_weights(
        dnnl::inner_product_backward_weights::primitive_desc(
            dnnl::inner_product_backward_weights::desc(src_md_, wei_md_,
                                                       bias_md_, dst_md_),
            CpuEngine(), fwd_pd));
  }

  const int64_t in_f_, out_f_;
  Param weight_, bias_;
  Shape in_shape_;
  memory::desc src_md_, wei_md_, bias_md_, dst_md_;
  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_data bwd_data_;
  dnnl::inner_product_backward_weights bwd_weights_;
};

// Elementwise layers see their tensor as one flat vector.
class Relu final : public Layer {
 public:
  std::string name() const override { return "relu"; }
  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    return in;
  }
  void Forward(const Tensor& in, Tensor* out) override {
    Prepare(in.size());
    out->Resize(in.shape);
    fwd_.execute(CpuStream(), {{DNNL_ARG_SRC, Wrap(md_, in.data.data())},
                               {DNNL_ARG_DST, Wrap(md_, out->data.data())}});
    CpuStream().wait();
  }
  void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                Tensor* din) override {
    if (din == nullptr) return;
    Prepare(in.size());
    din->Resize(in.shape);
    bwd_.execute(CpuStream(),
                 {{DNNL_ARG_SRC, Wrap(md_, in.data.data())},
                  {DNNL_ARG_DIFF_DST, Wrap(md_, dout.data.data())},
                  {DNNL_ARG_DIFF_SRC, Wrap(md_, din->data.data())}});
    CpuStream().wait();
  }

 private:
  void Prepare(int64_t n) {
    if (n == n_) return;
    n_ = n;
    md_ = memory::desc({n}, dt::f32, tag::x);
    dnnl::eltwise_forward::primitive_desc fwd_pd(
        dnnl::eltwise_forward::desc(prop_kind::forward_training,
                                    algorithm::eltwise_relu, md_, 0.0f),
        CpuEngine());
    fwd_ = dnnl::eltwise_forward(fwd_pd);
    bwd_ = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(algorithm::eltwise_relu, md_, md_, 0.0f),
        CpuEngine(), fwd_pd));
  }

  int64_t n_ = -1;
  memory::desc md_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(int64_t kernel, int64_t stride) : k_(kernel), stride_(stride) {}
  std::string name() const override { return absl::StrCat("maxpool", k_); }
  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    if (in.size() != 4 || in[2] < k_ || in[3] < k_) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": input ", ShapeToString(in),
                       "; expected [N, C, H, W] with H, W >= ", k_));
    }
    return Shape{in[0], in[1], (in[2] - k_) / stride_ + 1,
                 (in[3] - k_) / stride_ + 1};
  }
  void Forward(const Tensor& in, Tensor* out) override {
    Prepare(in.shape);
    out->Resize(out_shape_);
    fwd_.execute(CpuStream(), {{DNNL_ARG_SRC, Wrap(src_md_, in.data.data())},
                               {DNNL_ARG_DST, Wrap(dst_md_, out->data.data())},
                               {DNNL_ARG_WORKSPACE, workspace_}});
    CpuStream().wait();
  }
  // Uses the workspace of the last Forward(), which must have been on `in`.
  void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                Tensor* din) override {
    if (din == nullptr) return;
    Prepare(in.shape);
    din->Resize(in.shape);
    bwd_.execute(CpuStream(),
                 {{DNNL_ARG_DIFF_DST, Wrap(dst_md_, dout.data.data())},
                  {DNNL_ARG_DIFF_SRC, Wrap(src_md_, din->data.data())},
                  {DNNL_ARG_WORKSPACE, workspace_}});
    CpuStream().wait();
  }

 private:
  void Prepare(const Shape& in) {
    if (in == in_shape_) return;
    in_shape_ = in;
    out_shape_ = *OutputShape(in);
    src_md_ = memory::desc(Dims(in), dt::f32, tag::nchw);
    dst_md_ = memory::desc(Dims(out_shape_), dt::f32, tag::nchw);
    const memory::dims kernel = {k_, k_};
    const memory::dims strides = {stride_, stride_};
    const memory::dims padding = {0, 0};
    dnnl::pooling_forward::primitive_desc fwd_pd(
        dnnl::pooling_forward::desc(prop_kind::forward_training,
                                    algorithm::pooling_max, src_md_, dst_md_,
                                    strides, kernel, padding, padding),
        CpuEngine());
    fwd_ = dnnl::pooling_forward(fwd_pd);
    workspace_ = memory(fwd_pd.workspace_desc(), CpuEngine());
    bwd_ = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(
        dnnl::pooling_backward::desc(algorithm::pooling_max, src_md_, dst_md_,
                                     strides, kernel, padding, padding),
        CpuEngine(), fwd_pd));
  }

  const int64_t k_, stride_;
  Shape in_shape_, out_shape_;
  memory::desc src_md_, dst_md_;
  memory workspace_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
};

class Flatten final : public Layer {
 public:
  std::string name() const override { return "flatten"; }
  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    if (in.empty()) {
      return absl::InvalidArgumentError("flatten: input has no batch axis");
    }
    return Shape{in[0], NumElements(in) / std::max<int64_t>(in[0], 1)};
  }
  void Forward(const Tensor& in, Tensor* out) override {
    out->shape = *OutputShape(in.shape);
    out->data = in.data;
  }
  void Backward(const Tensor& in, const Tensor& out, const Tensor& dout,
                Tensor* din) override {
    if (din == nullptr) return;
    din->shape = in.shape;
    din->data = dout.data;
  }
};

}  // namespace

std::unique_ptr<Layer> MakeConv2d(int64_t in_channels, int64_t out_channels,
                                  int64_t kernel, int64_t stride,
                                  int64_t padding, std::mt19937_64& rng) {
  return std::make_unique<Conv2d>(in_channels, out_channels, kernel, stride,
                                  padding, rng);
}

std::unique_ptr<Layer> MakeLinear(int64_t in_features, int64_t out_features,
                                  std::mt19937_64& rng) {
  return std::make_unique<Linear>(in_features, out_features, rng);
}

std::unique_ptr<Layer> MakeRelu() { return std::make_unique<Relu>(); }

std::unique_ptr<Layer> MakeMaxPool2d(int64_t kernel, int64_t stride) {
  return std::make_unique<MaxPool2d>(kernel, stride);
}

std::unique_ptr<Layer> MakeFlatten() { return std::make_unique<Flatten>(); }

absl::StatusOr<float> SoftmaxCrossEntropy(const Tensor& logits,
                                          const std::vector<int32_t>& labels,
                                          Tensor* dlogits) {
  if (logits.shape.size() != 2 ||
      logits.shape[0] != static_cast<int64_t>(labels.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "softmax cross-entropy: logits ", ShapeToString(logits.shape),
        "; expected [", labels.size(), ", K]"));
  }
  const int64_t n = logits.shape[0];
  const int64_t k = logits.shape[1];
  if (dlogits != nullptr) dlogits->Resize(logits.shape);
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = labels[i];
    if (label < 0 || label >= k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", label, " of sample ", i, " is outside [0, ", k, ")"));
    }
    const float* row = &logits.data[i * k];
    const float max = *std::max_element(row, row + k);
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(row[j] - max);
    const double log_sum = std::log(sum);
    loss += log_sum - (row[label] - max);
    if (dlogits != nullptr) {
      float* d = &dlogits->data[i * k];
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(row[j] - max - log_sum);
        d[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / n);
      }
    }
  }
  return static_cast<float>(loss / n);
}

}  // namespace pstrain
