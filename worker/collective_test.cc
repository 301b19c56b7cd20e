#include "worker/collective.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// Runs `body(rank)` on `size` threads, each with its own Collective.
template <typename Body>
void OnRanks(int size, Body body) {
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, size, "127.0.0.1", &store, "test", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      body(**c);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(CollectiveTest, RingAllreduceSumsEveryRanksArray) {
  for (int size : {1, 2, 3, 4}) {
    // 1001 elements: not a multiple of the ring's chunk count.
    constexpr int kN = 1001;
    std::vector<std::vector<float>> results(size);
    OnRanks(size, [&](Collective& c) {
      std::vector<float> data(kN);
      for (int i = 0; i < kN; ++i) data[i] = c.rank() * 1000.0f + i;
      ASSERT_TRUE(c.AllreduceSum(data.data(), data.size()).ok());
      results[c.rank()] = data;
    });
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < kN; ++i) {
        // Sums of integers below 2^24 are exact in fp32.
        const float expected = 1000.0f * size * (size - 1) / 2 + size * i;
        ASSERT_EQ(results[r][i], expected) << "size " << size << " rank " << r;
      }
    }
  }
}

TEST(CollectiveTest, BroadcastCopiesTheRootsArray) {
  std::vector<std::vector<float>> results(3);
  OnRanks(3, [&](Collective& c) {
    std::vector<float> data(10, static_cast<float>(c.rank()));
    ASSERT_TRUE(c.Broadcast(data.data(), data.size(), 2).ok());
    results[c.rank()] = data;
  });
  for (const auto& r : results) EXPECT_EQ(r, std::vector<float>(10, 2.0f));
}

TEST(CollectiveTest, MissingRankTimesOutNamingTheKey) {
  InProcessStore store;
  absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
      0, 2, "127.0.0.1", &store, "lonely", absl::Milliseconds(300));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("rank 0 of 2 on 127.0.0.1"),
            std::string::npos)
      << c.status();
  EXPECT_EQ(
      Collective::CreateGloo(2, 2, "127.0.0.1", &store, "x", absl::Seconds(1))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// NCCL: these run with bazel test --config=cuda on a GPU machine and skip,
// saying why, elsewhere.

// Skips the test unless this build has NCCL and GPU `gpu` is visible (a
// one-rank communicator on it connects).
#define SKIP_UNLESS_NCCL_GPU(gpu)                                             \
  do {                                                                        \
    if (!Collective::HasNccl()) GTEST_SKIP() << "build without CUDA";         \
    InProcessStore probe_store;                                               \
    absl::StatusOr<std::unique_ptr<Collective>> probe =                       \
        Collective::CreateNccl(0, 1, gpu, &probe_store, "probe",              \
                               absl::Seconds(30));                            \
    if (!probe.ok()) GTEST_SKIP() << "GPU " << gpu << ": " << probe.status(); \
  } while (0)

TEST(NcclTest, BuildWithoutCudaSaysSo) {
  if (Collective::HasNccl()) GTEST_SKIP() << "build with CUDA";
  InProcessStore store;
  absl::StatusOr<std::unique_ptr<Collective>> c =
      Collective::CreateNccl(0, 2, 0, &store, "x", absl::Seconds(1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("this build has no NCCL collective"),
            std::string::npos)
      << c.status();
}

TEST(NcclTest, AllreduceAndBroadcastOnTwoGpus) {
  SKIP_UNLESS_NCCL_GPU(0);
  SKIP_UNLESS_NCCL_GPU(1);
  constexpr int kN = 1001;
  InProcessStore store;
  std::vector<std::vector<float>> sums(2), copies(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateNccl(
          r, 2, /*gpu=*/r, &store, "test", absl::Seconds(60));
      ASSERT_TRUE(c.ok()) << c.status();
      std::vector<float> data(kN);
      for (int i = 0; i < kN; ++i) data[i] = r * 1000.0f + i;
      ASSERT_TRUE((*c)->AllreduceSum(data.data(), data.size()).ok());
      sums[r] = data;
      std::vector<float> mine(10, static_cast<float>(r + 7));
      ASSERT_TRUE((*c)->Broadcast(mine.data(), mine.size(), 1).ok());
      copies[r] = mine;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(sums[r].size(), static_cast<size_t>(kN));
    for (int i = 0; i < kN; ++i) {
      // Integers below 2^24: the sum is exact in fp32.
      ASSERT_EQ(sums[r][i], 1000.0f + 2 * i) << "rank " << r;
    }
    EXPECT_EQ(copies[r], std::vector<float>(10, 8.0f)) << "rank " << r;
  }
}

TEST(NcclTest, MissingRankIsADeadlineNotAHang) {
  SKIP_UNLESS_NCCL_GPU(0);
  InProcessStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Collective>> c =
      Collective::CreateNccl(0, 2, 0, &store, "lonely", absl::Seconds(3));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded)
      << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(Collective::CreateNccl(2, 2, 0, &store, "x", absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
