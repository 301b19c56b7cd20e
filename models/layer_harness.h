// Test helper: one layer on a backend with its own parameters and buffers,
// driven by host vectors (copied to and from the backend's memory).
#ifndef PSTRAIN_MODELS_LAYER_HARNESS_H_
#define PSTRAIN_MODELS_LAYER_HARNESS_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_spec.h"

namespace pstrain {

// The values of `t` in memory order, copied to the host.
inline std::vector<float> Values(const DeviceTensor& t) {
  std::vector<float> v(t.size());
  Backend* b = t.backend();
  EXPECT_TRUE(b->CopyToHost(t.data(), t.size(), v.data()).ok());
  EXPECT_TRUE(b->Synchronize().ok());
  return v;
}

// `n` test inputs sin(a i + b), the same on every backend.
inline std::vector<float> Formula(int64_t n, double a, double b) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(std::sin(a * i + b));
  }
  return v;
}

// One layer on the CPU backend with its own parameters and buffers.
class Harness {
 public:
  // Parameters are drawn from U(-1, 1) with `seed` (the same values on
  // every backend).
  Harness(Backend* backend, const LayerSpec& spec, uint64_t seed = 1)
      : backend_(backend), spec_(spec) {
    const auto param_specs = ParamSpecs(spec);
    const auto buffer_specs = BufferSpecs(spec);
    params_.resize(param_specs.size());
    buffers_.resize(buffer_specs.size());
    std::vector<Param*> params;
    std::vector<Buffer*> buffers;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (size_t i = 0; i < param_specs.size(); ++i) {
      params_[i].name = param_specs[i].name;
      params_[i].value = DeviceTensor(backend_);
      params_[i].grad = DeviceTensor(backend_);
      EXPECT_TRUE(params_[i].value.Resize(param_specs[i].shape).ok());
      EXPECT_TRUE(params_[i].grad.Resize(param_specs[i].shape).ok());
      std::vector<float> host(params_[i].value.size());
      for (float& x : host) x = dist(rng);
      SetValues(&params_[i].value, host);
      params.push_back(&params_[i]);
    }
    for (size_t i = 0; i < buffer_specs.size(); ++i) {
      buffers_[i].value = DeviceTensor(backend_);
      EXPECT_TRUE(buffers_[i].value.Resize(buffer_specs[i].shape).ok());
      SetValues(&buffers_[i].value,
                std::vector<float>(
                    buffers_[i].value.size(),
                    buffer_specs[i].name == "running_var" ? 1.0f : 0.0f));
      buffers.push_back(&buffers_[i]);
    }
    layer_ = *backend_->CreateLayer(spec, params, buffers, seed);
  }

  void SetValues(DeviceTensor* t, const std::vector<float>& values) {
    EXPECT_EQ(static_cast<int64_t>(values.size()), t->size());
    EXPECT_TRUE(
        backend_->CopyToDevice(values.data(), t->size(), t->data()).ok());
    EXPECT_TRUE(backend_->Synchronize().ok());
  }

  DeviceTensor Make(const Shape& shape, const std::vector<float>& values) {
    DeviceTensor t(backend_);
    EXPECT_TRUE(t.Resize(shape).ok());
    EXPECT_EQ(static_cast<int64_t>(values.size()), t.size());
    EXPECT_TRUE(backend_->CopyToDevice(values.data(), t.size(), t.data()).ok());
    EXPECT_TRUE(backend_->Synchronize().ok());
    return t;
  }

  // Forward of `inputs`; returns the output values.
  std::vector<float> Forward(const std::vector<DeviceTensor*>& inputs,
                             bool training = true) {
    std::vector<const DeviceTensor*> in(inputs.begin(), inputs.end());
    std::vector<Shape> shapes;
    for (const DeviceTensor* t : in) shapes.push_back(t->shape());
    out_ = DeviceTensor(backend_);
    EXPECT_TRUE(out_.Resize(*OutputShape(spec_, shapes)).ok());
    absl::Status s = layer_->Forward(in, &out_, training);
    EXPECT_TRUE(s.ok()) << s;
    return Values(out_);
  }

  // Backward of the last Forward with dLoss/dOut = `dout`; returns the
  // input gradients.
  std::vector<std::vector<float>> Backward(
      const std::vector<DeviceTensor*>& inputs,
      const std::vector<float>& dout) {
    std::vector<const DeviceTensor*> in(inputs.begin(), inputs.end());
    DeviceTensor d = Make(out_.shape(), dout);
    d.set_layout(out_.layout());
    std::vector<DeviceTensor> din_store;
    for (const DeviceTensor* t : in) {
      din_store.emplace_back(backend_);
      EXPECT_TRUE(din_store.back().Resize(t->shape()).ok());
    }
    std::vector<DeviceTensor*> din;
    for (DeviceTensor& t : din_store) din.push_back(&t);
    absl::Status s = layer_->Backward(in, out_, d, din);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<std::vector<float>> result;
    for (DeviceTensor& t : din_store) result.push_back(Values(t));
    return result;
  }

  std::vector<Param>& params() { return params_; }
  std::vector<Buffer>& buffers() { return buffers_; }
  const Shape& out_shape() const { return out_.shape(); }
  // The last Forward's output, for tests that overwrite it.
  DeviceTensor* mutable_out() { return &out_; }

  // Overwrites every element of `t` with NaN (its layout kept).
  void Poison(DeviceTensor* t) {
    const int layout = t->layout();
    SetValues(t, std::vector<float>(t->size(), std::nanf("")));
    t->set_layout(layout);
  }

 private:
  Backend* backend_;
  LayerSpec spec_;
  std::vector<Param> params_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<Layer> layer_;
  DeviceTensor out_;
};

// Checks inverted dropout with p = 0.3 on `h` (a Dropout(0.3) harness): in
// training, about 30% of 4000 ones are zeroed and the rest scaled by 1/0.7
// (5 standard deviations either side), and the backward multiplies the
// gradient by the same mask.
inline void ExpectInvertedDropout(Harness& h) {
  const std::vector<float> ones(4000, 1.0f);
  DeviceTensor x = h.Make({4, 1000}, ones);
  const std::vector<float> out = h.Forward({&x});
  int zeros = 0;
  for (float v : out) {
    if (v == 0.0f) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
    }
  }
  // 4000 Bernoulli(0.3) draws: mean 1200, sd 29.
  EXPECT_NEAR(zeros, 1200, 145);
  const std::vector<float> din =
      h.Backward({&x}, std::vector<float>(ones.size(), 2.0f))[0];
  for (size_t i = 0; i < din.size(); ++i) {
    EXPECT_FLOAT_EQ(din[i], out[i] * 2.0f);
  }
}

// ||a - ref||_2 / ||ref||_2 (0 when both are zero; a NaN or a size
// mismatch gives infinity, so that a bound fails).
inline double RelativeL2(const std::vector<float>& a,
                         const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double{a[i]} - ref[i];
    diff += d * d;
    norm += double{ref[i]} * ref[i];
  }
  if (!(diff <= INFINITY)) return INFINITY;  // NaN
  if (diff == 0) return 0;
  return std::sqrt(diff) / std::sqrt(norm);
}

// The largest RelativeL2 of the output, input gradients and parameter
// gradients of layer `spec` on `backend` against the same layer on
// `reference`: parameters from seed 7 on both, input x of `shape` =
// Formula(0.37, 0.1), and the second input (the key padding mask) when
// `second` is not empty; one training forward and backward with dLoss/dOut =
// Formula(0.53, 0.2).
struct LayerDistance {
  double out = 0, din = 0, grads = 0;
};
inline LayerDistance CompareLayer(Backend* backend, Backend* reference,
                                  const LayerSpec& spec, const Shape& shape,
                                  const Shape& second_shape,
                                  const std::vector<float>& second) {
  Harness got(backend, spec, 7), want(reference, spec, 7);
  const std::vector<float> x = Formula(NumElements(shape), 0.37, 0.1);
  DeviceTensor gx = got.Make(shape, x), wx = want.Make(shape, x);
  std::vector<DeviceTensor*> gin = {&gx}, win = {&wx};
  DeviceTensor g2, w2;
  if (!second.empty()) {
    g2 = got.Make(second_shape, second);
    w2 = want.Make(second_shape, second);
    gin.push_back(&g2);
    win.push_back(&w2);
  }
  LayerDistance d;
  const std::vector<float> want_out = want.Forward(win);
  d.out = RelativeL2(got.Forward(gin), want_out);
  const std::vector<float> dout = Formula(want_out.size(), 0.53, 0.2);
  const auto gdin = got.Backward(gin, dout);
  const auto wdin = want.Backward(win, dout);
  d.din = RelativeL2(gdin[0], wdin[0]);
  for (size_t p = 0; p < want.params().size(); ++p) {
    d.grads = std::max(d.grads, RelativeL2(Values(got.params()[p].grad),
                                           Values(want.params()[p].grad)));
  }
  return d;
}

// Test batches of a masked-language model: [n, s] token ids and key padding
// masks, the same on every backend.
// Key padding masks [n, s]: sample b has its last min(2 b, s - 1) keys
// padded (one key always attended).
inline std::vector<float> PaddingMask(int64_t n, int64_t s) {
  std::vector<float> mask(n * s, 0.0f);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t t = std::max<int64_t>(s - 2 * b, 1); t < s; ++t) {
      mask[b * s + t] = 1.0f;
    }
  }
  return mask;
}

// `n` token ids (i * 7 + 3) mod vocab.
inline std::vector<float> TokenIds(int64_t n, int64_t vocab) {
  std::vector<float> ids(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<float>((i * 7 + 3) % vocab);
  }
  return ids;
}

inline Tensor MakeTensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t(shape);
  t.data = values;
  return t;
}

// MLM labels for [n, s] tokens: every 5th unpadded position predicts its
// token, the rest are ignored.
inline std::vector<int32_t> MlmLabels(const std::vector<float>& ids,
                                      const std::vector<float>& mask) {
  std::vector<int32_t> labels(ids.size(), kIgnoreLabel);
  for (size_t i = 0; i < ids.size(); i += 5) {
    if (mask[i] == 0.0f) labels[i] = static_cast<int32_t>(ids[i]);
  }
  return labels;
}

struct LayerCase;
inline void ExpectBackwardReadsOnlyWhatItSays(Backend* backend,
                                              const LayerCase& c,
                                              float tolerance = 0);

// The layer cases both the CPU test (against PyTorch fixtures) and the GPU
// test (against the CPU backend) run; names match
// testdata/gen_layers_fixture.py.
struct LayerCase {
  std::string name;
  LayerSpec spec;
  Shape shape;
  int num_inputs = 1;
};

inline std::vector<LayerCase> LayerCases() {
  return {
      {"conv_bias", LayerSpec::Conv2d(3, 4, 3, 1, 1, true), {2, 3, 5, 5}},
      {"conv_stride2_nobias",
       LayerSpec::Conv2d(3, 4, 3, 2, 1, false),
       {2, 3, 6, 6}},
      {"conv1x1_stride2",
       LayerSpec::Conv2d(4, 6, 1, 2, 0, false),
       {2, 4, 5, 5}},
      {"conv7x7_stride2",
       LayerSpec::Conv2d(3, 4, 7, 2, 3, false),
       {1, 3, 9, 9}},
      {"batchnorm", LayerSpec::BatchNorm2d(3), {4, 3, 3, 2}},
      {"relu", LayerSpec::Relu(), {2, 3, 4, 4}},
      {"maxpool3s2p1", LayerSpec::MaxPool2d(3, 2, 1), {2, 3, 6, 7}},
      {"maxpool2", LayerSpec::MaxPool2d(2, 2, 0), {2, 2, 6, 6}},
      {"avgpool2", LayerSpec::AvgPool2d(2, 2, 0), {2, 2, 6, 4}},
      {"avgpool3s2p1", LayerSpec::AvgPool2d(3, 2, 1), {2, 2, 5, 5}},
      {"globalavgpool", LayerSpec::GlobalAvgPool(), {2, 4, 3, 5}},
      {"linear", LayerSpec::Linear(12, 5), {3, 12}},
      {"flatten", LayerSpec::Flatten(), {2, 3, 2, 2}},
      {"add", LayerSpec::Add(), {2, 3, 2, 2}, 2},
  };
}

// Fused layers: no PyTorch fixture of their own (they compute what their
// unfused parts do; layers_test checks that bit for bit on the CPU).
// Channels 16 put the CPU backend's inputs in its blocked layout.
inline std::vector<LayerCase> FusedLayerCases() {
  return {{"add_relu", LayerSpec::AddRelu(), {2, 3, 2, 2}, 2},
          {"add_relu_c16", LayerSpec::AddRelu(), {2, 16, 3, 3}, 2}};
}

// layer_spec.h's BackwardReadsOf() for case `c` on `backend`: the backward
// gives the same input and parameter gradients, bit for bit, when the
// forward's input and output values it says it does not read are
// overwritten with NaN between the forward and the backward (as the memory
// plan reuses their memory). `tolerance` > 0: equal within that much of
// the largest magnitude instead (the CUDA backend picks each convolution's
// algorithm by timing it, so two instances of one layer may round
// differently; a NaN read still shows, as NaN or a gross difference).
inline void ExpectBackwardReadsOnlyWhatItSays(Backend* backend,
                                              const LayerCase& c,
                                              float tolerance) {
  SCOPED_TRACE(c.name);
  const BackwardReads reads = BackwardReadsOf(c.spec);
  std::vector<std::vector<std::vector<float>>> din(2);
  std::vector<std::vector<std::vector<float>>> grads(2);
  for (int poisoned = 0; poisoned < 2; ++poisoned) {
    Harness h(backend, c.spec, 11);
    const int64_t n = NumElements(c.shape);
    std::vector<DeviceTensor> in;
    for (int i = 0; i < c.num_inputs; ++i) {
      std::vector<float> x(n);
      for (int64_t j = 0; j < n; ++j) {
        x[j] = static_cast<float>(std::sin(0.41 * j + 0.3 * i) - 0.2);
      }
      in.push_back(h.Make(c.shape, x));
    }
    std::vector<DeviceTensor*> ptrs;
    for (DeviceTensor& t : in) ptrs.push_back(&t);
    const std::vector<float> out = h.Forward(ptrs);
    std::vector<float> dout(out.size());
    for (size_t j = 0; j < dout.size(); ++j) {
      dout[j] = static_cast<float>(std::cos(0.29 * j));
    }
    if (poisoned == 1) {
      if (!reads.input) {
        for (DeviceTensor* t : ptrs) h.Poison(t);
      }
      if (!reads.output) h.Poison(h.mutable_out());
    }
    din[poisoned] = h.Backward(ptrs, dout);
    for (Param& p : h.params()) grads[poisoned].push_back(Values(p.grad));
  }
  if (tolerance == 0) {
    EXPECT_EQ(din[1], din[0]) << "input gradients";
    EXPECT_EQ(grads[1], grads[0]) << "parameter gradients";
    return;
  }
  auto expect_close = [tolerance](const std::vector<std::vector<float>>& a,
                                  const std::vector<std::vector<float>>& b,
                                  const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t t = 0; t < a.size(); ++t) {
      ASSERT_EQ(a[t].size(), b[t].size()) << what;
      float scale = 1e-30f;
      for (float v : b[t]) scale = std::max(scale, std::fabs(v));
      for (size_t j = 0; j < a[t].size(); ++j) {
        // Written so that a NaN on either side fails.
        EXPECT_TRUE(std::fabs(a[t][j] - b[t][j]) <= tolerance * scale)
            << what << " " << t << "[" << j << "]: " << a[t][j] << " vs "
            << b[t][j];
      }
    }
  };
  expect_close(din[1], din[0], "input gradients");
  expect_close(grads[1], grads[0], "parameter gradients");
}

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_LAYER_HARNESS_H_
