// Adam and AdamW against fixed vectors from PyTorch 1.13's torch.optim.Adam
// and torch.optim.AdamW (testdata/gen_adam_fixture.py).
#include "optim/adam.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::vector<float> ReadFloats(std::istringstream& in) {
  std::vector<float> out;
  double x;
  while (in >> x) out.push_back(static_cast<float>(x));
  return out;
}

TEST(AdamTest, MatchesPyTorchAdamAndAdamW) {
  std::ifstream file("testdata/adam_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/adam_fixture.txt";
  std::string line;
  int cases = 0;
  int checked_steps = 0;
  AdamOptions options;
  std::vector<float> w, m, v, g;
  std::string name;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "case") {
      int n, steps;
      double lr, b1, b2, eps, wd;
      in >> name >> lr >> b1 >> b2 >> eps >> wd >> n >> steps;
      options = AdamOptions{static_cast<float>(lr), static_cast<float>(b1),
                            static_cast<float>(b2), static_cast<float>(eps),
                            static_cast<float>(wd)};
      ++cases;
    } else if (tag == "w0") {
      w = ReadFloats(in);
      m.assign(w.size(), 0.0f);
      v.assign(w.size(), 0.0f);
    } else if (tag == "g") {
      int step;
      in >> step;
      g = ReadFloats(in);
      ASSERT_EQ(g.size(), w.size());
      AdamUpdate(options, step, w.data(), g.data(), m.data(), v.data(),
                 static_cast<int64_t>(w.size()));
    } else if (tag == "w") {
      int step;
      in >> step;
      const std::vector<float> expected = ReadFloats(in);
      ASSERT_EQ(expected.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_NEAR(w[i], expected[i], 2e-6f * (1.0f + std::fabs(expected[i])))
            << name << " step " << step << " element " << i;
      }
      ++checked_steps;
    }
  }
  EXPECT_EQ(cases, 4);
  EXPECT_EQ(checked_steps, 20);
}

TEST(AdamTest, FirstStepMovesEachWeightByLr) {
  // With bias correction, step 1 gives m_hat = g, v_hat = g^2, so each weight
  // moves by lr * g / (|g| + eps) ~= lr * sign(g).
  AdamOptions options;
  options.lr = 0.01f;
  std::vector<float> w = {1.0f, -2.0f, 3.0f};
  std::vector<float> g = {0.5f, -4.0f, 1e-3f};
  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  AdamUpdate(options, 1, w.data(), g.data(), m.data(), v.data(), 3);
  EXPECT_NEAR(w[0], 0.99f, 1e-6f);
  EXPECT_NEAR(w[1], -1.99f, 1e-6f);
  EXPECT_NEAR(w[2], 2.99f, 1e-5f);
}

TEST(AdamTest, OutOfPlaceEqualsInPlaceBitForBit) {
  AdamOptions options;
  options.lr = 3e-3f;
  options.weight_decay = 0.01f;
  const int n = 1000;
  std::vector<float> w(n), g(n), m(n), v(n);
  for (int i = 0; i < n; ++i) {
    w[i] = std::sin(0.37f * i);
    g[i] = std::cos(1.3f * i) * (i % 7 == 0 ? 100.0f : 0.01f);
    m[i] = 0.1f * std::sin(0.11f * i);
    v[i] = 0.01f * std::fabs(std::cos(0.05f * i));
  }
  const std::vector<float> w0 = w, m0 = m, v0 = v;
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> wo(n), mo(n), vo(n);
    AdamUpdateInto(options, step, w.data(), g.data(), m.data(), v.data(),
                   wo.data(), mo.data(), vo.data(), n);
    AdamUpdate(options, step, w.data(), g.data(), m.data(), v.data(), n);
    ASSERT_EQ(0, std::memcmp(wo.data(), w.data(), n * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(mo.data(), m.data(), n * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(vo.data(), v.data(), n * sizeof(float)));
  }
  EXPECT_NE(0, std::memcmp(w0.data(), w.data(), n * sizeof(float)));
}

// freeze_variance_after = F (1-bit Adam's compression stage): updates 1 to
// F are Adam's; later ones keep v and its bias correction at F, so the
// step is lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^F) + eps).
TEST(AdamTest, FrozenVarianceKeepsVAndItsBiasCorrection) {
  constexpr int kF = 3;
  AdamOptions frozen;
  frozen.freeze_variance_after = kF;
  const AdamOptions plain;
  float w1 = 0.5f, m1 = 0, v1 = 0;
  float w2 = 0.5f, m2 = 0, v2 = 0;
  for (int step = 1; step <= 6; ++step) {
    const float g = 0.25f * step - 0.6f;
    const float v_before = v1;
    const float m_expected = 0.9f * m1 + (1.0f - 0.9f) * g;
    const float w_before = w1;
    AdamUpdate(frozen, step, &w1, &g, &m1, &v1, 1);
    AdamUpdate(plain, step, &w2, &g, &m2, &v2, 1);
    EXPECT_EQ(m1, m_expected) << step;
    if (step <= kF) {
      EXPECT_EQ(w1, w2) << step;
      EXPECT_EQ(v1, v2) << step;
      continue;
    }
    EXPECT_EQ(v1, v_before) << step;
    EXPECT_NE(v2, v_before) << step;
    const float step_size = static_cast<float>(
        double{1e-3f} / (1.0 - std::pow(double{0.9f}, step)));
    const float inv_bias2 =
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{0.999f}, kF)));
    const float expected =
        w_before - step_size * m1 / (std::sqrt(v1) * inv_bias2 + 1e-8f);
    EXPECT_EQ(w1, expected) << step;
  }
}

}  // namespace
}  // namespace pstrain
