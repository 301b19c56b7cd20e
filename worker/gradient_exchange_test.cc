// Both exchanges: communication starts during backward (before Step()):
// the allreduce's buckets, the PS's pushes (and, sync, the pulls of chunks
// every worker has pushed); the weights after a step equal Adam applied to
// the average gradient, whether or not backward announced its gradients.
#include "worker/gradient_exchange.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_server.h"
#include "common/partition.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "server/row_sparse.h"
#include "worker/checkpoint.h"
#include "worker/partition_tuner.h"

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

// What steps must give: the optimizer's update number `step` (Adam by
// default) on the average gradient of ranks 0 to sizes[step - 1] - 1.
std::vector<std::vector<float>> ExpectedOver(const std::vector<int>& sizes,
                                             const OptimizerOptions& adam) {
  std::vector<std::vector<float>> w(kTensors,
                                    std::vector<float>(kElements, 0.1f));
  std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
  std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
  for (int step = 1; step <= static_cast<int>(sizes.size()); ++step) {
    const int size = sizes[step - 1];
    for (int t = 0; t < kTensors; ++t) {
      std::vector<float> average(kElements, 0.0f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> g = Gradient(r, t);
        for (int i = 0; i < kElements; ++i) average[i] += g[i];
      }
      if (size > 1) {
        for (float& x : average) x *= 1.0f / size;
      }
      OptimizerUpdate(adam, step, w[t].data(), average.data(), m[t].data(),
                      v[t].data(), kElements);
    }
  }
  return w;
}

// The same with top-k compression at `ratio` (one chunk per tensor): each
// member's own compressor (a joining worker's from zeros at its first
// step), the members' selections summed in rank order, as the allreduce
// exchange's sparse allgather sums them (worker/topk_allgather.h).
std::vector<std::vector<float>> ExpectedTopKOver(const std::vector<int>& sizes,
                                                 const OptimizerOptions& adam,
                                                 double ratio) {
  std::vector<std::vector<float>> w(kTensors,
                                    std::vector<float>(kElements, 0.1f));
  std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
  std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
  CompressionOptions options;
  options.topk_ratio = ratio;
  std::vector<std::unique_ptr<TopKCompressor>> compressors;
  std::vector<uint32_t> indices;
  std::vector<float> values;
  for (int step = 1; step <= static_cast<int>(sizes.size()); ++step) {
    const int size = sizes[step - 1];
    while (static_cast<int>(compressors.size()) < size) {
      compressors.push_back(std::make_unique<TopKCompressor>(
          options, std::vector<int64_t>(kTensors, kElements), 3));
    }
    for (int r = 0; r < size; ++r) compressors[r]->BeginStep(step - 1);
    for (int t = 0; t < kTensors; ++t) {
      std::vector<float> average(kElements, 0.0f);
      for (int r = 0; r < size; ++r) {
        compressors[r]->Compress(t, 0, Gradient(r, t), &indices, &values);
        for (size_t i = 0; i < indices.size(); ++i) {
          average[indices[i]] += values[i];
        }
      }
      if (size > 1) {
        for (float& x : average) x *= 1.0f / size;
      }
      OptimizerUpdate(adam, step, w[t].data(), average.data(), m[t].data(),
                      v[t].data(), kElements);
    }
    for (int r = 0; r < size; ++r) compressors[r]->CommitStep(step - 1);
  }
  return w;
}

// The same with `size` ranks at every step.
std::vector<std::vector<float>> Expected(int size, int steps,
                                         const OptimizerOptions& adam) {
  return ExpectedOver(std::vector<int>(steps, size), adam);
}

// SGD with Nesterov momentum and weight decay under a warmup + cosine
// schedule (issue 25): the lr changes every step and the momentum buffer
// carries over, so a step applied twice, skipped, or at another step's lr
// would show.
OptimizerOptions NesterovCosine() {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.nesterov = true;
  o.weight_decay = 1e-3f;
  o.schedule.decay = LrDecay::kCosine;
  o.schedule.warmup_steps = 2;
  o.schedule.warmup_start_factor = 0.1;
  o.schedule.total_steps = 6;
  o.schedule.min_lr = 0.001;
  return o;
}

// Rank `rank`'s weights (all 0.1) and gradients (Gradient()), with the
// spans an exchange takes over them. Not movable: the spans point inside.
struct RankTensors {
  explicit RankTensors(int rank)
      : w(kTensors, std::vector<float>(kElements, 0.1f)) {
    for (int t = 0; t < kTensors; ++t) g.push_back(Gradient(rank, t));
    for (int t = 0; t < kTensors; ++t) {
      weights.emplace_back(w[t]);
      gradients.emplace_back(g[t]);
    }
  }
  RankTensors(const RankTensors&) = delete;
  RankTensors& operator=(const RankTensors&) = delete;

  std::vector<std::vector<float>> w;
  std::vector<std::vector<float>> g;
  std::vector<absl::Span<float>> weights;
  std::vector<absl::Span<const float>> gradients;
};

// `size` ranks (threads) over Gloo in one allreduce exchange each (one
// tensor per bucket; `optimizer`, clipping by global norm at `clip`, 0:
// none) run `steps` steps of Gradient(): each rank's weights after them.
std::vector<std::vector<std::vector<float>>> TrainWithAllreduce(
    int size, const OptimizerOptions& optimizer, int steps, double clip,
    const std::string& store_prefix, DType wire_dtype = DTYPE_FLOAT32,
    int num_buffers = 0, int64_t bucket_bytes = kElements * sizeof(float)) {
  InProcessStore store;
  std::vector<std::vector<std::vector<float>>> results(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, size, "127.0.0.1", &store, store_prefix, absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
          c->get(), optimizer, bucket_bytes, num_buffers, clip, wire_dtype);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < steps; ++step) {
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
      }
      results[r] = tensors.w;
    });
  }
  for (std::thread& t : ranks) t.join();
  return results;
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
      RankTensors tensors(r);
      const std::vector<std::vector<float>>& w = tensors.w;
      const std::vector<absl::Span<float>>& weights = tensors.weights;
      const std::vector<absl::Span<const float>>& gradients = tensors.gradients;
      ASSERT_TRUE(exchange->Start(weights).ok());

      // Step 1: backward announces the last tensor first; its bucket's
      // allreduce starts (the fence is waited on) before the other
      // gradients exist and before Step().
      auto first = std::make_shared<ProbeFence>();
      exchange->GradientsReady(gradients, 8, {2}, first);
      EXPECT_TRUE(first->WaitedWithin(absl::Seconds(10)))
          << "bucket 0 did not start before the rest of backward";
      exchange->GradientsReady(gradients, 8, {1}, nullptr);
      exchange->GradientsReady(gradients, 8, {0},
                               std::make_shared<ProbeFence>());
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

// A 16-bit allreduce (--wire_dtype with mode allreduce): two ranks, SGD
// with momentum, three steps; tensor 2 a buffer (BatchNorm's running
// statistics: fp32, averaged) sharing a bucket with tensor 1, tensor 0 in a
// bucket of its own. The weights equal, bit for bit, the optimizer on the
// average PyTorch DDP's bf16_compress_hook/fp16_compress_hook would take: each
// rank's gradient halved in fp32, rounded (fp16: scaled first by the power of
// two common/wire_dtype.h picks for twice the bucket's largest halved gradient
// over both ranks), the two summed in fp32 and rounded again, widened (and
// unscaled), then the optimizer.
TEST(AllreduceExchangeTest, SixteenBitAllreduceIsTheCompressHooksAverage) {
  constexpr int kSize = 2;
  constexpr int kSteps = 3;
  // SGD with momentum: the step follows the gradient's rounding (Adam's
  // m / sqrt(v) of a constant gradient would hide it).
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.01f;
  sgd.momentum = 0.9f;
  for (DType dtype : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    SCOPED_TRACE(DType_Name(dtype));
    const bool bf16 = dtype == DTYPE_BFLOAT16;
    // Buckets of two tensors' bytes, last tensor first: {2, 1}, {0}.
    const std::vector<std::vector<std::vector<float>>> results =
        TrainWithAllreduce(kSize, sgd, kSteps, /*clip=*/0,
                           absl::StrCat("wire16_", DType_Name(dtype)), dtype,
                           /*num_buffers=*/1, 2 * kElements * sizeof(float));
    std::vector<std::vector<float>> average(kTensors);
    for (const std::vector<int>& params :
         {std::vector<int>{1}, std::vector<int>{0}}) {
      float largest = 0;
      for (int r = 0; r < kSize; ++r) {
        for (int t : params) {
          for (float g : Gradient(r, t)) {
            largest = std::max(largest, std::fabs(g * 0.5f));
          }
        }
      }
      // The bound on a partial sum: the ranks times the largest.
      const float bound = largest * kSize;
      const int e = bf16 ? 0 : ScaleExponent(absl::MakeConstSpan(&bound, 1));
      for (int t : params) {
        std::vector<uint16_t> h0(kElements), h1(kElements), sum(kElements);
        std::vector<float> g0 = Gradient(0, t), g1 = Gradient(1, t);
        for (int i = 0; i < kElements; ++i) {
          g0[i] *= 0.5f;
          g1[i] *= 0.5f;
        }
        EncodeHalves(g0, dtype, e, h0.data());
        EncodeHalves(g1, dtype, e, h1.data());
        for (int i = 0; i < kElements; ++i) {
          sum[i] = bf16 ? FloatToBfloat16(Bfloat16ToFloat(h0[i]) +
                                          Bfloat16ToFloat(h1[i]))
                        : FloatToFloat16(Float16ToFloat(h0[i]) +
                                         Float16ToFloat(h1[i]));
        }
        average[t].resize(kElements);
        DecodeHalves(sum.data(), dtype, e, absl::MakeSpan(average[t]));
      }
    }
    std::vector<std::vector<float>> w(kTensors,
                                      std::vector<float>(kElements, 0.1f));
    std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
    std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
    for (int step = 1; step <= kSteps; ++step) {
      for (int t = 0; t < 2; ++t) {
        OptimizerUpdate(sgd, step, w[t].data(), average[t].data(), m[t].data(),
                        v[t].data(), kElements);
      }
    }
    // The buffer: the fp32 average, copied.
    for (int i = 0; i < kElements; ++i) {
      w[2][i] = (Gradient(0, 2)[i] + Gradient(1, 2)[i]) * 0.5f;
    }
    for (int r = 0; r < kSize; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[r][t], w[t]) << "rank " << r << " tensor " << t;
      }
    }
    const std::vector<std::vector<std::vector<float>>> fp32 =
        TrainWithAllreduce(kSize, sgd, kSteps, 0,
                           absl::StrCat("wire32_", DType_Name(dtype)),
                           DTYPE_FLOAT32, 1, 2 * kElements * sizeof(float));
    // bf16 rounds these gradients; fp16, scaled per bucket, holds them
    // (halved: multiples of 1/32 below 32, 10 significant bits at most)
    // and their sums exactly, so its job is the fp32 one.
    if (bf16) {
      EXPECT_NE(fp32[0][0], results[0][0]);
    } else {
      EXPECT_EQ(fp32[0][0], results[0][0]);
    }
    EXPECT_EQ(fp32[0][2], results[0][2]);
  }
}

// fp16's scale bounds every partial sum of the ring: three ranks pushing
// the same gradient 1 (each 1/3 after the division) sum to 1 without
// overflowing (a scale from the largest single value, 1/3 at 21845.3,
// would put the sum at 65536, past fp16's 65504: an infinity, a skipped
// step), so one SGD step with lr 1 takes every weight from 0.1 to -0.9.
TEST(AllreduceExchangeTest, Fp16AllreduceScaleLeavesRoomForTheSum) {
  constexpr int kSize = 3;
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 1.0f;
  InProcessStore store;
  std::vector<std::vector<float>> results(kSize);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, kSize, "127.0.0.1", &store, "fp16_room", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
          c->get(), sgd, kElements * sizeof(float), /*num_buffers=*/0,
          /*clip_grad_norm=*/0, DTYPE_FLOAT16);
      std::vector<float> w(kElements, 0.1f), g(kElements, 1.0f);
      ASSERT_TRUE(exchange->Start({absl::MakeSpan(w)}).ok());
      ASSERT_TRUE(exchange->Step({absl::MakeConstSpan(g)}, 8).ok());
      EXPECT_FALSE(exchange->SkippedStep().has_value());
      results[r] = w;
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(results[r], std::vector<float>(kElements, 0.1f - 1.0f)) << r;
  }
}

// Gradient clipping by global norm (issue 25): one SGD step of two Gloo
// ranks with clip_grad_norm 5 gives PyTorch's weights
// (testdata/gen_clip_fixture.py: clip_grad_norm_ on the averaged gradients,
// norm 1927.7, then torch.optim.SGD lr 0.1), within 1e-7 (the norm is
// summed in double here, in fp32 per tensor there).
// testdata/clip_fixture.txt (testdata/gen_clip_fixture.py, PyTorch 1.13): the
// weights after one step of SGD (lr 0.1) on the average of ranks 0 and 1's
// Gradient() under torch.nn.utils.clip_grad_norm_(params, 5.0).
void ReadClipFixture(std::vector<std::vector<float>>* expected) {
  std::ifstream file("testdata/clip_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/clip_fixture.txt";
  std::string word;
  double norm = 0;
  file >> word >> norm;
  ASSERT_EQ(word, "total_norm");
  expected->assign(kTensors, std::vector<float>(kElements));
  int t = 0, i = 0, lines = 0;
  float value = 0;
  while (file >> word >> t >> i >> value) {
    ASSERT_EQ(word, "weights");
    ASSERT_TRUE(t >= 0 && t < kTensors && i >= 0 && i < kElements);
    (*expected)[t][i] = value;
    ++lines;
  }
  ASSERT_EQ(lines, kTensors * kElements);
  ASSERT_GT(norm, 5.0);  // so the clipping acts
}

TEST(AllreduceExchangeTest, ClipsByGlobalNormAsPyTorch) {
  std::vector<std::vector<float>> expected;
  ASSERT_NO_FATAL_FAILURE(ReadClipFixture(&expected));
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.1f;
  constexpr int kSize = 2;
  // One tensor per bucket: the norm spans buckets.
  const std::vector<std::vector<std::vector<float>>> results =
      TrainWithAllreduce(kSize, sgd, /*steps=*/1, /*clip=*/5.0, "clip");
  for (int r = 0; r < kSize; ++r) {
    ASSERT_EQ(results[r].size(), static_cast<size_t>(kTensors));
    for (int k = 0; k < kTensors; ++k) {
      for (int e = 0; e < kElements; ++e) {
        ASSERT_NEAR(results[r][k][e], expected[k][e], 1e-7)
            << "rank " << r << " tensor " << k << " element " << e;
      }
    }
  }
  // Unclipped, the step would have moved element 999 of tensor 0 to
  // 0.1 - 0.1 * (-61.6875) = 6.27, not about 0.116.
  const float average = (Gradient(0, 0)[999] + Gradient(1, 0)[999]) / 2;
  EXPECT_GT(std::fabs(0.1f - 0.1f * average - expected[0][999]), 5.0f);
}

// A row-sparse table in mode allreduce (AllreduceRows): tensor 0 as a
// table of 100 rows of 10, each rank's gradient zero off the rows its batch
// touched (`touched[rank]`, SetStepRows), two Adam steps over the wire
// dtype `wire`. Each rank's table after them, and the step's bytes sent.
//
// Both Adam and SGD: Adam's steps on a constant gradient are close to lr x
// its sign whatever the gradient's rounding, so only SGD's (w - lr g,
// linear in g) shows a wire's rounding in the weights.
constexpr int64_t kRowElements = 10;

std::vector<float> TableGradient(const std::vector<uint32_t>& touched,
                                 int rank) {
  const std::vector<float> g = Gradient(rank, 0);
  std::vector<float> masked(kElements, 0.0f);
  for (uint32_t row : touched) {
    for (int64_t j = 0; j < kRowElements; ++j) {
      // Multiples of 1/64 under 2^8: fp32 sums them exactly in any order.
      masked[row * kRowElements + j] =
          g[row * kRowElements + j] * (1 + 0.25f * j);
    }
  }
  return masked;
}

struct RowRun {
  std::vector<std::vector<float>> tables;
  int64_t bytes_sent = 0;
};

RowRun RunRowTable(const std::vector<std::vector<uint32_t>>& touched,
                   DType wire, const OptimizerOptions& optimizer) {
  const int size = static_cast<int>(touched.size());
  InProcessStore store;
  RowRun run;
  run.tables.resize(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, size, "127.0.0.1", &store, "rows", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      AllreduceRows rows;
      rows.row_elements = {kRowElements, 0, 0};
      rows.partition_bytes = 4 * kRowElements * 4;
      std::unique_ptr<GradientExchange> exchange = CreateAllreduceExchange(
          c->get(), optimizer, kElements * sizeof(float), 0, 0, wire,
          std::nullopt, {}, rows);
      RankTensors tensors(r);
      // In place: the exchange's spans point into g[0].
      const std::vector<float> table = TableGradient(touched[r], r);
      std::copy(table.begin(), table.end(), tensors.g[0].begin());
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<uint32_t>> step_rows(kTensors);
        step_rows[0] = touched[r];
        exchange->SetStepRows(step_rows, {}, false);
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
      }
      run.tables[r] = tensors.w[0];
      if (r == 0) {
        run.bytes_sent = exchange->LastStepTimes().bytes_pushed.value_or(-1);
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  return run;
}

// The reference: `optimizer`'s row update (server/row_sparse.h
// LazyUpdateRows, the shards': lazy Adam, SGD) of the average on the union
// of the ranks' rows: each
// rank's rows encoded chunk by chunk of 4 rows (partition_bytes 160) as
// RoundThroughWire rounds them, summed in rank order, times 1 / W.
std::vector<float> LazyRowReference(
    const std::vector<std::vector<uint32_t>>& touched, DType wire,
    const OptimizerOptions& optimizer) {
  const int size = static_cast<int>(touched.size());
  const int64_t d = kRowElements;
  std::vector<float> w(kElements, 0.1f), m(kElements), v(kElements);
  std::vector<uint32_t> all;
  for (const std::vector<uint32_t>& mine : touched) {
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  for (int step = 1; step <= 2; ++step) {
    std::vector<float> sum(kElements, 0.0f);
    for (int r = 0; r < size; ++r) {
      const std::vector<uint32_t>& mine = touched[r];
      const std::vector<float> g = TableGradient(mine, r);
      // Chunks of 4 rows: rows 0-3, 4-7, ...
      for (size_t k = 0; k < mine.size();) {
        size_t e = k + 1;
        while (e < mine.size() && mine[e] / 4 == mine[k] / 4) ++e;
        std::vector<float> chunk;
        for (size_t i = k; i < e; ++i) {
          chunk.insert(chunk.end(), g.begin() + mine[i] * d,
                       g.begin() + (mine[i] + 1) * d);
        }
        RoundThroughWire(wire, absl::MakeSpan(chunk));
        for (size_t i = k; i < e; ++i) {
          for (int64_t j = 0; j < d; ++j) {
            sum[mine[i] * d + j] += chunk[(i - k) * d + j];
          }
        }
        k = e;
      }
    }
    RowValues grad;
    grad.rows = all;
    const float inverse = 1.0f / static_cast<float>(size);
    for (uint32_t row : all) {
      for (int64_t j = 0; j < d; ++j) {
        grad.values.push_back(sum[row * d + j] * inverse);
      }
    }
    RowUndo undo;
    EXPECT_TRUE(LazyUpdateRows(optimizer, step, step - 1, d, kElements / d,
                               grad, w.data(), m.data(), v.data(), &undo));
  }
  return w;
}

std::vector<OptimizerOptions> AdamAndSgd() {
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.01f;
  return {OptimizerOptions(), sgd};
}

// Two ranks, a few rows each, every wire dtype: the rows go in the
// allgather, and the table equals the reference bit for bit; the rows no
// rank touched keep their weights exactly.
TEST(AllreduceExchangeTest, RowTablesGoAsTheirRowsAndUpdateLazily) {
  const std::vector<std::vector<uint32_t>> touched = {{1, 2, 5, 7, 50},
                                                      {5, 8, 9, 99}};
  for (const OptimizerOptions& optimizer : AdamAndSgd()) {
    for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
      SCOPED_TRACE(::testing::Message() << WireDtypeSpelling(wire) << ", "
                                        << OptimizerName(optimizer.kind));
      const RowRun run = RunRowTable(touched, wire, optimizer);
      const std::vector<float> w = LazyRowReference(touched, wire, optimizer);
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < kElements; ++i) {
          ASSERT_EQ(run.tables[r][i], w[i])
              << "rank " << r << ", element " << i;
        }
      }
      EXPECT_EQ(run.tables[0][0], 0.1f) << "row 0, touched by no rank, moved";
      EXPECT_NE(run.tables[0][5 * kRowElements], 0.1f);
    }
  }
}

// Where one rank touches 98 of the 100 rows, the rows would cost more than
// the ring: fp32 with 3 ranks (3 x 98 rows x 40 bytes >= 2 x 4,000), fp16
// with 4 (4 x 98 x (4 + 20) >= 8,000). The ids go alone and the rows as a
// dense ring allreduce of each rank's rows, rounded through the wire chunk
// by chunk as the allgather would send them: the same table (the rounded
// values, multiples of 1/64 under 2^8, sum exactly in any order), the rows
// no rank touched still untouched, and in fp32 the ring's bytes, fewer
// than the allgather's 2 x (8 + 98 x 44).
TEST(AllreduceExchangeTest, RowTablesTouchedAlmostWholeGoThroughTheRing) {
  for (const OptimizerOptions& optimizer : AdamAndSgd()) {
    for (const auto& [wire, size] :
         {std::pair{DTYPE_FLOAT32, 3}, std::pair{DTYPE_FLOAT16, 4}}) {
      SCOPED_TRACE(::testing::Message()
                   << WireDtypeSpelling(wire) << ", " << size << " ranks, "
                   << OptimizerName(optimizer.kind));
      std::vector<std::vector<uint32_t>> touched(size);
      for (uint32_t row = 0; row < 100; ++row) {
        if (row != 0 && row != 20) touched[0].push_back(row);
        if (row >= 40 && row < 90) touched[2].push_back(row);
      }
      touched[1] = {5, 10, 99};
      if (size > 3) touched[3] = {2, 4, 6, 99};
      const RowRun run = RunRowTable(touched, wire, optimizer);
      const std::vector<float> w = LazyRowReference(touched, wire, optimizer);
      for (int r = 0; r < size; ++r) {
        for (int i = 0; i < kElements; ++i) {
          ASSERT_EQ(run.tables[r][i], w[i])
              << "rank " << r << ", element " << i;
        }
      }
      EXPECT_EQ(run.tables[1][20 * kRowElements + 3], 0.1f);
      if (wire != DTYPE_FLOAT32) continue;
      // The step's bytes: the table's counts (2 x 8), ids (2 x 98 x 4) and
      // ring (2 x 2 / 3 x 4,000), and the two dense tensors' rings (each 2
      // x 2 / 3 x 4,000).
      const int64_t ring = 2 * 2 * 4000 / 3;
      EXPECT_EQ(run.bytes_sent, 2 * 8 + 2 * 98 * 4 + 3 * ring);
      EXPECT_LT(run.bytes_sent - 2 * ring, 2 * (8 + 98 * 44));
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
        gradients, 1, {2},
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
    exchange->GradientsReady(gradients, 8, {2}, nullptr);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// An elastic allreduce job's worlds (issue 40), ranks as threads: two
// ranks train 2 steps; worker 0 proposes a membership with worker 2 at
// the boundary, all agree and move to its world, where worker 2 (started
// with it) receives rank 0's state; 3 ranks train 2 steps; worker 2 then
// dies in step 4 after its first bucket was averaged (ranks 0 and 1
// updated tensor 2 of that step), and ranks 0 and 1 undo it and meet in
// the next world, training one more step. Every rank's weights equal the
// optimizer's on the members' average at each step, bit for bit, and the
// joining worker starts at rank 0's step and data position. With top-k
// (`topk_ratio` > 0; worker/topk_allgather.h) the same, each worker with
// its own residuals: the joining worker's start at zeros, the survivors'
// step undone was not committed (they redo it from the residual before
// it), so the weights equal ExpectedTopKOver's.
void ElasticWorldScenario(double topk_ratio) {
  InProcessStore store;
  const AdamOptions adam;
  auto world = [](std::vector<int> workers, int64_t epoch) {
    WorkerMembership m;
    m.workers = std::move(workers);
    m.epoch = epoch;
    return m;
  };
  auto exchange_of = [&](int worker, const WorkerMembership& start) {
    ElasticWorld elastic;
    elastic.connect = [&store](int rank, int size, int64_t epoch,
                               absl::Duration timeout) {
      return Collective::CreateGloo(rank, size, "127.0.0.1", &store,
                                    absl::StrCat("elastic-m", epoch), timeout);
    };
    elastic.worker_id = worker;
    elastic.start = start;
    elastic.initial_workers = 2;
    elastic.timeout = absl::Seconds(20);
    ExchangeCompression compression;
    if (topk_ratio > 0) {
      CompressionOptions options;
      options.topk_ratio = topk_ratio;
      compression.compressor = std::make_unique<TopKCompressor>(
          options, std::vector<int64_t>(kTensors, kElements), 3);
      compression.worker_id = worker;
      compression.partition_bytes = kElements * sizeof(float);
    }
    std::unique_ptr<GradientExchange> exchange =
        CreateAllreduceExchange(nullptr, adam, kElements * sizeof(float), 0, 0,
                                DTYPE_FLOAT32, elastic, std::move(compression));
    // Rank 0's data position of a step (ElasticMembership's, here made up).
    exchange->set_restore_membership([](int64_t step) {
      WorkerMembership at;
      at.data_offset = step * 100;
      at.data_steps = step;
      return at;
    });
    return exchange;
  };
  // At each boundary: worker 0's proposal (the others pass none).
  auto agree = [](GradientExchange& exchange, int worker,
                  const std::optional<WorkerMembership>& proposal) {
    absl::StatusOr<std::optional<WorkerMembership>> agreed =
        exchange.AgreeMembership(worker == 0 ? proposal : std::nullopt);
    EXPECT_TRUE(agreed.ok()) << agreed.status();
    return agreed.ok() ? *agreed : std::nullopt;
  };
  std::vector<std::vector<std::vector<float>>> results(3);
  std::vector<std::vector<float>> partial(2);
  // fp16 precision's loss scalers: worker 0's state goes with its weights
  // to every new world (the others start from the defaults).
  std::vector<LossScaler> scalers(3);
  scalers[0].Restore({1024.0f, 7});
  auto expect_worker_0s_scale = [](const LossScaler& scaler) {
    EXPECT_EQ(scaler.state().scale, 1024.0f);
    EXPECT_EQ(scaler.state().growth_tracker, 7);
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          exchange_of(r, world({0, 1}, 0));
      exchange->set_loss_scaler(&scalers[r]);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < 2; ++step) {
        EXPECT_FALSE(agree(*exchange, r, std::nullopt).has_value());
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
      }
      WorkerMembership grow = world({0, 1, 2}, 1);
      grow.from_step = 2;
      const std::optional<WorkerMembership> agreed = agree(*exchange, r, grow);
      ASSERT_TRUE(agreed.has_value());
      EXPECT_EQ(agreed->workers, grow.workers);
      EXPECT_EQ(agreed->from_step, 2);
      EXPECT_EQ(*exchange->ChangeWorld(*agreed, false, absl::Seconds(20)), 2);
      for (int step = 2; step < 4; ++step) {
        EXPECT_FALSE(agree(*exchange, r, std::nullopt).has_value());
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
      }
      EXPECT_FALSE(agree(*exchange, r, std::nullopt).has_value());
      const std::vector<float> before = tensors.w[2];
      EXPECT_FALSE(exchange->Step(tensors.gradients, 8).ok());
      partial[r] = tensors.w[2];
      EXPECT_NE(partial[r], before) << "tensor 2 was not updated first";
      // Worker 2 removed: the survivors' world, with rank 0's state.
      absl::StatusOr<int64_t> step =
          exchange->ChangeWorld(world({0, 1}, 2), true, absl::Seconds(20));
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_EQ(*step, 4);
      EXPECT_EQ(tensors.w[2], before);
      EXPECT_FALSE(agree(*exchange, r, std::nullopt).has_value());
      ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
      EXPECT_EQ(*exchange->SamplesSoFar(), (2 * 2 + 3 * 2 + 2) * 8);
      expect_worker_0s_scale(scalers[r]);
      results[r] = tensors.w;
    });
  }
  ranks.emplace_back([&] {
    std::unique_ptr<GradientExchange> exchange =
        exchange_of(2, world({0, 1, 2}, 1));
    exchange->set_loss_scaler(&scalers[2]);
    RankTensors tensors(2);
    ASSERT_TRUE(exchange->Start(tensors.weights).ok());
    expect_worker_0s_scale(scalers[2]);
    const std::optional<WorkerMembership> joined = exchange->membership();
    ASSERT_TRUE(joined.has_value());
    EXPECT_EQ(joined->from_step, 2);
    EXPECT_EQ(joined->data_offset, 200);
    EXPECT_EQ(joined->data_steps, 2);
    EXPECT_EQ(*exchange->SamplesSoFar(), 2 * 2 * 8);
    for (int step = 2; step < 4; ++step) {
      EXPECT_FALSE(agree(*exchange, 2, std::nullopt).has_value());
      ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
    }
    results[2] = tensors.w;
    // Step 4: its last bucket's gradient only, then it dies (the exchange
    // and its collective go away once that bucket is averaged).
    EXPECT_FALSE(agree(*exchange, 2, std::nullopt).has_value());
    exchange->GradientsReady(tensors.gradients, 8, {2}, nullptr);
    absl::SleepFor(absl::Milliseconds(500));
  });
  for (std::thread& t : ranks) t.join();
  auto expected_over = [&](const std::vector<int>& sizes) {
    return topk_ratio > 0 ? ExpectedTopKOver(sizes, adam, topk_ratio)
                          : ExpectedOver(sizes, adam);
  };
  const std::vector<std::vector<float>> at_death = expected_over({2, 2, 3, 3});
  const std::vector<std::vector<float>> expected =
      expected_over({2, 2, 3, 3, 2});
  for (int t = 0; t < kTensors; ++t) {
    EXPECT_EQ(results[0][t], expected[t]) << "tensor " << t;
    EXPECT_EQ(results[1][t], expected[t]) << "tensor " << t;
    EXPECT_EQ(results[2][t], at_death[t]) << "tensor " << t;
  }
  // What ranks 0 and 1 held before the undo: step 4's update of tensor 2
  // with worker 2's gradient in it.
  EXPECT_EQ(partial[0], expected_over({2, 2, 3, 3, 3})[2]);
  if (topk_ratio > 0) {
    EXPECT_NE(expected, ExpectedOver({2, 2, 3, 3, 2}, adam))
        << "top-k did not act";
  }
}

TEST(AllreduceExchangeTest, ElasticWorldGrowsAndSurvivesADeathInPlace) {
  ElasticWorldScenario(/*topk_ratio=*/0);
}

TEST(AllreduceExchangeTest, ElasticTopKKeepsEachWorkersResiduals) {
  ElasticWorldScenario(/*topk_ratio=*/0.1);
}

// `num_shards` shards of a job of `num_workers` in `mode` (sync by
// default; bounded staleness `staleness`; `optimizer`, Adam by default;
// clipping by global norm at `clip_grad_norm`, 0: none), each behind its
// own gRPC server on 127.0.0.1, for tensors of kTensors x kElements in one
// chunk each.
class Shards {
 public:
  // `replicas_to_aggregate` > 0: backup workers (a step is decided by the
  // first that many workers); `checkpoint_dir`: the shards' checkpoints.
  Shards(int num_shards, int num_workers, int staleness = 0,
         const OptimizerOptions& optimizer = OptimizerOptions(),
         double clip_grad_norm = 0, int replicas_to_aggregate = 0,
         const std::string& checkpoint_dir = "",
         SyncMode mode = SyncMode::kSync)
      : mode_(mode),
        staleness_(staleness),
        clip_grad_norm_(clip_grad_norm),
        backup_workers_(replicas_to_aggregate > 0),
        checkpoint_dir_(checkpoint_dir) {
    num_workers_ = num_workers;
    for (int s = 0; s < num_shards; ++s) {
      ShardOptions options;
      options.job_id = "job";
      options.shard_index = s;
      options.num_shards = num_shards;
      options.num_workers = num_workers;
      options.mode = mode;
      options.staleness = staleness;
      options.adam = optimizer;
      options.clip_grad_norm = clip_grad_norm;
      options.replicas_to_aggregate = replicas_to_aggregate;
      options.checkpoint_dir = checkpoint_dir;
      shards_.push_back(std::make_unique<ParameterShard>(options));
      services_.push_back(
          std::make_unique<PsService>(shards_.back().get(), absl::Seconds(10)));
      absl::StatusOr<ListeningServer> listening =
          StartGrpcServer("127.0.0.1:0", services_.back().get(), "");
      EXPECT_TRUE(listening.ok()) << listening.status();
      addresses_.push_back("127.0.0.1:" + std::to_string(listening->port));
      servers_.push_back(std::move(listening->server));
    }
  }
  ~Shards() {
    for (auto& server : servers_) server->Shutdown();
  }
  PartitionPlan Plan() const {
    return *PartitionPlan::Create(
        std::vector<int64_t>(kTensors, kElements), partition_bytes_,
        static_cast<int>(shards_.size()), num_buffers_, row_elements_);
  }
  // Worker `worker`'s client options (no compressor).
  PsClientOptions ClientOptions(int worker) const {
    PsClientOptions options;
    options.addresses = addresses_;
    options.job_id = "job";
    options.worker_id = worker;
    options.rpc_timeout = absl::Seconds(10);
    options.clip_by_global_norm = clip_grad_norm_ > 0;
    options.wire_dtype = wire_dtype_;
    options.channels_per_shard = channels_per_shard_;
    options.priority_pulls = priority_pulls_;
    options.backup_workers = backup_workers_;
    options.stream_timeout = stream_timeout_;
    if (before_push_write_) {
      options.before_push_write = [f = before_push_write_, worker](
                                      const ChunkSpec& c) { f(worker, c); };
    }
    return options;
  }
  std::unique_ptr<GradientExchange> Exchange(int worker, bool chief) const {
    PsClientOptions options = ClientOptions(worker);
    ExchangeCompression compression;
    if (compression_.enabled()) {
      compression.compressor = std::make_unique<TopKCompressor>(
          compression_, std::vector<int64_t>(kTensors, kElements), 3);
      options.compressor = compression.compressor.get();
      if (!checkpoint_dir_.empty()) {
        compression.step_dir = [dir = checkpoint_dir_](int64_t step) {
          return CheckpointStepDir(dir, step);
        };
        compression.worker_id = worker;
        compression.num_workers = num_workers_;
        for (int t = 0; t < kTensors; ++t) {
          compression.names.push_back(absl::StrCat("t", t));
        }
      }
    }
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Create(options, Plan());
    EXPECT_TRUE(client.ok()) << client.status();
    for (int s = 0; s < (*client)->num_shards(); ++s) {
      EXPECT_EQ((*client)->channels_of(s), channels_per_shard_);
    }
    return CreatePsExchange(*std::move(client), mode_ == SyncMode::kSync, chief,
                            absl::Seconds(10), staleness_, backup_workers_,
                            std::move(compression));
  }
  ParameterShard& shard(int s) { return *shards_[s]; }
  // How the workers' pushes and pulls travel (default fp32).
  void set_wire_dtype(DType dtype) { wire_dtype_ = dtype; }
  // Top-k compression of the pushes (default none).
  void set_compression(const CompressionOptions& c) { compression_ = c; }
  // Connections from each worker to each shard (default 1); each shard
  // must hold at least that many chunks.
  void set_channels_per_shard(int channels) { channels_per_shard_ = channels; }
  // The chunk bound (default: a tensor per chunk).
  void set_partition_bytes(int64_t bytes) { partition_bytes_ = bytes; }
  // Priority pulls (PsClientOptions; default off).
  void set_priority_pulls(bool on) { priority_pulls_ = on; }
  // Each PushPull stream's deadline (PsClientOptions; default its own).
  void set_stream_timeout(absl::Duration d) { stream_timeout_ = d; }
  // PsClientOptions::before_push_write, told the worker (default none).
  void set_before_push_write(
      std::function<void(int worker, const ChunkSpec& c)> f) {
    before_push_write_ = std::move(f);
  }
  // The last `n` tensors are buffers (default none).
  void set_num_buffers(int n) { num_buffers_ = n; }
  // Per tensor, its elements per row if it is a row-sparse table, else 0
  // (default: every tensor dense).
  void set_row_elements(std::vector<int64_t> d) { row_elements_ = d; }
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  bool priority_pulls_ = false;
  absl::Duration stream_timeout_ = PsClientOptions().stream_timeout;
  std::function<void(int worker, const ChunkSpec& c)> before_push_write_;
  int num_buffers_ = 0;
  std::vector<int64_t> row_elements_;
  DType wire_dtype_ = DTYPE_FLOAT32;
  CompressionOptions compression_;
  int channels_per_shard_ = 1;
  int64_t partition_bytes_ = kElements * sizeof(float);
  const SyncMode mode_;
  const int staleness_;
  const double clip_grad_norm_;
  const bool backup_workers_;
  const std::string checkpoint_dir_;
  int num_workers_ = 0;
  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<std::unique_ptr<PsService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

// `workers` workers (threads, worker 0 the chief) run `steps` sync steps of
// Gradient() through `shards`: each worker's weights after its last pull.
// `await_final`: each worker ends with AwaitFinalWeights().
std::vector<std::vector<std::vector<float>>> TrainOnShards(
    const Shards& shards, int workers, int steps, bool await_final = false) {
  std::vector<std::vector<std::vector<float>>> results(workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < steps; ++step) {
        const absl::Status s = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(s.ok()) << s;
      }
      if (await_final) {
        const absl::Status s = exchange->AwaitFinalWeights();
        ASSERT_TRUE(s.ok()) << s;
      }
      results[r] = tensors.w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(PsExchangeTest, PushesStartDuringBackwardAndMatchAdam) {
  constexpr int kWorkers = 2;
  Shards shards(/*num_shards=*/2, kWorkers);
  const PartitionPlan plan = shards.Plan();
  ParameterShard& last_shard =
      shards.shard(plan.chunks()[plan.FindChunk(kTensors - 1, 0)].shard);
  std::vector<std::vector<std::vector<float>>> results(kWorkers);
  std::atomic<int> checked{0};
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorkers; ++r) {
    workers.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      const std::vector<std::vector<float>>& w = tensors.w;
      const std::vector<absl::Span<float>>& weights = tensors.weights;
      const std::vector<absl::Span<const float>>& gradients = tensors.gradients;
      const absl::Status started = exchange->Start(weights);
      ASSERT_TRUE(started.ok()) << started;

      // Step 1: backward announces the last tensor first; both workers'
      // pushes of it reach its shard before anyone calls Step().
      auto first = std::make_shared<ProbeFence>();
      exchange->GradientsReady(gradients, 8, {kTensors - 1}, first);
      EXPECT_TRUE(first->WaitedWithin(absl::Seconds(10)));
      const absl::Time start = absl::Now();
      while (last_shard.Stats().pushes < kWorkers &&
             absl::Now() < start + absl::Seconds(10)) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      EXPECT_EQ(last_shard.Stats().pushes, kWorkers)
          << "the pushes did not start before Step()";
      // No worker goes on before both have looked.
      ++checked;
      while (checked.load() < kWorkers &&
             absl::Now() < start + absl::Seconds(10)) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      exchange->GradientsReady(gradients, 8, {1}, nullptr);
      exchange->GradientsReady(gradients, 8, {0},
                               std::make_shared<ProbeFence>());
      ASSERT_TRUE(exchange->Step(gradients, 8).ok());
      // Step 2: nothing announced; Step() exchanges everything.
      ASSERT_TRUE(exchange->Step(gradients, 8).ok());
      results[r] = w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : workers) t.join();
  const std::vector<std::vector<float>> expected =
      Expected(kWorkers, 2, AdamOptions());
  for (int r = 0; r < kWorkers; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      EXPECT_EQ(results[r][t], expected[t])
          << "worker " << r << " tensor " << t;
    }
  }
}

// fp16 precision's loss scale in sync PS: worker 0's state goes to the
// shards with its Init, the shards take each decided step as the workers'
// scalers do, and a worker's WaitReady (its start, a rejoin after a
// restart, an elastic join) puts the members' state into its scaler, so a
// restarted worker does not come back at GradScaler's defaults.
TEST(PsExchangeTest, AJoiningWorkerTakesTheMembersLossScale) {
  constexpr int kWorkers = 2;
  Shards shards(/*num_shards=*/2, kWorkers);
  std::vector<LossScaler> scalers(kWorkers);
  scalers[0].Restore({1024.0f, 5});
  // Kept open to the end: a closed stream mid-job breaks the step.
  std::vector<std::unique_ptr<GradientExchange>> exchanges;
  for (int r = 0; r < kWorkers; ++r) {
    exchanges.push_back(shards.Exchange(r, /*chief=*/r == 0));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      GradientExchange* exchange = exchanges[r].get();
      exchange->set_loss_scaler(&scalers[r]);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      EXPECT_EQ(scalers[r].scale(), 1024.0f) << "worker " << r;
      EXPECT_EQ(scalers[r].state().growth_tracker, 5) << "worker " << r;
      for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
        scalers[r].Update(exchange->SkippedStep().has_value());  // StepLoop
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < 2; ++s) {
    const std::optional<LossScaler::State> kept =
        shards.shard(s).loss_scaler_state();
    ASSERT_TRUE(kept.has_value()) << "shard " << s;
    EXPECT_EQ(kept->scale, scalers[0].scale());
    EXPECT_EQ(kept->growth_tracker, 7);
  }
  // Worker 1 restarted: a fresh scaler, GradScaler's defaults, until its
  // rejoin's WaitReady.
  LossScaler restarted;
  ASSERT_EQ(restarted.scale(), 65536.0f);
  std::unique_ptr<GradientExchange> again = shards.Exchange(1, /*chief=*/false);
  again->set_loss_scaler(&restarted);
  RankTensors tensors(1);
  absl::StatusOr<int64_t> version =
      again->Rejoin(tensors.weights, {}, nullptr, absl::Seconds(10));
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 2);
  EXPECT_EQ(restarted.scale(), 1024.0f);
  EXPECT_EQ(restarted.state().growth_tracker, 7);
}

// A planned membership change (GradientExchange::PlanMembership): worker
// 0 plans 3 -> 2 workers at step 1, before its pushes of it. Every
// worker's step 1 counts (the weights after it equal a fixed 3-worker
// job's, bit for bit), each worker's Step() of it ends on the new
// generation with its membership, and the two members go on without the
// third. The same with priority pulls, whose next forward would start
// before the pull ends: a pull whose decision took a change is completed
// first. The workers' loss scalers stay their own (the StepLoop updates
// them after the exchange; the shards' copy has taken the step already).
TEST(PsExchangeTest, APlannedMembershipChangeDropsNoStep) {
  constexpr int kWorkers = 3;
  for (const bool priority : {false, true}) {
    SCOPED_TRACE(priority ? "priority pulls" : "plain pulls");
    Shards reference(/*num_shards=*/2, kWorkers);
    const std::vector<std::vector<std::vector<float>>> expected =
        TrainOnShards(reference, kWorkers, 2);
    Shards shards(/*num_shards=*/2, kWorkers);
    shards.set_priority_pulls(priority);
    std::vector<std::unique_ptr<GradientExchange>> exchanges;
    std::vector<LossScaler> scalers(kWorkers);
    for (int r = 0; r < kWorkers; ++r) {
      exchanges.push_back(shards.Exchange(r, /*chief=*/r == 0));
      scalers[r].Restore({1024.0f, 5});
      exchanges[r]->set_loss_scaler(&scalers[r]);
    }
    WorkerMembership two;
    two.workers = {0, 1};
    two.epoch = 1;
    two.from_step = 2;
    two.data_offset = 7;
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorkers; ++r) {
      threads.emplace_back([&, r] {
        GradientExchange* exchange = exchanges[r].get();
        RankTensors tensors(r);
        ASSERT_TRUE(exchange->Start(tensors.weights).ok());
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
        if (r == 0) {
          const absl::Status planned =
              exchange->PlanMembership(two, 1, absl::Seconds(10));
          ASSERT_TRUE(planned.ok()) << planned;
          // Not where it is not this step's.
          EXPECT_EQ(exchange->PlanMembership(two, 2, absl::Seconds(10)).code(),
                    absl::StatusCode::kInternal);
        }
        const absl::Status stepped = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(stepped.ok()) << stepped;
        EXPECT_EQ(tensors.w, expected[r]) << "worker " << r;
        const std::optional<WorkerMembership> m = exchange->membership();
        ASSERT_TRUE(m.has_value()) << "worker " << r;
        EXPECT_EQ(m->workers, two.workers) << "worker " << r;
        EXPECT_EQ(m->epoch, 1);
        EXPECT_EQ(m->from_step, 2);
        EXPECT_EQ(m->data_offset, 7);
        EXPECT_EQ(scalers[r].state().growth_tracker, 5) << "worker " << r;
        if (r == 2) return;  // not a member from step 2 on
        for (int step = 2; step < 4; ++step) {
          const absl::Status s = exchange->Step(tensors.gradients, 8);
          ASSERT_TRUE(s.ok()) << s;
        }
        ASSERT_TRUE(exchange->Finish().ok());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(shards.shard(s).generation(), 1);
      EXPECT_EQ(shards.shard(s).EndsToDecide(), 2);
    }
  }
}

// --partition_bytes=auto with fp16: the tuning's trial rounds are decided
// on the shards, but its last restore (the job's initial state at the
// chosen size) gives them a fresh job's loss scaler, as the workers hold
// (worker/trainer.cc ChoosePartition sets it on the tuning client).
TEST(PsExchangeTest, PartitionTuningLeavesTheShardsAFreshLossScaler) {
  constexpr int kWorkers = 2;
  Shards shards(/*num_shards=*/2, kWorkers);
  PartitionTunerOptions tuning;
  tuning.candidates = {kElements * sizeof(float) / 2,
                       kElements * sizeof(float)};
  tuning.init_timeout = absl::Seconds(20);
  std::vector<absl::StatusOr<PartitionChoice>> choices(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<PsClient>> client =
          PsClient::Create(shards.ClientOptions(r), shards.Plan());
      ASSERT_TRUE(client.ok()) << client.status();
      LossScaler fresh;
      (*client)->set_loss_scaler(&fresh);
      RankTensors tensors(r);
      std::vector<absl::Span<const float>> initial;
      if (r == 0) {
        initial.assign(tensors.weights.begin(), tensors.weights.end());
      }
      choices[r] = TunePartition(tuning, **client, initial, r == 0, nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(choices[r].ok()) << choices[r].status();
  }
  for (int s = 0; s < 2; ++s) {
    const std::optional<LossScaler::State> kept =
        shards.shard(s).loss_scaler_state();
    ASSERT_TRUE(kept.has_value()) << "shard " << s;
    EXPECT_EQ(kept->scale, 65536.0f);
    EXPECT_EQ(kept->growth_tracker, 0) << "a trial round counted";
    EXPECT_EQ(shards.shard(s).generation(), choices[0]->generation);
  }
}

// 16-bit wire formats (issue 39): a sync job whose pushes and pulls travel
// as bfloat16 or float16 ends with the weights of the fp32 job whose
// gradients and pulled weights were rounded the same way
// (RoundThroughWire, which testdata/wire_dtype_fixture.txt ties to
// PyTorch's conversions), bit for bit: the shards average and update in
// fp32.
TEST(PsExchangeTest, SixteenBitWireEqualsFp32OnRoundedValuesBitForBit) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 3;
  for (DType dtype : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    Shards shards(/*num_shards=*/2, kWorkers);
    shards.set_wire_dtype(dtype);
    const std::vector<std::vector<std::vector<float>>> results =
        TrainOnShards(shards, kWorkers, kSteps);
    // The reference: Expected()'s Adam on the rounded gradients (one chunk
    // per tensor, so one float16 scale per tensor), weights rounded as
    // pulled.
    std::vector<std::vector<float>> w(kTensors,
                                      std::vector<float>(kElements, 0.1f));
    std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
    std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
    for (int step = 1; step <= kSteps; ++step) {
      for (int t = 0; t < kTensors; ++t) {
        std::vector<float> average(kElements, 0.0f);
        for (int r = 0; r < kWorkers; ++r) {
          std::vector<float> g = Gradient(r, t);
          RoundThroughWire(dtype, absl::MakeSpan(g));
          for (int i = 0; i < kElements; ++i) average[i] += g[i];
        }
        for (float& x : average) x *= 1.0f / kWorkers;
        OptimizerUpdate(OptimizerOptions(), step, w[t].data(), average.data(),
                        m[t].data(), v[t].data(), kElements);
      }
    }
    std::vector<std::vector<float>> fp32 = w;
    for (std::vector<float>& tensor : w) {
      RoundThroughWire(dtype, absl::MakeSpan(tensor));
    }
    for (int r = 0; r < kWorkers; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[r][t], w[t])
            << WireDtypeSpelling(dtype) << " worker " << r << " tensor " << t;
        EXPECT_NE(results[r][t], fp32[t]) << "no rounding happened";
      }
    }
    // The final weights (AwaitFinalWeights()) are the shards' fp32 ones.
    Shards again(/*num_shards=*/2, kWorkers);
    again.set_wire_dtype(dtype);
    const std::vector<std::vector<std::vector<float>>> final_weights =
        TrainOnShards(again, kWorkers, kSteps, /*await_final=*/true);
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(final_weights[r], fp32)
          << WireDtypeSpelling(dtype) << " worker " << r;
    }
  }
}

// Buffers (BatchNorm's running statistics, the plan's last tensors) travel
// fp32 both ways on a 16-bit wire, as allreduce averages them: the workers
// end with the fp32 average of the values they pushed, which bf16 would
// have rounded, while the parameters' pulled weights are bf16's.
TEST(PsExchangeTest, SixteenBitWireCarriesBuffersInFp32) {
  constexpr int kWorkers = 2;
  constexpr int kBuffer = kTensors - 1;
  Shards shards(/*num_shards=*/2, kWorkers);
  shards.set_num_buffers(1);
  shards.set_wire_dtype(DTYPE_BFLOAT16);
  // More significant bits than bf16's 8.
  auto value = [](int r, int i) { return 0.1f * (r + 1) + 0.001f * i; };
  std::vector<std::vector<std::vector<float>>> results(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      for (int i = 0; i < kElements; ++i) tensors.g[kBuffer][i] = value(r, i);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < 2; ++step) {
        const absl::Status s = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(s.ok()) << s;
      }
      results[r] = tensors.w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<float> average(kElements);
  for (int i = 0; i < kElements; ++i) {
    average[i] = (value(0, i) + value(1, i)) * 0.5f;
  }
  std::vector<float> rounded = average;
  RoundThroughWire(DTYPE_BFLOAT16, absl::MakeSpan(rounded));
  ASSERT_NE(rounded, average) << "the test's buffer values are bf16's";
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(results[r][kBuffer], average) << "worker " << r;
    for (int t = 0; t < kBuffer; ++t) {
      std::vector<float> w = results[r][t];
      RoundThroughWire(DTYPE_BFLOAT16, absl::MakeSpan(w));
      EXPECT_EQ(w, results[r][t])
          << "worker " << r << " tensor " << t << ": pulled weights are bf16's";
    }
  }
}

// Top-k compression (issue 39 item 3): a sync job whose workers push the
// top 5% of each chunk (two chunks per tensor) of gradient + residual ends
// with the weights of a reference that sparsifies the same way by hand
// (SelectTopK, tested against sorting in topk_compression_test), averages
// the sparse gradients in worker order and runs Adam: bit for bit, with
// error feedback and without, and at 70% (a push that goes dense); each
// differs from the dense job. Over a 16-bit wire the pushed values arrive
// rounded (per chunk, RoundThroughWire), what the rounding drops stays in
// the residual, and the pulled weights are rounded too.
TEST(PsExchangeTest, TopKPushesEqualTheirReferenceBitForBit) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 4;
  constexpr int64_t kChunk = kElements / 2;
  const std::vector<std::vector<float>> dense =
      Expected(kWorkers, kSteps, AdamOptions());
  struct Case {
    double ratio;
    bool error_feedback;
    DType wire;
  };
  // At 0.7 the pairs would take more bytes than the chunk: the push goes
  // dense (zeros and the selected values), with the same result.
  for (const Case& c : std::vector<Case>{{0.05, true, DTYPE_FLOAT32},
                                         {0.05, false, DTYPE_FLOAT32},
                                         {0.7, true, DTYPE_FLOAT32},
                                         {0.05, true, DTYPE_BFLOAT16},
                                         {0.05, true, DTYPE_FLOAT16},
                                         {0.7, true, DTYPE_BFLOAT16}}) {
    const CompressionOptions topk{c.ratio, c.error_feedback};
    Shards shards(/*num_shards=*/2, kWorkers);
    shards.set_partition_bytes(kChunk * sizeof(float));
    shards.set_compression(topk);
    shards.set_wire_dtype(c.wire);
    const std::vector<std::vector<std::vector<float>>> results =
        TrainOnShards(shards, kWorkers, kSteps);

    std::vector<std::vector<float>> w(kTensors,
                                      std::vector<float>(kElements, 0.1f));
    std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
    std::vector<std::vector<float>> v(kTensors, std::vector<float>(kElements));
    // residual[r][t]
    std::vector<std::vector<std::vector<float>>> residual(
        kWorkers, std::vector<std::vector<float>>(
                      kTensors, std::vector<float>(kElements, 0.0f)));
    for (int step = 1; step <= kSteps; ++step) {
      for (int t = 0; t < kTensors; ++t) {
        std::vector<float> average(kElements, 0.0f);
        for (int r = 0; r < kWorkers; ++r) {
          const std::vector<float> g = Gradient(r, t);
          std::vector<float> sum(kElements);
          for (int i = 0; i < kElements; ++i) {
            sum[i] = g[i] + (c.error_feedback ? residual[r][t][i] : 0.0f);
          }
          std::vector<float> sparse(kElements, 0.0f);
          for (int64_t offset = 0; offset < kElements; offset += kChunk) {
            std::vector<uint32_t> picked;
            SelectTopK(absl::MakeConstSpan(sum).subspan(offset, kChunk),
                       TopKCount(topk.topk_ratio, kChunk), &picked);
            std::vector<float> sent;
            for (uint32_t i : picked) sent.push_back(sum[offset + i]);
            RoundThroughWire(c.wire, absl::MakeSpan(sent));
            for (size_t j = 0; j < picked.size(); ++j) {
              sparse[offset + picked[j]] = sent[j];
              sum[offset + picked[j]] -= sent[j];
            }
          }
          residual[r][t] = sum;
          for (int i = 0; i < kElements; ++i) average[i] += sparse[i];
        }
        for (float& x : average) x *= 1.0f / kWorkers;
        OptimizerUpdate(AdamOptions(), step, w[t].data(), average.data(),
                        m[t].data(), v[t].data(), kElements);
      }
    }
    for (std::vector<float>& tensor : w) {
      for (int64_t offset = 0; offset < kElements; offset += kChunk) {
        RoundThroughWire(c.wire,
                         absl::MakeSpan(tensor).subspan(offset, kChunk));
      }
    }
    for (int r = 0; r < kWorkers; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[r][t], w[t])
            << "ratio " << c.ratio << " error feedback " << c.error_feedback
            << " wire " << WireDtypeSpelling(c.wire) << " worker " << r
            << " tensor " << t;
        EXPECT_NE(results[r][t], dense[t]) << "nothing was left out";
      }
    }
  }
}

// Deep Gradient Compression's momentum correction and masking (issue 39):
// a sync job whose workers keep the SGD momentum (plain, Nesterov as DGC's
// code, and with dampening), accumulate it into the residual before the
// top 5% selection and zero both where they pushed, with shards applying
// SGD without momentum (lr schedule and weight decay as given), ends with
// the weights of DGC written out by hand: bit for bit. The momentum shows:
// the same job with momentum 0 on the workers differs.
TEST(PsExchangeTest, MomentumCorrectionEqualsDgcByHandBitForBit) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 5;
  constexpr int64_t kChunk = kElements / 2;
  OptimizerOptions plain_sgd = NesterovCosine();
  plain_sgd.momentum = 0;
  plain_sgd.nesterov = false;
  // DGC by hand: each worker's velocity u and residual v per tensor.
  auto reference = [&](const CompressionOptions& topk) {
    std::vector<std::vector<float>> w(kTensors,
                                      std::vector<float>(kElements, 0.1f));
    std::vector<std::vector<float>> m(kTensors, std::vector<float>(kElements));
    std::vector<std::vector<float>> unused(kTensors,
                                           std::vector<float>(kElements));
    using PerWorker = std::vector<std::vector<std::vector<float>>>;
    PerWorker u(kWorkers, std::vector<std::vector<float>>(
                              kTensors, std::vector<float>(kElements, 0.0f)));
    PerWorker v = u;
    const float mu = static_cast<float>(topk.momentum);
    const float c = static_cast<float>(1.0 - topk.dampening);
    for (int step = 1; step <= kSteps; ++step) {
      for (int t = 0; t < kTensors; ++t) {
        std::vector<float> average(kElements, 0.0f);
        for (int r = 0; r < kWorkers; ++r) {
          const std::vector<float> g = Gradient(r, t);
          std::vector<float>& ur = u[r][t];
          std::vector<float>& vr = v[r][t];
          for (int i = 0; i < kElements; ++i) {
            if (topk.nesterov) {
              ur[i] = (ur[i] + g[i]) * mu;
              vr[i] = (vr[i] + ur[i]) + g[i];
            } else {
              ur[i] = mu * ur[i] + c * g[i];
              vr[i] = vr[i] + ur[i];
            }
          }
          for (int64_t offset = 0; offset < kElements; offset += kChunk) {
            std::vector<uint32_t> picked;
            SelectTopK(absl::MakeConstSpan(vr).subspan(offset, kChunk),
                       TopKCount(topk.topk_ratio, kChunk), &picked);
            for (uint32_t i : picked) {
              average[offset + i] += vr[offset + i];
              vr[offset + i] = 0.0f;
              ur[offset + i] = 0.0f;
            }
          }
        }
        for (float& x : average) x *= 1.0f / kWorkers;
        OptimizerUpdate(plain_sgd, step, w[t].data(), average.data(),
                        m[t].data(), unused[t].data(), kElements);
      }
    }
    return w;
  };
  CompressionOptions no_momentum{0.05, true};
  no_momentum.momentum = 0;
  const std::vector<std::vector<float>> without = reference(no_momentum);
  for (const auto& [nesterov, dampening] : std::vector<std::pair<bool, double>>{
           {false, 0}, {true, 0}, {false, 0.5}}) {
    CompressionOptions topk{0.05, true};
    topk.momentum = 0.9;
    topk.nesterov = nesterov;
    topk.dampening = dampening;
    ASSERT_TRUE(topk.momentum_correction());
    Shards shards(/*num_shards=*/2, kWorkers, /*staleness=*/0, plain_sgd);
    shards.set_partition_bytes(kChunk * sizeof(float));
    shards.set_compression(topk);
    const std::vector<std::vector<std::vector<float>>> results =
        TrainOnShards(shards, kWorkers, kSteps);
    const std::vector<std::vector<float>> expected = reference(topk);
    for (int r = 0; r < kWorkers; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[r][t], expected[t])
            << "nesterov " << nesterov << " dampening " << dampening
            << " worker " << r << " tensor " << t;
        EXPECT_NE(results[r][t], without[t]) << "the momentum did nothing";
      }
    }
  }
}

// Several connections per shard (issue 39, channels_per_shard): a sync job
// whose chunks travel over 3 streams per worker per shard (each shard's
// chunk i on stream i mod 3: pushes, the step end after the other streams'
// PushesSent, and pulls of each stream's part) ends with the weights of
// the job over one stream, bit for bit (the shards' weights and optimizer
// state, and each worker's pulled weights); with clipping by global norm
// too (the partial norm on stream 0 only) and with bounded staleness (the
// shards' state only: a worker's last pull may be older).
// channels_per_shard 0 chooses per shard: one connection per 8 MiB of the
// shard's chunks, at most 4 (common/rpc_options.h), so a small model keeps
// one stream and a large one spreads over four.
TEST(PsClientTest, AutomaticChannelsFollowTheShardsBytes) {
  struct Case {
    std::vector<int64_t> elements;  // per tensor
    int shards;
    std::vector<int> channels;  // per shard
  };
  const std::vector<Case> cases = {
      {{61706}, 2, {1, 1}},                         // LeNet-5's size
      {{3'000'000}, 1, {2}},                        // 12 MB: 2 x 8 MiB
      {{25'000'000}, 1, {4}},                       // 100 MB: capped at 4
      {{25'000'000, 100}, 2, {4, 4}},               // 50 MB a shard
      {{1'500'000, 1'500'000, 10}, 3, {1, 1, 1}}};  // 6 MB a shard
  for (const Case& c : cases) {
    absl::StatusOr<PartitionPlan> plan =
        PartitionPlan::Create(c.elements, 4 << 20, c.shards);
    ASSERT_TRUE(plan.ok()) << plan.status();
    PsClientOptions options;
    for (int s = 0; s < c.shards; ++s) {
      options.addresses.push_back(absl::StrCat("127.0.0.1:", 1 + s));
    }
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Create(options, *plan);
    ASSERT_TRUE(client.ok()) << client.status();
    for (int s = 0; s < c.shards; ++s) {
      EXPECT_EQ((*client)->channels_of(s), c.channels[s])
          << c.elements[0] << " elements, shard " << s;
    }
  }
}

// A stream's deadline (stream_timeout) bounds one stream, not the job:
// only worker 0 closes its streams (before an evaluation), so the other
// workers kept theirs from step to step, and a job that ran past the
// deadline failed on all of them at once with DEADLINE_EXCEEDED, which no
// recovery takes. With a 2-s deadline, 2 workers (2 streams to each of 2
// shards) run sync steps for over 5 s: every step succeeds (each step
// begun on a stream older than 1 s re-opens it first), and each shard
// decides every step with both workers in it.
TEST(PsClientTest, StreamsAreReopenedBetweenStepsBeforeTheirDeadline) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 50;
  constexpr absl::Duration kBetweenSteps = absl::Milliseconds(100);
  Shards shards(/*num_shards=*/2, kWorkers);
  shards.set_stream_timeout(absl::Seconds(2));
  shards.set_partition_bytes(kElements);  // 6 chunks a shard, 3 a stream
  shards.set_channels_per_shard(2);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < kSteps; ++step) {
        absl::SleepFor(kBetweenSteps);
        const absl::Status s = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(s.ok())
            << "worker " << r << ", step " << step << " at "
            << absl::FormatDuration(absl::Now() - start) << ": " << s;
      }
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GE(absl::Now() - start, kSteps * kBetweenSteps);
  for (int s = 0; s < 2; ++s) {
    const ShardStats stats = shards.shard(s).Stats();
    EXPECT_EQ(stats.decided_step, kSteps - 1) << "shard " << s;
    EXPECT_EQ(stats.samples, kWorkers * kSteps * 8) << "shard " << s;
  }
}

TEST(PsExchangeTest, ThreeChannelsPerShardEqualOneBitForBit) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 4;
  struct Case {
    const char* name;
    int staleness;
    OptimizerOptions optimizer;
    double clip;
  };
  const std::vector<Case> cases = {
      {"adam", 0, OptimizerOptions(), 0},
      {"clipped sgd", 0, NesterovCosine(), 3.0},
      {"staleness 1", 1, OptimizerOptions(), 0},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<std::vector<float>>> results[2];
    // Each shard's chunks (weights, m, v) at the end.
    std::vector<std::vector<ChunkSnapshot>> state[2];
    for (int channels : {1, 3}) {
      Shards shards(/*num_shards=*/2, kWorkers, c.staleness, c.optimizer,
                    c.clip);
      // 4 chunks per tensor: 6 per shard, 2 per stream.
      shards.set_partition_bytes(kElements);
      shards.set_channels_per_shard(channels);
      ASSERT_EQ(shards.Plan().ChunksOfShard(0).size(), 6u);
      results[channels == 3] = TrainOnShards(shards, kWorkers, kSteps);
      for (int s = 0; s < 2; ++s) {
        absl::StatusOr<std::vector<ChunkSnapshot>> snapshot =
            shards.shard(s).Snapshot(kSteps);
        ASSERT_TRUE(snapshot.ok()) << c.name << ": " << snapshot.status();
        state[channels == 3].push_back(*std::move(snapshot));
      }
    }
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(state[1][s].size(), state[0][s].size());
      for (size_t i = 0; i < state[0][s].size(); ++i) {
        EXPECT_EQ(state[1][s][i].weights, state[0][s][i].weights)
            << c.name << ": shard " << s << " chunk " << i;
        EXPECT_EQ(state[1][s][i].m, state[0][s][i].m) << c.name;
        EXPECT_EQ(state[1][s][i].v, state[0][s][i].v) << c.name;
      }
    }
    // With staleness a worker's last pull may hold older chunks.
    if (c.staleness > 0) continue;
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_EQ(results[1][r].size(), static_cast<size_t>(kTensors));
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[1][r][t], results[0][r][t])
            << c.name << ": worker " << r << " tensor " << t;
        EXPECT_NE(results[1][r][t], std::vector<float>(kElements, 0.1f))
            << c.name << ": nothing trained";
      }
    }
  }
}

// `workers` workers run `steps` sync steps as a model would (issue 39 item
// 4): each step's "forward" reads every tensor's weights, and its
// "backward" writes a gradient that depends on them (Gradient() + w / 4),
// so a forward that read a weight before its pull wrote it would change the
// result. `gated`: the exchange's StartEarlyForward() gate is asked per
// tensor, then for all, as Model::ForwardBackward() asks (Step() returns
// with the pull still running). Worker 1 reports a non-finite loss at step
// `skip_step` (-1: none), which every worker's exchange skips. `row_d` >
// 0: tensor 0 is a row-sparse table of rows of `row_d` (the shards'
// row_elements), each step's gradient nonzero in the rows its batch
// touches only, set before each forward (SetStepRows) as the step loop
// does, while the step before may still be pushing. Each worker's weights
// at the end.
std::vector<std::vector<std::vector<float>>> TrainAsAModel(
    const Shards& shards, int workers, int steps, bool gated, int skip_step,
    int64_t row_d = 0) {
  auto rows_of = [row_d](int64_t step, int r) {
    std::vector<uint32_t> rows;
    for (uint32_t i = 0; row_d > 0 && i < kElements / row_d; ++i) {
      if ((i + step + r) % 3 == 0) rows.push_back(i);
    }
    return std::vector<std::vector<uint32_t>>{rows, {}, {}};
  };
  std::vector<std::vector<std::vector<float>>> results(workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      WeightsGate* gate = gated ? exchange->StartEarlyForward() : nullptr;
      ASSERT_EQ(gate != nullptr, gated);
      std::vector<std::vector<float>> read(kTensors);
      for (int step = 0; step < steps; ++step) {
        if (row_d > 0) {
          exchange->SetStepRows(rows_of(step, r), rows_of(step + 1, r), false);
        }
        for (int t = 0; t < kTensors; ++t) {
          if (gate != nullptr) {
            ASSERT_TRUE(gate->AwaitTensor(t).ok());
          }
          read[t] = tensors.w[t];
        }
        if (gate != nullptr) {
          ASSERT_TRUE(gate->AwaitAll().ok());
        }
        for (int t = 0; t < kTensors; ++t) {
          const std::vector<float> base = Gradient(r, t);
          for (int i = 0; i < kElements; ++i) {
            tensors.g[t][i] = base[i] + read[t][i] * 0.25f;
          }
        }
        if (row_d > 0) {
          // The table's gradient: the touched rows' only.
          std::vector<float> table(kElements, 0.0f);
          const std::vector<std::vector<uint32_t>> touched = rows_of(step, r);
          for (uint32_t row : touched[0]) {
            for (int64_t i = row * row_d; i < (row + 1) * row_d; ++i) {
              table[i] = tensors.g[0][i];
            }
          }
          tensors.g[0] = table;
        }
        // Backward's order: the last tensor first.
        for (int t = kTensors; t-- > 0;) {
          exchange->GradientsReady(tensors.gradients, 8, {t}, nullptr);
        }
        if (r == 1 && step == skip_step) {
          NonFiniteValue loss;
          loss.value = "nan";
          exchange->MarkStepNonFinite(loss);
        }
        const absl::Status s = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(exchange->SkippedStep().has_value(), step == skip_step)
            << "step " << step;
      }
      ASSERT_TRUE(exchange->AwaitWeights().ok());
      results[r] = tensors.w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Priority pulls (issue 39 item 4): front layers first on the shards, and
// the next forward started on the first tensors while the pull goes on,
// end with the weights of plain pulls bit for bit: 2 shards, 4 chunks per
// tensor, 1 and 2 channels, with a skipped step (whose pull Step() waits
// for whole), with clipping (no announcement: Step() waits for the whole
// pull) and with a row-sparse table whose next rows are set while the
// step before may still push (early verdicts).
TEST(PsExchangeTest, PriorityPullsAndEarlyForwardEqualPlainPullsBitForBit) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 5;
  struct Case {
    const char* name;
    int channels;
    int skip_step;
    double clip;
    int64_t row_d;
  };
  const std::vector<Case> cases = {
      {"1 channel", 1, -1, 0, 0},
      {"2 channels, step 2 skipped", 2, 2, 0, 0},
      {"clipped", 1, -1, 3.0, 0},
      {"clipped, 2 channels, step 2 skipped", 2, 2, 3.0, 0},
      {"a row-sparse table, 2 channels", 2, -1, 0, 10},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<std::vector<float>>> results[2];
    for (bool priority : {false, true}) {
      Shards shards(/*num_shards=*/2, kWorkers, 0, OptimizerOptions(), c.clip);
      shards.set_partition_bytes(kElements);
      shards.set_channels_per_shard(c.channels);
      shards.set_priority_pulls(priority);
      if (c.row_d > 0) shards.set_row_elements({c.row_d, 0, 0});
      results[priority] =
          TrainAsAModel(shards, kWorkers, kSteps,
                        /*gated=*/priority, c.skip_step, c.row_d);
    }
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_EQ(results[1][r].size(), static_cast<size_t>(kTensors)) << c.name;
      for (int t = 0; t < kTensors; ++t) {
        EXPECT_EQ(results[1][r][t], results[0][r][t])
            << c.name << ": worker " << r << " tensor " << t;
        EXPECT_NE(results[1][r][t], std::vector<float>(kElements, 0.1f))
            << c.name << ": nothing trained";
      }
    }
  }
}

// A worker speaking the wire protocol by hand: one stream per shard, each
// with the pull of version 1 sent first; its gradients are Gradient(worker,
// t), one chunk per tensor (chunk 0), of step 0.
class RawWorker {
 public:
  RawWorker(const Shards& shards, int worker_id) : streams_(2) {
    header_.set_job_id("job");
    header_.set_worker_id(worker_id);
    header_.set_generation(0);
    for (int s = 0; s < 2; ++s) {
      streams_[s].stub = ParameterServer::NewStub(grpc::CreateChannel(
          shards.addresses()[s], grpc::InsecureChannelCredentials()));
      streams_[s].context.set_deadline(
          absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      streams_[s].stream = streams_[s].stub->PushPull(&streams_[s].context);
      PushPullRequest pull = Request();
      pull.mutable_pull()->set_min_version(1);
      EXPECT_TRUE(streams_[s].stream->Write(pull));
    }
  }
  void Push(int shard, int t) {
    const std::vector<float> g = Gradient(header_.worker_id(), t);
    PushPullRequest request = Request();
    TensorChunk* chunk = request.mutable_push();
    chunk->mutable_key()->set_param_id(t);
    chunk->set_dtype(DTYPE_FLOAT32);
    chunk->set_num_elements(kElements);
    chunk->set_data(std::string(reinterpret_cast<const char*>(g.data()),
                                g.size() * sizeof(float)));
    chunk->set_version(0);
    EXPECT_TRUE(streams_[shard].stream->Write(request));
  }
  void EndStep(int shard) {
    PushPullRequest request = Request();
    request.mutable_step_end()->set_step(0);
    EXPECT_TRUE(streams_[shard].stream->Write(request));
  }
  // Every value of step 0 is finite (proto/ps.proto StepVerdict).
  void Verdict(int shard) {
    PushPullRequest request = Request();
    request.mutable_step_verdict()->set_step(0);
    EXPECT_TRUE(streams_[shard].stream->Write(request));
  }
  // Reads each pull to its last message and ends the streams.
  void Finish() {
    for (Stream& s : streams_) {
      PushPullResponse response;
      while (s.stream->Read(&response) && !response.last_of_pull()) {
      }
      s.stream->WritesDone();
      EXPECT_TRUE(s.stream->Finish().ok());
    }
  }

 private:
  PushPullRequest Request() const {
    PushPullRequest request;
    *request.mutable_header() = header_;
    return request;
  }
  struct Stream {
    std::unique_ptr<ParameterServer::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<PushPullRequest, PushPullResponse>>
        stream;
  };
  RequestHeader header_;
  std::vector<Stream> streams_;
};

// Every tensor of `tensors` holds Adam's first step on the average of
// `workers` workers' gradients (Expected()).
void ExpectOneAdamStep(const RankTensors& tensors, int workers) {
  const std::vector<std::vector<float>> expected =
      Expected(workers, 1, AdamOptions());
  for (int t = 0; t < kTensors; ++t) {
    EXPECT_EQ(tensors.w[t], expected[t]) << "tensor " << t;
  }
}

// Issue 39 item 4: the next step's forward of tensor 0 (layer 0) starts
// before the last chunk of the pull arrives. Worker 1 speaks the wire
// protocol by hand and holds back its push of a tensor on the other shard
// than tensor 0's: worker 0's Step() returns once tensor 0's shard has
// decided, its gate lets tensor 0 through with the new weights while the
// held tensor still has the old ones, and lets the rest through once
// worker 1 pushes it; the weights are Adam's on the average gradient.
TEST(PsExchangeTest, ForwardOfLayerZeroStartsBeforeTheLastChunkArrives) {
  constexpr int kWorkers = 2;
  Shards shards(/*num_shards=*/2, kWorkers);
  shards.set_priority_pulls(true);
  const PartitionPlan plan = shards.Plan();
  const int first_shard = plan.chunks()[plan.FindChunk(0, 0)].shard;
  int held = -1;  // a tensor on the other shard
  for (int t = 1; t < kTensors; ++t) {
    if (plan.chunks()[plan.FindChunk(t, 0)].shard != first_shard) held = t;
  }
  ASSERT_GE(held, 0);
  std::unique_ptr<GradientExchange> exchange =
      shards.Exchange(0, /*chief=*/true);
  RankTensors tensors(0);
  ASSERT_TRUE(exchange->Start(tensors.weights).ok());
  WeightsGate* gate = exchange->StartEarlyForward();
  ASSERT_NE(gate, nullptr);

  // Worker 1: its pushes of step 0 with the step's end on tensor 0's
  // shard only.
  RawWorker worker1(shards, 1);
  for (int t = 0; t < kTensors; ++t) {
    if (t != held) worker1.Push(first_shard, t);
  }
  worker1.EndStep(first_shard);

  // Worker 0: backward's order, then the step; it returns with the pull
  // still running (the held tensor cannot be updated yet).
  for (int t = kTensors; t-- > 0;) {
    exchange->GradientsReady(tensors.gradients, 8, {t}, nullptr);
  }
  ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
  const absl::Status first = gate->AwaitTensor(0);
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_NE(tensors.w[0], std::vector<float>(kElements, 0.1f))
      << "tensor 0 let through before its pull";
  EXPECT_EQ(tensors.w[held], std::vector<float>(kElements, 0.1f))
      << "the held tensor arrived before worker 1 pushed it";

  worker1.Push(1 - first_shard, held);
  worker1.EndStep(1 - first_shard);
  const absl::Status all = gate->AwaitAll();
  ASSERT_TRUE(all.ok()) << all;
  ExpectOneAdamStep(tensors, kWorkers);
  worker1.Finish();
  ASSERT_TRUE(exchange->Finish().ok());
}

// A copy fence (models/backend.h) that holds its chunks' pushes until
// Open().
class HeldFence : public CopyFence {
 public:
  absl::Status Wait() override {
    open_.WaitForNotification();
    return absl::OkStatus();
  }
  void Open() { open_.Notify(); }

 private:
  absl::Notification open_;
};

// Early verdicts (issue 39; proto/ps.proto StepVerdict): worker 1 (by
// hand) says its step is finite, pushes and ends it; worker 0's push of
// tensor 0 is held on its way to the wire, after its check
// (PsClientOptions::before_push_write), so no shard can decide the step.
// Worker 0's Step() finds every value finite and says so, on the other
// shard's stream while its own push still waits: that shard announces the
// step, and Step() returns. The forward gets the other shard's tensors,
// waits for tensor 0 until the push goes, and every weight is Adam's on
// the average gradient, as without verdicts. A chunk behind a copy fence,
// whose values are not final yet, holds the verdict until the fence opens
// (the second step).
TEST(PsExchangeTest, EveryVerdictLetsTheForwardStartBeforeThePushes) {
  constexpr int kWorkers = 2;
  for (const bool fenced : {false, true}) {
    SCOPED_TRACE(fenced ? "behind a copy fence" : "held after its check");
    Shards shards(/*num_shards=*/2, kWorkers);
    shards.set_priority_pulls(true);
    absl::Notification release;
    if (!fenced) {
      shards.set_before_push_write([&release](int worker, const ChunkSpec& c) {
        if (worker == 0 && c.param_id == 0) release.WaitForNotification();
      });
    }
    const PartitionPlan plan = shards.Plan();
    auto shard_of = [&plan](int t) {
      return plan.chunks()[plan.FindChunk(t, 0)].shard;
    };
    int other = -1;  // a tensor on the other shard than tensor 0's
    for (int t = 1; t < kTensors; ++t) {
      if (shard_of(t) != shard_of(0)) other = t;
    }
    ASSERT_GE(other, 0);
    std::unique_ptr<GradientExchange> exchange =
        shards.Exchange(0, /*chief=*/true);
    RankTensors tensors(0);
    ASSERT_TRUE(exchange->Start(tensors.weights).ok());
    WeightsGate* gate = exchange->StartEarlyForward();
    ASSERT_NE(gate, nullptr);
    RawWorker worker1(shards, 1);
    for (int s = 0; s < 2; ++s) worker1.Verdict(s);
    for (int t = 0; t < kTensors; ++t) worker1.Push(shard_of(t), t);
    for (int s = 0; s < 2; ++s) worker1.EndStep(s);

    auto held = std::make_shared<HeldFence>();
    for (int t = kTensors; t-- > 0;) {
      exchange->GradientsReady(tensors.gradients, 8, {t},
                               fenced && t == 0 ? held : nullptr);
    }
    absl::Status stepped = absl::UnknownError("not returned");
    absl::Notification returned;
    std::thread stepper([&] {
      stepped = exchange->Step(tensors.gradients, 8);
      returned.Notify();
    });
    if (fenced) {
      EXPECT_FALSE(
          returned.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
          << "a verdict on values not final yet";
    } else {
      EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)))
          << "Step() waited for its own held push";
    }
    if (returned.HasBeenNotified() && !fenced) {
      ASSERT_TRUE(stepped.ok()) << stepped;
      const absl::Status in = gate->AwaitTensor(other);
      ASSERT_TRUE(in.ok()) << in;
      EXPECT_NE(tensors.w[other], std::vector<float>(kElements, 0.1f));
      EXPECT_EQ(tensors.w[0], std::vector<float>(kElements, 0.1f))
          << "tensor 0 changed before worker 0 pushed it";
    }
    release.Notify();
    held->Open();
    stepper.join();
    ASSERT_TRUE(stepped.ok()) << stepped;
    const absl::Status all = gate->AwaitAll();
    ASSERT_TRUE(all.ok()) << all;
    ExpectOneAdamStep(tensors, kWorkers);
    worker1.Finish();
    ASSERT_TRUE(exchange->Finish().ok());
  }
}

// Backup workers with top-k residual files: shard 0 picks worker 0's
// checkpoint cut where worker 1 is, ahead of worker 0's step, so the
// checkpoint waits for worker 0's own residual file, written only once its
// step reaches the cut. A recovery beginning on worker 0 will not get
// there in this timeline: BeforeRecovery() gives the wait up at once
// (CANCELLED) instead of at its deadline (10 s here, 120 s in a job).
TEST(PsExchangeTest, ARecoveryGivesUpACheckpointWaitingForItsOwnResidual) {
  const std::string dir = ::testing::TempDir() + "/before_recovery";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  Shards shards(/*num_shards=*/1, /*num_workers=*/2, /*staleness=*/0,
                OptimizerOptions(), /*clip_grad_norm=*/0,
                /*replicas_to_aggregate=*/1, dir);
  shards.set_compression(CompressionOptions{0.05, true});
  std::unique_ptr<GradientExchange> w0 = shards.Exchange(0, /*chief=*/true);
  std::unique_ptr<GradientExchange> w1 = shards.Exchange(1, /*chief=*/false);
  RankTensors t0(0), t1(1);
  std::thread start0([&] { ASSERT_TRUE(w0->Start(t0.weights).ok()); });
  ASSERT_TRUE(w1->Start(t1.weights).ok());
  start0.join();
  // Worker 1 alone decides steps 0 to 2 (one replica to aggregate).
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(w1->Step(t1.gradients, 8).ok());
  }
  constexpr int64_t kEndStep = 100;
  absl::StatusOr<std::vector<CheckpointResponse>> begun =
      w0->Checkpoint(0, kEndStep, /*latest_step=*/-1, CheckpointStepDir(dir, 0),
                     /*wait=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_FALSE(begun->empty());
  const int64_t cut = (*begun)[0].step();
  EXPECT_EQ(cut, 3);
  std::atomic<bool> waited{false};
  absl::Status wait_status;
  std::thread wait([&] {
    wait_status = w0->Checkpoint(cut, kEndStep, /*latest_step=*/-1,
                                 CheckpointStepDir(dir, cut),
                                 /*wait=*/true)
                      .status();
    waited.store(true);
  });
  // Worker 1 takes the shard past the cut and writes its residual file.
  for (int step = 3; step < 5; ++step) {
    ASSERT_TRUE(w1->Step(t1.gradients, 8).ok());
  }
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(waited.load()) << wait_status;
  const absl::Time recovery = absl::Now();
  w0->BeforeRecovery();
  wait.join();
  EXPECT_LT(absl::Now() - recovery, absl::Seconds(3));
  EXPECT_TRUE(absl::IsCancelled(wait_status)) << wait_status;
  EXPECT_NE(wait_status.message().find("worker(s) 0"), std::string::npos)
      << wait_status;
}

// A residual file that cannot be written (CI, 2026-11-29: worker 0 gave
// the checkpoint up when a shard died and removed its step folder while
// worker 1 renamed its file into it) loses that checkpoint, not the
// worker: every step still succeeds, and no residual file is left.
TEST(PsExchangeTest, AResidualFileThatCannotBeWrittenLosesOnlyItsCheckpoint) {
  const std::string dir = ::testing::TempDir() + "/unwritable_residual";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  Shards shards(/*num_shards=*/1, /*num_workers=*/2, /*staleness=*/0,
                OptimizerOptions(), /*clip_grad_norm=*/0,
                /*replicas_to_aggregate=*/0, dir);
  shards.set_compression(CompressionOptions{0.05, true});
  std::unique_ptr<GradientExchange> w0 = shards.Exchange(0, /*chief=*/true);
  std::unique_ptr<GradientExchange> w1 = shards.Exchange(1, /*chief=*/false);
  RankTensors t0(0), t1(1);
  auto both = [&](auto fn0, auto fn1) {
    absl::Status s0;
    std::thread other([&] { s0 = fn0(); });
    const absl::Status s1 = fn1();
    other.join();
    EXPECT_TRUE(s0.ok()) << s0;
    EXPECT_TRUE(s1.ok()) << s1;
  };
  both([&] { return w0->Start(t0.weights); },
       [&] { return w1->Start(t1.weights); });
  both([&] { return w0->Step(t0.gradients, 8); },
       [&] { return w1->Step(t1.gradients, 8); });
  // Folders where the residual files go: neither can be renamed into
  // place.
  const std::string step_dir = CheckpointStepDir(dir, 1);
  for (const char* name :
       {"residual-0.safetensors", "residual-1.safetensors"}) {
    std::filesystem::create_directories(step_dir + "/" + name + "/in_the_way");
  }
  absl::StatusOr<std::vector<CheckpointResponse>> begun =
      w0->Checkpoint(1, /*end_step=*/100, /*latest_step=*/-1, step_dir,
                     /*wait=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  for (int step = 1; step < 3; ++step) {
    both([&] { return w0->Step(t0.gradients, 8); },
         [&] { return w1->Step(t1.gradients, 8); });
  }
  for (const char* name :
       {"residual-0.safetensors", "residual-1.safetensors"}) {
    EXPECT_TRUE(std::filesystem::is_directory(step_dir + "/" + name));
  }
  w0->BeforeRecovery();
  both([&] { return w0->Finish(); }, [&] { return w1->Finish(); });
}

// Backup workers with a row-sparse table (issue 41): 1 backup of 3 workers,
// SGD, tensor 0 a table of 100 rows of 10. Workers 0 and 1 run steps 0 to
// 3 by rows while worker 2 waits; then worker 2 pushes step 0 and pulls
// the rows of its batch 1, but the shards are at version 4: it is late and
// jumps to step 4, whose batch reads other rows. Its exchange then pulls
// again, whole: every row batch 4 reads is the shards' (with the rows of
// batch 1 alone, batch 4's rows kept their initial values).
TEST(PsExchangeTest, ABackupWorkerThatJumpsPullsTheTableWhole) {
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.1f;
  Shards shards(2, 3, /*staleness=*/0, sgd, /*clip_grad_norm=*/0,
                /*replicas_to_aggregate=*/2);
  constexpr int64_t kD = 10;
  shards.set_row_elements({kD, 0, 0});
  constexpr int kSteps = 4;
  // The rows worker w's batch of step `step` reads: worker 2's of steps 1
  // and 4 are disjoint, and workers 0 and 1 update the latter's.
  auto rows_of = [](int64_t step, int w) {
    std::vector<uint32_t> rows;
    for (uint32_t r = 0; r < kElements / kD; ++r) {
      if ((r + step + w) % 5 == 0) rows.push_back(r);
    }
    return std::vector<std::vector<uint32_t>>{rows, {}, {}};
  };
  absl::Mutex mu;
  int started = 0, trained = 0;
  bool checked = false;
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(w, /*chief=*/w == 0);
      RankTensors tensors(w);
      // Whatever fails, the others do not wait for ever.
      bool failed = true;
      absl::Cleanup release = [&] {
        if (!failed) return;
        absl::MutexLock lock(&mu);
        started = 3;
        trained = 2;
        checked = true;
      };
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      {
        absl::MutexLock lock(&mu);
        ++started;
        mu.Await(absl::Condition(
            +[](int* n) { return *n >= 3; }, &started));
      }
      if (w < 2) {
        for (int step = 0; step < kSteps; ++step) {
          exchange->SetStepRows(rows_of(step, w), rows_of(step + 1, w), true);
          const absl::Status s = exchange->Step(tensors.gradients, 8);
          ASSERT_TRUE(s.ok()) << "worker " << w << " step " << step << s;
        }
        {
          absl::MutexLock lock(&mu);
          ++trained;
          mu.Await(absl::Condition(&checked));
        }
      } else {
        {
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(
              +[](int* n) { return *n >= 2; }, &trained));
        }
        exchange->SetStepRows(rows_of(0, 2), rows_of(1, 2), true);
        ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
        ASSERT_EQ(exchange->NextStep(0), kSteps);
        std::vector<float> table(kElements, -1.0f);
        for (int s = 0; s < 2; ++s) {
          absl::StatusOr<std::vector<ChunkSnapshot>> chunks =
              shards.shard(s).Snapshot(kSteps);
          ASSERT_TRUE(chunks.ok()) << chunks.status();
          for (const ChunkSnapshot& c : *chunks) {
            if (c.spec.param_id != 0) continue;
            std::copy(c.weights.begin(), c.weights.end(),
                      table.begin() + c.spec.offset);
          }
        }
        int moved = 0;
        const std::vector<uint32_t> read = rows_of(kSteps, 2)[0];
        for (uint32_t r : read) {
          for (int64_t j = 0; j < kD; ++j) {
            const int64_t i = r * kD + j;
            EXPECT_EQ(tensors.w[0][i], table[i]) << "row " << r;
            moved += table[i] != 0.1f;
          }
        }
        EXPECT_GT(moved, 0);  // batch 4's rows were updated
        absl::MutexLock lock(&mu);
        checked = true;
      }
      ASSERT_TRUE(exchange->Finish().ok());
      failed = false;
    });
  }
  for (std::thread& t : threads) t.join();
}

// Bounded staleness 2 (issue 25) through the client and gRPC: worker 1 is
// held between steps; worker 0 runs at most 2 steps ahead of it (after the
// first step, whose pull waits for step 0), and the shards end with the
// sync model: each step's update is the average of both workers' pushes.
TEST(PsExchangeTest, StalenessLetsAWorkerRunAtMostThatFarAhead) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 6;
  constexpr int kStaleness = 2;
  Shards shards(/*num_shards=*/2, kWorkers, kStaleness);
  std::atomic<int> done0{0};  // steps worker 0 has finished
  absl::Mutex mu;
  int allowed1 ABSL_GUARDED_BY(mu) = 0;  // steps worker 1 may run
  std::atomic<int> done1{0};
  std::thread fast([&] {
    std::unique_ptr<GradientExchange> exchange = shards.Exchange(0, true);
    RankTensors tensors(0);
    ASSERT_TRUE(exchange->Start(tensors.weights).ok());
    for (int t = 0; t < kSteps; ++t) {
      const absl::Status s = exchange->Step(tensors.gradients, 8);
      ASSERT_TRUE(s.ok()) << s;
      ++done0;
    }
    ASSERT_TRUE(exchange->Finish().ok());
  });
  std::thread slow([&] {
    std::unique_ptr<GradientExchange> exchange = shards.Exchange(1, false);
    RankTensors tensors(1);
    ASSERT_TRUE(exchange->Start(tensors.weights).ok());
    for (int t = 0; t < kSteps; ++t) {
      {
        absl::MutexLock lock(&mu);
        auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return allowed1 > t;
        };
        ASSERT_TRUE(
            mu.AwaitWithTimeout(absl::Condition(&go), absl::Seconds(30)));
      }
      const absl::Status s = exchange->Step(tensors.gradients, 8);
      ASSERT_TRUE(s.ok()) << s;
      ++done1;
    }
    ASSERT_TRUE(exchange->Finish().ok());
  });
  // Waits up to 10 s for `count` to reach `n`.
  auto reach = [](const std::atomic<int>& count, int n) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (count.load() < n && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return count.load();
  };
  // Worker 1 still at step 0: worker 0's first pull waits for step 0.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(done0.load(), 0);
  for (int k = 1; k <= kSteps; ++k) {
    {
      absl::MutexLock lock(&mu);
      allowed1 = k;
    }
    ASSERT_EQ(reach(done1, k), k);
    // Worker 0's step j pulls version max(1, j - 1), so it waits for step
    // max(0, j - 2) to be decided: with worker 1's steps 0 to k - 1 in,
    // worker 0 finishes steps 0 to k + 1 (k + 2 of them) and no more.
    const int bound = std::min(kSteps, k + kStaleness);
    EXPECT_EQ(reach(done0, bound), bound) << k;
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(done0.load(), bound) << "worker 0 ran past the bound at " << k;
  }
  fast.join();
  slow.join();
  // Both workers' pushes of every step went into its update: the sync model.
  const std::vector<std::vector<float>> expected =
      Expected(kWorkers, kSteps, AdamOptions());
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<std::vector<ChunkSnapshot>> snapshot =
        shards.shard(s).Snapshot(kSteps);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    for (const ChunkSnapshot& c : *snapshot) {
      EXPECT_EQ(c.weights, expected[c.spec.param_id]) << c.spec.param_id;
    }
  }
}

// With staleness s a worker's last pull is of version T - s, and with
// clipping a step's pull answers the norm round of the step s before it:
// the job's last s steps were decided by no one (their updates never
// applied) and the final weights lagged. AwaitFinalWeights() answers those
// rounds and pulls version T: every worker ends with the sync model, and
// so do the shards.
TEST(PsExchangeTest, StalenessEndsWithEveryStepDecidedWithAndWithoutClipping) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 6;
  for (double clip : {0.0, 3.0}) {
    std::vector<std::vector<std::vector<float>>> sync;
    {
      Shards shards(/*num_shards=*/2, kWorkers, /*staleness=*/0,
                    NesterovCosine(), clip);
      sync = TrainOnShards(shards, kWorkers, kSteps);
    }
    Shards shards(/*num_shards=*/2, kWorkers, /*staleness=*/2, NesterovCosine(),
                  clip);
    const std::vector<std::vector<std::vector<float>>> stale =
        TrainOnShards(shards, kWorkers, kSteps, /*await_final=*/true);
    for (int s = 0; s < 2; ++s) {
      const ShardStats stats = shards.shard(s).Stats();
      EXPECT_EQ(stats.decided_step, kSteps - 1) << "clip " << clip;
      EXPECT_EQ(stats.min_version, kSteps) << "clip " << clip;
    }
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(stale[r], sync[0]) << "clip " << clip << " worker " << r;
    }
  }
}

// Async: a worker's newest pull lacks the pushes of the workers still
// training. AwaitFinalWeights() waits for every member's last push and
// pulls then: worker 0, done first, ends with the shards' final weights,
// worker 1's last push in them, bit for bit.
TEST(PsExchangeTest, AsyncFinalWeightsHoldEveryWorkersLastPush) {
  constexpr int kSteps = 4;
  Shards shards(/*num_shards=*/2, /*num_workers=*/2, /*staleness=*/0,
                AdamOptions(), /*clip_grad_norm=*/0,
                /*replicas_to_aggregate=*/0,
                /*checkpoint_dir=*/"", SyncMode::kAsync);
  absl::Notification worker0_ended;  // its steps, before its final pull
  std::atomic<bool> worker0_final{false};
  std::vector<std::vector<std::vector<float>>> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          shards.Exchange(r, /*chief=*/r == 0);
      RankTensors tensors(r);
      ASSERT_TRUE(exchange->Start(tensors.weights).ok());
      for (int step = 0; step < kSteps; ++step) {
        if (r == 1 && step + 1 == kSteps) {
          // Worker 1's last step once worker 0 has ended its steps.
          ASSERT_TRUE(
              worker0_ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
          absl::SleepFor(absl::Milliseconds(300));
          EXPECT_FALSE(worker0_final.load())
              << "worker 0 took its final weights before worker 1's last step";
        }
        const absl::Status s = exchange->Step(tensors.gradients, 8);
        ASSERT_TRUE(s.ok()) << s;
      }
      if (r == 0) worker0_ended.Notify();
      const absl::Status s = exchange->AwaitFinalWeights();
      ASSERT_TRUE(s.ok()) << s;
      if (r == 0) worker0_final.store(true);
      results[r] = tensors.w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t pushes = 0;
  for (int s = 0; s < 2; ++s) {
    pushes += shards.shard(s).Stats().pushes;
    absl::StatusOr<std::vector<ChunkSnapshot>> snapshot =
        shards.shard(s).Snapshot(0);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    for (const ChunkSnapshot& c : *snapshot) {
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(results[r][c.spec.param_id], c.weights)
            << "worker " << r << " tensor " << c.spec.param_id;
      }
    }
  }
  EXPECT_EQ(pushes, 2 * kSteps * kTensors);  // every push applied
}

// The wait for the other workers' last pushes ends when no push reaches
// the shards for its stall timeout (a worker evaluating, checkpointing or
// dead), answering the workers still training.
TEST(PsExchangeTest, AsyncFinalWaitWithoutProgressNamesTheWorkersTraining) {
  Shards shards(/*num_shards=*/2, /*num_workers=*/3, /*staleness=*/0,
                AdamOptions(), /*clip_grad_norm=*/0,
                /*replicas_to_aggregate=*/0,
                /*checkpoint_dir=*/"", SyncMode::kAsync);
  std::unique_ptr<GradientExchange> exchange = shards.Exchange(0, true);
  RankTensors tensors(0);
  ASSERT_TRUE(exchange->Start(tensors.weights).ok());
  ASSERT_TRUE(exchange->Step(tensors.gradients, 8).ok());
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Create(shards.ClientOptions(0), shards.Plan());
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::vector<int>> training =
      (*client)->AwaitStepsEnded(absl::Milliseconds(300));
  ASSERT_TRUE(training.ok()) << training.status();
  EXPECT_EQ(*training, std::vector<int>({1, 2}));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(PsExchangeTest, FailedCopyIsStepsErrorAndMidStepExitIsPrompt) {
  Shards shards(/*num_shards=*/1, /*num_workers=*/1);
  std::vector<std::vector<float>> w(kTensors,
                                    std::vector<float>(kElements, 0.1f));
  std::vector<std::vector<float>> g(kTensors, std::vector<float>(kElements));
  std::vector<absl::Span<float>> weights(w.begin(), w.end());
  std::vector<absl::Span<const float>> gradients(g.begin(), g.end());
  {
    std::unique_ptr<GradientExchange> exchange = shards.Exchange(0, true);
    ASSERT_TRUE(exchange->Start(weights).ok());
    exchange->GradientsReady(
        gradients, 1, {2},
        std::make_shared<ProbeFence>(absl::DataLossError("copy 7 failed")));
    const absl::Time start = absl::Now();
    const absl::Status s = exchange->Step(gradients, 1);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ(s.message(), "copy 7 failed");
    // Nothing reached the shard, and the weights were not touched.
    EXPECT_EQ(shards.shard(0).Stats().pushes, 0);
    EXPECT_EQ(w[2], std::vector<float>(kElements, 0.1f));
  }
  // The step given up mid-way broke the shard's barrier (its pull was in,
  // its pushes never came): no step of this generation can complete, and
  // a worker that joins hears why at once. The shard learns of the broken
  // stream when gRPC delivers its cancel, asynchronously: wait for that.
  const absl::Time break_deadline = absl::Now() + absl::Seconds(5);
  while (!shards.shard(0).Stats().barrier_broken &&
         absl::Now() < break_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(shards.shard(0).Stats().barrier_broken);
  {
    std::unique_ptr<GradientExchange> exchange = shards.Exchange(0, false);
    const absl::Status s = exchange->Start(weights);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("worker 0 on 127.0.0.1:"), std::string::npos)
        << s;
    EXPECT_NE(s.message().find(": its push/pull stream to shard 0 broke"),
              std::string::npos)
        << s;
  }
  // Worker 0 restores the shards (generation 1); then backward fails after
  // one layer: the exchange goes away mid-step, promptly.
  ModelState initial;
  initial.weights = w;
  initial.m.resize(kTensors);
  initial.v.resize(kTensors);
  initial.versions.resize(kTensors);
  const absl::Time start = absl::Now();
  {
    std::unique_ptr<GradientExchange> exchange = shards.Exchange(0, true);
    absl::StatusOr<int64_t> version =
        exchange->Rejoin(weights, {}, &initial, absl::Seconds(5));
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, 0);
    EXPECT_EQ(shards.shard(0).generation(), 1);
    exchange->GradientsReady(gradients, 1, {2}, nullptr);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Gradient clipping by global norm on the PS (issue 25): the 3 tensors lie
// on 2 shards, so the norm spans shards; each shard sends its partial,
// each worker sends back the sum, and both workers pull the weights of
// the PyTorch fixture (as the allreduce test above).
TEST(PsExchangeTest, ClipsByGlobalNormAgreedAcrossShardsAsPyTorch) {
  std::vector<std::vector<float>> expected;
  ASSERT_NO_FATAL_FAILURE(ReadClipFixture(&expected));
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.1f;
  constexpr int kWorkers = 2;
  Shards shards(/*num_shards=*/2, kWorkers, /*staleness=*/0, sgd,
                /*clip_grad_norm=*/5.0);
  const PartitionPlan plan = shards.Plan();
  ASSERT_NE(plan.chunks()[0].shard, plan.chunks()[1].shard);
  const std::vector<std::vector<std::vector<float>>> results =
      TrainOnShards(shards, kWorkers, /*steps=*/1);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(results[r].size(), static_cast<size_t>(kTensors));
    for (int k = 0; k < kTensors; ++k) {
      for (int e = 0; e < kElements; ++e) {
        ASSERT_NEAR(results[r][k][e], expected[k][e], 1e-7)
            << "worker " << r << " tensor " << k << " element " << e;
      }
    }
  }
}

// Several steps of SGD with Nesterov momentum under a cosine schedule,
// clipped: the PS path and the allreduce path (a Gloo rank per thread) end
// with the same weights, which are not the unclipped ones.
TEST(PsExchangeTest, ClippingOnTheShardsEqualsClippingInAllreduce) {
  constexpr int kWorkers = 2;
  constexpr int kSteps = 4;
  constexpr double kClip = 3.0;
  const OptimizerOptions sgd = NesterovCosine();
  std::vector<std::vector<std::vector<float>>> ps;
  {
    Shards shards(/*num_shards=*/2, kWorkers, /*staleness=*/0, sgd, kClip);
    ps = TrainOnShards(shards, kWorkers, kSteps);
  }
  const std::vector<std::vector<std::vector<float>>> ar =
      TrainWithAllreduce(kWorkers, sgd, kSteps, kClip, "clip-sgd");
  const std::vector<std::vector<float>> unclipped =
      Expected(kWorkers, kSteps, sgd);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(ps[r].size(), static_cast<size_t>(kTensors));
    for (int k = 0; k < kTensors; ++k) {
      for (int e = 0; e < kElements; ++e) {
        ASSERT_NEAR(ps[r][k][e], ar[r][k][e], 1e-7)
            << "worker " << r << " tensor " << k << " element " << e;
      }
    }
  }
  EXPECT_GT(std::fabs(ps[0][0][999] - unclipped[0][999]), 0.1f)
      << "the clipping did not act";
}

// A shard that ends a step with an error (here: the other worker's stream
// broke) while this worker still has pushes to send: the worker reports
// the shard's own status, not a cancel of its own making. (Its pusher,
// stopped mid-step, used to cancel the call before the shard's status
// arrived: "CANCELLED (the call ended without the shard's status)", which
// named neither the shard's reason nor the worker that died.)
TEST(PsExchangeTest, ShardErrorMidPushIsReportedAsTheShardSentIt) {
  Shards shards(/*num_shards=*/1, /*num_workers=*/2);
  RankTensors tensors0(0);
  RankTensors tensors1(1);
  std::unique_ptr<GradientExchange> exchange0 = shards.Exchange(0, true);
  std::unique_ptr<GradientExchange> exchange1 = shards.Exchange(1, false);
  std::thread start1(
      [&] { ASSERT_TRUE(exchange1->Start(tensors1.weights).ok()); });
  ASSERT_TRUE(exchange0->Start(tensors0.weights).ok());
  start1.join();
  // Both begin step 0 with one tensor pushed; worker 0's other pushes wait
  // for its backward.
  exchange0->GradientsReady(tensors0.gradients, 8, {kTensors - 1}, nullptr);
  exchange1->GradientsReady(tensors1.gradients, 8, {kTensors - 1}, nullptr);
  const absl::Time start = absl::Now();
  while (shards.shard(0).Stats().pushes < 2 &&
         absl::Now() < start + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(shards.shard(0).Stats().pushes, 2);
  // Worker 1 goes away mid-step; the shard tells worker 0 in-band, while
  // worker 0's pusher still waits for its next gradients.
  exchange1.reset();
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Status s = exchange0->Step(tensors0.gradients, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("worker 1 on 127.0.0.1:"), std::string::npos) << s;
  EXPECT_NE(s.message().find("broke mid-step"), std::string::npos) << s;
}

// The same steps through a sync ParameterShard with 2 workers (one chunk
// per tensor) and through the allreduce exchange give the single-process
// update, bit for bit: both sum in worker order, scale by 1/W and call the
// same update at the same scheduled lr.
TEST(OptimizerEquivalenceTest, SgdOnTheShardAndInAllreduceIsOneUpdate) {
  constexpr int kSize = 2;
  constexpr int kSteps = 5;
  const OptimizerOptions sgd = NesterovCosine();
  const std::vector<std::vector<float>> expected = Expected(kSize, kSteps, sgd);
  ASSERT_NE(expected[0][0], 0.1f);

  ShardOptions options;
  options.num_workers = kSize;
  options.adam = sgd;
  ParameterShard shard(options);
  std::vector<InitChunk> chunks(kTensors);
  for (int t = 0; t < kTensors; ++t) {
    chunks[t].param_id = t;
    chunks[t].values.assign(kElements, 0.1f);
  }
  ASSERT_TRUE(shard
                  .Initialize(std::vector<int64_t>(kTensors, kElements),
                              kElements * sizeof(float), std::move(chunks))
                  .ok());
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kSize; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        ASSERT_TRUE(shard.Push(r, t, 0, step, Gradient(r, t)).ok());
      }
      ASSERT_TRUE(shard.EndStep(r, step, nullptr).ok());
    }
  }
  std::vector<std::vector<float>> on_shard(kTensors);
  ASSERT_TRUE(shard
                  .Pull(kSteps, 0, absl::Now() + absl::Seconds(10),
                        [&](const ChunkSpec& chunk, int64_t,
                            absl::Span<const float> weights) {
                          on_shard[chunk.param_id].assign(weights.begin(),
                                                          weights.end());
                        })
                  .ok());
  EXPECT_EQ(on_shard, expected);

  const std::vector<std::vector<std::vector<float>>> results =
      TrainWithAllreduce(kSize, sgd, kSteps, /*clip=*/0, "sgd");
  for (int r = 0; r < kSize; ++r) EXPECT_EQ(results[r], expected) << r;
}

}  // namespace
}  // namespace pstrain
