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

TEST(PartitionPlanTest, RowSparseTablesAreCutOnRowsAcrossShards) {
  // A table of 1000 rows of 12 elements (48 bytes a row) and a dense
  // tensor; chunks of at most 1000 bytes hold 20 whole rows (960 bytes).
  const std::vector<int64_t> sizes = {12000, 500};
  auto plan = PartitionPlan::Create(sizes, 1000, 3, 0, {12, 0});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->row_elements(0), 12);
  EXPECT_EQ(plan->row_elements(1), 0);
  int64_t covered = 0;
  std::vector<int> table_chunks_per_shard(3, 0);
  for (const ChunkSpec& c : plan->chunks()) {
    if (c.param_id != 0) {
      EXPECT_EQ(c.row_elements, 0);
      EXPECT_EQ(c.num_elements, 250);
      continue;
    }
    EXPECT_EQ(c.row_elements, 12);
    EXPECT_EQ(c.offset, covered);
    EXPECT_EQ(c.offset % 12, 0);
    EXPECT_EQ(c.num_elements, 240);
    covered += c.num_elements;
    ++table_chunks_per_shard[c.shard];
  }
  EXPECT_EQ(covered, 12000);
  // 50 chunks of the table: every shard holds some of it.
  for (int n : table_chunks_per_shard) EXPECT_GE(n, 16);
  // A row wider than partition_bytes is one row per chunk.
  auto wide = PartitionPlan::Create({400}, 16, 1, 0, {100});
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->chunks().size(), 4u);
  EXPECT_EQ(wide->chunks()[3].offset, 300);
}

TEST(PartitionPlanTest, RejectsBadRowElements) {
  EXPECT_EQ(PartitionPlan::Create({12, 5}, 16, 1, 0, {5}).status().message(),
            "param_row_elements has 1 entries; expected one per tensor (2) "
            "or none");
  EXPECT_EQ(PartitionPlan::Create({12}, 16, 1, 0, {5}).status().message(),
            "tensor 0 of 12 elements has 5 elements per row; expected 0 "
            "(dense) or a divisor of its size (row-sparse tensors are "
            "parameters, not buffers)");
  EXPECT_EQ(PartitionPlan::Create({12}, 16, 1, 0, {-4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A buffer cannot be row-sparse.
  EXPECT_EQ(PartitionPlan::Create({12, 4}, 16, 1, 1, {0, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Offsets go as varint gaps: 7 bits a byte, at least one.
TEST(SparseWireTest, IndexGapBytesCountsEachGapsVarint) {
  EXPECT_EQ(IndexGapBytes({}), 0);
  EXPECT_EQ(IndexGapBytes({0}), 1);
  EXPECT_EQ(IndexGapBytes({127}), 1);
  EXPECT_EQ(IndexGapBytes({128}), 2);
  // Gaps 5, 123, 16384 (3 bytes), 2^32 - 1 - 16512 (5 bytes).
  EXPECT_EQ(IndexGapBytes({5, 128, 16512, 0xffffffffu}), 1 + 1 + 3 + 5);
}

TEST(SparseWireTest, PairsGoWholeWhereTheyCostAtLeastTheDenseBytes) {
  // 1% of 10,000 fp32 entries: 100 pairs of about 5 bytes, not 40,000.
  std::vector<uint32_t> every_hundredth;
  for (uint32_t i = 0; i < 10000; i += 100) every_hundredth.push_back(i);
  EXPECT_FALSE(SparseAtLeastDense(every_hundredth, 10000, 4));
  // 80% of 10 entries at 1-byte gaps: 8 x 5 bytes = 40 bytes = 10 x 4.
  const std::vector<uint32_t> most = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(SparseAtLeastDense(most, 10, 4));
  EXPECT_FALSE(SparseAtLeastDense(most, 11, 4));
  // bf16 values: 8 x 3 bytes against 12 x 2.
  EXPECT_TRUE(SparseAtLeastDense(most, 12, 2));
  EXPECT_FALSE(SparseAtLeastDense(most, 13, 2));
  // A 3-byte gap decides by the exact count: 10 index bytes and 8 x 2
  // value bytes (26) against 13 x 2 and 14 x 2.
  const std::vector<uint32_t> far_last = {0, 1, 2, 3, 4, 5, 6, 16390};
  EXPECT_TRUE(SparseAtLeastDense(far_last, 13, 2));
  EXPECT_FALSE(SparseAtLeastDense(far_last, 14, 2));
}

}  // namespace
}  // namespace pstrain
