// SGD (momentum, dampening, Nesterov, weight decay) and the lr schedules
// against PyTorch 1.13's torch.optim.SGD and torch.optim.lr_scheduler
// (testdata/gen_optimizer_fixture.py), and the dispatch's invariants.
#include "optim/optimizer.h"

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

LrDecay DecayOf(const std::string& name) {
  if (name == "step") return LrDecay::kStep;
  if (name == "cosine") return LrDecay::kCosine;
  return LrDecay::kConstant;
}

TEST(OptimizerTest, MatchesPyTorchSgdAndSchedules) {
  std::ifstream file("testdata/optimizer_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/optimizer_fixture.txt";
  std::string line, name;
  int sgd_cases = 0, checked_steps = 0, schedules = 0, checked_lrs = 0;
  OptimizerOptions options;
  std::vector<float> w, m, v, g;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "sgd") {
      double lr, momentum, dampening, wd;
      int nesterov, n, steps;
      in >> name >> lr >> momentum >> dampening >> nesterov >> wd >> n >> steps;
      options = OptimizerOptions();
      options.kind = OptimizerKind::kSgd;
      options.lr = static_cast<float>(lr);
      options.momentum = static_cast<float>(momentum);
      options.dampening = static_cast<float>(dampening);
      options.nesterov = nesterov != 0;
      options.weight_decay = static_cast<float>(wd);
      ++sgd_cases;
    } else if (tag == "w0") {
      w = ReadFloats(in);
      m.assign(w.size(), 0.0f);
      v.assign(w.size(), 0.0f);
    } else if (tag == "g") {
      int step;
      in >> step;
      g = ReadFloats(in);
      ASSERT_EQ(g.size(), w.size());
      OptimizerUpdate(options, step, w.data(), g.data(), m.data(), v.data(),
                      static_cast<int64_t>(w.size()));
    } else if (tag == "w") {
      int step;
      in >> step;
      const std::vector<float> expected = ReadFloats(in);
      ASSERT_EQ(expected.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        // torch's CPU kernels may fuse a multiply-add: 1-2 ulp apart.
        EXPECT_NEAR(w[i], expected[i], 1e-6f * (1.0f + std::fabs(expected[i])))
            << name << " step " << step << " element " << i;
      }
      for (float x : v) EXPECT_EQ(x, 0.0f) << name << ": SGD leaves v alone";
      ++checked_steps;
    } else if (tag == "lr") {
      double lr, start_factor, gamma, lr_min;
      std::string decay;
      int64_t warmup, step_size, total, steps;
      in >> name >> lr >> decay >> warmup >> start_factor >> step_size >>
          gamma >> total >> lr_min >> steps;
      options = OptimizerOptions();
      options.lr = static_cast<float>(lr);
      options.schedule.decay = DecayOf(decay);
      options.schedule.warmup_steps = warmup;
      options.schedule.warmup_start_factor = start_factor;
      options.schedule.step_size = step_size;
      options.schedule.gamma = gamma;
      options.schedule.total_steps = total;
      options.schedule.min_lr = lr_min;
      ++schedules;
    } else if (tag == "at") {
      int64_t step;
      double expected;
      in >> step >> expected;
      // The base lr is fp32 here (0.1f) and a double in torch: scale
      // torch's lr by their ratio (lr_min's share, below 1e-10, stays).
      const double scale = static_cast<double>(0.1f) / 0.1;
      EXPECT_NEAR(ScheduledLr(options, step), expected * scale,
                  1e-10 + 1e-9 * std::fabs(expected))
          << name << " step " << step;
      ++checked_lrs;
    }
  }
  EXPECT_EQ(sgd_cases, 6);
  EXPECT_EQ(checked_steps, 36);
  EXPECT_EQ(schedules, 5);
  EXPECT_EQ(checked_lrs, 200);
}

// ... and SGD leaves v alone, and m too without momentum: the out-of-place
// form neither reads nor writes them (null is allowed), so a caller
// swapping state keeps them.
TEST(OptimizerTest, SgdOutOfPlaceEqualsInPlaceBitForBit) {
  for (const bool momentum : {true, false}) {
    SCOPED_TRACE(momentum ? "Nesterov momentum" : "no momentum");
    OptimizerOptions options;
    options.kind = OptimizerKind::kSgd;
    options.lr = 0.05f;
    options.momentum = momentum ? 0.9f : 0.0f;
    options.nesterov = momentum;
    options.weight_decay = 1e-4f;
    EXPECT_EQ(UpdatesFirstMoment(options), momentum);
    EXPECT_FALSE(UpdatesSecondMoment(options));
    const int n = 1000;
    std::vector<float> w(n), m(n, momentum ? 0.0f : 5.0f), v(n, 7.0f), g(n);
    for (int i = 0; i < n; ++i) w[i] = std::sin(0.37f * i);
    std::vector<float> w2 = w, m2 = m, w_out(n), m_out(n);
    for (int step = 1; step <= 4; ++step) {
      for (int i = 0; i < n; ++i) g[i] = std::cos(0.11f * i * step);
      OptimizerUpdate(options, step, w.data(), g.data(), m.data(), v.data(), n);
      OptimizerUpdateInto(options, step, w2.data(), g.data(),
                          momentum ? m2.data() : nullptr, nullptr, w_out.data(),
                          momentum ? m_out.data() : nullptr, nullptr, n);
      w2.swap(w_out);
      if (momentum) m2.swap(m_out);
    }
    EXPECT_EQ(0, std::memcmp(w.data(), w2.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), n * sizeof(float)));
    EXPECT_EQ(v, std::vector<float>(n, 7.0f));
    if (!momentum) {
      EXPECT_EQ(m, std::vector<float>(n, 5.0f));
    }
  }
  OptimizerOptions adam;
  EXPECT_TRUE(UpdatesFirstMoment(adam));
  EXPECT_TRUE(UpdatesSecondMoment(adam));
}

TEST(OptimizerTest, AdamWithAConstantLrIsAdamUpdateBitForBit) {
  AdamOptions adam;
  adam.lr = 3e-3f;
  adam.weight_decay = 0.01f;
  const OptimizerOptions options = adam;
  const int n = 257;
  std::vector<float> w(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (int i = 0; i < n; ++i) w[i] = std::sin(0.5f * i);
  std::vector<float> w2 = w, m2 = m, v2 = v;
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < n; ++i) g[i] = std::cos(0.2f * i + step);
    AdamUpdate(adam, step, w.data(), g.data(), m.data(), v.data(), n);
    OptimizerUpdate(options, step, w2.data(), g.data(), m2.data(), v2.data(),
                    n);
  }
  EXPECT_EQ(0, std::memcmp(w.data(), w2.data(), n * sizeof(float)));
}

TEST(OptimizerTest, ScheduledLrIsThePureFunctionOfTheStep) {
  OptimizerOptions options;
  options.lr = 1.0f;
  EXPECT_EQ(ScheduledLr(options, 0), 1.0);
  EXPECT_EQ(ScheduledLr(options, 1000000), 1.0);
  options.schedule.decay = LrDecay::kCosine;
  options.schedule.total_steps = 10;
  options.schedule.min_lr = 0.01;
  EXPECT_DOUBLE_EQ(ScheduledLr(options, 5), 0.505);
  // Held at lr_min past the horizon (torch's would rise again).
  EXPECT_EQ(ScheduledLr(options, 10), 0.01);
  EXPECT_EQ(ScheduledLr(options, 25), 0.01);
  options.schedule.warmup_steps = 4;
  EXPECT_EQ(ScheduledLr(options, 0), 0.0);  // From 0 by default.
  EXPECT_EQ(ScheduledLr(options, 2), 0.5);
  EXPECT_EQ(ScheduledLr(options, 4), 1.0);
}

}  // namespace
}  // namespace pstrain
