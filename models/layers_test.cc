// Every layer of the CPU backend:
//  - against PyTorch (testdata/layers_fixture.txt, written by
//    testdata/gen_layers_fixture.py with Debian's python3-torch): forward
//    output, input gradient, parameter gradients and BatchNorm running
//    statistics, on small shapes with inputs and weights given by formulas;
//  - by finite differences, in the manner of Caffe's GradientChecker: loss
//    L = sum(out * R) for a fixed random R, central differences with step
//    h = 1e-2, tolerance 1e-2 relative (scale max(1, |analytic|, |numeric|)).
//    Conv and linear are linear in their input and weights, so central
//    differences are exact up to fp32 rounding; ReLU and max pooling get
//    inputs kept away from their kinks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/dropout_mask.h"
#include "models/layer_fixture.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"
#include "models/model.h"

namespace pstrain {
namespace {

constexpr float kStep = 1e-2f;
constexpr float kTolerance = 1e-2f;

std::vector<float> RandomValues(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectClose(float analytic, double numeric, const std::string& what) {
  const double scale =
      std::max({1.0, std::fabs(double{analytic}), std::fabs(numeric)});
  EXPECT_NEAR(analytic, numeric, kTolerance * scale) << what;
}

// Checks d(sum(layer(x) * R))/dx and /dparams against central differences
// (training mode).
void CheckGradients(const LayerSpec& spec, const Shape& shape,
                    std::vector<float> x_values, uint64_t seed,
                    int num_inputs = 1) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  Harness h(cpu.get(), spec, seed);
  std::mt19937_64 rng(seed + 100);
  std::vector<DeviceTensor> store;
  for (int i = 0; i < num_inputs; ++i) {
    store.push_back(h.Make(
        shape, i == 0 ? x_values : RandomValues(NumElements(shape), rng)));
  }
  std::vector<DeviceTensor*> inputs;
  for (DeviceTensor& t : store) inputs.push_back(&t);
  const std::vector<float> out = h.Forward(inputs);
  const std::vector<float> r = RandomValues(out.size(), rng);
  const std::vector<std::vector<float>> din = h.Backward(inputs, r);
  std::vector<std::vector<float>> grads;
  for (Param& p : h.params()) grads.push_back(Values(p.grad));
  auto loss = [&]() {
    const std::vector<float> o = h.Forward(inputs);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += double{o[i]} * r[i];
    return s;
  };
  auto check = [&](float* values, int64_t n, const std::vector<float>& grad,
                   const std::string& what) {
    for (int64_t i = 0; i < n; ++i) {
      const float saved = values[i];
      values[i] = saved + kStep;
      const double plus = loss();
      values[i] = saved - kStep;
      const double minus = loss();
      values[i] = saved;
      ExpectClose(grad[i], (plus - minus) / (2.0 * kStep),
                  what + "[" + std::to_string(i) + "]");
    }
  };
  for (int i = 0; i < num_inputs; ++i) {
    check(inputs[i]->data(), inputs[i]->size(), din[i],
          LayerName(spec) + " input " + std::to_string(i));
  }
  for (size_t p = 0; p < h.params().size(); ++p) {
    check(h.params()[p].value.data(), h.params()[p].value.size(), grads[p],
          LayerName(spec) + " " + h.params()[p].name);
  }
}

std::vector<float> RandomInput(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return RandomValues(NumElements(shape), rng);
}

// Distinct values 0.05 apart: no tie within a pooling window under a nudge.
std::vector<float> DistinctInput(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> order(NumElements(shape));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> v(order.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * order[i] - 2.0f;
  return v;
}

TEST(FiniteDifferences, Conv2dWithBias) {
  const Shape shape = {2, 2, 5, 5};
  CheckGradients(LayerSpec::Conv2d(2, 3, 3, 1, 1, true), shape,
                 RandomInput(shape, 1), 2);
}

TEST(FiniteDifferences, Conv2dStridedWithoutBias) {
  const Shape shape = {2, 3, 7, 7};
  CheckGradients(LayerSpec::Conv2d(3, 2, 3, 2, 1, false), shape,
                 RandomInput(shape, 3), 4);
}

// 16 channels in and out: the output (and, for the second convolution, the
// input) use the CPU's channel-blocked layout.
TEST(FiniteDifferences, Conv2dBlockedLayout) {
  const Shape shape = {1, 16, 3, 3};
  CheckGradients(LayerSpec::Conv2d(16, 16, 3, 1, 1, false), shape,
                 RandomInput(shape, 31), 32);
}

TEST(FiniteDifferences, Linear) {
  const Shape shape = {3, 7};
  CheckGradients(LayerSpec::Linear(7, 4), shape, RandomInput(shape, 5), 6);
}

TEST(FiniteDifferences, BatchNorm2dTraining) {
  const Shape shape = {3, 2, 3, 3};
  // The loss is quadratic-ish in x through the batch statistics; a smaller
  // relative error needs inputs of spread ~1, which these have.
  CheckGradients(LayerSpec::BatchNorm2d(2), shape, RandomInput(shape, 7), 8);
}

TEST(FiniteDifferences, ReluAwayFromKink) {
  const Shape shape = {2, 3, 4, 4};
  std::vector<float> x = RandomInput(shape, 9);
  for (float& v : x) {
    if (std::fabs(v) < 2 * kStep) v += v < 0 ? -3 * kStep : 3 * kStep;
  }
  CheckGradients(LayerSpec::Relu(), shape, x, 10);
}

TEST(FiniteDifferences, MaxPoolPadded) {
  const Shape shape = {2, 2, 5, 6};
  CheckGradients(LayerSpec::MaxPool2d(3, 2, 1), shape, DistinctInput(shape, 11),
                 12);
}

TEST(FiniteDifferences, AvgPool) {
  const Shape shape = {2, 2, 4, 6};
  CheckGradients(LayerSpec::AvgPool2d(2, 2, 0), shape, RandomInput(shape, 13),
                 14);
}

TEST(FiniteDifferences, GlobalAvgPool) {
  const Shape shape = {2, 3, 3, 4};
  CheckGradients(LayerSpec::GlobalAvgPool(), shape, RandomInput(shape, 15), 16);
}

TEST(FiniteDifferences, ResidualAdd) {
  const Shape shape = {2, 3, 2, 2};
  CheckGradients(LayerSpec::Add(), shape, RandomInput(shape, 17), 18, 2);
}

TEST(FiniteDifferences, Flatten) {
  const Shape shape = {2, 3, 2, 2};
  CheckGradients(LayerSpec::Flatten(), shape, RandomInput(shape, 19), 20);
}

TEST(Dropout, ZeroesAboutPAndScalesTheRestAndBackwardUsesTheMask) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  Harness h(cpu.get(), LayerSpec::Dropout(0.3f), 21);
  ExpectInvertedDropout(h);
  // Eval mode is the identity.
  const std::vector<float> ones(4000, 1.0f);
  DeviceTensor x = h.Make({4, 1000}, ones);
  EXPECT_EQ(h.Forward({&x}, false), ones);
}

// The masks are models/dropout_mask.h's draws (the CUDA backend's too:
// cuda_test), call after call, whatever the number of threads that fill
// them.
TEST(Dropout, MasksAreTheCounterBasedDrawsOnAnyThreadCount) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  constexpr uint64_t kSeed = 21;
  const std::vector<float> ones(40000, 1.0f);
  std::vector<std::vector<float>> by_threads;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Harness h(cpu.get(), LayerSpec::Dropout(0.3f), kSeed);
    DeviceTensor x = h.Make({4, 10000}, ones);
    for (uint64_t call = 1; call <= 2; ++call) {
      const std::vector<float> out = h.Forward({&x});
      for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
        ASSERT_EQ(out[i], DropoutMaskValue(DropoutCallSeed(kSeed, call), i,
                                           0.7f, 1.0f / 0.7f))
            << "call " << call << ", element " << i << ", " << threads
            << " threads";
      }
      by_threads.push_back(out);
    }
  }
  omp_set_num_threads(1);
  EXPECT_EQ(by_threads[0], by_threads[2]);
  EXPECT_NE(by_threads[0], by_threads[1]);  // a new mask per call
}

// ---- PyTorch fixtures ----

void ExpectAllNear(const std::vector<float>& actual,
                   const std::vector<float>& expected,
                   const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-4 + 1e-4 * std::fabs(expected[i]))
        << what << "[" << i << "]";
  }
}

TEST(PyTorchFixtures, EveryLayerMatchesForwardBackwardAndRunningStats) {
  const std::vector<FixtureCase> fixture =
      ReadLayerFixture("testdata/layers_fixture.txt");
  std::map<std::string, const FixtureCase*> by_name;
  for (const FixtureCase& c : fixture) by_name[c.name] = &c;
  for (const LayerCase& c : LayerCases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(by_name.count(c.name)) << "fixture has no case " << c.name;
    const auto& v = by_name[c.name]->values;
    std::unique_ptr<Backend> cpu = NewCpuBackend();
    Harness h(cpu.get(), c.spec);
    for (Param& p : h.params()) {
      const std::vector<float>& w = v.at("param:" + p.name);
      ASSERT_EQ(static_cast<int64_t>(w.size()), p.value.size()) << p.name;
      std::copy(w.begin(), w.end(), p.value.data());
    }
    DeviceTensor x = h.Make(c.shape, v.at("input"));
    DeviceTensor x2;
    std::vector<DeviceTensor*> inputs = {&x};
    if (c.num_inputs == 2) {
      x2 = h.Make(c.shape, v.at("input2"));
      inputs.push_back(&x2);
    }
    ExpectAllNear(h.Forward(inputs), v.at("out"), "out");
    const auto din = h.Backward(inputs, v.at("dout"));
    ExpectAllNear(din[0], v.at("din"), "din");
    if (c.num_inputs == 2) ExpectAllNear(din[1], v.at("din2"), "din2");
    for (Param& p : h.params()) {
      ExpectAllNear(Values(p.grad), v.at("grad:" + p.name), "grad:" + p.name);
    }
    for (size_t b = 0; b < h.buffers().size(); ++b) {
      const std::string name = BufferSpecs(c.spec)[b].name;
      ExpectAllNear(Values(h.buffers()[b].value), v.at("buffer:" + name),
                    "buffer:" + name);
    }
    if (v.count("eval_out")) {
      ExpectAllNear(h.Forward(inputs, false), v.at("eval_out"), "eval_out");
    }
  }
}

TEST(SoftmaxCrossEntropy, ValueGradientAndBadLabel) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, -1.0f};
  const std::vector<int32_t> labels = {2, 0};
  std::vector<float> d(6);
  absl::StatusOr<float> loss =
      HostSoftmaxCrossEntropy(logits.data(), 2, 3, labels, d.data());
  ASSERT_TRUE(loss.ok());
  // PyTorch: F.cross_entropy(tensor([[1,2,3],[.5,.5,-1]]), tensor([2,0]))
  //          = 0.6032611131668091.
  EXPECT_NEAR(*loss, 0.6032611131668091, 1e-6);
  for (int i = 0; i < 6; ++i) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += 1e-3f;
    minus[i] -= 1e-3f;
    const double numeric =
        (double{*HostSoftmaxCrossEntropy(plus.data(), 2, 3, labels, nullptr)} -
         *HostSoftmaxCrossEntropy(minus.data(), 2, 3, labels, nullptr)) /
        2e-3;
    EXPECT_NEAR(d[i], numeric, 1e-3);
  }
  const std::vector<int32_t> bad = {2, 3};
  EXPECT_EQ(HostSoftmaxCrossEntropy(logits.data(), 2, 3, bad, nullptr)
                .status()
                .message(),
            "label 3 of sample 1 is outside [0, 3)");
}

// The contract the memory plan relies on (layer_spec.h BackwardReadsOf).
TEST(BackwardReads, EveryLayerCaseReadsOnlyWhatItsContractSays) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (const LayerCase& c : LayerCases()) {
    ExpectBackwardReadsOnlyWhatItSays(cpu.get(), c);
  }
  for (const LayerCase& c : FusedLayerCases()) {
    ExpectBackwardReadsOnlyWhatItSays(cpu.get(), c);
  }
}

// AddRelu is Add then Relu, bit for bit both ways, in the dense and the
// blocked layout (inputs from a conv of 16 channels).
TEST(FusedLayers, AddReluIsAddThenRelu) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (const LayerCase& c : FusedLayerCases()) {
    SCOPED_TRACE(c.name);
    const int64_t channels = c.shape[1];
    Harness conv(cpu.get(),
                 LayerSpec::Conv2d(channels, channels, 1, 1, 0, false), 3);
    Harness fused(cpu.get(), c.spec), add(cpu.get(), LayerSpec::Add()),
        relu(cpu.get(), LayerSpec::Relu());
    const int64_t n = NumElements(c.shape);
    std::vector<DeviceTensor> x;
    for (int i = 0; i < 2; ++i) {
      std::vector<float> v(n);
      for (int64_t j = 0; j < n; ++j) v[j] = std::sin(0.7 * j + i);
      DeviceTensor in = conv.Make(c.shape, v);
      conv.Forward({&in});
      // The conv's output, in its layout, as the input.
      x.push_back(std::move(*conv.mutable_out()));
    }
    const std::vector<float> y = fused.Forward({&x[0], &x[1]});
    add.Forward({&x[0], &x[1]});
    DeviceTensor sum = std::move(*add.mutable_out());
    EXPECT_EQ(y, relu.Forward({&sum}));
    std::vector<float> dy(y.size());
    for (size_t j = 0; j < dy.size(); ++j) dy[j] = std::cos(0.3 * j);
    const auto dx = fused.Backward({&x[0], &x[1]}, dy);
    const std::vector<float> dsum = relu.Backward({&sum}, dy)[0];
    *add.mutable_out() = std::move(sum);
    const auto want = add.Backward({&x[0], &x[1]}, dsum);
    EXPECT_EQ(dx, want);
  }
}

}  // namespace
}  // namespace pstrain
