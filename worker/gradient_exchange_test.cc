// The allreduce exchange: buckets start during backward (before Step()),
// and the weights after a step equal Adam applied to the average gradient,
// whether or not backward announced its gradients.
#include "worker/gradient_exchange.h"

#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// A fence that records whether anyone waited on it, and can fail.
class ProbeFence : public CopyFence {
 public:
  explicit ProbeFence(absl::Status result = absl::OkStatus())
      : result_(std::move(result)) {}
  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    waited_ = true;
    return result_;
  }
  // True once Wait() was called, within `timeout`.
  bool WaitedWithin(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&waited_), timeout);
  }

 private:
  const absl::Status result_;
  absl::Mutex mu_;
  bool waited_ ABSL_GUARDED_BY(mu_) = false;
};

constexpr int kTensors = 3;
constexpr int kElements = 1000;

// Rank `rank`'s gradient of tensor t: sums over ranks are exact in fp32.
std::vector<float> Gradient(int rank, int t) {
  std::vector<float> g(kElements);
  for (int i = 0; i < kElements; ++i) {
    g[i] = (rank + 1) * 0.5f + t * 0.25f - i * 0.0625f;
  }
  return g;
}

// What one step must give: Adam (step `step`) on the average gradient.
std::vector<std::vector<float>> Expected(int size, int steps,
                                         const AdamOptions& adam) {
  std::vector<std::vector<float>> w(kTensors,
                                    std::vector<float>(kElements, 0.1f));
  std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
  std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
  for (int step = 1; step <= steps; ++step) {
    for (int t = 0; t < kTensors; ++t) {
      std::vector<float> average(kElements, 0.0f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> g = Gradient(r, t);
        for (int i = 0; i < kElements; ++i) average[i] += g[i];
      }
      if (size > 1) {
        for (float& x : average) x *= 1.0f / size;
      }
      AdamUpdate(adam, step, w[t].data(), average.data(), m[t].data(),
                 v[t].data(), kElements);
    }
  }
  return w;
}

TEST(AllreduceExchangeTest, BucketsStartDuringBackwardAndMatchAdam) {
  constexpr int kSize = 2;
  AdamOptions adam;
  InProcessStore store;
  std::vector<std::vector<std::vector<float>>> results(kSize);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, kSize, "127.0.0.1", &store, "exchange", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      // One tensor per bucket.
      std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
          c->get(), adam, kElements * sizeof(float), /*num_buffers=*/0);
      std::vector<std::vector<float>> w(kTensors,
                                        std::vector<float>(kElements, 0.1f));
      std::vector<std::vector<float>> g;
      std::vector<absl::Span<float>> weights;
      std::vector<absl::Span<const float>> gradients;
      for (int t = 0; t < kTensors; ++t) g.push_back(Gradient(r, t));
      for (int t = 0; t < kTensors; ++t) {
        weights.emplace_back(w[t]);
        gradients.emplace_back(g[t]);
      }
      ASSERT_TRUE(exchange->Start(weights).ok());

      // Step 1: backward announces the last tensor first; its bucket's
      // allreduce starts (the fence is waited on) before the other
      // gradients exist and before Step().
      auto first = std::make_shared<ProbeFence>();
      exchange->GradientsReady(gradients, {2}, first);
      EXPECT_TRUE(first->WaitedWithin(absl::Seconds(10)))
          << "bucket 0 did not start before the rest of backward";
      exchange->GradientsReady(gradients, {1}, nullptr);
      exchange->GradientsReady(gradients, {0}, std::make_shared<ProbeFence>());
      ASSERT_TRUE(exchange->Step(gradients, 8).ok());
      // Step 2: nothing announced; Step() exchanges everything.
      ASSERT_TRUE(exchange->Step(gradients, 8).ok());
      EXPECT_EQ(*exchange->SamplesSoFar(), 2 * 8 * kSize);
      results[r] = w;
    });
  }
  for (std::thread& t : ranks) t.join();
  const std::vector<std::vector<float>> expected = Expected(kSize, 2, adam);
  for (int r = 0; r < kSize; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      EXPECT_EQ(results[r][t], expected[t]) << "rank " << r << " tensor " << t;
    }
  }
}

TEST(AllreduceExchangeTest, FailedCopyIsStepsErrorAndMidStepExitIsPrompt) {
  InProcessStore store;
  absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
      0, 1, "127.0.0.1", &store, "one", absl::Seconds(5));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::vector<float>> w(kTensors, std::vector<float>(kElements));
  std::vector<std::vector<float>> g(kTensors, std::vector<float>(kElements));
  std::vector<absl::Span<float>> weights(w.begin(), w.end());
  std::vector<absl::Span<const float>> gradients(g.begin(), g.end());
  {
    std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
        c->get(), AdamOptions(), kElements * sizeof(float), 0);
    ASSERT_TRUE(exchange->Start(weights).ok());
    exchange->GradientsReady(
        gradients, {2},
        std::make_shared<ProbeFence>(absl::DataLossError("copy 7 failed")));
    const absl::Status s = exchange->Step(gradients, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ(s.message(), "copy 7 failed");
    // The weights were not touched.
    EXPECT_EQ(w[0], std::vector<float>(kElements, 0.0f));
  }
  // Backward fails after one layer: the exchange goes away mid-step.
  const absl::Time start = absl::Now();
  {
    std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
        c->get(), AdamOptions(), kElements * sizeof(float), 0);
    ASSERT_TRUE(exchange->Start(weights).ok());
    exchange->GradientsReady(gradients, {2}, nullptr);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace pstrain
