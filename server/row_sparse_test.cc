// Row-sparse chunks on a shard (issue 41): the union's average and the lazy
// update (against optim/sparse_adam.h, itself checked bit for bit against
// torch.optim.SparseAdam), sparse pushes equal to dense ones under SGD
// (with clipping by global norm too), malformed row pushes refused, a
// skipped step put back by rows, async pushes, and a resume from a
// snapshot that goes on bit for bit.
#include "server/row_sparse.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "optim/sparse_adam.h"
#include "server/parameter_shard.h"

namespace pstrain {
namespace {

// A table of 8 rows of 3 elements (param 0) and a dense tensor of 2: in
// 48-byte chunks, (0,0) holds rows 0-3, (0,1) rows 4-7, (1,0) the 2.
constexpr int64_t kD = 3;
const std::vector<int64_t> kSizes = {24, 2};
const std::vector<int64_t> kRowLayout = {kD, 0};
constexpr int64_t kPartitionBytes = 48;

ShardOptions Options(int num_workers, SyncMode mode,
                     OptimizerKind kind = OptimizerKind::kAdam) {
  ShardOptions options;
  options.job_id = "job";
  options.num_workers = num_workers;
  options.mode = mode;
  options.adam.lr = 0.1f;
  options.adam.kind = kind;
  return options;
}

std::vector<InitChunk> InitChunks() {
  std::vector<InitChunk> chunks(3);
  for (int i = 0; i < 12; ++i) chunks[0].values.push_back(0.5f * i - 2.0f);
  chunks[1].chunk_index = 1;
  for (int i = 0; i < 12; ++i) chunks[1].values.push_back(1.0f - 0.25f * i);
  chunks[2].param_id = 1;
  chunks[2].values = {7, 8};
  return chunks;
}

absl::Status InitRows(ParameterShard& shard,
                      std::vector<InitChunk> chunks = InitChunks(),
                      int64_t generation = 0) {
  shard.SetRowSparseLayout(kRowLayout);
  return shard.Initialize(kSizes, kPartitionBytes, std::move(chunks), 0,
                          generation);
}

absl::Status PushRows(ParameterShard& shard, int worker, int32_t param,
                      int32_t chunk, int64_t step, const RowValues& rows) {
  return shard.PushRows(worker, param, chunk, step,
                        [&](int64_t, int64_t, RowValues* out) {
                          *out = rows;
                          return absl::OkStatus();
                        });
}

std::vector<std::vector<float>> PullAll(ParameterShard& shard,
                                        int64_t min_version) {
  std::vector<std::vector<float>> out(3);
  const PartitionPlan& plan = shard.plan();
  EXPECT_TRUE(
      shard
          .Pull(min_version, 0, absl::Now() + absl::Seconds(5),
                [&](const ChunkSpec& spec, int64_t, absl::Span<const float> w) {
                  out[plan.FindChunk(spec.param_id, spec.chunk_index)].assign(
                      w.begin(), w.end());
                })
          .ok());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The dense form of a chunk's rows (zeros elsewhere).
std::vector<float> Dense(const RowValues& rows, int64_t n) {
  std::vector<float> out(n, 0.0f);
  for (size_t i = 0; i < rows.rows.size(); ++i) {
    std::copy(rows.values.begin() + i * kD, rows.values.begin() + (i + 1) * kD,
              out.begin() + rows.rows[i] * kD);
  }
  return out;
}

TEST(RowSparseTest, AverageEqualsTheDenseAverageOnTheUnion) {
  const RowValues a = {{0, 2}, {1, 2, 3, -0.0f, 5, 6}};
  const RowValues b = {{2, 3}, {0.5f, 0.25f, 0.125f, 7, 8, 9}};
  RowValues avg;
  AverageRows({&a, &b}, kD, &avg);
  EXPECT_EQ(avg.rows, (std::vector<uint32_t>{0, 2, 3}));
  std::vector<float> da = Dense(a, 12), db = Dense(b, 12);
  for (int i = 0; i < 12; ++i) da[i] = (da[i] + db[i]) * 0.5f;
  EXPECT_TRUE(SameBits(Dense(avg, 12), da));
  // One worker: its rows as they are.
  AverageRows({&a}, kD, &avg);
  EXPECT_TRUE(SameBits(avg.values, a.values));
}

TEST(RowSparseTest, SyncAveragesTheUnionThenAppliesLazyAdamToItsRowsOnly) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(InitRows(shard).ok());
  // Row 0 by worker 0 only, row 2 by both, row 3 by worker 1; rows 1 and
  // 4-7 by nobody (chunk (0,1) gets no rows from either).
  const RowValues w0 = {{0, 2}, {0.1f, -0.2f, 0.3f, 1.0f, 2.0f, -3.0f}};
  const RowValues w1 = {{2, 3}, {0.5f, 0.5f, 0.5f, -1.0f, 0.0f, 4.0f}};
  ASSERT_TRUE(PushRows(shard, 0, 0, 0, 0, w0).ok());
  ASSERT_TRUE(PushRows(shard, 1, 0, 0, 0, w1).ok());
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(PushRows(shard, w, 0, 1, 0, RowValues{}).ok());
    ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>{1.0f, -1.0f}).ok());
    ASSERT_TRUE(shard.EndStep(w, 0, nullptr).ok());
  }
  const std::vector<std::vector<float>> pulled = PullAll(shard, 1);
  // The reference: SparseAdam on rows {0, 2, 3} of the dense average.
  std::vector<float> avg = Dense(w0, 12), d1 = Dense(w1, 12);
  for (int i = 0; i < 12; ++i) avg[i] = (avg[i] + d1[i]) * 0.5f;
  std::vector<float> packed;
  for (uint32_t r : {0u, 2u, 3u}) {
    packed.insert(packed.end(), avg.begin() + r * kD,
                  avg.begin() + (r + 1) * kD);
  }
  std::vector<float> w = InitChunks()[0].values, m(12, 0.0f), v(12, 0.0f);
  AdamOptions adam;
  adam.lr = 0.1f;
  const std::vector<uint32_t> rows = {0, 2, 3};
  ASSERT_TRUE(SparseAdamRows(adam, 1, kD, rows, packed.data(), w.data(),
                             m.data(), v.data()));
  EXPECT_TRUE(SameBits(pulled[0], w));
  // Untouched rows: row 1 and all of chunk (0,1) keep every bit, and their
  // moments stay 0.
  for (int i = 3; i < 6; ++i)
    EXPECT_EQ(pulled[0][i], InitChunks()[0].values[i]);
  EXPECT_TRUE(SameBits(pulled[1], InitChunks()[1].values));
  absl::StatusOr<std::vector<ChunkSnapshot>> snap = shard.Snapshot(1);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_TRUE(SameBits((*snap)[0].m, m));
  EXPECT_TRUE(SameBits((*snap)[0].v, v));
  EXPECT_EQ((*snap)[1].version, 1);  // t advances on untouched chunks too
  EXPECT_TRUE(SameBits((*snap)[1].m, std::vector<float>(12, 0.0f)));
}

// SGD without momentum: a zero gradient moves nothing, so the job pushing
// rows and the job pushing the same gradients dense (no row layout) end
// with the same weights, bit for bit.
void ExpectSgdRowPushesEqualDensePushes(const ShardOptions& options,
                                        bool every_row_moves);

// SGD on row pushes is the dense SGD of their densified average, bit for
// bit: plain (the touched rows move, a zero gradient moves nothing), and
// with Nesterov momentum and weight decay, which move every row as PyTorch's
// SGD on a sparse gradient does (server/row_sparse.h).
TEST(RowSparseTest, SgdRowPushesEqualDensePushesBitForBit) {
  for (const bool momentum : {false, true}) {
    SCOPED_TRACE(momentum ? "momentum 0.9, Nesterov, weight decay 0.01"
                          : "plain SGD");
    ShardOptions options = Options(2, SyncMode::kSync, OptimizerKind::kSgd);
    if (momentum) {
      options.adam.momentum = 0.9f;
      options.adam.nesterov = true;
      options.adam.weight_decay = 0.01f;
    }
    ExpectSgdRowPushesEqualDensePushes(options, momentum);
  }
}

void ExpectSgdRowPushesEqualDensePushes(const ShardOptions& options,
                                        bool every_row_moves) {
  ParameterShard sparse(options);
  ParameterShard dense(options);
  ASSERT_TRUE(InitRows(sparse).ok());
  ASSERT_TRUE(dense.Initialize(kSizes, kPartitionBytes, InitChunks()).ok());
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<float>> before = PullAll(sparse, 0);
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<bool> touched(8, false);
    for (int w = 0; w < 2; ++w) {
      for (int32_t c = 0; c < 2; ++c) {
        RowValues rows;
        for (uint32_t r = 0; r < 4; ++r) {
          if (rng() % 2 == 0) continue;
          rows.rows.push_back(r);
          touched[c * 4 + r] = true;
          for (int j = 0; j < kD; ++j) rows.values.push_back(value(rng));
        }
        ASSERT_TRUE(PushRows(sparse, w, 0, c, step, rows).ok());
        ASSERT_TRUE(dense.Push(w, 0, c, step, Dense(rows, 12)).ok());
      }
      const std::vector<float> g = {value(rng), value(rng)};
      ASSERT_TRUE(sparse.Push(w, 1, 0, step, g).ok());
      ASSERT_TRUE(dense.Push(w, 1, 0, step, g).ok());
      ASSERT_TRUE(sparse.EndStep(w, step, nullptr).ok());
      ASSERT_TRUE(dense.EndStep(w, step, nullptr).ok());
    }
    const auto a = PullAll(sparse, step + 1), b = PullAll(dense, step + 1);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(SameBits(a[i], b[i])) << "step " << step << " chunk " << i;
    }
    // A row no worker touched this step: moved only where every row moves.
    for (int row = 0; row < 8; ++row) {
      if (touched[row]) continue;
      const float* now = a[row / 4].data() + (row % 4) * kD;
      const float* was = before[row / 4].data() + (row % 4) * kD;
      EXPECT_EQ(std::memcmp(now, was, kD * sizeof(float)) != 0, every_row_moves)
          << "step " << step << ", untouched row " << row;
    }
    before = a;
  }
}

// Clipping by global norm: a row chunk's partial (the union's squares) is
// the dense chunk's bit for bit, so the clipped SGD steps agree too.
TEST(RowSparseTest, ClippingSeesTheDenseNormAndUpdate) {
  auto options = [] {
    ShardOptions o = Options(2, SyncMode::kSync, OptimizerKind::kSgd);
    o.clip_grad_norm = 0.5;
    return o;
  };
  ParameterShard sparse(options()), dense(options());
  ASSERT_TRUE(InitRows(sparse).ok());
  ASSERT_TRUE(dense.Initialize(kSizes, kPartitionBytes, InitChunks()).ok());
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<double> partials[2];
    std::vector<std::vector<float>> pulled[2];
    int i = 0;
    for (ParameterShard* shard : {&sparse, &dense}) {
      for (int w = 0; w < 2; ++w) {
        const RowValues rows = {{static_cast<uint32_t>((step + w) % 4)},
                                {1.0f + w, -2.0f, 0.5f * step}};
        if (shard == &sparse) {
          ASSERT_TRUE(PushRows(*shard, w, 0, 0, step, rows).ok());
          ASSERT_TRUE(PushRows(*shard, w, 0, 1, step, RowValues{}).ok());
        } else {
          ASSERT_TRUE(shard->Push(w, 0, 0, step, Dense(rows, 12)).ok());
          ASSERT_TRUE(
              shard->Push(w, 0, 1, step, std::vector<float>(12, 0.0f)).ok());
        }
        ASSERT_TRUE(shard->Push(w, 1, 0, step, std::vector<float>{1, 1}).ok());
        ASSERT_TRUE(shard->EndStep(w, step, nullptr).ok());
      }
      std::atomic<bool> have_partial{false};
      std::thread puller([&, shard, i] {
        EXPECT_TRUE(
            shard
                ->Pull(
                    step + 1, 0, absl::Now() + absl::Seconds(10),
                    [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
                      pulled[i].emplace_back(w.begin(), w.end());
                    },
                    nullptr, nullptr, 0, nullptr,
                    [&](int64_t, double sum_sq) {
                      partials[i].push_back(sum_sq);
                      have_partial = true;
                      return true;
                    })
                .ok());
      });
      while (!have_partial) absl::SleepFor(absl::Milliseconds(5));
      ASSERT_TRUE(shard->ApplyStepNorm(0, step, partials[i][0]).ok());
      puller.join();
      ++i;
    }
    ASSERT_EQ(partials[0].size(), 1u);
    ASSERT_EQ(partials[1].size(), 1u);
    EXPECT_EQ(partials[0][0], partials[1][0]) << "step " << step;
    ASSERT_EQ(pulled[0].size(), 3u);
    ASSERT_EQ(pulled[1].size(), 3u);
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(SameBits(pulled[0][c], pulled[1][c]))
          << "step " << step << " chunk " << c;
    }
  }
}

TEST(RowSparseTest, BadRowPushesAreInvalidArgumentAndChangeNothing) {
  ParameterShard shard(Options(1, SyncMode::kSync));
  ASSERT_TRUE(InitRows(shard).ok());
  auto code = [&](int32_t param, const RowValues& rows) {
    return PushRows(shard, 0, param, 0, 0, rows).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(0, {{1, 1}, std::vector<float>(6, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{2, 1}, std::vector<float>(6, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{4}, std::vector<float>(3, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{0xffffffffu}, std::vector<float>(3, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{0, 1}, std::vector<float>(5, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{0, 1, 2, 3, 4}, std::vector<float>(15, 1.0f)}), kInvalid);
  EXPECT_EQ(code(0, {{0}, {1.0f, std::nanf(""), 1.0f}}), kInvalid);
  EXPECT_EQ(PushRows(shard, 0, 1, 0, 0, {{0}, {1, 2}}).message(),
            "row push to chunk (1, 0), which is dense; expected a row-sparse "
            "tensor's");
  EXPECT_EQ(PushRows(shard, 0, 0, 0, 0, {{1, 1}, std::vector<float>(6, 1.0f)})
                .message(),
            "row push to chunk (0, 0): row 1 is 1; expected strictly "
            "ascending rows below 4");
  // Nothing was taken: the real pushes of step 0 go through once each.
  ASSERT_TRUE(PushRows(shard, 0, 0, 0, 0, {{3}, {1, 1, 1}}).ok());
  // (One worker: the chunk's barrier is complete, so it is past step 0.)
  EXPECT_EQ(PushRows(shard, 0, 0, 0, 0, {{3}, {1, 1, 1}}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(PushRows(shard, 0, 0, 1, 0, {}).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>{0, 0}).ok());
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  const auto pulled = PullAll(shard, 1);
  for (int i = 0; i < 9; ++i)
    EXPECT_EQ(pulled[0][i], InitChunks()[0].values[i]);
  EXPECT_NE(pulled[0][9], InitChunks()[0].values[9]);
}

void ExpectASkippedStepPutsTheRowsBack(const ShardOptions& options);

// A skipped step (a non-finite value) leaves the rows it touched, and with
// SGD's momentum or weight decay every row, as they were: weights, m, v
// (SGD without momentum keeps no m to put back: its m stays as it was).
TEST(RowSparseTest, ASkippedStepPutsTheRowsBack) {
  auto sgd_with = [](float momentum) {
    ShardOptions o = Options(1, SyncMode::kSync, OptimizerKind::kSgd);
    o.adam.momentum = momentum;
    o.adam.weight_decay = 0.01f;
    return o;
  };
  const ShardOptions adam = Options(1, SyncMode::kSync);
  const ShardOptions sgd = sgd_with(0.9f);
  const ShardOptions decay = sgd_with(0.0f);
  for (const ShardOptions* options : {&adam, &sgd, &decay}) {
    SCOPED_TRACE(options == &adam  ? "Adam"
                 : options == &sgd ? "SGD, momentum and weight decay"
                                   : "SGD, weight decay");
    ExpectASkippedStepPutsTheRowsBack(*options);
  }
}

void ExpectASkippedStepPutsTheRowsBack(const ShardOptions& options) {
  ParameterShard shard(options);
  ASSERT_TRUE(InitRows(shard).ok());
  auto step = [&](int64_t s, const NonFiniteValue* nonfinite) {
    ASSERT_TRUE(PushRows(shard, 0, 0, 0, s, {{1, 3}, {1, 2, 3, 4, 5, 6}}).ok());
    ASSERT_TRUE(PushRows(shard, 0, 0, 1, s, {{0}, {-1, -2, -3}}).ok());
    ASSERT_TRUE(shard.Push(0, 1, 0, s, std::vector<float>{1, 1}).ok());
    ASSERT_TRUE(shard.EndStep(0, s, nonfinite).ok());
  };
  step(0, nullptr);
  step(1, nullptr);  // m nonzero in every row SGD moves
  const auto before = PullAll(shard, 2);
  absl::StatusOr<std::vector<ChunkSnapshot>> snap_before = shard.Snapshot(2);
  ASSERT_TRUE(snap_before.ok());
  NonFiniteValue nan;
  nan.param_id = 1;
  nan.value = "nan";
  step(2, &nan);
  const auto after = PullAll(shard, 3);
  absl::StatusOr<std::vector<ChunkSnapshot>> snap_after = shard.Snapshot(3);
  ASSERT_TRUE(snap_after.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(SameBits(before[i], after[i])) << i;
    EXPECT_TRUE(SameBits((*snap_before)[i].m, (*snap_after)[i].m)) << i;
    EXPECT_TRUE(SameBits((*snap_before)[i].v, (*snap_after)[i].v)) << i;
  }
}

TEST(RowSparseTest, AsyncAppliesEachRowPushAtOnce) {
  ParameterShard shard(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(InitRows(shard).ok());
  ASSERT_TRUE(PushRows(shard, 1, 0, 1, 0, {{2}, {1, 1, 1}}).ok());
  const auto pulled = PullAll(shard, 0);
  std::vector<float> w = InitChunks()[1].values, m(12, 0.0f), v(12, 0.0f);
  AdamOptions adam;
  adam.lr = 0.1f;
  const std::vector<float> g = {1, 1, 1};
  const std::vector<uint32_t> rows = {2};
  SparseAdamRows(adam, 1, kD, rows, g.data(), w.data(), m.data(), v.data());
  EXPECT_TRUE(SameBits(pulled[1], w));
  EXPECT_TRUE(SameBits(pulled[0], InitChunks()[0].values));
}

// Async row pushes take the lr of their worker's step, as dense ones
// (parameter_shard_test AsyncPushesTakeTheLrOfTheirWorkersStep): a warm-up
// from lr x 0.5 to lr over 2 steps gives both workers' step-0 pushes lr /
// 2, SparseAdam's first update and then its second (update count 2) at the
// same lr.
TEST(RowSparseTest, AsyncRowPushesTakeTheLrOfTheirWorkersStep) {
  ShardOptions options = Options(2, SyncMode::kAsync);
  options.adam.schedule.warmup_steps = 2;
  options.adam.schedule.warmup_start_factor = 0.5;
  ParameterShard shard(options);
  ASSERT_TRUE(InitRows(shard).ok());
  ASSERT_TRUE(PushRows(shard, 0, 0, 1, 0, {{2}, {1, 1, 1}}).ok());
  ASSERT_TRUE(PushRows(shard, 1, 0, 1, 0, {{2}, {1, 1, 1}}).ok());
  const auto pulled = PullAll(shard, 0);
  std::vector<float> w = InitChunks()[1].values, m(12, 0.0f), v(12, 0.0f);
  AdamOptions adam;
  adam.lr = 0.05f;  // the warm-up's first step
  const std::vector<float> g = {1, 1, 1};
  const std::vector<uint32_t> rows = {2};
  SparseAdamRows(adam, 1, kD, rows, g.data(), w.data(), m.data(), v.data());
  SparseAdamRows(adam, 2, kD, rows, g.data(), w.data(), m.data(), v.data());
  EXPECT_TRUE(SameBits(pulled[1], w));
}

// A checkpoint holds the table and its moments as any chunk: a shard
// initialised from a snapshot (a resume) goes on exactly as the one that
// took it.
TEST(RowSparseTest, ResumeFromASnapshotIsExact) {
  ParameterShard original(Options(1, SyncMode::kSync));
  ASSERT_TRUE(InitRows(original).ok());
  auto step = [](ParameterShard& shard, int64_t s) {
    const uint32_t r = static_cast<uint32_t>(s % 4);
    ASSERT_TRUE(
        PushRows(shard, 0, 0, 0, s, {{r}, {0.1f * s, -0.2f, 0.3f}}).ok());
    ASSERT_TRUE(PushRows(shard, 0, 0, 1, s, {{3 - r}, {1, 2, 3}}).ok());
    ASSERT_TRUE(shard.Push(0, 1, 0, s, std::vector<float>{1, -1}).ok());
    ASSERT_TRUE(shard.EndStep(0, s, nullptr).ok());
  };
  for (int64_t s = 0; s < 3; ++s) step(original, s);
  absl::StatusOr<std::vector<ChunkSnapshot>> snap = original.Snapshot(3);
  ASSERT_TRUE(snap.ok());
  std::vector<InitChunk> chunks;
  for (const ChunkSnapshot& c : *snap) {
    chunks.push_back(
        {c.spec.param_id, c.spec.chunk_index, c.weights, c.m, c.v, c.version});
  }
  ParameterShard resumed(Options(1, SyncMode::kSync));
  ASSERT_TRUE(InitRows(resumed, chunks).ok());
  for (int64_t s = 3; s < 6; ++s) {
    step(original, s);
    step(resumed, s);
  }
  const auto a = PullAll(original, 6), b = PullAll(resumed, 6);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(SameBits(a[i], b[i])) << i;
  // A restore whose layout has other row widths is another layout.
  resumed.SetRowSparseLayout({0, 0});
  EXPECT_EQ(
      resumed.Initialize(kSizes, kPartitionBytes, InitChunks(), 0, 1).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
