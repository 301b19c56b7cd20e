#include "worker/collective.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// Runs `body(rank)` on `size` threads, each with its own Collective. The
// Collectives close only after every rank's body has returned: a rank whose
// body sends nothing would otherwise close its connections while a slower
// rank's Gloo device thread is still completing the connection, which that
// rank then reads as "Connection closed by peer" (1 run in 50 on 2 loaded
// cores). A job's ranks always communicate after connecting.
template <typename Body>
void OnRanks(int size, Body body) {
  InProcessStore store;
  std::vector<std::unique_ptr<Collective>> collectives(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
          r, size, "127.0.0.1", &store, "test", absl::Seconds(20));
      ASSERT_TRUE(c.ok()) << c.status();
      body(**c);
      collectives[r] = *std::move(c);
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

// 16-bit sums (Collective::AllreduceSum16): with two ranks each element is
// one addition, so the result is exactly round(widen(a) + widen(b)); with
// three and four it is a chain of such roundings in the ring's order: the
// same on every rank, and within one rounding per addition of the exact
// sum of the 16-bit inputs.
TEST(CollectiveTest, SixteenBitAllreduceRoundsEveryAddition) {
  for (DType dtype : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    const bool bf16 = dtype == DTYPE_BFLOAT16;
    auto round = [&](float x) {
      return bf16 ? FloatToBfloat16(x) : FloatToFloat16(x);
    };
    auto widen = [&](uint16_t h) {
      return bf16 ? Bfloat16ToFloat(h) : Float16ToFloat(h);
    };
    // Values whose sums need rounding in either type.
    auto input = [](int rank, int i) {
      return 0.3f + 0.01f * static_cast<float>(i % 97) +
             0.123f * static_cast<float>(rank);
    };
    for (int size : {2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << DType_Name(dtype) << " size " << size);
      constexpr int kN = 1001;
      std::vector<std::vector<uint16_t>> results(size);
      OnRanks(size, [&](Collective& c) {
        std::vector<uint16_t> data(kN);
        for (int i = 0; i < kN; ++i) data[i] = round(input(c.rank(), i));
        ASSERT_TRUE(c.AllreduceSum16(data.data(), data.size(), dtype).ok());
        results[c.rank()] = data;
      });
      for (int i = 0; i < kN; ++i) {
        double exact = 0;
        for (int r = 0; r < size; ++r) exact += widen(round(input(r, i)));
        const float got = widen(results[0][i]);
        if (size == 2) {
          ASSERT_EQ(results[0][i], round(widen(round(input(0, i))) +
                                         widen(round(input(1, i)))))
              << i;
        } else {
          // Each of the size - 1 additions rounds by at most half a unit
          // in the last place of a partial sum no larger than the total.
          const double ulp = std::ldexp(exact, bf16 ? -7 : -10);
          ASSERT_LE(std::fabs(got - exact), (size - 1) * 0.5 * ulp) << i;
        }
        for (int r = 1; r < size; ++r) {
          ASSERT_EQ(results[r][i], results[0][i]) << "rank " << r << " " << i;
        }
      }
    }
  }
  OnRanks(2, [&](Collective& c) {
    uint16_t x = 0;
    EXPECT_EQ(c.AllreduceSum16(&x, 1, DTYPE_FLOAT32).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

TEST(CollectiveTest, MaxAllreduceTakesTheLargest) {
  std::vector<std::vector<float>> results(3);
  OnRanks(3, [&](Collective& c) {
    std::vector<float> data = {static_cast<float>(c.rank()),
                               -static_cast<float>(c.rank()), 5.0f};
    ASSERT_TRUE(c.AllreduceMax(data.data(), data.size()).ok());
    results[c.rank()] = data;
  });
  for (const auto& r : results) {
    EXPECT_EQ(r, (std::vector<float>{2.0f, 0.0f, 5.0f}));
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

// Allgather: rank r's bytes land at slot r of every rank's output, also
// with one rank, and a length that is no multiple of anything.
TEST(CollectiveTest, AllgatherPlacesEveryRanksBytesInRankOrder) {
  for (int size : {1, 2, 3}) {
    constexpr size_t kBytes = 1003;
    std::vector<std::string> results(size);
    OnRanks(size, [&](Collective& c) {
      std::string mine(kBytes, '\0');
      for (size_t i = 0; i < kBytes; ++i) {
        mine[i] = static_cast<char>(c.rank() * 31 + i % 251);
      }
      std::string all(kBytes * c.size(), 'x');
      ASSERT_TRUE(c.Allgather(mine.data(), kBytes, all.data()).ok());
      results[c.rank()] = all;
    });
    std::string expected;
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < kBytes; ++i) {
        expected.push_back(static_cast<char>(r * 31 + i % 251));
      }
    }
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(results[r], expected) << "size " << size << " rank " << r;
    }
  }
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
  std::vector<std::vector<float>> sums(2), copies(2), gathered(2);
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
      // Allgather: [rank 0's 3 floats, rank 1's 3 floats].
      const std::vector<float> own = {r + 0.5f, r + 1.5f, r + 2.5f};
      std::vector<float> all(6);
      ASSERT_TRUE(
          (*c)->Allgather(own.data(), own.size() * sizeof(float), all.data())
              .ok());
      gathered[r] = all;
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
    EXPECT_EQ(gathered[r],
              (std::vector<float>{0.5f, 1.5f, 2.5f, 1.5f, 2.5f, 3.5f}))
        << "rank " << r;
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
