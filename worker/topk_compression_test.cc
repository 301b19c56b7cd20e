#include "worker/topk_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/wire_dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/adam.h"
#include "optim/optimizer.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseCompressionTest, AcceptsNoneAndTopK) {
  EXPECT_FALSE(ParseCompression("").value().enabled());
  EXPECT_FALSE(ParseCompression("none").value().enabled());
  const CompressionOptions topk = ParseCompression("topk:0.01").value();
  EXPECT_TRUE(topk.enabled());
  EXPECT_DOUBLE_EQ(topk.topk_ratio, 0.01);
  EXPECT_EQ(CompressionSpelling(topk), "topk:0.01");
  EXPECT_DOUBLE_EQ(ParseCompression("topk:1").value().topk_ratio, 1.0);
}

TEST(ParseCompressionTest, RefusesOtherTexts) {
  for (const char* bad : {"topk", "topk:", "topk:0", "topk:1.5", "topk:-0.1",
                          "topk:x", "randomk:0.1", "TOPK:0.1", "topk:nan"}) {
    const absl::StatusOr<CompressionOptions> parsed = ParseCompression(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("expected none or topk:R"))
        << bad;
  }
}

TEST(ParseCompressionTest, TheTextIsEscapedInTheMessage) {
  const absl::Status s = ParseCompression("topk:\n\x1b[2J").status();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << s;
  EXPECT_THAT(s.message(), HasSubstr("topk:\\n\\x1b[2J"));
}

TEST(TopKCountTest, CeilingAtLeastOne) {
  EXPECT_EQ(TopKCount(0.01, 1000), 10);
  EXPECT_EQ(TopKCount(0.01, 1001), 11);
  EXPECT_EQ(TopKCount(0.01, 5), 1);
  EXPECT_EQ(TopKCount(1.0, 5), 5);
  EXPECT_EQ(TopKCount(0.5, 0), 0);
}

// The reference: every index sorted by the order, the first k, ascending.
std::vector<uint32_t> BruteTopK(const std::vector<float>& v, int64_t k) {
  std::vector<uint32_t> all(v.size());
  std::iota(all.begin(), all.end(), 0u);
  std::stable_sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(v[a]) > std::fabs(v[b]);
  });
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}

TEST(SelectTopKTest, MatchesSortingEverything) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int n : {1, 2, 17, 1000, 4099}) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    for (int64_t k :
         {int64_t{1}, TopKCount(0.01, n), TopKCount(0.3, n), int64_t{n}}) {
      std::vector<uint32_t> got;
      SelectTopK(v, k, &got);
      EXPECT_EQ(got, BruteTopK(v, k)) << n << " " << k;
    }
  }
}

// Distributions that put many entries in the k-th entry's bin, or exactly
// on its key: zeros (a ReLU's dead units), a few repeated values, +0 and
// -0, denormals, one bin's worth of nearby values, and a wide spread.
TEST(SelectTopKTest, MatchesSortingEverythingWhereManyEntriesTie) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> small(-3, 3);
  const int n = 100003;
  std::vector<std::vector<float>> inputs;
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i % 10 == 0 ? normal(rng) : 0.0f;
  inputs.push_back(v);
  for (float& x : v) x = static_cast<float>(small(rng));
  inputs.push_back(v);
  for (int i = 0; i < n; ++i) v[i] = i % 2 ? 0.0f : -0.0f;
  inputs.push_back(v);
  for (float& x : v) x = normal(rng) * 1e-40f;  // denormals
  inputs.push_back(v);
  for (float& x : v) x = 1.0f + normal(rng) * 1e-3f;  // one or two bins
  inputs.push_back(v);
  for (float& x : v) x = normal(rng) * std::exp(normal(rng) * 8.0f);
  inputs.push_back(v);
  for (size_t c = 0; c < inputs.size(); ++c) {
    for (int64_t k : {int64_t{1}, TopKCount(0.001, n), TopKCount(0.01, n),
                      TopKCount(0.3, n), int64_t{n - 1}}) {
      std::vector<uint32_t> got;
      SelectTopK(inputs[c], k, &got);
      EXPECT_EQ(got, BruteTopK(inputs[c], k)) << "input " << c << " k " << k;
    }
  }
}

// Chunks of 65,536 entries and more first try a threshold from every 64th
// entry: inputs whose large entries the sample misses (all between its
// positions: the threshold is 0, which every entry reaches) or only sees
// (all on its positions: fewer than k reach the threshold) fall back to
// the radix select, and every answer is the sort's.
TEST(SelectTopKTest, MatchesSortingEverythingWhereTheSampleMisleads) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  const int n = 1 << 17;
  std::vector<std::vector<float>> inputs;
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i % 64 == 0 ? 0.0f : normal(rng);
  inputs.push_back(v);
  for (int i = 0; i < n; ++i) v[i] = i % 64 == 0 ? 10.0f + normal(rng) : 0.0f;
  inputs.push_back(v);
  for (int i = 0; i < n; ++i) {
    v[i] = i % 64 == 0 ? 10.0f + normal(rng) : normal(rng);
  }
  inputs.push_back(v);
  for (int i = 0; i < n; ++i)
    v[i] = i < n / 2 ? normal(rng) : 100 * normal(rng);
  inputs.push_back(v);
  // NaNs and infinities (a NaN above infinity above every finite
  // magnitude) on and off the sample's positions.
  const float inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    v[i] = i % 997 == 0 ? std::nanf("") : i % 389 == 0 ? -inf : normal(rng);
  }
  inputs.push_back(v);
  // The order by the magnitude's bits (NaN's above infinity's), then the
  // lower index: the first k, ascending.
  auto reference = [](const std::vector<float>& x, int64_t k) {
    auto key = [&](uint32_t i) {
      uint32_t bits;
      std::memcpy(&bits, &x[i], sizeof(bits));
      return bits & 0x7fffffffu;
    };
    std::vector<uint32_t> all(x.size());
    std::iota(all.begin(), all.end(), 0u);
    std::stable_sort(all.begin(), all.end(),
                     [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
    all.resize(k);
    std::sort(all.begin(), all.end());
    return all;
  };
  for (size_t c = 0; c < inputs.size(); ++c) {
    for (int64_t k : {int64_t{1}, TopKCount(0.001, n), TopKCount(0.01, n),
                      TopKCount(0.02, n), int64_t{n / 8}}) {
      std::vector<uint32_t> got;
      SelectTopK(inputs[c], k, &got);
      EXPECT_EQ(got, reference(inputs[c], k)) << "input " << c << " k " << k;
    }
  }
}

TEST(SelectTopKTest, NaNAndInfinityComeFirst) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {1.0f, -inf, std::nanf(""), 5.0f, inf};
  std::vector<uint32_t> got;
  SelectTopK(v, 1, &got);
  EXPECT_THAT(got, ElementsAre(2));
  SelectTopK(v, 3, &got);
  EXPECT_THAT(got, ElementsAre(1, 2, 4));
  SelectTopK(v, 4, &got);
  EXPECT_THAT(got, ElementsAre(1, 2, 3, 4));
}

TEST(SelectTopKTest, TiesGoToTheLowerIndexWhateverTheSign) {
  const std::vector<float> v = {1.0f, -3.0f, 3.0f, 0.5f, -3.0f, 2.0f};
  std::vector<uint32_t> got;
  SelectTopK(v, 2, &got);
  EXPECT_THAT(got, ElementsAre(1, 2));
  SelectTopK(v, 3, &got);
  EXPECT_THAT(got, ElementsAre(1, 2, 4));
}

TEST(TopKCompressorTest, SentPlusResidualIsGradientPlusOldResidualExactly) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::vector<int64_t> sizes = {300, 57};
  TopKCompressor compressor({0.05, true}, sizes, 3);
  std::vector<std::vector<float>> residual = {std::vector<float>(300, 0.0f),
                                              std::vector<float>(57, 0.0f)};
  for (int64_t step = 0; step < 6; ++step) {
    compressor.BeginStep(step);
    std::vector<std::vector<float>> sent = {std::vector<float>(300, 0.0f),
                                            std::vector<float>(57, 0.0f)};
    std::vector<std::vector<float>> gradient = sent;
    for (int t = 0; t < 2; ++t) {
      for (float& g : gradient[t]) g = normal(rng);
      // Tensor 0 in two chunks, tensor 1 in one.
      const std::vector<std::pair<int64_t, int64_t>> chunks =
          t == 0
              ? std::vector<std::pair<int64_t, int64_t>>{{0, 200}, {200, 100}}
              : std::vector<std::pair<int64_t, int64_t>>{{0, 57}};
      for (auto [offset, n] : chunks) {
        std::vector<uint32_t> indices;
        std::vector<float> values;
        compressor.Compress(t, offset,
                            absl::MakeConstSpan(gradient[t]).subspan(offset, n),
                            &indices, &values);
        ASSERT_EQ(static_cast<int64_t>(indices.size()), TopKCount(0.05, n));
        for (size_t i = 0; i < indices.size(); ++i) {
          sent[t][offset + indices[i]] = values[i];
        }
      }
    }
    compressor.CommitStep(step);
    const std::vector<absl::Span<const float>> now =
        compressor.ResidualAt(step + 1).value();
    for (int t = 0; t < 2; ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        const float sum = gradient[t][i] + residual[t][i];
        // Every entry is either sent (residual cleared) or kept.
        if (sent[t][i] != 0.0f) {
          EXPECT_EQ(sent[t][i], sum);
          EXPECT_EQ(now[t][i], 0.0f);
        } else {
          EXPECT_EQ(now[t][i], sum);
        }
        residual[t][i] = now[t][i];
      }
    }
  }
  EXPECT_EQ(compressor.newest_step(), 6);
}

// Momentum correction: the state is the residuals then the velocities;
// per entry u' = 0.9 u + g, v' = v + u', and a pushed entry has both
// cleared (masking); an uncommitted step leaves both as they were; Reset
// takes both (and refuses residuals alone).
TEST(TopKCompressorTest, MomentumCorrectionKeepsAndMasksTheVelocity) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  CompressionOptions options{0.1, true};
  options.momentum = 0.9;
  TopKCompressor compressor(options, {40}, 3);
  ASSERT_EQ(compressor.num_state_tensors(), 2);
  ASSERT_EQ(compressor.state_size(1), 40);
  std::vector<float> u(40, 0.0f);
  std::vector<float> v(40, 0.0f);
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<float> g(40);
    for (float& x : g) x = normal(rng);
    compressor.BeginStep(step);
    std::vector<uint32_t> indices;
    std::vector<float> values;
    compressor.Compress(0, 0, g, &indices, &values);
    ASSERT_EQ(indices.size(), 4u);
    if (step == 3) continue;  // never committed: step 4 starts from 3's
    compressor.CommitStep(step);
    for (int i = 0; i < 40; ++i) {
      u[i] = 0.9f * u[i] + 1.0f * g[i];
      v[i] = v[i] + u[i];
    }
    for (size_t j = 0; j < indices.size(); ++j) {
      EXPECT_EQ(values[j], v[indices[j]]);
      u[indices[j]] = 0.0f;
      v[indices[j]] = 0.0f;
    }
    const std::vector<absl::Span<const float>> state =
        compressor.ResidualAt(step + 1).value();
    ASSERT_EQ(state.size(), 2u);
    EXPECT_EQ(std::vector<float>(state[0].begin(), state[0].end()), v);
    EXPECT_EQ(std::vector<float>(state[1].begin(), state[1].end()), u);
  }
  EXPECT_FALSE(compressor.Reset(5, {std::vector<float>(40, 1.0f)}).ok());
  ASSERT_TRUE(compressor
                  .Reset(5, {std::vector<float>(40, 1.0f),
                             std::vector<float>(40, 2.0f)})
                  .ok());
  EXPECT_EQ(compressor.ResidualAt(5).value()[1][7], 2.0f);
}

// Adam's moments on the workers: m and v are Adam's (optim/adam.h) bit for
// bit and never masked; at ratio 1 the pushed d, applied by the shards'
// plain SGD (w -= lr d), is dense Adam's update within float rounding; at
// 0.1 what is pushed plus the residual is the old residual plus d.
TEST(TopKCompressorTest, AdamMomentsOnTheWorkersAreAdamsUpdate) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int n = 50;
  for (double ratio : {1.0, 0.1}) {
    CompressionOptions options{ratio, true};
    options.adam = true;
    ASSERT_TRUE(options.momentum_correction());
    TopKCompressor compressor(options, {n}, 3);
    ASSERT_EQ(compressor.num_state_tensors(), 3);
    AdamOptions adam;  // the same betas and epsilon as the defaults above
    adam.lr = 0.01f;
    std::vector<float> w(n), w_pushed(n), m(n, 0.0f), v(n, 0.0f);
    std::vector<float> r(n, 0.0f);
    for (float& x : w) x = normal(rng);
    w_pushed = w;
    for (int64_t step = 0; step < 10; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng) * (1.0f + step);
      compressor.BeginStep(step);
      std::vector<uint32_t> indices;
      std::vector<float> values;
      compressor.Compress(0, 0, g, &indices, &values);
      compressor.CommitStep(step);
      AdamUpdate(adam, step + 1, w.data(), g.data(), m.data(), v.data(), n);
      const std::vector<absl::Span<const float>> state =
          compressor.ResidualAt(step + 1).value();
      ASSERT_EQ(state.size(), 3u);
      EXPECT_EQ(std::vector<float>(state[1].begin(), state[1].end()), m);
      EXPECT_EQ(std::vector<float>(state[2].begin(), state[2].end()), v);
      // d as Adam's step: w_before - w_after = lr * d.
      std::vector<float> sent(n, 0.0f);
      for (size_t j = 0; j < indices.size(); ++j) {
        sent[indices[j]] = values[j];
      }
      for (int i = 0; i < n; ++i) {
        const double d = (1.0 / (1.0 - std::pow(0.9, step + 1))) * m[i] /
                         (std::sqrt(static_cast<double>(v[i])) /
                              std::sqrt(1.0 - std::pow(0.999, step + 1)) +
                          1e-8);
        EXPECT_NEAR(sent[i] + state[0][i], r[i] + d, 1e-5 * (1 + std::fabs(d)))
            << "step " << step << " entry " << i;
        r[i] = state[0][i];
        w_pushed[i] -= adam.lr * sent[i];
        if (ratio == 1.0) {
          EXPECT_EQ(state[0][i], 0.0f);
          EXPECT_NEAR(w_pushed[i], w[i], 1e-5f) << "step " << step;
        }
      }
    }
  }
}

TEST(TopKCompressorTest, RingKeepsTheLastResidualsAndSkipsUncommitted) {
  TopKCompressor compressor({0.5, true}, {2}, 3);
  std::vector<uint32_t> indices;
  std::vector<float> values;
  auto step = [&](int64_t s, float a, float b, bool commit) {
    compressor.BeginStep(s);
    const std::vector<float> g = {a, b};
    compressor.Compress(0, 0, g, &indices, &values);
    if (commit) compressor.CommitStep(s);
  };
  step(0, 1.0f, 2.0f, true);   // sends 2, keeps {1, 0}: start of step 1
  step(1, 1.0f, 0.0f, true);   // sum {2, 0}: sends 2, keeps {0, 0}
  step(2, 0.0f, 5.0f, false);  // skipped: never committed
  step(2, 0.5f, 0.25f, true);  // sum {0.5, 0.25}: keeps {0, 0.25}
  EXPECT_THAT(compressor.ResidualAt(1).value()[0], ElementsAre(1.0f, 0.0f));
  EXPECT_THAT(compressor.ResidualAt(2).value()[0], ElementsAre(0.0f, 0.0f));
  EXPECT_THAT(compressor.ResidualAt(3).value()[0], ElementsAre(0.0f, 0.25f));
  // Three kept: the start of step 0 is gone; step 4 is not reached.
  EXPECT_THAT(compressor.ResidualAt(0).status().message(),
              HasSubstr("not held"));
  // Past the newest commit: the newest (the caller knows steps 3.. pushed
  // nothing yet that counts).
  EXPECT_THAT(compressor.ResidualAt(4).value()[0], ElementsAre(0.0f, 0.25f));
  // A jump from step 3 to 7 pushes nothing in between: the start of steps
  // 4 to 7 is the start of 3's successor.
  step(3, 0.0f, 0.0f, true);  // sum {0, 0.25}: sends 0.25
  step(7, 4.0f, 1.0f, true);  // sum {4, 1}: keeps {0, 1}
  EXPECT_THAT(compressor.ResidualAt(6).value()[0], ElementsAre(0.0f, 0.0f));
  EXPECT_THAT(compressor.ResidualAt(8).value()[0], ElementsAre(0.0f, 1.0f));
  // Back to the start of step 6 (a restore to a checkpoint of step 6):
  // the commit of step 7 is dropped, the next step reads step 3's.
  EXPECT_FALSE(compressor.RewindTo(2));  // not held: ring unchanged
  EXPECT_EQ(compressor.newest_step(), 8);
  ASSERT_TRUE(compressor.RewindTo(6));
  EXPECT_EQ(compressor.newest_step(), 4);
  EXPECT_THAT(compressor.ResidualAt(8).value()[0], ElementsAre(0.0f, 0.0f));

  ASSERT_TRUE(compressor.Reset(20, {{3.0f, -1.0f}}).ok());
  EXPECT_EQ(compressor.newest_step(), 20);
  EXPECT_THAT(compressor.ResidualAt(20).value()[0], ElementsAre(3.0f, -1.0f));
  EXPECT_FALSE(compressor.ResidualAt(8).ok());
  EXPECT_THAT(compressor.Reset(0, {{1.0f}}).message(), HasSubstr("expected 2"));
  ASSERT_TRUE(compressor.Reset(0, {}).ok());
  EXPECT_THAT(compressor.ResidualAt(0).value()[0], ElementsAre(0.0f, 0.0f));
}

TEST(TopKCompressorTest, WithoutErrorFeedbackTheRestIsDropped) {
  TopKCompressor compressor({0.5, false}, {4}, 3);
  std::vector<uint32_t> indices;
  std::vector<float> values;
  for (int64_t s = 0; s < 2; ++s) {
    compressor.BeginStep(s);
    const std::vector<float> g = {1.0f, -4.0f, 2.0f, 3.0f};
    compressor.Compress(0, 0, g, &indices, &values);
    compressor.CommitStep(s);
    // The same every step: nothing carried over.
    EXPECT_THAT(indices, ElementsAre(1, 3));
    EXPECT_THAT(values, ElementsAre(-4.0f, 3.0f));
  }
  EXPECT_TRUE(compressor.ResidualAt(5).value().empty());
}

TEST(WholeTensorsTest, OneDimensionalParametersGoWhole) {
  EXPECT_THAT(WholeTensors({{6, 1, 5, 5}, {6}, {10, 84}, {10}, {}}),
              ElementsAre(false, true, false, true, true));
}

// Whole tensors (DGC's uncompressed one-dimensional parameters): every
// entry pushed each step, no residual, and with momentum correction an
// unmasked velocity, so that two workers' pushes averaged and applied by
// the shards' plain SGD (w -= lr * average) train the tensor as SGD with
// momentum (PyTorch's, optim/optimizer.h) on the average gradient, within
// float rounding; a compressed tensor beside it still pushes its top k.
TEST(TopKCompressorTest, WholeTensorsTrainAsDenseMomentumSgd) {
  for (bool nesterov : {false, true}) {
    std::mt19937 rng(13);
    std::normal_distribution<float> normal;
    const int n = 16, big = 100;
    CompressionOptions options{0.1, true};
    options.momentum = 0.9;
    options.nesterov = nesterov;
    std::vector<TopKCompressor> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back(options, std::vector<int64_t>{n, big}, 3,
                           std::vector<bool>{true, false});
    }
    ASSERT_TRUE(workers[0].whole(0));
    ASSERT_FALSE(workers[0].whole(1));
    OptimizerOptions sgd;
    sgd.kind = OptimizerKind::kSgd;
    sgd.momentum = 0.9f;
    sgd.nesterov = nesterov;
    const float lr = 0.1f;
    std::vector<float> w_pushed(n), w_dense(n), buf(n, 0.0f);
    for (float& x : w_pushed) x = normal(rng);
    w_dense = w_pushed;
    for (int64_t step = 0; step < 8; ++step) {
      std::vector<float> average(n, 0.0f), pushed(n, 0.0f);
      for (TopKCompressor& worker : workers) {
        std::vector<float> g(n), g_big(big);
        for (float& x : g) x = normal(rng);
        for (float& x : g_big) x = normal(rng);
        worker.BeginStep(step);
        std::vector<uint32_t> indices;
        std::vector<float> values;
        worker.Compress(1, 0, g_big, &indices, &values);
        EXPECT_EQ(indices.size(), 10u);
        worker.Compress(0, 0, g, &indices, &values);
        worker.CommitStep(step);
        ASSERT_EQ(indices.size(), static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          ASSERT_EQ(indices[i], static_cast<uint32_t>(i));
          pushed[i] += values[i] / 2;
          average[i] += g[i] / 2;
        }
        const std::vector<absl::Span<const float>> state =
            worker.ResidualAt(step + 1).value();
        EXPECT_THAT(std::vector<float>(state[0].begin(), state[0].end()),
                    ::testing::Each(0.0f));
      }
      for (int i = 0; i < n; ++i) w_pushed[i] -= lr * pushed[i];
      SgdUpdate(sgd, lr, step + 1, w_dense.data(), average.data(), buf.data(),
                n);
      for (int i = 0; i < n; ++i) {
        EXPECT_NEAR(w_pushed[i], w_dense[i],
                    2e-5f * (1 + std::fabs(w_dense[i])))
            << "nesterov " << nesterov << " step " << step << " entry " << i;
      }
    }
  }
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// The default start is dense; DGC's schedule (section 3.3) starts at
// sparsity 75%. Either falls exponentially to the ratio.
TEST(CompressionOptionsTest, WarmupFallsExponentiallyFromItsStartToTheRatio) {
  CompressionOptions o{0.01, true, 100};
  EXPECT_DOUBLE_EQ(o.RatioAt(0), 1.0);
  EXPECT_DOUBLE_EQ(o.RatioAt(50), 0.1);
  EXPECT_NEAR(o.RatioAt(75), std::pow(0.01, 0.75), 1e-15);
  EXPECT_DOUBLE_EQ(o.RatioAt(100), 0.01);
  EXPECT_DOUBLE_EQ(o.RatioAt(5000), 0.01);
  o.warmup_start = 0.25;
  EXPECT_DOUBLE_EQ(o.RatioAt(0), 0.25);
  EXPECT_DOUBLE_EQ(o.RatioAt(50), 0.05);  // 0.25 * (0.04)^(1/2)
  EXPECT_NEAR(o.RatioAt(75), 0.25 * std::pow(0.04, 0.75), 1e-15);
  EXPECT_DOUBLE_EQ(o.RatioAt(100), 0.01);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(o.RatioAt(0), 0.01);
  // A ratio above the start has no warm-up left to do.
  CompressionOptions wide{0.5, true, 100};
  wide.warmup_start = 0.25;
  EXPECT_DOUBLE_EQ(wide.RatioAt(0), 0.5);
  EXPECT_DOUBLE_EQ(wide.RatioAt(50), 0.5);
}

TEST(TopKCompressorTest, WarmupPushesMoreInEarlySteps) {
  TopKCompressor compressor({0.01, true, 10}, {1000}, 3);
  std::vector<uint32_t> indices;
  std::vector<float> values;
  const std::vector<float> g(1000, 1.0f);
  for (int64_t step : {0, 5, 10}) {
    compressor.BeginStep(step);
    compressor.Compress(0, 0, g, &indices, &values);
    compressor.CommitStep(step);
    EXPECT_EQ(
        static_cast<int64_t>(indices.size()),
        TopKCount(std::pow(0.01, std::min<int64_t>(step, 10) / 10.0), 1000))
        << step;
  }
}

// A 16-bit wire rounds the pushed values; with error feedback what the
// rounding drops stays in the residual, so that the values the shards
// receive add up to the gradients' sum within one rounding, where
// rounding each push on its own drifts by every step's.
TEST(TopKCompressorTest, WireRoundingIsFedBack) {
  for (DType wire : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    SCOPED_TRACE(WireDtypeSpelling(wire));
    // 1 + 2^-9 (bf16 keeps 8 bits: it rounds to 1) and 3 * 2^-14 + 2^-25
    // (below fp16's 11 bits once the chunk is scaled to its largest).
    const std::vector<float> g = {1.0f + 0x1p-9f, 0.25f,
                                  3 * 0x1p-14f + 0x1p-25f, -0.5f};
    TopKCompressor compressor({0.5, true, 0}, {4}, 3);
    std::vector<uint32_t> indices;
    std::vector<float> values;
    std::vector<double> received(4, 0.0), rounded_alone(4, 0.0);
    const int steps = 64;
    for (int step = 0; step < steps; ++step) {
      compressor.BeginStep(step);
      compressor.Compress(0, 0, g, &indices, &values, wire);
      compressor.CommitStep(step);
      std::vector<float> sent = values;
      RoundThroughWire(wire, absl::MakeSpan(sent));  // what the shard gets
      for (size_t j = 0; j < indices.size(); ++j) {
        received[indices[j]] += sent[j];
      }
      if (step == 0) {
        // The first push: entries 0 and 3 (the largest); each one's
        // residual is what its rounding dropped, the others' their value.
        ASSERT_EQ(indices, (std::vector<uint32_t>{0, 3}));
        absl::StatusOr<std::vector<absl::Span<const float>>> r =
            compressor.ResidualAt(1);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ((*r)[0][0], values[0] - sent[0]);
        EXPECT_EQ((*r)[0][3], values[1] - sent[1]);
        EXPECT_EQ((*r)[0][1], g[1]);
        EXPECT_EQ((*r)[0][2], g[2]);
        if (wire == DTYPE_BFLOAT16) {
          EXPECT_EQ((*r)[0][0], 0x1p-9f);
        }
      }
    }
    absl::StatusOr<std::vector<absl::Span<const float>>> r =
        compressor.ResidualAt(steps);
    ASSERT_TRUE(r.ok()) << r.status();
    for (int i = 0; i < 4; ++i) {
      // Received plus the residual left is the gradients' sum (the float
      // sums are exact here), and the residual stays small.
      EXPECT_NEAR(received[i] + (*r)[0][i], steps * static_cast<double>(g[i]),
                  1e-6)
          << i;
    }
    // Entry 0 is pushed every step: its sum is off by less than one
    // rounding of a value, where rounding each push alone (1 + 2^-9 to
    // bf16's 1) would be 64 * 2^-9 = 0.125 short.
    EXPECT_NEAR(received[0], steps * static_cast<double>(g[0]), 0x1p-7);
  }
}

}  // namespace
}  // namespace pstrain
