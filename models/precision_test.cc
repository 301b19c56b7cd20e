// bf16 precision on the CPU backend (issue 38; Backend::SetPrecision):
// convolutions, linear layers and the transformer's projections on oneDNN's
// bf16 primitives.
//
// Two checks per layer, forward output, input gradient and parameter
// gradients:
//  - exactness of the arithmetic: the bf16 layer equals the fp32 layer run
//    on the bf16-rounded input, weights and output gradient (round to
//    nearest even). A product of two bf16 values (8-bit significands) is
//    exact in fp32, so the two differ only by the order of fp32
//    accumulation: within 1e-5 of the sum of the absolute terms (the
//    "mass", the fp32 layer run on absolute values);
//  - the tolerance bf16 costs against fp32 on the unrounded values: each
//    rounding is off by at most u = 2^-8 relative (the unit roundoff of an
//    8-bit significand with round to nearest), a product of two rounded
//    factors by at most 2u + u^2 = 2^-7 + 2^-16, so a sum of products by
//    at most that much of its mass.
//    The bf16 results must also differ from fp32 somewhere (the layer did
//    round).
// Skipped where oneDNN creates no bf16 primitive (a CPU without AVX-512).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"
#include "models/model.h"
#include "models/precision_checks.h"

namespace pstrain {
namespace {

// fp32 -> bf16 -> fp32, round to nearest even (finite values).
float RoundBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float y;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

std::vector<float> Rounded(std::vector<float> v) {
  for (float& x : v) x = RoundBf16(x);
  return v;
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

std::vector<float> Random(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One run of a layer: forward of `x`, backward of `dy`; the output, the
// input gradient and the parameter gradients. `transform` is applied to
// the weight (not the bias), `x` and `dy` first.
struct Results {
  std::vector<float> out, din;
  std::vector<std::vector<float>> grads;
};

template <typename F>
Results RunLayer(Backend* backend, const LayerSpec& spec, const Shape& shape,
                 const std::vector<float>& x, const std::vector<float>& dy,
                 bool abs_bias, F transform) {
  Harness h(backend, spec, /*seed=*/7);
  Param& weight = h.params()[0];
  h.SetValues(&weight.value, transform(Values(weight.value)));
  if (abs_bias && h.params().size() > 1) {
    h.SetValues(&h.params()[1].value, Abs(Values(h.params()[1].value)));
  }
  DeviceTensor in = h.Make(shape, transform(x));
  Results r;
  r.out = h.Forward({&in});
  std::vector<float> d = transform(dy);
  r.din = h.Backward({&in}, d)[0];
  for (Param& p : h.params()) r.grads.push_back(Values(p.grad));
  return r;
}

void ExpectWithin(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<float>& mass, double relative,
                  const std::string& what, int* differing = nullptr) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(got.size(), mass.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = relative * mass[i] + 1e-6;
    EXPECT_LE(std::fabs(double{got[i]} - ref[i]), bound)
        << what << "[" << i << "]: " << got[i] << " vs " << ref[i] << " (mass "
        << mass[i] << ")";
    if (differing != nullptr && got[i] != ref[i]) ++*differing;
  }
}

struct Case {
  std::string name;
  LayerSpec spec;
  Shape shape;
};

class Bf16LayerTest : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16LayerTest, IsFp32OnRoundedValuesWithinTheBf16Bound) {
  if (absl::Status s = CpuBf16Available(); !s.ok()) {
    GTEST_SKIP() << s.message();
  }
  const Case& c = GetParam();
  std::unique_ptr<Backend> fp32 = NewCpuBackend();
  std::unique_ptr<Backend> bf16 = NewCpuBackend();
  ASSERT_TRUE(bf16->SetPrecision(PRECISION_BF16).ok());
  EXPECT_EQ(bf16->precision(), PRECISION_BF16);
  std::mt19937_64 rng(11);
  const std::vector<float> x = Random(NumElements(c.shape), rng);
  const Shape out_shape = *OutputShape(c.spec, {c.shape});
  const std::vector<float> dy = Random(NumElements(out_shape), rng);
  auto same = [](std::vector<float> v) { return v; };
  auto rounded = [](std::vector<float> v) { return Rounded(std::move(v)); };
  auto abs = [](std::vector<float> v) { return Abs(std::move(v)); };

  const Results b = RunLayer(bf16.get(), c.spec, c.shape, x, dy, false, same);
  const Results ref =
      RunLayer(fp32.get(), c.spec, c.shape, x, dy, false, rounded);
  const Results exact =
      RunLayer(fp32.get(), c.spec, c.shape, x, dy, false, same);
  const Results mass = RunLayer(fp32.get(), c.spec, c.shape, x, dy, true, abs);

  // bf16 products are exact in fp32: only the accumulation order differs.
  ExpectWithin(b.out, ref.out, mass.out, 1e-5, c.name + " out");
  ExpectWithin(b.din, ref.din, mass.din, 1e-5, c.name + " din");
  for (size_t p = 0; p < b.grads.size(); ++p) {
    ExpectWithin(b.grads[p], ref.grads[p], mass.grads[p], 1e-5,
                 c.name + " grad " + std::to_string(p));
  }
  // Against fp32 on the unrounded values: at most 2^-7 + 2^-16 of the mass
  // (and fp32's own accumulation).
  const double bound = std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 1e-5;
  int differing = 0;
  ExpectWithin(b.out, exact.out, mass.out, bound, c.name + " out vs fp32",
               &differing);
  ExpectWithin(b.din, exact.din, mass.din, bound, c.name + " din vs fp32",
               &differing);
  for (size_t p = 0; p < b.grads.size(); ++p) {
    ExpectWithin(b.grads[p], exact.grads[p], mass.grads[p], bound,
                 c.name + " grad vs fp32 " + std::to_string(p), &differing);
  }
  EXPECT_GT(differing, 0) << c.name << ": bf16 computed exactly fp32";
}

INSTANTIATE_TEST_SUITE_P(
    Layers, Bf16LayerTest,
    ::testing::Values(
        Case{"conv_bias", LayerSpec::Conv2d(3, 4, 3, 1, 1, true), {2, 3, 5, 5}},
        Case{"conv_stride2_nobias",
             LayerSpec::Conv2d(3, 4, 3, 2, 1, false),
             {2, 3, 6, 6}},
        // LeNet's convolutions: 1 and 6 input channels, 16 output channels
        // in the blocked layout (the dense output gradient path).
        Case{"lenet_conv1",
             LayerSpec::Conv2d(1, 6, 5, 1, 2, true),
             {2, 1, 12, 12}},
        Case{"lenet_conv2",
             LayerSpec::Conv2d(6, 16, 5, 1, 0, true),
             {2, 6, 10, 10}},
        // ResNet's: blocked output, 1x1 stride 2.
        Case{"conv16_32",
             LayerSpec::Conv2d(16, 32, 3, 1, 1, false),
             {2, 16, 6, 6}},
        Case{"conv1x1_stride2",
             LayerSpec::Conv2d(16, 32, 1, 2, 0, false),
             {2, 16, 6, 6}},
        Case{"linear", LayerSpec::Linear(40, 10), {3, 40}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(PrecisionTest, CpuBackendRefusesTf32AndFp16) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  EXPECT_EQ(cpu->precision(), PRECISION_FP32);
  const absl::Status tf32 = cpu->SetPrecision(PRECISION_TF32);
  EXPECT_TRUE(absl::IsInvalidArgument(tf32)) << tf32;
  EXPECT_NE(tf32.message().find("CPUs have no TF32 arithmetic"),
            std::string::npos);
  const absl::Status fp16 = cpu->SetPrecision(PRECISION_FP16);
  EXPECT_TRUE(absl::IsInvalidArgument(fp16)) << fp16;
  EXPECT_NE(fp16.message().find("no fp16 convolution"), std::string::npos);
  EXPECT_EQ(cpu->precision(), PRECISION_FP32);
  EXPECT_EQ(cpu->name(), "cpu");
  if (CpuBf16Available().ok()) {
    ASSERT_TRUE(cpu->SetPrecision(PRECISION_BF16).ok());
    EXPECT_EQ(cpu->name(), "cpu (bf16)");
  } else {
    EXPECT_TRUE(absl::IsFailedPrecondition(CpuBf16Available()));
    EXPECT_TRUE(absl::IsFailedPrecondition(cpu->SetPrecision(PRECISION_BF16)));
  }
}

// A whole model in bf16: LeNet-5 and a ResNet-18 step on the same batch as
// fp32. The loss within 2% of fp32's, and every gradient within a relative
// L2 error of 0.5: a coarse check of the wiring (a wrong layout or a missed
// conversion is off by the gradient's whole size), since at initialisation
// each layer's rounding compounds through the chain and the sums of
// BatchNorm's and the first layers' gradients cancel (up to 0.37 seen for
// ResNet-18's last BatchNorm biases, 0.09 for LeNet's first conv). The
// per-layer bound is the test above; the training accuracy is in
// BENCHMARKS.md.
TEST(PrecisionTest, Bf16ModelsTrainCloseToFp32) {
  if (absl::Status s = CpuBf16Available(); !s.ok()) {
    GTEST_SKIP() << s.message();
  }
  for (const char* name : {"lenet5", "resnet18"}) {
    std::unique_ptr<Backend> fp32 = NewCpuBackend();
    std::unique_ptr<Backend> bf16 = NewCpuBackend();
    ASSERT_TRUE(bf16->SetPrecision(PRECISION_BF16).ok());
    const Shape chw = {1, 28, 28};
    auto a = Model::Create(name, chw, 10, {}, fp32.get());
    auto b = Model::Create(name, chw, 10, {}, bf16.get());
    ASSERT_TRUE(a.ok() && b.ok());
    std::mt19937_64 rng(3);
    Tensor input;
    input.shape = {8, 1, 28, 28};
    input.data = Random(NumElements(input.shape), rng);
    std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
    absl::StatusOr<float> la = (*a)->ForwardBackward(input, labels);
    absl::StatusOr<float> lb = (*b)->ForwardBackward(input, labels);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_NEAR(*lb, *la, 0.02 * std::fabs(*la)) << name;
    for (size_t t = 0; t < (*a)->params().size(); ++t) {
      const auto ga = (*a)->HostGradients()[t];
      const auto gb = (*b)->HostGradients()[t];
      double diff = 0, norm = 0;
      for (size_t i = 0; i < ga.size(); ++i) {
        diff += (double{gb[i]} - ga[i]) * (double{gb[i]} - ga[i]);
        norm += double{ga[i]} * ga[i];
      }
      EXPECT_LE(std::sqrt(diff), 0.5 * std::sqrt(norm) + 1e-7)
          << name << " " << (*a)->params()[t]->name;
    }
  }
}

// bf16 in the transformer (cpu_transformer.h): the attention's and the
// encoder block's projections round, within precision_checks.h's bounds of
// fp32; LayerNorm and GELU stay fp32 bit for bit; bert_tiny's loss and
// gradients stay close to fp32's (precision_checks.h).
TEST(PrecisionTest, Bf16TransformerRoundsItsProjectionsOnly) {
  if (absl::Status s = CpuBf16Available(); !s.ok()) {
    GTEST_SKIP() << s.message();
  }
  std::unique_ptr<Backend> fp32 = NewCpuBackend();
  std::unique_ptr<Backend> bf16 = NewCpuBackend();
  ASSERT_TRUE(bf16->SetPrecision(PRECISION_BF16).ok());
  ExpectProjectionsRound(bf16.get(), fp32.get(), kBf16UnitRoundoff);
  for (const LayerSpec& spec : {LayerSpec::LayerNorm(16), LayerSpec::Gelu()}) {
    const LayerDistance d =
        CompareLayer(bf16.get(), fp32.get(), spec, {2, 6, 16}, {}, {});
    EXPECT_EQ(d.out, 0) << LayerName(spec);
    EXPECT_EQ(d.din, 0) << LayerName(spec);
    EXPECT_EQ(d.grads, 0) << LayerName(spec);
  }
  ExpectBertTinyCloseTo(bf16.get(), fp32.get());
}

// fp16's loss scaling in the model (Model::set_loss_scale): a power-of-two
// scale multiplies dLoss/dLogits and divides each gradient back, which is
// exact in fp32, so the gradients equal the unscaled ones bit for bit; an
// infinity left in a gradient is what GradientsFinite() reports.
TEST(PrecisionTest, LossScaleIsUndoneExactlyAndOverflowIsFound) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  auto plain = Model::Create("lenet5", {1, 28, 28}, 10, {}, cpu.get());
  auto scaled = Model::Create("lenet5", {1, 28, 28}, 10, {}, cpu.get());
  ASSERT_TRUE(plain.ok() && scaled.ok());
  std::mt19937_64 rng(5);
  Tensor input;
  input.shape = {4, 1, 28, 28};
  input.data = Random(NumElements(input.shape), rng);
  const std::vector<int32_t> labels = {1, 3, 5, 7};
  (*scaled)->set_loss_scale(65536.0f);
  absl::StatusOr<float> a = (*plain)->ForwardBackward(input, labels);
  absl::StatusOr<float> b = (*scaled)->ForwardBackward(input, labels);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);  // the loss is not scaled
  for (size_t t = 0; t < (*plain)->params().size(); ++t) {
    const auto ga = (*plain)->HostGradients()[t];
    const auto gb = (*scaled)->HostGradients()[t];
    for (size_t i = 0; i < ga.size(); ++i) {
      ASSERT_EQ(ga[i], gb[i]) << (*plain)->params()[t]->name << "[" << i << "]";
    }
  }
  EXPECT_TRUE(*(*scaled)->GradientsFinite());
  // An overflowed gradient (as fp16's backward makes one) is found.
  (*scaled)->params()[0]->grad.data()[3] =
      std::numeric_limits<float>::infinity();
  EXPECT_FALSE(*(*scaled)->GradientsFinite());
}

}  // namespace
}  // namespace pstrain
