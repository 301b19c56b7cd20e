// The sparse allgather of top-k pairs (worker/topk_allgather.h) against an
// independent reference: each rank's k largest magnitudes per chunk (a full
// sort), rounded through the wire as the compressor feeds back, summed over
// the ranks in rank order. Ranks are threads over Gloo on loopback.
#include "worker/topk_allgather.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "worker/collective.h"
#include "worker/topk_compression.h"

namespace pstrain {
namespace {

// Two tensors of 37 and 20 elements (a bucket), chunks of 16 elements.
const std::vector<int64_t> kSizes = {37, 20};
constexpr int64_t kChunk = 16;

// Rank `rank`'s gradients of the bucket: distinct magnitudes, both signs,
// a spread of exponents (fp16 scaling and bf16 rounding both act).
std::vector<float> Gradients(int rank) {
  std::vector<float> g;
  for (int64_t n : kSizes) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = std::sin(0.7f * (i + 1) + 1.3f * rank) *
                      std::pow(2.0f, static_cast<float>((i * 5 + rank) % 9));
      g.push_back(x);
    }
  }
  return g;
}

// The reference: per chunk, the k of the largest magnitude (ties to the
// lower index), rounded through `wire` chunk by chunk, summed over ranks.
std::vector<float> Reference(int size, double ratio, DType wire) {
  std::vector<float> sum(Gradients(0).size(), 0.0f);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> g = Gradients(r);
    int64_t base = 0;
    for (int64_t n : kSizes) {
      for (int64_t offset = 0; offset < n; offset += kChunk) {
        const int64_t length = std::min(kChunk, n - offset);
        std::vector<int64_t> order(length);
        std::iota(order.begin(), order.end(), 0);
        const float* chunk = g.data() + base + offset;
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return std::fabs(chunk[a]) > std::fabs(chunk[b]);
        });
        const int64_t k = TopKCount(ratio, length);
        order.resize(k);
        std::sort(order.begin(), order.end());
        std::vector<float> values;
        for (int64_t i : order) values.push_back(chunk[i]);
        RoundThroughWire(wire, absl::MakeSpan(values));
        for (int64_t j = 0; j < k; ++j) {
          sum[base + offset + order[j]] += values[j];
        }
      }
      base += n;
    }
  }
  return sum;
}

struct RankResult {
  std::vector<float> sum;
  TopKAllgather::Traffic traffic;
};

std::vector<RankResult> RunRanks(int size, double ratio, DType wire) {
  InProcessStore store;
  std::vector<RankResult> results(size);
  std::vector<std::unique_ptr<Collective>> collectives(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, size, "127.0.0.1", &store, "topk", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      CompressionOptions options;
      options.topk_ratio = ratio;
      TopKCompressor compressor(options, kSizes, 3);
      compressor.BeginStep(0);
      TopKAllgather gather(&compressor, kChunk, wire);
      std::vector<float> flat = Gradients(r);
      const std::vector<int> tensors = {0, 1};
      absl::Status s = gather.SumBucket(**c, tensors, absl::MakeSpan(flat));
      ASSERT_TRUE(s.ok()) << s;
      results[r].sum = flat;
      results[r].traffic = gather.TakeTraffic();
      collectives[r] = *std::move(c);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(TopKAllgatherTest, EveryRankGetsTheSumOfEveryRanksSelection) {
  for (int size : {1, 2, 3}) {
    for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
      SCOPED_TRACE(::testing::Message()
                   << size << " ranks, " << WireDtypeSpelling(wire));
      const std::vector<RankResult> results = RunRanks(size, 0.2, wire);
      const std::vector<float> expected = Reference(size, 0.2, wire);
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(results[r].sum.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          // Rank order on every rank: exactly the reference's additions.
          ASSERT_EQ(results[r].sum[i], expected[i]) << "rank " << r << " " << i;
        }
      }
      // Pairs of 37 and 20 elements in chunks of 16 at 20%: k = 4, 4, 1
      // and 4, 1: 14 pairs; fp16 adds an exponent per chunk (5).
      const int64_t bytes = 14 * (4 + WireBytesPerElement(wire)) +
                            (wire == DTYPE_FLOAT16 ? 5 * 4 : 0);
      EXPECT_EQ(results[0].traffic.sent, (size - 1) * bytes);
      EXPECT_EQ(results[0].traffic.received, (size - 1) * bytes);
    }
  }
}

// Where the pairs would cost more than the ring's dense traffic (ratio 1:
// every entry a pair), the selections go through a dense fp32 allreduce:
// the same sums, the ring's bytes.
TEST(TopKAllgatherTest, DenseSelectionsGoThroughTheRing) {
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16}) {
    const std::vector<RankResult> results = RunRanks(2, 1.0, wire);
    const std::vector<float> expected = Reference(2, 1.0, wire);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].sum, expected);
    // 57 elements in fp32, 2 ranks: 2 (W - 1) / W x 228 bytes each way.
    EXPECT_EQ(results[0].traffic.sent, 228);
  }
}

}  // namespace
}  // namespace pstrain
