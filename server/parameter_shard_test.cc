#include "server/parameter_shard.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "server/shared_floats.h"

namespace pstrain {
namespace {

// One parameter of 6 elements, one of 2, in 16-byte chunks on 1 shard:
// chunks (0,0) of 4, (0,1) of 2, (1,0) of 2.
ShardOptions Options(int num_workers, SyncMode mode) {
  ShardOptions options;
  options.job_id = "job";
  options.num_workers = num_workers;
  options.mode = mode;
  options.adam.lr = 0.1f;
  return options;
}

// Sync SGD (lr 0.1) clipping by global norm 1.
ShardOptions ClippingSgdOptions(int num_workers) {
  ShardOptions options = Options(num_workers, SyncMode::kSync);
  options.adam.kind = OptimizerKind::kSgd;
  options.clip_grad_norm = 1.0;
  return options;
}

std::vector<InitChunk> InitChunks() {
  std::vector<InitChunk> chunks(3);
  chunks[0].values = {1, 2, 3, 4};
  chunks[1].chunk_index = 1;
  chunks[1].values = {5, 6};
  chunks[2].param_id = 1;
  chunks[2].values = {7, 8};
  return chunks;
}

std::vector<std::vector<float>> PullAll(ParameterShard& shard,
                                        int64_t min_version,
                                        absl::Status* status = nullptr) {
  std::vector<std::vector<float>> out;
  absl::Status s =
      shard.Pull(min_version, 0, absl::Now() + absl::Seconds(5),
                 [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
                   out.emplace_back(w.begin(), w.end());
                 });
  if (status != nullptr) *status = s;
  return out;
}

// Every worker of `num_workers` ends sync step `step` (no non-finite value).
void EndAll(ParameterShard& shard, int num_workers, int64_t step) {
  for (int w = 0; w < num_workers; ++w) {
    ASSERT_TRUE(shard.EndStep(w, step, nullptr).ok()) << w;
  }
}

TEST(ParameterShardTest, RejectsPushAndPullBeforeInit) {
  ParameterShard shard(Options(1, SyncMode::kSync));
  const std::vector<float> g = {1, 1, 1, 1};
  absl::Status status = shard.Push(0, 0, 0, 0, g);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "push to shard 0 before it was initialised");
  PullAll(shard, 0, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.WaitReady(absl::Now() + absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(ParameterShardTest, BadPushesGetInvalidArgumentAndChangeNothing) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  const std::vector<float> four = {1, 1, 1, 1};
  absl::Status status = shard.Push(0, 3, 0, 0, four);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "chunk (3, 0) is not owned by shard 0");
  status = shard.Push(0, 0, 1, 0, four);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "chunk (0, 1) push has 4 elements; expected 2");
  status = shard.Push(2, 0, 0, 0, four);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "worker id 2 is outside the job's [0, 2)");
  EXPECT_EQ(shard.CheckWorker("other", 0).message(),
            "job id \"other\" does not match this shard's job \"job\"");
  // A push for a step other than the current version.
  status = shard.Push(0, 0, 0, 5, four);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  // Twice the same push: the second is refused, the first stays pending.
  ASSERT_TRUE(shard.Push(0, 0, 0, 0, four).ok());
  status = shard.Push(0, 0, 0, 0, four);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // Nothing was applied: version 0, weights as initialised.
  const auto weights = PullAll(shard, 0);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_EQ(weights[0], (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(weights[1], (std::vector<float>{5, 6}));
  EXPECT_EQ(shard.Stats().min_version, 0);
}

TEST(ParameterShardTest, NonFinitePushesAreRefusedAndChangeNothing) {
  for (SyncMode mode : {SyncMode::kSync, SyncMode::kAsync}) {
    ParameterShard shard(Options(1, mode));
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      const std::vector<float> pushed = {0.5f, 0.5f, bad, 0.5f};
      const absl::Status status = shard.Push(0, 0, 0, 0, pushed);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(status.message().find("push of parameter 0, chunk 0 (elements "
                                      "0 to 3) of step 0 holds a non-finite "
                                      "value"),
                std::string::npos)
          << status;
      EXPECT_NE(status.message().find("at element 2 of the parameter"),
                std::string::npos)
          << status;
    }
    // Nothing applied or pending: a good push then completes the step.
    EXPECT_EQ(shard.Stats().pushes, 0);
    ASSERT_TRUE(shard.Push(0, 0, 0, 0, std::vector<float>{1, 1, 1, 1}).ok());
    const auto weights = PullAll(shard, 0);
    ASSERT_EQ(weights.size(), 3u);
    for (float w : weights[0]) EXPECT_TRUE(std::isfinite(w));
    EXPECT_EQ(weights[1], (std::vector<float>{5, 6}));
  }
}

TEST(ParameterShardTest, InitIsAllOrNothing) {
  ParameterShard shard(Options(1, SyncMode::kSync));
  std::vector<InitChunk> chunks = InitChunks();
  chunks[2].values = {1, 2, 3};
  absl::Status status = shard.Initialize({6, 2}, 16, chunks);
  EXPECT_EQ(status.message(), "init chunk (1, 0) has 3 elements; expected 2");
  EXPECT_FALSE(shard.initialized());
  chunks = InitChunks();
  chunks.pop_back();
  EXPECT_EQ(shard.Initialize({6, 2}, 16, chunks).message(),
            "init sent 2 chunks; shard 0 owns 3");
  EXPECT_FALSE(shard.initialized());
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  EXPECT_EQ(shard.Initialize({6, 2}, 16, InitChunks()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterShardTest, SyncAveragesWorkersThenAppliesAdamOnce) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  // Worker 0 pushes +3, worker 1 pushes -1: the mean is +1, so Adam's first
  // step moves every weight by -lr (0.1).
  for (int w = 0; w < 2; ++w) {
    const float value = w == 0 ? 3.0f : -1.0f;
    ASSERT_TRUE(shard.Push(w, 0, 0, 0, std::vector<float>(4, value)).ok());
    ASSERT_TRUE(shard.Push(w, 0, 1, 0, std::vector<float>(2, value)).ok());
    if (w == 0) {
      // Half the workers pushed: nothing is applied yet, the pull for
      // version 1 times out naming worker 1.
      absl::Status status =
          shard.Pull(1, 0, absl::Now() + absl::Milliseconds(20),
                     [](const ChunkSpec&, int64_t, absl::Span<const float>) {});
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_NE(status.message().find("no push yet from worker(s) 1"),
                std::string::npos)
          << status.message();
    }
    ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>(2, value)).ok());
  }
  EndAll(shard, 2, 0);
  const auto weights = PullAll(shard, 1);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_NEAR(weights[0][0], 0.9f, 1e-6f);
  EXPECT_NEAR(weights[0][3], 3.9f, 1e-6f);
  EXPECT_NEAR(weights[2][1], 7.9f, 1e-6f);
  EXPECT_EQ(shard.Stats().min_version, 1);
  // One update per chunk of the step, timed (ShardStats.updates and
  // .optimizer_ns, which the shard metrics rows report).
  EXPECT_GE(shard.Stats().updates, 1);
  EXPECT_GT(shard.Stats().optimizer_ns, 0);
}

// A cosine schedule with total_steps 0 (the job's lr_total_steps unset)
// takes worker 0's count of the job's steps (InitRequest.lr_total_steps):
// SGD at lr 1 over a horizon of 2 moves the weights by 1 at step 0 and by
// 0.5 at step 1 (CosineAnnealingLR's (1 + cos(pi t / 2)) / 2); a horizon
// of 1 (none) would stop at step 1. Bad values change nothing.
TEST(ParameterShardTest, CosineScheduleTakesWorkerZerosHorizon) {
  ShardOptions options = Options(1, SyncMode::kSync);
  options.adam.kind = OptimizerKind::kSgd;
  options.adam.lr = 1.0f;
  options.adam.schedule.decay = LrDecay::kCosine;
  options.adam.schedule.total_steps = 0;
  options.adam.schedule.warmup_steps = 1;
  ParameterShard shard(options);
  EXPECT_EQ(shard.SetLrHorizon(-1).message(),
            "lr_total_steps -1; expected 0 to 1e9");
  EXPECT_EQ(shard.SetLrHorizon(int64_t{2000000000}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard.SetLrHorizon(0).message(),
            "lr_total_steps 0 for shard 0's cosine schedule (the job's "
            "steps, counted by worker 0); expected more than warmup_steps "
            "(1)");
  EXPECT_EQ(shard.SetLrHorizon(1).code(), absl::StatusCode::kInvalidArgument);
  options.adam.schedule.warmup_steps = 0;
  ParameterShard cosine(options);
  ASSERT_TRUE(cosine.SetLrHorizon(2).ok());
  EXPECT_TRUE(cosine.SetLrHorizon(0).ok());  // a reopen's: kept
  ASSERT_TRUE(cosine.Initialize({6, 2}, 16, InitChunks()).ok());
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(cosine.Push(0, 0, 0, step, std::vector<float>(4, 1.0f)).ok());
    ASSERT_TRUE(cosine.Push(0, 0, 1, step, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE(cosine.Push(0, 1, 0, step, std::vector<float>(2, 1.0f)).ok());
    EndAll(cosine, 1, step);
  }
  const auto weights = PullAll(cosine, 2);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_FLOAT_EQ(weights[0][0], 1.0f - 1.5f);
  EXPECT_FLOAT_EQ(weights[2][1], 8.0f - 1.5f);
  // Another schedule needs no horizon.
  ParameterShard constant(Options(1, SyncMode::kSync));
  EXPECT_TRUE(constant.SetLrHorizon(0).ok());
}

TEST(ParameterShardTest, PullWaitsForBarrierFromAnotherThread) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  std::vector<std::vector<float>> pulled;
  std::thread puller([&] { pulled = PullAll(shard, 1); });
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(w, 0, 0, 0, std::vector<float>(4, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 0, 1, 0, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>(2, 1.0f)).ok());
  }
  EndAll(shard, 2, 0);
  puller.join();
  ASSERT_EQ(pulled.size(), 3u);
  EXPECT_NEAR(pulled[1][0], 4.9f, 1e-6f);
}

// A pull waiting at the barrier for a worker that died returns ABORTED as
// soon as the shard is aborted, long before its deadline; so do later
// pulls and waits.
TEST(ParameterShardTest, AbortEndsWaitsAtTheBarrier) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ParameterShard uninitialised(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  absl::Status status;
  absl::Status ready_status;
  const absl::Time start = absl::Now();
  std::thread waiter([&] { PullAll(shard, 1, &status); });
  std::thread ready_waiter([&] {
    ready_status = uninitialised.WaitReady(absl::Now() + absl::Seconds(5));
  });
  absl::SleepFor(absl::Milliseconds(50));
  shard.Abort("lost worker 1");
  uninitialised.Abort("cancelled");
  waiter.join();
  ready_waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(), "shard 0 aborted: lost worker 1");
  EXPECT_EQ(ready_status.code(), absl::StatusCode::kAborted);
  PullAll(shard, 0, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
}

// A server's pull runs beside the pushes of its own stream: chunks are
// handed out one by one as each reaches the version, with `after_chunk`
// outside the lock, and a cancelled caller ends the wait.
TEST(ParameterShardTest, PullHandsOutChunksAsTheyBecomeReadyAndCancels) {
  ParameterShard shard(Options(1, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  std::atomic<int> written{0};
  std::atomic<bool> cancelled{false};
  absl::Status status;
  std::thread puller([&] {
    status = shard.Pull(
        1, 0, absl::Now() + absl::Seconds(10),
        [](const ChunkSpec&, int64_t version, absl::Span<const float>) {
          EXPECT_EQ(version, 1);
        },
        [&] {
          ++written;
          return true;
        },
        &cancelled);
  });
  // Chunk by chunk: after the first chunk's push only it has gone out.
  const std::vector<ChunkSpec> chunks = shard.plan().chunks();
  ASSERT_GE(chunks.size(), 2u);
  const ChunkSpec& first = chunks[0];
  ASSERT_TRUE(shard
                  .Push(0, first.param_id, first.chunk_index, 0,
                        std::vector<float>(first.num_elements, 1.0f))
                  .ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(written.load(), 1);
  // The caller's stream breaks: the wait for the second chunk ends.
  const absl::Time start = absl::Now();
  cancelled.store(true);
  puller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(written.load(), 1);
}

// A worker pushing during backward sends the last tensors first; the pull
// must hand those out at once, not wait behind the first chunk.
TEST(ParameterShardTest, PullHandsOutChunksInTheOrderTheyBecomeReady) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  absl::Mutex mu;
  std::vector<int> order;  // param_id * 10 + chunk_index, as handed out
  absl::Status status;
  std::thread puller([&] {
    status = shard.Pull(
        1, 0, absl::Now() + absl::Seconds(10),
        [&](const ChunkSpec& c, int64_t version, absl::Span<const float>) {
          EXPECT_EQ(version, 1);
          absl::MutexLock lock(&mu);
          order.push_back(c.param_id * 10 + c.chunk_index);
        });
  });
  auto push_both = [&](int param, int index, int n) {
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(
          shard.Push(w, param, index, 0, std::vector<float>(n, 1.0f)).ok());
    }
  };
  auto handed_out = [&] {
    absl::MutexLock lock(&mu);
    return order;
  };
  // Chunks (1,0), then (0,1), then (0,0): the reverse of plan order.
  push_both(1, 0, 2);
  const absl::Time start = absl::Now();
  while (handed_out().empty() && absl::Now() < start + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(handed_out(), std::vector<int>({10}));
  push_both(0, 1, 2);
  while (handed_out().size() < 2 && absl::Now() < start + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(handed_out(), std::vector<int>({10, 1}));
  push_both(0, 0, 4);
  EndAll(shard, 2, 0);
  puller.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(handed_out(), std::vector<int>({10, 1, 0}));
}

// Finite pushes whose update is not finite (two workers' 3e38 sum to inf;
// SGD at lr 10 on 3.4e38) are not applied: the chunk keeps its weights,
// counted in overflowed, and later updates go on.
TEST(ParameterShardTest, UpdatesThatOverflowAreNotApplied) {
  const float big = 3e38f;
  const float max = std::numeric_limits<float>::max();
  {
    ParameterShard shard(Options(2, SyncMode::kSync));
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(shard.Push(w, 0, 0, 0, std::vector<float>(4, big)).ok());
      ASSERT_TRUE(shard.Push(w, 0, 1, 0, std::vector<float>(2, 1)).ok());
      ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>(2, 1)).ok());
    }
    EndAll(shard, 2, 0);
    auto w = PullAll(shard, 1);
    ASSERT_EQ(w.size(), 3u);
    EXPECT_EQ(w[0], (std::vector<float>{1, 2, 3, 4}));
    EXPECT_NEAR(w[1][0], 5 - 0.1f, 1e-5);
    const ShardStats stats = shard.Stats();
    EXPECT_EQ(stats.overflowed, 1);
    EXPECT_EQ(stats.updates, 2);
    EXPECT_NE(stats.last_overflow.find("update of chunk (0, 0) for step 0 "
                                       "overflowed to nan at element 0; not "
                                       "applied"),
              std::string::npos)
        << stats.last_overflow;
    // The next step applies to every chunk, from the kept weights.
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(shard.Push(w, 0, 0, 1, std::vector<float>(4, 1)).ok());
      ASSERT_TRUE(shard.Push(w, 0, 1, 1, std::vector<float>(2, 1)).ok());
      ASSERT_TRUE(shard.Push(w, 1, 0, 1, std::vector<float>(2, 1)).ok());
    }
    EndAll(shard, 2, 1);
    w = PullAll(shard, 2);
    ASSERT_EQ(w.size(), 3u);
    // Adam's update number 2 (the chunk's version): m and v from zero.
    const float step_size = 0.1f / (1 - 0.9f * 0.9f);
    const float denom = std::sqrt(0.001f) / std::sqrt(1 - 0.999f * 0.999f);
    EXPECT_NEAR(w[0][0], 1 - step_size * 0.1f / denom, 1e-5);
    EXPECT_EQ(shard.Stats().overflowed, 1);
  }
  {
    ShardOptions options = Options(2, SyncMode::kAsync);
    options.adam.kind = OptimizerKind::kSgd;
    options.adam.lr = 10;
    ParameterShard shard(options);
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 1).ok());
    ASSERT_TRUE(shard.Push(0, 0, 0, 0, std::vector<float>(4, max)).ok());
    auto w = PullAll(shard, 0);
    EXPECT_EQ(w[0], (std::vector<float>{1, 2, 3, 4}));
    ASSERT_TRUE(shard.Push(0, 0, 0, 0, std::vector<float>(4, 0.01f)).ok());
    w = PullAll(shard, 0);
    EXPECT_NEAR(w[0][0], 1 - 0.1f, 1e-5);
    // A buffer: one worker's 3e38 is kept; both workers' sum to inf.
    ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>{big, 1}).ok());
    ASSERT_TRUE(shard.Push(1, 1, 0, 0, std::vector<float>{big, 1}).ok());
    EXPECT_EQ(PullAll(shard, 0)[2], (std::vector<float>{big, 1}));
    EXPECT_EQ(shard.Stats().overflowed, 2);
  }
}

// Found by parameter_shard_fuzzer: a clipping shard restored with one chunk
// a step ahead of the others counted that chunk as pushed when the step
// ended (its version is past it), then took the chunk's slot as the step's
// gradients: whatever the slot held (stale values, NaNs a refused push
// left, or nothing: a read through a null pointer) went into the partial
// norm and was applied. A chunk past the step is now left out of both.
TEST(ParameterShardTest, ClippingLeavesOutChunksRestoredPastTheStep) {
  ParameterShard shard(ClippingSgdOptions(1));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  std::vector<InitChunk> restored = InitChunks();
  restored[2].version = 1;
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, restored, 0, 1).ok());
  ASSERT_TRUE(shard.Push(0, 0, 0, 0, std::vector<float>(4, 0.1f), 1).ok());
  ASSERT_TRUE(shard.Push(0, 0, 1, 0, std::vector<float>(2, 0.1f), 1).ok());
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr, 1).ok());
  std::vector<double> partials;
  std::map<std::pair<int, int>, std::vector<float>> pulled;
  std::thread puller([&] {
    const absl::Status s = shard.Pull(
        1, 0, absl::Now() + absl::Seconds(10),
        [&](const ChunkSpec& c, int64_t, absl::Span<const float> w) {
          pulled[{c.param_id, c.chunk_index}].assign(w.begin(), w.end());
        },
        nullptr, nullptr, 1, nullptr,
        [&](int64_t, double sum_sq) {
          partials.push_back(sum_sq);
          return true;
        });
    EXPECT_TRUE(s.ok()) << s;
  });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(shard.ApplyStepNorm(0, 0, 0.06, 1).ok());
  puller.join();
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_NEAR(partials[0], 6 * 0.1 * 0.1, 1e-6);
  ASSERT_EQ(pulled.size(), 3u);
  // Norm sqrt(0.06) < 1: not clipped; SGD at lr 0.1.
  EXPECT_NEAR(pulled[std::make_pair(0, 0)][0], 1 - 0.1f * 0.1f, 1e-5);
  EXPECT_NEAR(pulled[std::make_pair(0, 1)][1], 6 - 0.1f * 0.1f, 1e-5);
  EXPECT_EQ(pulled[std::make_pair(1, 0)], (std::vector<float>{7, 8}));
}

TEST(ParameterShardTest, AsyncAppliesEveryPush) {
  ParameterShard shard(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  ASSERT_TRUE(shard.Push(1, 1, 0, 0, std::vector<float>(2, 1.0f)).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>(2, 1.0f)).ok());
  const auto weights = PullAll(shard, 0);
  // Two Adam steps with the same gradient: each moves by lr.
  EXPECT_NEAR(weights[2][0], 6.8f, 1e-5f);
  EXPECT_EQ(weights[0], (std::vector<float>{1, 2, 3, 4}));
}

// Async: each push takes the lr of the step it carries (the pushing
// worker's), not of the shard's update count, which grows num_workers
// times faster: with StepLR halving every step, both workers' step-0
// pushes move the weight by lr x g and a step-1 push by lr / 2 x g (the
// count would have given the second step-0 push lr / 2 and the step-1 push
// lr / 4, and a cosine horizon of T steps would end after T / W). The
// momentum-free SGD update is w - lr g, so each move is exact to rounding.
TEST(ParameterShardTest, AsyncPushesTakeTheLrOfTheirWorkersStep) {
  ShardOptions options = Options(2, SyncMode::kAsync);
  options.adam.kind = OptimizerKind::kSgd;
  options.adam.schedule.decay = LrDecay::kStep;
  options.adam.schedule.step_size = 1;
  options.adam.schedule.gamma = 0.5;
  ParameterShard shard(options);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  const std::vector<float> g = {1.0f, 1.0f};
  ASSERT_TRUE(shard.Push(0, 1, 0, /*step=*/0, g).ok());
  EXPECT_NEAR(PullAll(shard, 0)[2][0], 7 - 0.1f, 1e-6f);
  ASSERT_TRUE(shard.Push(1, 1, 0, /*step=*/0, g).ok());
  EXPECT_NEAR(PullAll(shard, 0)[2][0], 7 - 0.2f, 1e-6f);
  ASSERT_TRUE(shard.Push(0, 1, 0, /*step=*/1, g).ok());
  EXPECT_NEAR(PullAll(shard, 0)[2][0], 7 - 0.25f, 1e-6f);
}

// Tensor 1 (2 elements) is a buffer: its pushes are values, averaged over
// workers with no Adam, while tensor 0 is still trained.
TEST(ParameterShardTest, SyncBuffersAreTheWorkersAverageWithoutAdam) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 1).ok());
  EXPECT_TRUE(shard.plan().is_buffer(1));
  EXPECT_FALSE(shard.plan().is_buffer(0));
  const std::vector<float> g4 = {1, 1, 1, 1}, g2 = {1, 1};
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(w, 0, 0, 0, g4).ok());
    ASSERT_TRUE(shard.Push(w, 0, 1, 0, g2).ok());
  }
  const std::vector<float> mean0 = {0.5f, 10.0f}, mean1 = {1.5f, 20.0f};
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, mean0).ok());
  ASSERT_TRUE(shard.Push(1, 1, 0, 0, mean1).ok());
  EndAll(shard, 2, 0);
  const auto w = PullAll(shard, 1);
  ASSERT_EQ(w.size(), 3u);
  // Adam's first step moves every weight by lr = 0.1 against the gradient.
  EXPECT_NEAR(w[0][0], 1 - 0.1f, 1e-5);
  EXPECT_EQ(w[2], (std::vector<float>{1.0f, 15.0f}));
}

TEST(ParameterShardTest, AsyncBuffersAverageEachWorkersLatestPush) {
  ParameterShard shard(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 1).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>{2, 4}).ok());
  EXPECT_EQ(PullAll(shard, 0)[2], (std::vector<float>{2, 4}));
  ASSERT_TRUE(shard.Push(1, 1, 0, 0, std::vector<float>{4, 8}).ok());
  EXPECT_EQ(PullAll(shard, 0)[2], (std::vector<float>{3, 6}));
  // Worker 0's newer values replace its older ones.
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>{0, 0}).ok());
  EXPECT_EQ(PullAll(shard, 0)[2], (std::vector<float>{2, 4}));
}

// A pull reply holds a chunk's weights themselves (PullOrder::visit_shared:
// no copy), or in a 16-bit wire dtype their form converted once per
// update (SharedFloats::ShareHalves), until gRPC has sent them; whatever
// the shard writes next must leave them as they were: a sync update
// writing beside the state, an undone step's storage written by the next
// update, a buffer's average, and an async update swapping the chunk with
// its thread's scratch. And a 16-bit form handed out must be the current
// values' (a form kept past a write would send the weights before it).
struct HeldReply {
  std::shared_ptr<const std::vector<float>> weights;  // fp32
  std::shared_ptr<const EncodedHalves> halves;        // 16-bit
  std::vector<float> when_pulled;
  // The payload's first byte (what two replies share).
  const void* data() const {
    return weights != nullptr ? static_cast<const void*>(weights->data())
                              : static_cast<const void*>(halves->bits().data());
  }
};

absl::Status PullShared(ParameterShard& shard, int64_t min_version,
                        std::vector<HeldReply>* held,
                        DType wire = DTYPE_FLOAT32) {
  PullOrder order;
  order.visit_shared = [held, wire](const ChunkSpec& spec, int64_t,
                                    SharedFloats& w) {
    HeldReply reply;
    reply.when_pulled = w.ToVector();
    if (wire == DTYPE_FLOAT32) {
      reply.weights = w.Share();
    } else {
      reply.halves = w.ShareHalves(wire);
      EXPECT_EQ(reply.halves->bits(),
                EncodeHalvesOf(reply.when_pulled, wire).bits())
          << "chunk (" << spec.param_id << ", " << spec.chunk_index
          << ") handed out a 16-bit form of other values";
    }
    held->push_back(std::move(reply));
  };
  return shard.Pull(
      min_version, 0, absl::Now() + absl::Seconds(10),
      [](const ChunkSpec&, int64_t, absl::Span<const float>) {
        ADD_FAILURE() << "a dense chunk was copied, not shared";
      },
      nullptr, nullptr, 0, nullptr, nullptr, {}, order);
}

void ExpectHeldUnchanged(const std::vector<HeldReply>& held,
                         const std::string& what) {
  for (size_t i = 0; i < held.size(); ++i) {
    if (held[i].weights != nullptr) {
      EXPECT_EQ(*held[i].weights, held[i].when_pulled)
          << what << " reply " << i;
    } else {
      EXPECT_EQ(
          held[i].halves->bits(),
          EncodeHalvesOf(held[i].when_pulled, held[i].halves->dtype).bits())
          << what << " reply " << i;
    }
  }
}

class SharedPullTest : public ::testing::TestWithParam<DType> {};

INSTANTIATE_TEST_SUITE_P(WireDtypes, SharedPullTest,
                         ::testing::Values(DTYPE_FLOAT32, DTYPE_BFLOAT16,
                                           DTYPE_FLOAT16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(WireDtypeSpelling(info.param));
                         });

TEST_P(SharedPullTest, RepliesHoldTheirWeightsThroughLaterWrites) {
  const DType wire = GetParam();
  ParameterShard shard(Options(1, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 1).ok());
  auto push_step = [&](int64_t step, float g) {
    ASSERT_TRUE(shard.Push(0, 0, 0, step, std::vector<float>(4, g)).ok());
    ASSERT_TRUE(shard.Push(0, 0, 1, step, std::vector<float>(2, g)).ok());
    ASSERT_TRUE(shard.Push(0, 1, 0, step, std::vector<float>{g, -g}).ok());
  };
  push_step(0, 1.0f);
  EndAll(shard, 1, 0);
  std::vector<HeldReply> first, undone, last, again;
  ASSERT_TRUE(PullShared(shard, 1, &first, wire).ok());
  ASSERT_EQ(first.size(), 3u);
  // Step 1 is handed out, then skipped: its storage goes back to being the
  // buffer the next update writes into, while the replies still hold it.
  absl::Status undone_status;
  SkippedStepInfo skipped;
  std::thread puller(
      [&] { undone_status = PullShared(shard, 2, &undone, wire); });
  push_step(1, 2.0f);
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(0, 1, &nan).ok());
  puller.join();
  ASSERT_TRUE(undone_status.ok()) << undone_status;
  ASSERT_GE(undone.size(), 3u);
  push_step(2, 3.0f);
  EndAll(shard, 1, 2);
  push_step(3, 4.0f);
  EndAll(shard, 1, 3);
  ASSERT_TRUE(PullShared(shard, 4, &last, wire).ok());
  ExpectHeldUnchanged(first, "version 1");
  ExpectHeldUnchanged(undone, "version 2, undone");
  ExpectHeldUnchanged(last, "version 4");
  EXPECT_NE(last[0].when_pulled, first[0].when_pulled);
  // The replies share the shard's storage, or its one 16-bit form of it:
  // two pulls of one version hold the same memory.
  ASSERT_TRUE(PullShared(shard, 4, &again, wire).ok());
  ASSERT_EQ(again.size(), last.size());
  for (size_t i = 0; i < last.size(); ++i) {
    EXPECT_EQ(again[i].data(), last[i].data()) << i;
  }
}

TEST_P(SharedPullTest, AsyncRepliesHoldTheirWeightsThroughUpdates) {
  const DType wire = GetParam();
  ParameterShard shard(Options(1, SyncMode::kAsync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 1).ok());
  std::vector<HeldReply> held;
  for (int i = 0; i < 4; ++i) {
    // Each update swaps the chunk with this thread's scratch, which then
    // holds the storage a reply took one update before.
    ASSERT_TRUE(shard.Push(0, 0, 0, i, std::vector<float>(4, 1.0f + i)).ok());
    ASSERT_TRUE(shard.Push(0, 1, 0, i, std::vector<float>{1.0f * i, 2}).ok());
    ASSERT_TRUE(PullShared(shard, 0, &held, wire).ok());
  }
  ASSERT_EQ(held.size(), 12u);
  ExpectHeldUnchanged(held, "async");
  EXPECT_NE(held[0].when_pulled, held[9].when_pulled);
}

TEST(ParameterShardTest, LayoutWithOnlyBuffersIsRefused) {
  ParameterShard shard(Options(1, SyncMode::kSync));
  EXPECT_EQ(shard.Initialize({6, 2}, 16, InitChunks(), 2).message(),
            "num_buffers 2; expected in [0, 2) (at least one parameter)");
  EXPECT_FALSE(shard.initialized());
}

// Issue 22: a step in which one worker found a non-finite value is skipped
// on the whole shard, although some chunks' updates were applied (and
// handed to pulls) before that worker's report came in.
TEST(ParameterShardTest, SyncSkippedStepRestoresEveryChunkAndResends) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  // Step 0 applied normally (the Adam state then holds non-zero m, v).
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(w, 0, 0, 0, std::vector<float>(4, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 0, 1, 0, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>(2, 1.0f)).ok());
  }
  EndAll(shard, 2, 0);
  const auto before = PullAll(shard, 1);
  ASSERT_EQ(before.size(), 3u);
  // Step 1: chunk (1,0) gets both pushes (applied at once); worker 1 then
  // finds a NaN in parameter 0 and skips its chunks (0,0) and (0,1).
  std::vector<std::vector<float>> pulled;  // read after the join
  std::vector<int64_t> versions;
  std::atomic<int> chunks_pulled{0};  // polled while the pull runs
  SkippedStepInfo skipped;
  absl::Status pull_status;
  std::thread puller([&] {
    pull_status = shard.Pull(
        2, 0, absl::Now() + absl::Seconds(10),
        [&](const ChunkSpec&, int64_t version, absl::Span<const float> w) {
          pulled.emplace_back(w.begin(), w.end());
          versions.push_back(version);
          ++chunks_pulled;
        },
        nullptr, nullptr, 0, &skipped);
  });
  ASSERT_TRUE(shard.Push(0, 1, 0, 1, std::vector<float>(2, 5.0f)).ok());
  ASSERT_TRUE(shard.Push(1, 1, 0, 1, std::vector<float>(2, 5.0f)).ok());
  ASSERT_TRUE(shard.Push(0, 0, 0, 1, std::vector<float>(4, 5.0f)).ok());
  ASSERT_TRUE(shard.Push(0, 0, 1, 1, std::vector<float>(2, 5.0f)).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 0, 1).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 1, 1).ok());
  // Chunk (1,0) was updated and handed out; the pull still waits for the
  // decision.
  const absl::Time start = absl::Now();
  while (absl::Now() < start + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(5));
    if (chunks_pulled.load() > 0) break;
  }
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(shard.EndStep(0, 1, nullptr).ok());
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.element = 3;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(1, 1, &nan).ok());
  puller.join();
  ASSERT_TRUE(pull_status.ok()) << pull_status;
  // 3 chunks, then all 3 again with the restored weights.
  ASSERT_EQ(pulled.size(), 6u);
  EXPECT_EQ(skipped.step, 1);
  EXPECT_EQ(skipped.worker_id, 1);
  EXPECT_EQ(skipped.nonfinite.param_id, 0);
  EXPECT_EQ(skipped.nonfinite.element, 3);
  EXPECT_EQ(skipped.nonfinite.value, "nan");
  std::vector<std::vector<float>> last(pulled.end() - 3, pulled.end());
  EXPECT_EQ(last, before);  // bit for bit: no chunk keeps a partial update
  for (int64_t v : versions) EXPECT_EQ(v, 2);
  EXPECT_EQ(shard.Stats().skipped, 1);
  // Step 2 goes on from the restored state: pushes of step 2 are taken.
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(w, 0, 0, 2, std::vector<float>(4, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 0, 1, 2, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE(shard.Push(w, 1, 0, 2, std::vector<float>(2, 1.0f)).ok());
  }
  EndAll(shard, 2, 2);
  const auto next = PullAll(shard, 3);
  ASSERT_EQ(next.size(), 3u);
  EXPECT_LT(next[0][0], before[0][0]);  // moved against the gradient
}

// Pushes `value` for every chunk of `step` from `worker` at `generation`.
void PushStep(ParameterShard& shard, int worker, int64_t step, float value,
              int64_t generation = 0) {
  ASSERT_TRUE(
      shard.Push(worker, 0, 0, step, std::vector<float>(4, value), generation)
          .ok());
  ASSERT_TRUE(
      shard.Push(worker, 0, 1, step, std::vector<float>(2, value), generation)
          .ok());
  ASSERT_TRUE(
      shard.Push(worker, 1, 0, step, std::vector<float>(2, value), generation)
          .ok());
}

std::vector<std::vector<float>> PullAt(ParameterShard& shard,
                                       int64_t min_version,
                                       int64_t generation) {
  std::vector<std::vector<float>> out;
  absl::Status s = shard.Pull(
      min_version, 0, absl::Now() + absl::Seconds(5),
      [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
        out.emplace_back(w.begin(), w.end());
      },
      nullptr, nullptr, generation);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Gradient clipping by global norm (issue 25): once every worker ended the
// step, the pull sends the shard's partial sum of squares and nothing else
// until a worker sends the global sum; the first sum decides the step with
// the clipped update, later sums must equal it; a skipped step goes the
// same round and applies nothing.
TEST(ParameterShardTest, ClippingWaitsForTheAgreedNormAndChecksIt) {
  ParameterShard shard(ClippingSgdOptions(2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  const auto initial = PullAll(shard, 0);
  // A clipping shard's sync pull needs a way to send its partial.
  absl::Status no_visitor;
  PullAll(shard, 1, &no_visitor);
  EXPECT_EQ(no_visitor.code(), absl::StatusCode::kInvalidArgument)
      << no_visitor;

  std::vector<std::vector<float>> pulled;
  std::vector<std::pair<int64_t, double>> partials;
  std::atomic<int> chunks_pulled{0};
  absl::Status pull_status;
  auto pull = [&](int64_t min_version, SkippedStepInfo* skipped) {
    pulled.clear();
    partials.clear();
    chunks_pulled = 0;
    return std::thread([&, min_version, skipped] {
      pull_status = shard.Pull(
          min_version, 0, absl::Now() + absl::Seconds(10),
          [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
            pulled.emplace_back(w.begin(), w.end());
            ++chunks_pulled;
          },
          nullptr, nullptr, 0, skipped,
          [&](int64_t step, double sum_sq) {
            EXPECT_EQ(chunks_pulled.load(), 0) << "partial after a chunk";
            partials.emplace_back(step, sum_sq);
            return true;
          });
    });
  };
  // Step 0: worker 0 pushes 1, worker 1 pushes 3: an average of 2 over 8
  // elements, sum of squares 32, norm 5.657: clipped to 1.
  std::thread puller = pull(1, nullptr);
  PushStep(shard, 0, 0, 1.0f);
  PushStep(shard, 1, 0, 3.0f);
  EndAll(shard, 2, 0);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(chunks_pulled.load(), 0) << "a chunk passed before the norm";
  EXPECT_EQ(shard.Stats().updates, 0);
  // Not the step awaiting its norm; not a finite sum.
  EXPECT_EQ(shard.ApplyStepNorm(0, 1, 32.0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.ApplyStepNorm(0, 0, std::nan("")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard.ApplyStepNorm(0, 0, -1.0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard.ApplyStepNorm(2, 0, 32.0).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard.ApplyStepNorm(1, 0, 32.0).ok());
  puller.join();
  ASSERT_TRUE(pull_status.ok()) << pull_status;
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].first, 0);
  EXPECT_EQ(partials[0].second, 32.0);
  // As torch.nn.utils.clip_grad_norm_ and SGD: w - lr * 2 * clip.
  const float clip =
      std::min(1.0f / (static_cast<float>(std::sqrt(32.0)) + 1e-6f), 1.0f);
  ASSERT_EQ(pulled.size(), 3u);
  for (size_t c = 0; c < pulled.size(); ++c) {
    for (size_t i = 0; i < pulled[c].size(); ++i) {
      EXPECT_NEAR(pulled[c][i], initial[c][i] - 0.1f * 2.0f * clip, 1e-6)
          << c << " " << i;
    }
  }
  // Worker 0's sum of the decided step: the same is OK, another refused.
  EXPECT_TRUE(shard.ApplyStepNorm(0, 0, 32.0).ok());
  const absl::Status differs = shard.ApplyStepNorm(0, 0, 33.0);
  EXPECT_EQ(differs.code(), absl::StatusCode::kInvalidArgument) << differs;
  EXPECT_NE(differs.message().find("clipped it with 32"), std::string::npos)
      << differs;
  // A pull of a decided step still gets the partial (the worker whose sum
  // came second needs it).
  {
    std::thread late = pull(1, nullptr);
    late.join();
    ASSERT_TRUE(pull_status.ok()) << pull_status;
    ASSERT_EQ(partials.size(), 1u);
    EXPECT_EQ(partials[0].second, 32.0);
  }
  const std::vector<std::vector<float>> after_step0 = pulled;

  // Step 1: worker 1 finds a NaN: partial 0, and nothing applied.
  SkippedStepInfo skipped;
  puller = pull(2, &skipped);
  PushStep(shard, 0, 1, 1.0f);
  ASSERT_TRUE(shard.PushSkipped(1, 0, 0, 1).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 1, 1).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 1, 0, 1).ok());
  ASSERT_TRUE(shard.EndStep(0, 1, nullptr).ok());
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.element = 0;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(1, 1, &nan).ok());
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(shard.ApplyStepNorm(0, 1, 0.0).ok());
  puller.join();
  ASSERT_TRUE(pull_status.ok()) << pull_status;
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].second, 0.0);
  EXPECT_EQ(skipped.step, 1);
  ASSERT_EQ(pulled.size(), 6u);  // sent, then resent as skipped steps are
  std::vector<std::vector<float>> last(pulled.end() - 3, pulled.end());
  EXPECT_EQ(last, after_step0);
  EXPECT_EQ(shard.Stats().skipped, 1);

  // A shard that does not clip refuses a norm.
  ParameterShard plain(Options(2, SyncMode::kSync));
  ASSERT_TRUE(plain.Initialize({6, 2}, 16, InitChunks()).ok());
  EXPECT_EQ(plain.ApplyStepNorm(0, 0, 1.0).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Two sync shards of 2 workers (Adam) that both decided step 0 with the
// same pushes: one to fail and reopen, and a clean one to compare with.
void TwoShardsAfterStepZero(ParameterShard& shard, ParameterShard& clean) {
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  ASSERT_TRUE(clean.Initialize({6, 2}, 16, InitChunks()).ok());
  for (ParameterShard* s : {&shard, &clean}) {
    PushStep(*s, 0, 0, 1.0f);
    PushStep(*s, 1, 0, -3.0f);
    EndAll(*s, 2, 0);
  }
}

// Steps 1 and 2 with the same pushes on both: `shard` reopened at
// generation 1 and version 1, `clean` at generation 0.
void RedoStepsOneAndTwo(ParameterShard& shard, ParameterShard& clean) {
  for (int64_t step : {1, 2}) {
    PushStep(shard, 0, step, 0.5f * step, 1);
    PushStep(shard, 1, step, -2.0f, 1);
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(shard.EndStep(w, step, nullptr, 1).ok());
    }
    PushStep(clean, 0, step, 0.5f * step);
    PushStep(clean, 1, step, -2.0f);
    EndAll(clean, 2, step);
  }
}

// A sync worker dies mid-step (issue 20): worker 0 reopens the shard at its
// last decided step instead of restoring a checkpoint. The step in flight
// (one chunk's update applied but undecided, others half pushed) is put
// back, and redoing it gives the model of a shard that never saw the
// failure, bit for bit.
TEST(ParameterShardTest, ReopenDropsTheUndecidedStepAndGoesOnBitForBit) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ParameterShard clean(Options(2, SyncMode::kSync));
  ASSERT_NO_FATAL_FAILURE(TwoShardsAfterStepZero(shard, clean));
  const auto decided = PullAll(shard, 1);
  ASSERT_EQ(decided.size(), 3u);
  // Nothing of step 1 is in: no step waits for anyone.
  EXPECT_FALSE(shard.StepWaitsFor(0));
  EXPECT_FALSE(shard.StepWaitsFor(1));
  // Step 1 on the failing shard: chunk (1,0) has both pushes (its update is
  // applied, undecided), chunk (0,0) only worker 0's; then worker 1 dies.
  ASSERT_TRUE(shard.Push(0, 1, 0, 1, std::vector<float>(2, 7.0f)).ok());
  ASSERT_TRUE(shard.Push(1, 1, 0, 1, std::vector<float>(2, 7.0f)).ok());
  ASSERT_TRUE(shard.Push(0, 0, 0, 1, std::vector<float>(4, 7.0f)).ok());
  // Step 1 waits for worker 1's push of chunk (0,0), not for worker 0.
  EXPECT_TRUE(shard.StepWaitsFor(1));
  EXPECT_FALSE(shard.StepWaitsFor(0));
  shard.BreakBarrier(0, "worker 1's stream broke");

  absl::StatusOr<int64_t> version = shard.Reopen(1);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(shard.generation(), 1);
  EXPECT_EQ(PullAt(shard, 0, 1), decided);  // the undecided update undone
  // The older generation is refused; a second reopen must go higher.
  EXPECT_EQ(shard.Push(0, 0, 1, 1, std::vector<float>(2, 1.0f), 0).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(shard.Reopen(1).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Both redo step 1 and do step 2: the same weights as the clean shard's.
  ASSERT_NO_FATAL_FAILURE(RedoStepsOneAndTwo(shard, clean));
  EXPECT_EQ(PullAt(shard, 3, 1), PullAll(clean, 3));
  EXPECT_EQ(shard.Stats().min_version, 3);
}

// A worker dies between its step ends to two shards: this shard decided
// step 1, another did not (it lacks the dead worker's end). Worker 0
// reopens every shard at the smallest version any stands at (1): this one
// takes its decision back, undoing step 1's update (weights and Adam
// moments) bit for bit, and redoing steps 1 and 2 gives the model of a
// shard that never saw the failure. Once a later update is applied over
// it, the step cannot be taken back, and the reopen is refused.
TEST(ParameterShardTest, ReopenTakesBackAStepAnotherShardDidNotDecide) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ParameterShard clean(Options(2, SyncMode::kSync));
  ASSERT_NO_FATAL_FAILURE(TwoShardsAfterStepZero(shard, clean));
  const auto before_step1 = PullAll(shard, 1);
  PushStep(shard, 0, 1, 4.0f);
  PushStep(shard, 1, 1, 2.0f);
  EndAll(shard, 2, 1);
  EXPECT_EQ(shard.Stats().decided_step, 1);
  ASSERT_NE(PullAll(shard, 2), before_step1);
  shard.BreakBarrier(0, "worker 1's stream broke");

  // Asked for its own version (2), it would go on from there; asked for
  // the other shard's (1), it steps back.
  absl::StatusOr<int64_t> version = shard.Reopen(1, /*expected_version=*/1);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(shard.Stats().decided_step, 0);
  EXPECT_EQ(shard.Stats().min_version, 1);
  EXPECT_EQ(PullAt(shard, 1, 1), before_step1);
  ASSERT_NO_FATAL_FAILURE(RedoStepsOneAndTwo(shard, clean));
  EXPECT_EQ(PullAt(shard, 3, 1), PullAll(clean, 3));

  // Step 3's pushes are all in (its update applied, undecided): step 2's
  // state is gone, and a reopen at version 2 is refused, nothing changed.
  PushStep(shard, 0, 3, 1.0f, 1);
  PushStep(shard, 1, 3, 1.0f, 1);
  shard.BreakBarrier(1, "worker 1's stream broke");
  version = shard.Reopen(2, /*expected_version=*/2);
  EXPECT_EQ(version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(version.status().message().find(
                "reopens at version 3, not 2 (step 2's update cannot be "
                "undone"),
            std::string::npos)
      << version.status();
  EXPECT_EQ(shard.generation(), 1);
  // At its own version it reopens, the undecided step 3 undone.
  version = shard.Reopen(2, /*expected_version=*/3);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(PullAt(shard, 3, 2), PullAll(clean, 3));
}

// fp16's loss scaler (InitRequest.loss_scaler): the shard takes each
// decided step as every worker's scaler does (LossScaler::Update: a
// growth after 2000 good steps, a halving on a skip) and takes back the
// update of a decision a Reopen undoes; a restore sets it anew; a bad one
// is INVALID_ARGUMENT and changes nothing.
TEST(ParameterShardTest, TheLossScalerFollowsTheDecidedSteps) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  const LossScaler::State start{1024.0f, 1998};
  ASSERT_TRUE(
      shard.Initialize({6, 2}, 16, InitChunks(), 0, 0, nullptr, 0, &start)
          .ok());
  auto expect = [&shard](float scale, int64_t tracker) {
    const std::optional<LossScaler::State> s = shard.loss_scaler_state();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->scale, scale);
    EXPECT_EQ(s->growth_tracker, tracker);
  };
  expect(1024.0f, 1998);
  PushStep(shard, 0, 0, 1.0f);
  PushStep(shard, 1, 0, 1.0f);
  EndAll(shard, 2, 0);
  expect(1024.0f, 1999);
  PushStep(shard, 0, 1, 1.0f);
  PushStep(shard, 1, 1, 1.0f);
  EndAll(shard, 2, 1);
  expect(2048.0f, 0);  // the 2000th good step grows it
  // Step 2: worker 1 found a NaN; the step is skipped and the scale halves.
  PushStep(shard, 0, 2, 1.0f);
  ASSERT_TRUE(shard.PushSkipped(1, 0, 0, 2).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 1, 2).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 1, 0, 2).ok());
  ASSERT_TRUE(shard.EndStep(0, 2, nullptr).ok());
  NonFiniteValue nan;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(1, 2, &nan).ok());
  EXPECT_EQ(shard.Stats().skipped, 1);
  expect(1024.0f, 0);
  // Step 3 decided, then taken back by a reopen at version 3.
  PushStep(shard, 0, 3, 1.0f);
  PushStep(shard, 1, 3, 1.0f);
  EndAll(shard, 2, 3);
  expect(1024.0f, 1);
  shard.BreakBarrier(0, "worker 1's stream broke");
  absl::StatusOr<int64_t> version = shard.Reopen(1, /*expected_version=*/3);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 3);
  expect(1024.0f, 0);
  // A reopen at its own version keeps it.
  shard.BreakBarrier(0, "again");
  version = shard.Reopen(2);
  ASSERT_TRUE(version.ok()) << version.status();
  expect(1024.0f, 0);

  // A bad state is refused and changes nothing.
  for (const LossScaler::State& bad :
       {LossScaler::State{0.0f, 0}, LossScaler::State{-1.0f, 0},
        LossScaler::State{std::numeric_limits<float>::infinity(), 0},
        LossScaler::State{std::nanf(""), 0}, LossScaler::State{8.0f, -1}}) {
    EXPECT_EQ(shard.Initialize({6, 2}, 16, InitChunks(), 0, 3, nullptr, 0, &bad)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  expect(1024.0f, 0);
  EXPECT_EQ(shard.generation(), 2);
  // A restore sets it; one without a scaler leaves none.
  const LossScaler::State restored{256.0f, 7};
  ASSERT_TRUE(
      shard.Initialize({6, 2}, 16, InitChunks(), 0, 3, nullptr, 0, &restored)
          .ok());
  expect(256.0f, 7);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks(), 0, 4).ok());
  EXPECT_FALSE(shard.loss_scaler_state().has_value());

  // An async shard keeps none (each worker's scaler follows its own skips).
  ParameterShard async(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(
      async.Initialize({6, 2}, 16, InitChunks(), 0, 0, nullptr, 0, &start)
          .ok());
  EXPECT_FALSE(async.loss_scaler_state().has_value());
}

TEST(ParameterShardTest, ReopenIsRefusedWhereTheStateCannotGoOn) {
  ParameterShard fresh(Options(2, SyncMode::kSync));
  absl::StatusOr<int64_t> v = fresh.Reopen(1);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("not initialised"), std::string::npos)
      << v.status();

  ParameterShard async(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(async.Initialize({6, 2}, 16, InitChunks()).ok());
  v = async.Reopen(1);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("runs async"), std::string::npos)
      << v.status();
  // (With staleness a shard reopens: shard_membership_test
  // WithStalenessTheStepsRunAheadAreRedone.)

  // A version other than the one asked for changes nothing but the broken
  // barrier: the shard stays at its generation and version.
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  v = shard.Reopen(1, /*expected_version=*/4);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("reopens at version 0, not 4"),
            std::string::npos)
      << v.status();
  EXPECT_EQ(shard.generation(), 0);
  // A restore (or a reopen at the version it has) then goes on.
  v = shard.Reopen(1, 0);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 0);
}

TEST(ParameterShardTest, StepEndsAreCheckedAndAsyncSkipsDropThePush) {
  ParameterShard shard(Options(2, SyncMode::kSync));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  // An end before the worker's pushes names the chunk it lacks.
  absl::Status status = shard.EndStep(0, 0, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "worker 0 ended step 0 on shard 0 before pushing chunk (0, 0)");
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(w, 0, 0, 0, std::vector<float>(4, 1.0f)).ok());
    ASSERT_TRUE(shard.PushSkipped(w, 0, 1, 0).ok());
    ASSERT_TRUE(shard.Push(w, 1, 0, 0, std::vector<float>(2, 1.0f)).ok());
  }
  // A skipped push twice, and a push of the next step before this one is
  // decided, are refused.
  EXPECT_EQ(shard.PushSkipped(0, 0, 1, 0).code(),
            absl::StatusCode::kFailedPrecondition);  // the chunk moved on
  status = shard.Push(0, 0, 0, 1, std::vector<float>(4, 1.0f));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("before step 0 was decided"),
            std::string::npos)
      << status;
  status = shard.EndStep(0, 3, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "worker 0 ended step 3 but shard 0 is collecting the ends of step "
            "0");
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  EXPECT_EQ(shard.EndStep(0, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // A pull of version 1 names the worker whose end is missing.
  status =
      shard.Pull(1, 0, absl::Now() + absl::Milliseconds(30),
                 [](const ChunkSpec&, int64_t, absl::Span<const float>) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("waiting for the end of step 0 from "
                                  "worker(s) 1"),
            std::string::npos)
      << status;
  // Step 0 was skipped (every chunk the worker marked): nothing changed.
  NonFiniteValue inf;
  inf.param_id = 0;
  inf.element = 4;
  inf.value = "inf";
  ASSERT_TRUE(shard.EndStep(1, 0, &inf).ok());
  std::vector<std::vector<float>> init;
  for (const InitChunk& c : InitChunks()) init.push_back(c.values);
  const auto after = PullAll(shard, 1);
  ASSERT_EQ(after.size(), 6u);
  EXPECT_EQ(std::vector<std::vector<float>>(after.begin() + 3, after.end()),
            init);

  ParameterShard async(Options(2, SyncMode::kAsync));
  ASSERT_TRUE(async.Initialize({6, 2}, 16, InitChunks()).ok());
  ASSERT_TRUE(async.PushSkipped(0, 0, 0, 0).ok());
  EXPECT_EQ(async.Stats().skipped, 1);
  EXPECT_EQ(PullAll(async, 0)[0], (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(async.EndStep(0, 0, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Bounded staleness (issue 25). Worker `w`'s step `t` on the 3-chunk shard
// of InitChunks(): a push of every chunk (a fixed pseudo-random gradient of
// (w, t, chunk)) and the step's end; worker 1 finds a NaN in step 3 and
// skips its pushes of chunks (0, 1) and (1, 0) (the first still goes up).
void RunStep(ParameterShard& shard, int w, int64_t t) {
  const int32_t param[3] = {0, 0, 1};
  const int32_t index[3] = {0, 1, 0};
  const int size[3] = {4, 2, 2};
  const bool nan_step = w == 1 && t == 3;
  for (int c = 0; c < 3; ++c) {
    if (nan_step && c > 0) {
      ASSERT_TRUE(shard.PushSkipped(w, param[c], index[c], t).ok()) << t;
      continue;
    }
    std::vector<float> g(size[c]);
    for (int i = 0; i < size[c]; ++i) {
      // Exact in fp32 and different per worker, step, chunk and element.
      g[i] = static_cast<float>(((w * 7 + t * 13 + c * 5 + i * 3) % 17) - 8) /
             8.0f;
    }
    ASSERT_TRUE(shard.Push(w, param[c], index[c], t, g).ok()) << w << " " << t;
  }
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.element = 4;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(w, t, nan_step ? &nan : nullptr).ok())
      << w << " " << t;
}

// The weights after `steps` steps of 2 workers, run in the order given by
// `ahead`: worker 0 keeps `ahead` steps in front of worker 1 (0: lockstep).
std::vector<std::vector<float>> TrainTwoWorkers(int staleness, int ahead,
                                                int64_t steps) {
  ShardOptions options = Options(2, SyncMode::kSync);
  options.staleness = staleness;
  ParameterShard shard(options);
  EXPECT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  for (int64_t t = 0; t < ahead; ++t) RunStep(shard, 0, t);
  for (int64_t t = 0; t < steps; ++t) {
    if (t + ahead < steps) RunStep(shard, 0, t + ahead);
    RunStep(shard, 1, t);
  }
  EXPECT_EQ(shard.Stats().skipped, 1);
  EXPECT_EQ(shard.Stats().min_version, steps);
  return PullAll(shard, steps);
}

TEST(ParameterShardTest, StalenessAppliesTheSyncUpdatesBitForBit) {
  // Plain sync, lockstep: the reference.
  const std::vector<std::vector<float>> sync = TrainTwoWorkers(0, 0, 12);
  ASSERT_EQ(sync.size(), 3u);
  EXPECT_NE(sync[0], (std::vector<float>{1, 2, 3, 4}));
  // Staleness 2, in lockstep and with worker 0 one and two steps ahead
  // (the skipped step 3 decided while worker 0 has pushed step 5): each
  // step's update is still the average of both workers' pushes of that
  // step, applied in step order, so the weights equal sync's bit for bit.
  for (int ahead : {0, 1, 2}) {
    EXPECT_EQ(TrainTwoWorkers(2, ahead, 12), sync) << ahead;
  }
}

TEST(ParameterShardTest, StalenessBoundsHowFarAWorkerRunsAhead) {
  ShardOptions options = Options(2, SyncMode::kSync);
  options.staleness = 2;
  ParameterShard shard(options);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  // Worker 0 runs steps 0, 1 and 2 while worker 1 has not pushed: nothing
  // is applied (every chunk still at version 0).
  for (int64_t t = 0; t < 3; ++t) RunStep(shard, 0, t);
  EXPECT_EQ(shard.Stats().min_version, 0);
  EXPECT_EQ(shard.Stats().updates, 0);
  // A fourth step ahead is refused, naming the bound.
  absl::Status status = shard.Push(0, 0, 0, 3, std::vector<float>(4, 1.0f));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "push of chunk (0, 0) for step 3 but the chunk is at version 0 "
            "(staleness 2: steps 0 to 2)");
  status = shard.EndStep(0, 3, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "worker 0 ended step 3 but shard 0 is collecting the ends of step "
            "0 to 2");
  // Worker 0's pull for its step 3 (version >= 3 + 1 - 2 = 2) waits for
  // step 1, and its deadline names the slowest worker.
  std::vector<int64_t> versions;
  status =
      shard.Pull(2, 0, absl::Now() + absl::Milliseconds(50),
                 [&](const ChunkSpec&, int64_t version,
                     absl::Span<const float>) { versions.push_back(version); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("still at version 0; no push yet from "
                                  "worker(s) 1"),
            std::string::npos)
      << status;
  // Worker 1 catches up one step at a time: each of its steps lets
  // worker 0 go one step further (version 1 after step 0, and so on).
  for (int64_t t = 0; t < 3; ++t) {
    RunStep(shard, 1, t);
    EXPECT_EQ(shard.Stats().min_version, t + 1);
    versions.clear();
    ASSERT_TRUE(
        shard
            .Pull(t + 1, 0, absl::Now() + absl::Seconds(5),
                  [&](const ChunkSpec&, int64_t version,
                      absl::Span<const float>) { versions.push_back(version); })
            .ok());
    EXPECT_EQ(versions, std::vector<int64_t>(3, t + 1));
    RunStep(shard, 0, t + 3);  // now within the bound
  }
  // Worker 0 is at step 6, worker 1 at 3: a push of step 6 is 3 ahead.
  EXPECT_EQ(shard.Push(0, 0, 0, 6, std::vector<float>(4, 1.0f)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Checkpoints with staleness (issue 36): the cut of step 4, asked for by
// worker 0 before it pushes step 4, while worker 1 is `behind` steps
// behind it. The chunks reach version 4 at different times (worker 1's
// pushes of step 3 take them there one by one, the step's NaN puts chunk
// (0, 0) back at its decision, and worker 0's pushes of steps 4 and 5 are
// waiting), yet every chunk is copied at version 4 with step 3 decided:
// the same cut, bit for bit, as plain sync's snapshot of step 4.
std::vector<ChunkSnapshot> StaleCutAtStep4(int behind) {
  ShardOptions options = Options(2, SyncMode::kSync);
  options.staleness = 2;
  ParameterShard shard(options);
  EXPECT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  for (int64_t t = 0; t < 4; ++t) {
    RunStep(shard, 0, t);
    if (t >= behind) RunStep(shard, 1, t - behind);
  }
  std::vector<ChunkSnapshot> cut;
  EXPECT_TRUE(shard.BeginDeferredSnapshot(4, &cut).ok());
  if (behind > 0) {
    // Not there yet: the wait ends at its deadline, naming the shortfall.
    absl::Status waited =
        shard.AwaitDeferredSnapshot(4, absl::Now() + absl::Milliseconds(20));
    EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(waited.message().find("3 chunks have not reached"),
              std::string::npos)
        << waited;
  }
  RunStep(shard, 0, 4);
  for (int64_t t = 4 - behind; t < 5; ++t) {
    if (t == 4) {
      // Worker 0 runs ahead once more: step 5 waits beside step 4.
      RunStep(shard, 0, 5);
    }
    RunStep(shard, 1, t);
  }
  EXPECT_TRUE(
      shard.AwaitDeferredSnapshot(4, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(shard.Stats().min_version, 5);
  return cut;
}

TEST(ParameterShardTest, StalenessCheckpointIsOneCutAtTheAnnouncedStep) {
  ShardOptions options = Options(2, SyncMode::kSync);
  ParameterShard sync(options);
  ASSERT_TRUE(sync.Initialize({6, 2}, 16, InitChunks()).ok());
  for (int64_t t = 0; t < 4; ++t) {
    RunStep(sync, 0, t);
    RunStep(sync, 1, t);
  }
  absl::StatusOr<std::vector<ChunkSnapshot>> want = sync.Snapshot(4);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int behind : {0, 1, 2}) {
    const std::vector<ChunkSnapshot> cut = StaleCutAtStep4(behind);
    ASSERT_EQ(cut.size(), want->size()) << behind;
    for (size_t i = 0; i < cut.size(); ++i) {
      EXPECT_EQ(cut[i].version, 4) << behind << " " << i;
      EXPECT_EQ(cut[i].weights, (*want)[i].weights) << behind << " " << i;
      EXPECT_EQ(cut[i].m, (*want)[i].m) << behind << " " << i;
      EXPECT_EQ(cut[i].v, (*want)[i].v) << behind << " " << i;
    }
  }
}

TEST(ParameterShardTest, StalenessCheckpointRefusesAPassedStepAndEndsOnBreak) {
  ShardOptions options = Options(2, SyncMode::kSync);
  options.staleness = 2;
  ParameterShard shard(options);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  for (int64_t t = 0; t < 3; ++t) {
    RunStep(shard, 0, t);
    RunStep(shard, 1, t);
  }
  std::vector<ChunkSnapshot> cut;
  absl::Status status = shard.BeginDeferredSnapshot(2, &cut);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "checkpoint of step 2 on shard 0: chunk (0, 0) is at version 3 "
            "already (a checkpoint is asked for before the step's push)");
  // A cut that a broken barrier will never complete ends the wait.
  ASSERT_TRUE(shard.BeginDeferredSnapshot(5, &cut).ok());
  std::thread breaker([&shard]() {
    absl::SleepFor(absl::Milliseconds(20));
    shard.BreakBarrier(0, "worker 1's stream broke");
  });
  status = shard.AwaitDeferredSnapshot(5, absl::Now() + absl::Seconds(5));
  breaker.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  // So does a cancelled one.
  ASSERT_TRUE(shard.BeginDeferredSnapshot(5, &cut).ok());
  shard.CancelDeferredSnapshot();
  EXPECT_EQ(
      shard.AwaitDeferredSnapshot(5, absl::Now() + absl::Seconds(5)).code(),
      absl::StatusCode::kAborted);
}

// Backup workers (issue 25): 3 workers, R = 2, the 3 chunks of InitChunks()
// on 2 shards (the plan's split). `Gradient` is worker w's gradient of
// chunk c in step t, exact in fp32.
std::vector<float> Gradient(int w, int64_t t, const ChunkSpec& c) {
  std::vector<float> g(c.num_elements);
  for (int64_t i = 0; i < c.num_elements; ++i) {
    g[i] = static_cast<float>(
               ((w * 7 + t * 13 + (c.param_id * 3 + c.chunk_index) * 5 +
                 static_cast<int>(i) * 3) %
                17) -
               8) /
           8.0f;
  }
  return g;
}

struct BackupJob {
  static constexpr int kWorkers = 3;
  PartitionPlan plan;
  std::vector<std::unique_ptr<ParameterShard>> shards;

  // `replicas`: R (0: no backups, kWorkers workers; a reference run with
  // `workers` workers). `clip` > 0: SGD clipping by that global norm.
  BackupJob(int workers, int replicas, double clip = 0, int staleness = 0)
      : plan(*PartitionPlan::Create({6, 2}, 16, 2)) {
    std::vector<InitChunk> all = InitChunks();
    for (int s = 0; s < 2; ++s) {
      ShardOptions options = clip > 0 ? ClippingSgdOptions(workers)
                                      : Options(workers, SyncMode::kSync);
      options.clip_grad_norm = clip;
      options.staleness = staleness;
      options.shard_index = s;
      options.num_shards = 2;
      options.replicas_to_aggregate = replicas;
      shards.push_back(std::make_unique<ParameterShard>(options));
      std::vector<InitChunk> own;
      for (const InitChunk& c : all) {
        const int index = plan.FindChunk(c.param_id, c.chunk_index);
        if (plan.chunks()[index].shard == s) own.push_back(c);
      }
      EXPECT_FALSE(own.empty()) << s;
      EXPECT_TRUE(shards[s]->Initialize({6, 2}, 16, own).ok()) << s;
    }
  }

  // Worker w pushes every chunk of step t to shard s (as worker `as`).
  void Push(int s, int w, int64_t t, int as = -1) {
    for (const ChunkSpec& c : plan.ChunksOfShard(s)) {
      ASSERT_TRUE(shards[s]
                      ->Push(as < 0 ? w : as, c.param_id, c.chunk_index, t,
                             Gradient(w, t, c))
                      .ok())
          << s << " " << w << " " << t;
    }
  }

  // Clipping: the norm round of step t, as every worker does it: each
  // shard's partial (from a pull of version t + 1, which returns once the
  // step is decided), added in shard order, sent to every shard.
  void NormRound(int64_t t) {
    std::vector<double> partials(shards.size(), -1);
    std::vector<std::thread> pulls;
    for (size_t s = 0; s < shards.size(); ++s) {
      pulls.emplace_back([this, s, t, &partials] {
        absl::Status pulled = shards[s]->Pull(
            t + 1, 0, absl::Now() + absl::Seconds(5),
            [](const ChunkSpec&, int64_t, absl::Span<const float>) {}, nullptr,
            nullptr, 0, nullptr,
            [&partials, s](int64_t, double sum_sq) {
              partials[s] = sum_sq;
              return true;
            });
        EXPECT_TRUE(pulled.ok()) << pulled;
      });
    }
    // The partials come before the decision: wait for them, then decide.
    for (int i = 0; i < 500; ++i) {
      if (std::count(partials.begin(), partials.end(), -1.0) == 0) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    double sum_sq = 0;
    for (double p : partials) sum_sq += p;
    for (auto& shard : shards) {
      EXPECT_TRUE(shard->ApplyStepNorm(0, t, sum_sq).ok());
    }
    for (std::thread& pull : pulls) pull.join();
  }

  // Every chunk's weights, by plan order, at version >= v.
  std::vector<std::vector<float>> Weights(int64_t v) {
    std::vector<std::vector<float>> out;
    for (auto& shard : shards) {
      for (std::vector<float>& w : PullAll(*shard, v)) out.push_back(w);
    }
    return out;
  }
};

TEST(ParameterShardTest, BackupWorkersAverageTheSameWorkersOnEveryShard) {
  BackupJob job(BackupJob::kWorkers, 2);
  // Every worker pushes step 0 everywhere; shard 0 hears the ends in the
  // order 2, 0, 1: workers 2 and 0 are admitted, 1 is late.
  for (int w = 0; w < 3; ++w) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 0);
  }
  ParameterShard& arbiter = *job.shards[0];
  ParameterShard& other = *job.shards[1];
  absl::StatusOr<bool> admitted =
      arbiter.EndStepWithBackups(2, 0, nullptr, 0, AdmissionClaim::kDecide, 64);
  ASSERT_TRUE(admitted.ok() && *admitted) << admitted.status();
  admitted =
      arbiter.EndStepWithBackups(0, 0, nullptr, 0, AdmissionClaim::kDecide, 64);
  ASSERT_TRUE(admitted.ok() && *admitted) << admitted.status();
  // A non-finite value from the late worker does not skip the step.
  NonFiniteValue nan;
  nan.value = "nan";
  admitted =
      arbiter.EndStepWithBackups(1, 0, &nan, 0, AdmissionClaim::kDecide, 64);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_FALSE(*admitted);
  EXPECT_EQ(arbiter.Stats().min_version, 1);
  EXPECT_EQ(arbiter.Stats().samples, 128);  // the admitted workers' only
  // Shard 1 hears them in another order: the late end first. It decides
  // at the second admitted end, over the same workers (0 and 2).
  ASSERT_TRUE(
      other.EndStepWithBackups(1, 0, &nan, 0, AdmissionClaim::kLate, 64).ok());
  ASSERT_TRUE(
      other.EndStepWithBackups(0, 0, nullptr, 0, AdmissionClaim::kAdmitted, 64)
          .ok());
  EXPECT_EQ(other.Stats().min_version, 0);
  ASSERT_TRUE(
      other.EndStepWithBackups(2, 0, nullptr, 0, AdmissionClaim::kAdmitted, 64)
          .ok());
  EXPECT_EQ(other.Stats().min_version, 1);
  EXPECT_EQ(arbiter.Stats().skipped + other.Stats().skipped, 0);

  // The reference: 2 workers without backups, pushing workers 0's and 2's
  // gradients (as workers 0 and 1: the same worker-id order): every chunk
  // bit for bit.
  BackupJob reference(2, 0);
  for (int s = 0; s < 2; ++s) {
    reference.Push(s, 0, 0, 0);
    reference.Push(s, 2, 0, 1);
    EndAll(*reference.shards[s], 2, 0);
  }
  EXPECT_EQ(job.Weights(1), reference.Weights(1));

  // The late worker's pushes of step 0 that come after the decision are
  // dropped and counted; its step 1 goes on as usual.
  const ChunkSpec first = job.plan.ChunksOfShard(1)[0];
  ASSERT_TRUE(
      other.Push(1, first.param_id, first.chunk_index, 0, Gradient(1, 0, first))
          .ok());
  EXPECT_EQ(other.Stats().late_pushes, 1);
  EXPECT_EQ(job.Weights(1), reference.Weights(1));
}

TEST(ParameterShardTest, BackupWorkersRefuseWhatWouldMixStepsOrWorkers) {
  BackupJob job(BackupJob::kWorkers, 2);
  ParameterShard& arbiter = *job.shards[0];
  ParameterShard& other = *job.shards[1];
  for (int w = 0; w < 3; ++w) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 0);
  }
  // The plain end (no admission) and claims that do not fit the shard.
  absl::Status status = arbiter.EndStep(0, 0, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "end of step 0 on shard 0, which aggregates 2 of 3 workers per "
            "step: a step end must say the worker's admission");
  EXPECT_EQ(
      arbiter.EndStepWithBackups(0, 0, nullptr, 0, AdmissionClaim::kAdmitted, 0)
          .status()
          .message(),
      "worker 0 ended step 0 on shard 0 with an admission: shard 0 gives the "
      "admissions");
  EXPECT_EQ(
      other.EndStepWithBackups(0, 0, nullptr, 0, AdmissionClaim::kDecide, 0)
          .status()
          .message(),
      "worker 0 ended step 0 on shard 1 without shard 0's admission");
  // A step ahead of the one being decided: refused, nothing applied.
  const ChunkSpec c = job.plan.ChunksOfShard(1)[0];
  status = other.Push(0, c.param_id, c.chunk_index, 1, Gradient(0, 1, c));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      other.EndStepWithBackups(0, 1, nullptr, 0, AdmissionClaim::kAdmitted, 0)
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  // Step 0 is decided with workers 0 and 1; a third admitted end of it
  // is a claim shard 0 cannot have given.
  for (int w : {0, 1}) {
    ASSERT_TRUE(
        arbiter.EndStepWithBackups(w, 0, nullptr, 0, AdmissionClaim::kDecide, 0)
            .ok());
    ASSERT_TRUE(
        other.EndStepWithBackups(w, 0, nullptr, 0, AdmissionClaim::kAdmitted, 0)
            .ok());
  }
  status =
      other.EndStepWithBackups(2, 0, nullptr, 0, AdmissionClaim::kAdmitted, 0)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "worker 2 claims an admission to step 0, which shard 1 decided "
            "already with 2 other workers");
  // An admitted worker's non-finite value skips the step on every shard.
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.value = "inf";
  for (int w = 0; w < 3; ++w) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 1);
  }
  const std::vector<std::vector<float>> before = job.Weights(1);
  ASSERT_TRUE(
      arbiter.EndStepWithBackups(1, 1, &nan, 0, AdmissionClaim::kDecide, 0)
          .ok());
  ASSERT_TRUE(
      arbiter.EndStepWithBackups(2, 1, nullptr, 0, AdmissionClaim::kDecide, 0)
          .ok());
  for (int w : {2, 1}) {
    ASSERT_TRUE(other
                    .EndStepWithBackups(w, 1, w == 1 ? &nan : nullptr, 0,
                                        AdmissionClaim::kAdmitted, 0)
                    .ok());
  }
  EXPECT_EQ(arbiter.Stats().skipped, 1);
  EXPECT_EQ(other.Stats().skipped, 1);
  EXPECT_EQ(arbiter.Stats().min_version, 2);
  EXPECT_EQ(other.Stats().min_version, 2);
  // Each shard's pull sends every chunk twice (a skipped step's), the
  // second time with the weights of before the step.
  std::vector<std::vector<float>> after;
  for (auto& shard : job.shards) {
    std::vector<std::vector<float>> pulled;
    SkippedStepInfo skip;
    absl::Status status = shard->Pull(
        2, 0, absl::Now() + absl::Seconds(5),
        [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
          pulled.emplace_back(w.begin(), w.end());
        },
        nullptr, nullptr, 0, &skip);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(skip.worker_id, 1);
    ASSERT_EQ(pulled.size() % 2, 0u);
    after.insert(after.end(), pulled.begin() + pulled.size() / 2, pulled.end());
  }
  EXPECT_EQ(after, before);
}

// Backup workers with clipping (issue 36): the norm is that of the admitted
// workers' average, the late worker's pushes are in neither the norm nor
// the update, and every shard clips with the same coefficient: bit for bit
// the update of 2 workers without backups that push the admitted ones'
// gradients.
TEST(ParameterShardTest, BackupWorkersClipTheAdmittedWorkersAverage) {
  BackupJob job(BackupJob::kWorkers, 2, /*clip=*/0.5);
  BackupJob reference(2, 0, /*clip=*/0.5);
  for (int64_t t = 0; t < 3; ++t) {
    for (int w = 0; w < 3; ++w) {
      for (int s = 0; s < 2; ++s) job.Push(s, w, t);
    }
    // Shard 0 admits workers t % 3 and (t + 1) % 3; the third is late.
    const int first = static_cast<int>(t % 3);
    const int second = (first + 1) % 3;
    const int late = (first + 2) % 3;
    for (int w : {first, second, late}) {
      absl::StatusOr<bool> admitted = job.shards[0]->EndStepWithBackups(
          w, t, nullptr, 0, AdmissionClaim::kDecide, 8);
      ASSERT_TRUE(admitted.ok()) << admitted.status();
      EXPECT_EQ(*admitted, w != late) << t << " " << w;
    }
    // The step awaits its norm: nothing is applied yet.
    EXPECT_EQ(job.shards[0]->Stats().min_version, t);
    for (int w : {late, first, second}) {
      ASSERT_TRUE(job.shards[1]
                      ->EndStepWithBackups(w, t, nullptr, 0,
                                           w == late
                                               ? AdmissionClaim::kLate
                                               : AdmissionClaim::kAdmitted,
                                           8)
                      .ok());
    }
    job.NormRound(t);
    EXPECT_EQ(job.shards[0]->Stats().min_version, t + 1);
    EXPECT_EQ(job.shards[1]->Stats().min_version, t + 1);
    for (int s = 0; s < 2; ++s) {
      reference.Push(s, std::min(first, second), t, 0);
      reference.Push(s, std::max(first, second), t, 1);
      EndAll(*reference.shards[s], 2, t);
    }
    reference.NormRound(t);
    ASSERT_EQ(job.Weights(t + 1), reference.Weights(t + 1)) << t;
  }
  // The gradients were clipped (a norm above 0.5), so the weights differ
  // from the unclipped run's.
  BackupJob unclipped(2, 0);
  for (int64_t t = 0; t < 3; ++t) {
    const int first = static_cast<int>(t % 3), second = (first + 1) % 3;
    for (int s = 0; s < 2; ++s) {
      unclipped.Push(s, std::min(first, second), t, 0);
      unclipped.Push(s, std::max(first, second), t, 1);
      EndAll(*unclipped.shards[s], 2, t);
    }
  }
  EXPECT_NE(job.Weights(3), unclipped.Weights(3));
}

// Staleness with clipping (issue 36): each step is clipped by its own
// norm, agreed in the round of the pulls of its next version, and applied
// in step order, so the weights equal lockstep sync's with clipping bit for
// bit however far worker 0 runs ahead.
std::vector<std::vector<float>> TrainTwoClippingWorkers(int staleness,
                                                        int ahead,
                                                        int64_t steps) {
  ShardOptions options = ClippingSgdOptions(2);
  options.clip_grad_norm = 0.25;
  options.staleness = staleness;
  ParameterShard shard(options);
  EXPECT_TRUE(shard.Initialize({6, 2}, 16, InitChunks()).ok());
  int64_t next_norm = 0;  // the oldest step whose norm is not sent
  // Every step awaiting its norm gets it, as a worker pulling its next
  // version would send it.
  auto norms = [&] {
    while (next_norm < steps) {
      double partial = -1;
      shard
          .Pull(
              next_norm + 1, 0, absl::Now() + absl::Milliseconds(20),
              [](const ChunkSpec&, int64_t, absl::Span<const float>) {},
              nullptr, nullptr, 0, nullptr,
              [&](int64_t step, double sum_sq) {
                EXPECT_EQ(step, next_norm);
                partial = sum_sq;
                return true;
              })
          .IgnoreError();
      if (partial < 0) return;
      EXPECT_TRUE(shard.ApplyStepNorm(1, next_norm, partial).ok());
      // A second worker's sum of the same step: checked, accepted.
      EXPECT_TRUE(shard.ApplyStepNorm(0, next_norm, partial).ok());
      ++next_norm;
    }
  };
  for (int64_t t = 0; t < ahead; ++t) {
    RunStep(shard, 0, t);
    norms();
  }
  for (int64_t t = 0; t < steps; ++t) {
    if (t + ahead < steps) RunStep(shard, 0, t + ahead);
    norms();
    RunStep(shard, 1, t);
    norms();
  }
  EXPECT_EQ(next_norm, steps);
  EXPECT_EQ(shard.Stats().skipped, 1);
  EXPECT_EQ(shard.Stats().min_version, steps);
  // A clipping shard's pull takes a norm visitor (the step is decided:
  // the partial comes from its recent decisions).
  std::vector<std::vector<float>> out;
  EXPECT_TRUE(
      shard
          .Pull(
              steps, 0, absl::Now() + absl::Seconds(5),
              [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
                out.emplace_back(w.begin(), w.end());
              },
              nullptr, nullptr, 0, nullptr,
              [](int64_t, double) { return true; })
          .ok());
  return out;
}

TEST(ParameterShardTest, StalenessClipsEachStepWithItsOwnNorm) {
  const std::vector<std::vector<float>> sync = TrainTwoClippingWorkers(0, 0, 8);
  ASSERT_EQ(sync.size(), 3u);
  for (int ahead : {1, 2}) {
    EXPECT_EQ(TrainTwoClippingWorkers(2, ahead, 8), sync) << ahead;
  }
  // Clipping changed the weights (the reference without it differs).
  EXPECT_NE(TrainTwoWorkers(0, 0, 8), sync);
}

// Checkpoints with backup workers (issue 36): shard 0 picks the cut, the
// first step it has admitted no end of, and holds that step's admissions
// until the other shard registered it; every chunk of both shards is then
// copied at the cut, equal to a run without the checkpoint.
TEST(ParameterShardTest, BackupWorkersCheckpointIsShardZerosCut) {
  BackupJob job(BackupJob::kWorkers, 2);
  ParameterShard& arbiter = *job.shards[0];
  ParameterShard& other = *job.shards[1];
  // Only shard 0 of a backup job picks a cut.
  EXPECT_EQ(other.HoldCheckpointStep(0, /*end_step=*/0, absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  auto run_step = [&](int64_t t, std::vector<int> order) {
    for (int w = 0; w < 3; ++w) {
      for (int s = 0; s < 2; ++s) job.Push(s, w, t);
    }
    std::vector<bool> admitted(3);
    for (int w : order) {
      absl::StatusOr<bool> a = arbiter.EndStepWithBackups(
          w, t, nullptr, 0, AdmissionClaim::kDecide, 8);
      ASSERT_TRUE(a.ok()) << a.status();
      admitted[w] = *a;
    }
    for (int w : order) {
      ASSERT_TRUE(other
                      .EndStepWithBackups(w, t, nullptr, 0,
                                          admitted[w]
                                              ? AdmissionClaim::kAdmitted
                                              : AdmissionClaim::kLate,
                                          8)
                      .ok());
    }
  };
  run_step(0, {1, 2, 0});
  // Worker 0 (late in step 0) asks at its step 1 while worker 2 has ended
  // step 1 on shard 0 already: the cut is step 2.
  for (int s = 0; s < 2; ++s) job.Push(s, 2, 1);
  ASSERT_TRUE(
      arbiter.EndStepWithBackups(2, 1, nullptr, 0, AdmissionClaim::kDecide, 8)
          .ok());
  // A job of 2 steps has no cut left: every step admitted without worker
  // 0 (nothing is held: the ask below gets the same cut at once).
  EXPECT_EQ(arbiter.HoldCheckpointStep(1, /*end_step=*/2, absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  absl::StatusOr<int64_t> cut =
      arbiter.HoldCheckpointStep(1, /*end_step=*/3, absl::Seconds(5));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut, 2);
  std::vector<ChunkSnapshot> cut0, cut1;
  ASSERT_TRUE(arbiter.BeginDeferredSnapshot(2, &cut0).ok());
  ASSERT_TRUE(other.BeginDeferredSnapshot(2, &cut1).ok());
  arbiter.ReleaseCheckpointHold();
  // Step 1's other ends, then step 2, whose admissions were free again.
  for (int w : {0, 1}) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 1);
  }
  for (int w : {0, 1}) {
    ASSERT_TRUE(
        arbiter.EndStepWithBackups(w, 1, nullptr, 0, AdmissionClaim::kDecide, 8)
            .ok());
  }
  for (int w : {2, 0, 1}) {
    ASSERT_TRUE(other
                    .EndStepWithBackups(w, 1, nullptr, 0,
                                        w == 1 ? AdmissionClaim::kLate
                                               : AdmissionClaim::kAdmitted,
                                        8)
                    .ok());
  }
  const std::vector<std::vector<float>> at_cut = job.Weights(2);
  // A hold on step 3 (nothing of step 2 admitted yet: the cut is 2 again,
  // the same registration) makes step 2's first end wait for the release.
  cut = arbiter.HoldCheckpointStep(2, /*end_step=*/0, absl::Seconds(5));
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(*cut, 2);
  for (int w = 0; w < 3; ++w) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 2);
  }
  std::atomic<bool> admitted{false};
  std::thread ender([&] {
    EXPECT_TRUE(
        arbiter.EndStepWithBackups(0, 2, nullptr, 0, AdmissionClaim::kDecide, 8)
            .ok());
    admitted = true;
  });
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_FALSE(admitted.load()) << "admitted while the cut was held";
  arbiter.ReleaseCheckpointHold();
  ender.join();
  EXPECT_TRUE(admitted.load());
  ASSERT_TRUE(
      arbiter.EndStepWithBackups(1, 2, nullptr, 0, AdmissionClaim::kDecide, 8)
          .ok());
  for (int w : {0, 1}) {
    ASSERT_TRUE(
        other.EndStepWithBackups(w, 2, nullptr, 0, AdmissionClaim::kAdmitted, 8)
            .ok());
  }
  for (auto* shard : {&arbiter, &other}) {
    ASSERT_TRUE(
        shard->AwaitDeferredSnapshot(2, absl::Now() + absl::Seconds(5)).ok());
  }
  std::vector<std::vector<float>> copied;
  for (const auto* part : {&cut0, &cut1}) {
    for (const ChunkSnapshot& c : *part) {
      EXPECT_EQ(c.version, 2);
      copied.push_back(c.weights);
    }
  }
  EXPECT_EQ(copied, at_cut);
  EXPECT_NE(job.Weights(3), at_cut);  // step 2 went on past the cut
  // A hold nobody releases ends by itself: the end waits it out.
  cut = arbiter.HoldCheckpointStep(3, /*end_step=*/0, absl::Milliseconds(100));
  ASSERT_TRUE(cut.ok());
  for (int s = 0; s < 2; ++s) job.Push(s, 0, 3);
  const absl::Time before = absl::Now();
  ASSERT_TRUE(
      arbiter.EndStepWithBackups(0, 3, nullptr, 0, AdmissionClaim::kDecide, 8)
          .ok());
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(50));
}

// An elastic change with backup workers (issue 40): worker 0 will not push
// the steps between its own and the others', so shard 0 holds the first
// step it has not decided, even one with an end admitted already (a
// checkpoint's cut would skip it and wait for worker 0's end for ever);
// an end of it or of a later step is answered late at once (a waiting end
// would stall its stream, and the norm of an earlier step behind it: the
// settle then outlived the hold, and shard 1 decided the held step before
// worker 0's reopen, once in elastic_test BackupsAndStaleness...); no
// shard decides it, and a reopen of both at it drops its admitted end.
TEST(ParameterShardTest, BackupWorkersHoldTheFirstUndecidedStepForAChange) {
  BackupJob job(BackupJob::kWorkers, 2, /*clip=*/0, /*staleness=*/1);
  ParameterShard& arbiter = *job.shards[0];
  ParameterShard& other = *job.shards[1];
  const std::vector<std::vector<float>> initial = job.Weights(0);
  EXPECT_EQ(other.HoldFirstUndecidedStep(0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (int w : {1, 2}) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 0);
  }
  absl::StatusOr<bool> a =
      arbiter.EndStepWithBackups(2, 0, nullptr, 0, AdmissionClaim::kDecide, 8);
  ASSERT_TRUE(a.ok() && *a) << a.status();
  ASSERT_TRUE(
      other.EndStepWithBackups(2, 0, nullptr, 0, AdmissionClaim::kAdmitted, 8)
          .ok());
  absl::StatusOr<int64_t> held =
      arbiter.HoldFirstUndecidedStep(0, absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, 0);
  for (int64_t step : {0, 1}) {
    const absl::Time before = absl::Now();
    absl::StatusOr<bool> late = arbiter.EndStepWithBackups(
        1, step, nullptr, 0, AdmissionClaim::kDecide, 8);
    ASSERT_TRUE(late.ok()) << late.status();
    EXPECT_FALSE(*late) << "step " << step << " admitted under the hold";
    EXPECT_LT(absl::Now() - before, absl::Milliseconds(500));
  }
  for (ParameterShard* shard : {&arbiter, &other}) {
    EXPECT_EQ(shard->Stats().decided_step, -1);
  }
  for (ParameterShard* shard : {&arbiter, &other}) {
    absl::StatusOr<int64_t> version = shard->Reopen(1, /*expected_version=*/0);
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, 0);
  }
  std::vector<std::vector<float>> reopened;
  for (ParameterShard* shard : {&arbiter, &other}) {
    for (std::vector<float>& w : PullAt(*shard, 0, 1)) reopened.push_back(w);
  }
  EXPECT_EQ(reopened, initial);
}

// The same with clipping: step 0's admissions are complete (workers 1 and
// 2) but it waits for its norm, which decides it on every shard whatever a
// hold: the hold for a change is past it, at step 1 (held at step 0, shard
// 0 decided it and shard 1 not yet, and worker 0's reopen of both at step
// 0 failed: tests:elastic_test BackupsAndStaleness..., once in CI).
TEST(ParameterShardTest, BackupWorkersHoldForAChangeSkipsACompleteStep) {
  BackupJob job(BackupJob::kWorkers, 2, /*clip=*/1.0, /*staleness=*/1);
  ParameterShard& arbiter = *job.shards[0];
  for (int w : {1, 2}) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, 0);
    absl::StatusOr<bool> a = arbiter.EndStepWithBackups(
        w, 0, nullptr, 0, AdmissionClaim::kDecide, 8);
    ASSERT_TRUE(a.ok() && *a) << a.status();
  }
  EXPECT_EQ(arbiter.Stats().decided_step, -1);  // its norm is not in
  absl::StatusOr<int64_t> held =
      arbiter.HoldFirstUndecidedStep(0, absl::Seconds(1));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, 1);
}

// Backup workers with staleness (issue 36): a fast worker pushes and ends
// step 1 before step 0 is decided; each step is still decided by its first
// R admitted ends, in step order, so the weights equal backups without
// staleness with the same admitted sets, bit for bit. Shard 0's checkpoint
// cut skips every step with an admitted end.
TEST(ParameterShardTest, BackupWorkersWithStalenessDecideInStepOrder) {
  BackupJob job(BackupJob::kWorkers, 2, /*clip=*/0, /*staleness=*/1);
  ParameterShard& arbiter = *job.shards[0];
  ParameterShard& other = *job.shards[1];
  auto end = [&](int w, int64_t t, bool admitted) {
    for (ParameterShard* shard : {&arbiter, &other}) {
      absl::StatusOr<bool> a =
          shard->EndStepWithBackups(w, t, nullptr, 0,
                                    shard == &arbiter ? AdmissionClaim::kDecide
                                    : admitted ? AdmissionClaim::kAdmitted
                                               : AdmissionClaim::kLate,
                                    8);
      ASSERT_TRUE(a.ok()) << w << " " << t << ": " << a.status();
      EXPECT_EQ(*a, admitted) << w << " " << t;
    }
  };
  auto push = [&](int w, int64_t t) {
    for (int s = 0; s < 2; ++s) job.Push(s, w, t);
  };
  // Worker 0 runs a step ahead: steps 0 and 1 admitted, nothing decided.
  push(0, 0);
  end(0, 0, true);
  push(0, 1);
  end(0, 1, true);
  EXPECT_EQ(arbiter.Stats().min_version, 0);
  // Step 2 is past the bound (step 0 undecided).
  const ChunkSpec c = job.plan.ChunksOfShard(0)[0];
  EXPECT_EQ(
      arbiter.Push(0, c.param_id, c.chunk_index, 2, Gradient(0, 2, c)).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      arbiter.EndStepWithBackups(0, 2, nullptr, 0, AdmissionClaim::kDecide, 8)
          .status()
          .message(),
      "worker 0 ended step 2 but shard 0 is collecting the ends of step 0 to "
      "1");
  // A checkpoint asked for at step 0: steps 0 and 1 have admitted ends, so
  // the cut is step 2.
  absl::StatusOr<int64_t> cut =
      arbiter.HoldCheckpointStep(0, /*end_step=*/0, absl::Seconds(5));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut, 2);
  arbiter.ReleaseCheckpointHold();
  // Worker 2 ends step 1 first (admitted, the second: step 1 complete but
  // waiting for step 0), then step 0 (admitted: both decided, in order);
  // worker 1's step 0 is late.
  push(2, 1);
  end(2, 1, true);
  EXPECT_EQ(arbiter.Stats().min_version, 0);
  push(2, 0);
  end(2, 0, true);
  EXPECT_EQ(arbiter.Stats().min_version, 2);
  EXPECT_EQ(other.Stats().min_version, 2);
  push(1, 0);  // after the decision: dropped, counted
  end(1, 0, false);
  EXPECT_GT(arbiter.Stats().late_pushes, 0);

  // The reference: backups without staleness, the same admitted sets.
  BackupJob reference(BackupJob::kWorkers, 2);
  for (int64_t t = 0; t < 2; ++t) {
    for (int w : {0, 2}) {
      for (int s = 0; s < 2; ++s) reference.Push(s, w, t);
      for (int s = 0; s < 2; ++s) {
        ASSERT_TRUE(reference.shards[s]
                        ->EndStepWithBackups(w, t, nullptr, 0,
                                             s == 0 ? AdmissionClaim::kDecide
                                                    : AdmissionClaim::kAdmitted,
                                             8)
                        .ok());
      }
    }
  }
  EXPECT_EQ(job.Weights(2), reference.Weights(2));
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// A delta pull (PullOrder::have_version, visit_delta) of one sync SGD job
// (lr 0.1, 1 worker): parameter 0 of 8 elements in one chunk, parameter
// 1 a buffer of 2.
struct DeltaPull {
  std::map<int, std::vector<float>> whole;  // param_id -> weights
  std::map<int, std::pair<std::vector<uint32_t>, std::vector<float>>> deltas;
};
DeltaPull PullDeltas(ParameterShard& shard, int64_t min_version,
                     int64_t have_version, int wire_bytes = 4) {
  DeltaPull out;
  PullOrder order;
  order.have_version = have_version;
  order.wire_bytes = wire_bytes;
  order.visit_delta = [&](const ChunkSpec& c, int64_t version,
                          const ChunkDelta& d) {
    EXPECT_EQ(version, min_version);
    out.deltas[c.param_id] = {
        std::vector<uint32_t>(d.indices.begin(), d.indices.end()),
        std::vector<float>(d.values.begin(), d.values.end())};
  };
  const absl::Status s = shard.Pull(
      min_version, 0, absl::Now() + absl::Seconds(5),
      [&](const ChunkSpec& c, int64_t, absl::Span<const float> w) {
        out.whole[c.param_id].assign(w.begin(), w.end());
      },
      nullptr, nullptr, 0, nullptr, nullptr, {}, order);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(ParameterShardTest, DeltaPullsSendTheEntriesTheUpdateChanged) {
  ShardOptions options = Options(1, SyncMode::kSync);
  options.adam.kind = OptimizerKind::kSgd;
  ParameterShard shard(options);
  std::vector<InitChunk> chunks(2);
  chunks[0].values = {1, 2, 3, 4, 5, 6, 7, 8};
  chunks[1].param_id = 1;
  chunks[1].values = {9, 9};
  ASSERT_TRUE(shard.Initialize({8, 2}, 32, chunks, /*num_buffers=*/1).ok());
  // Step 0: a top-k push of 2 entries: SGD changes those two only.
  ASSERT_TRUE(
      shard.Push(0, 0, 0, 0, std::vector<float>{0, 0, 1, 0, 0, 0, 0, -2}).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 0, std::vector<float>{3, 4}).ok());
  EndAll(shard, 1, 0);
  DeltaPull pulled = PullDeltas(shard, 1, /*have_version=*/0);
  ASSERT_EQ(pulled.deltas.count(0), 1u);
  EXPECT_EQ(pulled.deltas[0].first, (std::vector<uint32_t>{2, 7}));
  EXPECT_EQ(pulled.deltas[0].second,
            (std::vector<float>{3 - 0.1f * 1, 8 - 0.1f * -2}));
  // The buffer goes whole (a worker's forward changes its copy).
  EXPECT_EQ(pulled.whole[1], (std::vector<float>{3, 4}));
  // Applied to version 0's weights, the delta is version 1, bit for bit.
  std::vector<float> mine = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t i = 0; i < pulled.deltas[0].first.size(); ++i) {
    mine[pulled.deltas[0].first[i]] = pulled.deltas[0].second[i];
  }
  EXPECT_EQ(mine, PullAll(shard, 1)[0]);
  // A puller that holds another version, or none, gets the whole chunk.
  EXPECT_EQ(PullDeltas(shard, 1, /*have_version=*/1).whole[0], mine);
  EXPECT_EQ(PullDeltas(shard, 1, /*have_version=*/-1).whole[0], mine);
  // A 16-bit wire: 3 changed entries of 8 are 9 bytes (1-byte index gaps)
  // against 16 whole (with 4-byte indices they were 18: whole).
  ASSERT_TRUE(
      shard.Push(0, 0, 0, 1, std::vector<float>{1, 1, 1, 0, 0, 0, 0, 0}).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 1, std::vector<float>{3, 4}).ok());
  EndAll(shard, 1, 1);
  EXPECT_EQ(PullDeltas(shard, 2, 1, /*wire_bytes=*/2).deltas[0].first,
            (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(PullDeltas(shard, 2, 1, /*wire_bytes=*/4).deltas[0].first,
            (std::vector<uint32_t>{0, 1, 2}));
  // A dense update (half the entries or more): whole.
  ASSERT_TRUE(shard.Push(0, 0, 0, 2, std::vector<float>(8, 1.0f)).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 2, std::vector<float>{3, 4}).ok());
  EndAll(shard, 1, 2);
  EXPECT_EQ(PullDeltas(shard, 3, 2).deltas.count(0), 0u);
  // A skipped step puts the weights back: the pull's second round sends
  // them whole (the first had sent the delta of the undone update).
  const std::vector<float> before = PullAll(shard, 3)[0];
  ASSERT_TRUE(
      shard.Push(0, 0, 0, 3, std::vector<float>{0, 0, 0, 0, 0, 0, 0, 5}).ok());
  ASSERT_TRUE(shard.Push(0, 1, 0, 3, std::vector<float>{3, 4}).ok());
  NonFiniteValue nan;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(0, 3, &nan).ok());
  pulled = PullDeltas(shard, 4, 3);
  EXPECT_EQ(pulled.deltas.count(0), 0u);
  EXPECT_EQ(pulled.whole[0], before);
  EXPECT_EQ(PullDeltas(shard, 4, 3).deltas.count(0), 0u);
}

}  // namespace
}  // namespace pstrain
