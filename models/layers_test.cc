// Finite-difference checks of every layer's backward pass, in the manner of
// Caffe's GradientChecker: loss L = sum(out * R) for a fixed random R, central
// differences with step h = 1e-2, tolerance 1e-2 relative (scale
// max(1, |analytic|, |numeric|)). Conv and linear are linear in their input
// and weights, so central differences are exact up to fp32 rounding; ReLU and
// max pooling get inputs kept 2h away from their kinks.
#include "models/layers.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>

#include "gtest/gtest.h"
#include "models/model.h"

namespace pstrain {
namespace {

constexpr float kStep = 1e-2f;
constexpr float kTolerance = 1e-2f;

Tensor RandomTensor(const Shape& shape, std::mt19937_64& rng) {
  Tensor t(shape);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : t.data) x = dist(rng);
  return t;
}

double WeightedSum(const Tensor& out, const Tensor& r) {
  double s = 0.0;
  for (int64_t i = 0; i < out.size(); ++i) s += double{out.data[i]} * r.data[i];
  return s;
}

void ExpectClose(float analytic, double numeric, const std::string& what) {
  const double scale =
      std::max({1.0, std::fabs(double{analytic}), std::fabs(numeric)});
  EXPECT_NEAR(analytic, numeric, kTolerance * scale) << what;
}

// Checks d(sum(layer(x) * R))/dx and /dparams against central differences.
void CheckLayerGradients(Layer& layer, Tensor x, uint64_t seed,
                         bool check_input = true) {
  std::mt19937_64 rng(seed);
  Tensor out;
  layer.Forward(x, &out);
  const Tensor r = RandomTensor(out.shape, rng);
  Tensor din;
  layer.Backward(x, out, r, &din);
  ASSERT_EQ(din.shape, x.shape);
  auto loss = [&]() {
    Tensor o;
    layer.Forward(x, &o);
    return WeightedSum(o, r);
  };
  auto check = [&](std::vector<float>& values, const std::vector<float>& grad,
                   const std::string& what) {
    for (size_t i = 0; i < values.size(); ++i) {
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
  if (check_input) check(x.data, din.data, layer.name() + " input");
  for (Param* p : layer.params()) {
    const std::vector<float> grad = p->grad.data;
    check(p->value.data, grad, layer.name() + " " + p->name);
  }
}

TEST(LayersTest, Conv2dGradients) {
  std::mt19937_64 rng(1);
  auto conv = MakeConv2d(2, 3, 3, 1, 1, rng);
  CheckLayerGradients(*conv, RandomTensor({2, 2, 5, 5}, rng), 2);
}

TEST(LayersTest, Conv2dStridedGradients) {
  std::mt19937_64 rng(3);
  auto conv = MakeConv2d(3, 2, 3, 2, 0, rng);
  CheckLayerGradients(*conv, RandomTensor({2, 3, 7, 7}, rng), 4);
}

TEST(LayersTest, Conv2dForwardMatchesDirectSum) {
  std::mt19937_64 rng(5);
  auto conv = MakeConv2d(1, 1, 3, 1, 1, rng);
  Param* w = conv->params()[0];
  Param* b = conv->params()[1];
  Tensor x = RandomTensor({1, 1, 4, 4}, rng);
  Tensor out;
  conv->Forward(x, &out);
  ASSERT_EQ(out.shape, (Shape{1, 1, 4, 4}));
  // Output (1, 2): cross-correlation over rows 0..2, columns 1..3.
  double expected = b->value.data[0];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      expected += double{w->value.data[i * 3 + j]} * x.data[i * 4 + (1 + j)];
    }
  }
  EXPECT_NEAR(out.data[1 * 4 + 2], expected, 1e-5);
}

TEST(LayersTest, LinearGradients) {
  std::mt19937_64 rng(6);
  auto fc = MakeLinear(7, 4, rng);
  CheckLayerGradients(*fc, RandomTensor({3, 7}, rng), 7);
}

TEST(LayersTest, LinearForwardIsXWtPlusB) {
  std::mt19937_64 rng(8);
  auto fc = MakeLinear(2, 2, rng);
  fc->params()[0]->value.data = {1, 2, 3, 4};
  fc->params()[1]->value.data = {0.5f, -1};
  Tensor x({1, 2});
  x.data = {1, -1};
  Tensor out;
  fc->Forward(x, &out);
  EXPECT_FLOAT_EQ(out.data[0], 1 - 2 + 0.5f);
  EXPECT_FLOAT_EQ(out.data[1], 3 - 4 - 1);
}

TEST(LayersTest, ReluGradientsAwayFromKink) {
  std::mt19937_64 rng(9);
  Tensor x = RandomTensor({2, 3, 4, 4}, rng);
  for (float& v : x.data) {
    if (std::fabs(v) < 2 * kStep) v += v < 0 ? -3 * kStep : 3 * kStep;
  }
  auto relu = MakeRelu();
  CheckLayerGradients(*relu, x, 10);
}

TEST(LayersTest, MaxPoolGradientsWithDistinctInputs) {
  std::mt19937_64 rng(11);
  Tensor x({2, 2, 4, 6});
  // Distinct values 0.05 apart: no tie within a window under a 1e-2 nudge.
  std::vector<int> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t i = 0; i < x.size(); ++i) x.data[i] = 0.05f * order[i] - 2.0f;
  auto pool = MakeMaxPool2d(2, 2);
  Tensor out;
  pool->Forward(x, &out);
  ASSERT_EQ(out.shape, (Shape{2, 2, 2, 3}));
  EXPECT_FLOAT_EQ(out.data[0],
                  std::max({x.data[0], x.data[1], x.data[6], x.data[7]}));
  CheckLayerGradients(*pool, x, 12);
}

TEST(LayersTest, SoftmaxCrossEntropyValueAndGradient) {
  Tensor logits({2, 3});
  logits.data = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, -1.0f};
  const std::vector<int32_t> labels = {2, 0};
  Tensor d;
  absl::StatusOr<float> loss = SoftmaxCrossEntropy(logits, labels, &d);
  ASSERT_TRUE(loss.ok());
  // PyTorch: F.cross_entropy(tensor([[1,2,3],[.5,.5,-1]]), tensor([2,0]))
  //          = 0.6032611131668091.
  EXPECT_NEAR(*loss, 0.6032611131668091, 1e-6);
  for (int64_t i = 0; i < logits.size(); ++i) {
    Tensor plus = logits, minus = logits;
    plus.data[i] += 1e-3f;
    minus.data[i] -= 1e-3f;
    const double numeric =
        (double{*SoftmaxCrossEntropy(plus, labels, nullptr)} -
         *SoftmaxCrossEntropy(minus, labels, nullptr)) /
        2e-3;
    EXPECT_NEAR(d.data[i], numeric, 1e-3);
  }
  EXPECT_EQ(SoftmaxCrossEntropy(logits, {2, 3}, nullptr).status().message(),
            "label 3 of sample 1 is outside [0, 3)");
}

TEST(ModelTest, LeNet5HasTheClassicParameterCount) {
  auto model = Model::Create("lenet5", {1, 28, 28}, 10, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->NumParameters(), 61706);
  EXPECT_EQ((*model)->params().size(), 10u);
  EXPECT_EQ((*model)->ParamNumElements()[4], 400 * 120);
}

TEST(ModelTest, UnknownModelNamesTheKnownOnes) {
  auto model = Model::Create("resnet9000", {1, 28, 28}, 10, 1);
  EXPECT_EQ(model.status().message(),
            "unknown model \"resnet9000\"; expected one of: lenet5, mlp");
}

// LeNet-5's composition (padding, pooling, flatten order) is checked against
// PyTorch rather than finite differences, whose central differences cross
// too many ReLU and max-pool kinks in a whole network.
TEST(ModelTest, LeNet5MatchesPyTorchForwardAndBackward) {
  auto created = Model::Create("lenet5", {1, 28, 28}, 10, 1);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  // testdata/gen_lenet_fixture.py defines these formulas.
  for (size_t p = 0; p < model.params().size(); ++p) {
    std::vector<float>& w = model.params()[p]->value.data;
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<float>(0.1 * std::sin(0.7 * i + 1.3 * p));
    }
  }
  Tensor x({2, 1, 28, 28});
  for (int64_t i = 0; i < x.size(); ++i) {
    x.data[i] = static_cast<float>(0.5 * std::cos(0.37 * i));
  }
  absl::StatusOr<float> loss = model.ForwardBackward(x, {3, 7});
  ASSERT_TRUE(loss.ok());
  std::ifstream file("testdata/lenet5_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/lenet5_fixture.txt";
  std::string line;
  int grads_checked = 0;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "loss") {
      double expected;
      in >> expected;
      EXPECT_NEAR(*loss, expected, 1e-5);
    } else if (tag == "logits") {
      const Tensor* logits = *model.Forward(x);
      for (int i = 0; i < 20; ++i) {
        double expected;
        in >> expected;
        EXPECT_NEAR(logits->data[i], expected, 1e-5) << "logit " << i;
      }
    } else if (tag == "grad") {
      size_t p;
      int64_t n;
      double sum, sum_abs;
      in >> p >> n >> sum >> sum_abs;
      ASSERT_LT(p, model.params().size());
      const std::vector<float>& g = model.params()[p]->grad.data;
      ASSERT_EQ(static_cast<int64_t>(g.size()), n);
      double s = 0, sa = 0;
      for (float v : g) {
        s += v;
        sa += std::fabs(v);
      }
      EXPECT_NEAR(s, sum, 1e-5 + 1e-4 * sum_abs) << "param " << p;
      EXPECT_NEAR(sa, sum_abs, 1e-4 * sum_abs) << "param " << p;
      for (int64_t i = 0; i < std::min<int64_t>(8, n); ++i) {
        double expected;
        in >> expected;
        EXPECT_NEAR(g[i], expected, 1e-6 + 1e-4 * std::fabs(expected))
            << "param " << p << " element " << i;
      }
      ++grads_checked;
    }
  }
  EXPECT_EQ(grads_checked, 10);
}

TEST(ModelTest, WholeModelGradientMatchesFiniteDifferences) {
  for (const char* name : {"mlp"}) {
    auto model = Model::Create(name, {1, 16, 16}, 4, 3);
    ASSERT_TRUE(model.ok()) << model.status();
    std::mt19937_64 rng(4);
    Tensor x = RandomTensor({2, 1, 16, 16}, rng);
    const std::vector<int32_t> labels = {1, 3};
    ASSERT_TRUE((*model)->ForwardBackward(x, labels).ok());
    // Spot-check a few elements of every parameter tensor.
    for (Param* p : (*model)->params()) {
      const std::vector<float> grad = p->grad.data;
      for (int64_t i = 0; i < p->value.size(); i += 1 + p->value.size() / 5) {
        const float saved = p->value.data[i];
        // A small step keeps ReLU and max-pool kinks out of the difference.
        p->value.data[i] = saved + 2e-3f;
        const double plus = *(*model)->ForwardBackward(x, labels);
        p->value.data[i] = saved - 2e-3f;
        const double minus = *(*model)->ForwardBackward(x, labels);
        p->value.data[i] = saved;
        const double numeric = (plus - minus) / 4e-3;
        EXPECT_NEAR(grad[i], numeric, 2e-4 + 0.02 * std::fabs(numeric))
            << name << " " << p->name << "[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace pstrain
