// The sparse allgather of top-k pairs (worker/topk_allgather.h) against an
// independent reference: each rank's k largest magnitudes per chunk (a full
// sort), rounded through the wire as the compressor feeds back, summed over
// the ranks in rank order. Ranks are threads over Gloo on loopback.
#include "worker/topk_allgather.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "absl/status/status.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "worker/collective.h"
#include "worker/topk_compression.h"

namespace pstrain {
namespace {

// A bucket: its tensors' sizes and the partition's chunk bound, both in
// elements.
struct Shape {
  std::vector<int64_t> sizes;
  int64_t chunk = 0;
  // Rank 0's largest entries every `spread` elements (gaps of several
  // varint bytes), the other ranks' anywhere; 0: every rank's anywhere.
  int64_t spread = 0;
};
// Two tensors of 37 and 20 elements, chunks of 16 elements.
const Shape kSmall = {{37, 20}, 16, 0};
// Chunks of 1024 where rank 0's selection lies 300 apart (two-byte gaps)
// and the others' close together: messages of different lengths.
const Shape kWide = {{3000, 700}, 1024, 300};

// Rank `rank`'s gradients of the bucket: distinct magnitudes, both signs,
// a spread of exponents (fp16 scaling and bf16 rounding both act).
std::vector<float> Gradients(const Shape& shape, int rank) {
  std::vector<float> g;
  for (int64_t n : shape.sizes) {
    for (int64_t i = 0; i < n; ++i) {
      float x = std::sin(0.7f * (i + 1) + 1.3f * rank) *
                std::pow(2.0f, static_cast<float>((i * 5 + rank) % 9));
      if (shape.spread > 0) {
        const bool large = rank == 0 ? i % shape.spread == 0 : i % 97 < 3;
        x = large ? x + (x < 0 ? -1000.0f : 1000.0f) : x;
      }
      g.push_back(x);
    }
  }
  return g;
}

// The tensors' gradients as SumBucket takes them: one span each, over
// `flat` (the tensors' elements one after the other).
std::vector<absl::Span<const float>> PerTensor(
    const std::vector<float>& flat, const std::vector<int64_t>& sizes) {
  std::vector<absl::Span<const float>> spans;
  int64_t at = 0;
  for (int64_t n : sizes) {
    spans.push_back(absl::MakeConstSpan(flat).subspan(at, n));
    at += n;
  }
  return spans;
}

// The reference: per chunk, the k of the largest magnitude (ties to the
// lower index), rounded through `wire` chunk by chunk, summed over ranks.
// `gap_bytes` (if not null): each rank's offsets' bytes as varint gaps
// (each chunk's first offset, then each minus the one before; a byte per
// 7 bits, at least one).
std::vector<float> Reference(const Shape& shape, int size, double ratio,
                             DType wire,
                             std::vector<int64_t>* gap_bytes = nullptr) {
  std::vector<float> sum(Gradients(shape, 0).size(), 0.0f);
  if (gap_bytes != nullptr) gap_bytes->assign(size, 0);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> g = Gradients(shape, r);
    int64_t base = 0;
    for (int64_t n : shape.sizes) {
      for (int64_t offset = 0; offset < n; offset += shape.chunk) {
        const int64_t length = std::min(shape.chunk, n - offset);
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
        int64_t before = 0;
        for (int64_t j = 0; j < k; ++j) {
          sum[base + offset + order[j]] += values[j];
          if (gap_bytes != nullptr) {
            int64_t gap = order[j] - before;
            int64_t varint = 1;
            while (gap >= 128) {
              gap >>= 7;
              ++varint;
            }
            (*gap_bytes)[r] += varint;
          }
          before = order[j];
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

std::vector<RankResult> RunRanks(const Shape& shape, int size, double ratio,
                                 DType wire) {
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
      TopKCompressor compressor(options, shape.sizes, 3);
      compressor.BeginStep(0);
      TopKAllgather gather(&compressor, shape.chunk, wire);
      // The sum in a buffer of its own, as the allreduce exchange's.
      const std::vector<float> gradients = Gradients(shape, r);
      std::vector<float> sum(gradients.size(), -1.0f);
      const std::vector<int> tensors = {0, 1};
      absl::Status s = gather.SumBucket(
          **c, tensors, PerTensor(gradients, shape.sizes), absl::MakeSpan(sum));
      ASSERT_TRUE(s.ok()) << s;
      results[r].sum = sum;
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
      const std::vector<RankResult> results = RunRanks(kSmall, size, 0.2, wire);
      std::vector<int64_t> gap_bytes;
      const std::vector<float> expected =
          Reference(kSmall, size, 0.2, wire, &gap_bytes);
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(results[r].sum.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          // Rank order on every rank: exactly the reference's additions.
          ASSERT_EQ(results[r].sum[i], expected[i]) << "rank " << r << " " << i;
        }
      }
      // Pairs of 37 and 20 elements in chunks of 16 at 20%: k = 4, 4, 1
      // and 4, 1: 14 pairs, each offset a byte (chunks of 16); fp16 adds
      // an exponent per chunk (5). Each rank sends its length (8 bytes),
      // then its message padded to the longest.
      for (int r = 0; r < size; ++r) EXPECT_EQ(gap_bytes[r], 14);
      const int64_t bytes = 8 + 14 * (1 + WireBytesPerElement(wire)) +
                            (wire == DTYPE_FLOAT16 ? 5 * 4 : 0);
      EXPECT_EQ(results[0].traffic.sent, (size - 1) * bytes);
      EXPECT_EQ(results[0].traffic.received, (size - 1) * bytes);
    }
  }
}

// Offsets go as varint gaps, a message's length depends on where its pairs
// lie, and every message is padded to the longest: rank 0's gaps of 300
// take two bytes, the others' one.
TEST(TopKAllgatherTest, MessagesOfDifferentLengthsArePaddedToTheLongest) {
  for (int size : {2, 3}) {
    for (DType wire : {DTYPE_FLOAT32, DTYPE_FLOAT16}) {
      SCOPED_TRACE(::testing::Message()
                   << size << " ranks, " << WireDtypeSpelling(wire));
      const std::vector<RankResult> results = RunRanks(kWide, size, 0.01, wire);
      std::vector<int64_t> gap_bytes;
      const std::vector<float> expected =
          Reference(kWide, size, 0.01, wire, &gap_bytes);
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(results[r].sum, expected) << "rank " << r;
      }
      ASSERT_GT(gap_bytes[0], gap_bytes[1]);
      // k: 11 in each full chunk of 1024 (1% of 1024, rounded up), 10 in
      // 952, 7 in 700: 11 x 2 + 10 + 7 = 39 pairs in 4 chunks.
      const int64_t fixed =
          39 * WireBytesPerElement(wire) + (wire == DTYPE_FLOAT16 ? 4 * 4 : 0);
      const int64_t longest =
          fixed + *std::max_element(gap_bytes.begin(), gap_bytes.end());
      EXPECT_EQ(results[0].traffic.sent, (size - 1) * (8 + longest));
      EXPECT_EQ(results[1].traffic.received, (size - 1) * (8 + longest));
    }
  }
}

// Where the pairs would cost more than the ring's dense traffic (ratio 1:
// every entry a pair), the selections go through a dense fp32 allreduce:
// the same sums, the ring's bytes. With 2 ranks that holds for fp32's
// pairs (5 bytes an entry, at least) but not bf16's (3 bytes: a byte of
// gap and 2 of value, under the ring's 4 of fp32), which go as pairs.
TEST(TopKAllgatherTest, DenseSelectionsGoThroughTheRing) {
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16}) {
    SCOPED_TRACE(WireDtypeSpelling(wire));
    const std::vector<RankResult> results = RunRanks(kSmall, 2, 1.0, wire);
    const std::vector<float> expected = Reference(kSmall, 2, 1.0, wire);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].sum, expected);
    // 57 elements: the ring's 2 (W - 1) / W x 228 bytes each way; the
    // allgather's 8 + 57 x (1 + 2).
    EXPECT_EQ(results[0].traffic.sent, wire == DTYPE_FLOAT32 ? 228 : 8 + 171);
  }
}

// Rank 0 of `size` whose peers (ranks 1 and up) each send what `craft`
// makes of rank 0's own message, and a length `length_delta` bytes off rank
// 0's: a malformed or hostile peer, or many ranks, without a network. Its
// AllreduceSum leaves the data as it is (this rank's alone).
class CraftedPeers : public Collective {
 public:
  CraftedPeers(int size, std::function<void(uint8_t*)> craft,
               int64_t length_delta)
      : Collective(0, size), craft_(std::move(craft)), delta_(length_delta) {}
  absl::Status AllreduceSum(float*, size_t) override {
    return absl::OkStatus();
  }
  absl::Status AllreduceSum16(uint16_t*, size_t, DType) override {
    return absl::OkStatus();
  }
  absl::Status AllreduceMax(float*, size_t) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(float*, size_t, int) override {
    return absl::OkStatus();
  }
  absl::Status Allgather(const void* in, size_t bytes, void* out) override {
    uint8_t* slots = static_cast<uint8_t*>(out);
    for (int r = 0; r < size(); ++r) std::memcpy(slots + r * bytes, in, bytes);
    if (!lengths_sent_) {
      // The first round: the lengths.
      lengths_sent_ = true;
      int64_t length = 0;
      std::memcpy(&length, in, 8);
      length += delta_;
      for (int r = 1; r < size(); ++r) std::memcpy(slots + 8 * r, &length, 8);
    } else {
      for (int r = 1; r < size(); ++r) craft_(slots + r * bytes);
    }
    return absl::OkStatus();
  }

 private:
  std::function<void(uint8_t*)> craft_;
  const int64_t delta_;
  bool lengths_sent_ = false;
};

struct PeerRun {
  absl::Status status;
  std::vector<float> sum;
  TopKAllgather::Traffic traffic;
};

// Rank 0's bucket of `shape` at `ratio` over `peers`.
PeerRun SumWithPeers(CraftedPeers& peers, const Shape& shape, double ratio,
                     DType wire = DTYPE_FLOAT32) {
  CompressionOptions options;
  options.topk_ratio = ratio;
  TopKCompressor compressor(options, shape.sizes, 3);
  compressor.BeginStep(0);
  TopKAllgather gather(&compressor, shape.chunk, wire);
  PeerRun run;
  run.sum = Gradients(shape, 0);
  const std::vector<int> tensors = {0, 1};
  // In the gradients' own memory (SumBucket reads them first).
  run.status = gather.SumBucket(peers, tensors, PerTensor(run.sum, shape.sizes),
                                absl::MakeSpan(run.sum));
  run.traffic = gather.TakeTraffic();
  return run;
}

absl::Status SumWithPeer(std::function<void(uint8_t*)> craft,
                         int64_t length_delta, const Shape& shape = kSmall) {
  CraftedPeers peer(2, std::move(craft), length_delta);
  return SumWithPeers(peer, shape, shape.spread > 0 ? 0.01 : 0.2).status;
}

// A gradient of another size than its tensor's, or a sum shorter than the
// bucket: INTERNAL, each named, before anything is compressed or sent.
TEST(TopKAllgatherTest, GradientsOfAnotherShapeAreInternalErrors) {
  CompressionOptions options;
  options.topk_ratio = 0.1;
  TopKCompressor compressor(options, kSmall.sizes, 3);
  compressor.BeginStep(0);
  TopKAllgather gather(&compressor, kSmall.chunk, DTYPE_FLOAT32);
  CraftedPeers peers(
      2, [](uint8_t*) {}, 0);
  std::vector<float> g = Gradients(kSmall, 0);
  std::vector<float> sum(g.size());
  std::vector<absl::Span<const float>> spans = PerTensor(g, kSmall.sizes);
  spans[1] = spans[1].first(19);
  absl::Status s = gather.SumBucket(peers, {0, 1}, spans, absl::MakeSpan(sum));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("tensor 1 has 20 elements; its gradient 19"),
            absl::string_view::npos)
      << s;
  s = gather.SumBucket(peers, {0, 1}, PerTensor(g, kSmall.sizes),
                       absl::MakeSpan(sum).first(56));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("57 elements; the sum holds 56"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(gather.TakeTraffic().sent, 0);
}

// A peer's message is checked before it is summed: its length against its
// pairs' bounds (the values' bytes and 1 to 5 bytes an offset), each gap
// after a chunk's first at least 1 (offsets strictly ascending), each
// offset inside its chunk. kSmall's 14 pairs in fp32: 56 bytes of values,
// then 14 one-byte gaps.
TEST(TopKAllgatherTest, MalformedPeerMessagesAreInternalErrors) {
  EXPECT_TRUE(SumWithPeer([](uint8_t*) {}, 0).ok());
  absl::Status s = SumWithPeer([](uint8_t*) {}, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "top-k allgather: rank 1 sent a message of 69 bytes; expected 70 "
            "to 126 for its 14 pairs");
  s = SumWithPeer([](uint8_t*) {}, 57);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  // Chunk 0's second gap 0: a repeated offset.
  s = SumWithPeer([](uint8_t* m) { m[57] = 0; }, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "top-k allgather: rank 1 sent a truncated or repeated offset in "
            "chunk 0");
  // Chunk 0's first offset 100, in a chunk of 16.
  s = SumWithPeer([](uint8_t* m) { m[56] = 100; }, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "top-k allgather: rank 1 sent offset 100 in a chunk of 16 "
            "elements");
  // The last gap a varint that goes on past the message: truncated.
  s = SumWithPeer([](uint8_t* m) { m[69] = 0x80; }, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "top-k allgather: rank 1 sent a truncated or repeated offset in "
            "chunk 4");
  // A peer one byte shorter than rank 0 (kWide: rank 0's gaps of 300 take
  // two bytes), its region padded with rank 0's bytes: its own length
  // bounds the read, so its last varint is cut off.
  s = SumWithPeer([](uint8_t*) {}, -1, kWide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "top-k allgather: rank 1 sent a truncated or repeated offset in "
            "chunk 3");
}

// The dense fallback decided after the lengths' round: with 100 ranks whose
// pairs take a byte an offset (kWide's 39 pairs in fp32: 156 + 39 bytes, x
// 100 < 2 x 14,800) but whose longest message takes five (156 + 195 bytes,
// x 100 >= 29,600), every rank goes to the ring. The fake's ring leaves
// this rank's selection, so the bucket holds it alone.
TEST(TopKAllgatherTest, TheLongestMessageDecidesTheDenseFallback) {
  const int64_t fixed = 39 * 4;
  for (const int64_t longest : {fixed + 39 * 2, fixed + 39 * 5}) {
    SCOPED_TRACE(::testing::Message() << "longest " << longest << " bytes");
    // Rank 0's own message, for its length.
    CraftedPeers probe(
        2, [](uint8_t*) {}, 0);
    const PeerRun own = SumWithPeers(probe, kWide, 0.01);
    ASSERT_TRUE(own.status.ok()) << own.status;
    const int64_t own_bytes = own.traffic.sent - 8;
    CraftedPeers wide(
        100, [](uint8_t*) {}, longest - own_bytes);
    const PeerRun run = SumWithPeers(wide, kWide, 0.01);
    const bool dense = 100 * longest >= 2 * 4 * 3700;
    if (dense) {
      ASSERT_TRUE(run.status.ok()) << run.status;
      EXPECT_EQ(run.sum, Reference(kWide, 1, 0.01, DTYPE_FLOAT32));
      EXPECT_EQ(run.traffic.sent, 99 * 8 + 2 * 99 * 4 * 3700 / 100);
    } else {
      // The allgather: each peer a copy of rank 0's pairs, padded.
      ASSERT_TRUE(run.status.ok()) << run.status;
      EXPECT_EQ(run.traffic.sent, 99 * 8 + 99 * longest);
    }
  }
}

// One TopKAllgather sums bucket after bucket, its scratch reused: a wide
// bucket of many pairs, then a small one of fewer, each its reference.
TEST(TopKAllgatherTest, BucketAfterBucketEachItsOwnSum) {
  InProcessStore store;
  const std::vector<int64_t> sizes = {3000, 700, 37, 20};
  constexpr int64_t kChunk = 64;
  const Shape wide = {{3000, 700}, kChunk, 300};
  const Shape small = {{37, 20}, kChunk, 0};
  std::vector<std::vector<float>> sums(2 * 2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, 2, "127.0.0.1", &store, "buckets", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      CompressionOptions options;
      options.topk_ratio = 0.05;
      TopKCompressor compressor(options, sizes, 3);
      compressor.BeginStep(0);
      TopKAllgather gather(&compressor, kChunk, DTYPE_FLOAT16);
      std::vector<float> first = Gradients(wide, r);
      ASSERT_TRUE(gather
                      .SumBucket(**c, {0, 1}, PerTensor(first, wide.sizes),
                                 absl::MakeSpan(first))
                      .ok());
      std::vector<float> second = Gradients(small, r);
      ASSERT_TRUE(gather
                      .SumBucket(**c, {2, 3}, PerTensor(second, small.sizes),
                                 absl::MakeSpan(second))
                      .ok());
      sums[2 * r] = first;
      sums[2 * r + 1] = second;
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<float> wide_sum = Reference(wide, 2, 0.05, DTYPE_FLOAT16);
  const std::vector<float> small_sum = Reference(small, 2, 0.05, DTYPE_FLOAT16);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[2 * r], wide_sum) << "rank " << r;
    EXPECT_EQ(sums[2 * r + 1], small_sum) << "rank " << r;
  }
}

}  // namespace
}  // namespace pstrain
