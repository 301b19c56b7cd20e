#include "common/partition.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(PartitionPlanTest, CutsTensorsIntoBoundedChunks) {
  // 10 elements with 16-byte chunks: 4 + 4 + 2.
  auto plan = PartitionPlan::Create({10, 3}, 16, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->chunks().size(), 4u);
  EXPECT_EQ(plan->chunks()[0].num_elements, 4);
  EXPECT_EQ(plan->chunks()[1].offset, 4);
  EXPECT_EQ(plan->chunks()[2].num_elements, 2);
  EXPECT_EQ(plan->chunks()[2].chunk_index, 2);
  EXPECT_EQ(plan->chunks()[3].param_id, 1);
  EXPECT_EQ(plan->chunks()[3].num_elements, 3);
  EXPECT_EQ(plan->FindChunk(0, 2), 2);
  EXPECT_EQ(plan->FindChunk(1, 0), 3);
  EXPECT_EQ(plan->FindChunk(1, 1), -1);
  // Keys from the network: out of range, never an overflow.
  EXPECT_EQ(plan->FindChunk(1, INT32_MAX), -1);
  EXPECT_EQ(plan->FindChunk(0, INT32_MAX - 1), -1);
  EXPECT_EQ(plan->FindChunk(0, -1), -1);
  EXPECT_EQ(plan->FindChunk(INT32_MAX, 0), -1);
  EXPECT_EQ(plan->FindChunk(2, 0), -1);
  EXPECT_EQ(plan->FindChunk(-1, 0), -1);
}

TEST(PartitionPlanTest, BalancesBytesAcrossShards) {
  // LeNet-5's parameter sizes.
  const std::vector<int64_t> sizes = {150, 6,     2400, 16,  48000,
                                      120, 10080, 84,   840, 10};
  auto plan = PartitionPlan::Create(sizes, 4 << 10, 2);
  ASSERT_TRUE(plan.ok());
  const std::vector<int64_t> bytes = plan->BytesPerShard();
  const int64_t total = bytes[0] + bytes[1];
  EXPECT_EQ(total, 61706 * 4);
  // Greedy largest-first keeps the imbalance below one chunk.
  EXPECT_LE(std::llabs(bytes[0] - bytes[1]), 4 << 10);
  // Every element is covered exactly once.
  int64_t covered = 0;
  for (const ChunkSpec& c : plan->chunks()) covered += c.num_elements;
  EXPECT_EQ(covered, 61706);
}

TEST(PartitionPlanTest, SameInputsGiveSamePlan) {
  const std::vector<int64_t> sizes = {1000, 7, 123456, 5, 99999};
  auto a = PartitionPlan::Create(sizes, 4096, 3);
  auto b = PartitionPlan::Create(sizes, 4096, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->chunks().size(), b->chunks().size());
  for (size_t i = 0; i < a->chunks().size(); ++i) {
    EXPECT_EQ(a->chunks()[i].shard, b->chunks()[i].shard);
    EXPECT_EQ(a->chunks()[i].num_elements, b->chunks()[i].num_elements);
  }
}

TEST(PartitionPlanTest, RejectsBadArguments) {
  EXPECT_EQ(PartitionPlan::Create({10}, 16, 0).status().message(),
            "num_shards must be > 0, got 0");
  EXPECT_EQ(PartitionPlan::Create({10}, 6, 1).status().message(),
            "partition_bytes must be a positive multiple of 4 bytes, got 6");
  EXPECT_EQ(PartitionPlan::Create({10, 0}, 16, 1).status().message(),
            "parameter 1 has 0 elements; expected > 0");
  EXPECT_EQ(PartitionPlan::Create({}, 16, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
