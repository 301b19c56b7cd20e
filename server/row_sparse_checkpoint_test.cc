// A row-sparse table through a checkpoint (issue 41): shard files written
// and read as any job's (server/shard_checkpoint.h), reassembled per
// tensor, and resumed on another number of shards and another partition;
// the resumed job goes on exactly as the one that was never stopped (the
// lazy Adam state of touched and untouched rows included).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/parameter_shard.h"
#include "server/shard_checkpoint.h"

namespace pstrain {
namespace {

// A table of 40 rows of 3 and a dense tensor of 5; one sync worker, Adam.
constexpr int64_t kD = 3, kRows = 40;
const std::vector<int64_t> kSizes = {kRows * kD, 5};
const std::vector<int64_t> kRowLayout = {kD, 0};

// `num_shards` shards of one job, cut at `partition_bytes`.
class Job {
 public:
  Job(int num_shards, int64_t partition_bytes)
      : plan_(*PartitionPlan::Create(kSizes, partition_bytes, num_shards, 0,
                                     kRowLayout)),
        partition_bytes_(partition_bytes) {
    for (int s = 0; s < num_shards; ++s) {
      ShardOptions options;
      options.job_id = "job";
      options.num_workers = 1;
      options.num_shards = num_shards;
      options.shard_index = s;
      options.mode = SyncMode::kSync;
      options.adam.lr = 0.05f;
      shards_.push_back(std::make_unique<ParameterShard>(options));
      shards_.back()->SetRowSparseLayout(kRowLayout);
    }
  }

  // Initialises every shard from whole tensors (and their Adam state and
  // version, if given).
  void Init(const std::vector<std::vector<float>>& weights,
            const ModelState* state = nullptr) {
    for (size_t s = 0; s < shards_.size(); ++s) {
      std::vector<InitChunk> chunks;
      for (const ChunkSpec& c : plan_.ChunksOfShard(static_cast<int>(s))) {
        InitChunk chunk;
        chunk.param_id = c.param_id;
        chunk.chunk_index = c.chunk_index;
        auto cut = [&](const std::vector<float>& t) {
          return std::vector<float>(t.begin() + c.offset,
                                    t.begin() + c.offset + c.num_elements);
        };
        chunk.values = cut(weights[c.param_id]);
        if (state != nullptr) {
          chunk.m = cut(state->m[c.param_id]);
          chunk.v = cut(state->v[c.param_id]);
          chunk.version =
              state->VersionOf(c.param_id, c.offset, c.num_elements);
        }
        chunks.push_back(std::move(chunk));
      }
      ASSERT_TRUE(shards_[s]
                      ->Initialize(kSizes, partition_bytes_, std::move(chunks))
                      .ok());
    }
  }

  // Step `step`: rows {step % 40, (7 * step) % 40, 39 - step % 5} touched.
  void Step(int64_t step) {
    std::vector<uint32_t> rows = {static_cast<uint32_t>(step % kRows),
                                  static_cast<uint32_t>(7 * step % kRows),
                                  static_cast<uint32_t>(39 - step % 5)};
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    for (const ChunkSpec& c : plan_.chunks()) {
      ParameterShard& shard = *shards_[c.shard];
      if (c.param_id == 1) {
        std::vector<float> g(5);
        for (int i = 0; i < 5; ++i) g[i] = 0.1f * (i - 2) + 0.01f * step;
        ASSERT_TRUE(shard.Push(0, 1, c.chunk_index, step, g).ok());
        continue;
      }
      RowValues local;
      const int64_t first = c.offset / kD, last = first + c.num_elements / kD;
      for (uint32_t r : rows) {
        if (r < first || r >= last) continue;
        local.rows.push_back(static_cast<uint32_t>(r - first));
        for (int j = 0; j < kD; ++j) {
          local.values.push_back(std::sin(0.3f * (r * kD + j) + step));
        }
      }
      ASSERT_TRUE(shard
                      .PushRows(0, 0, c.chunk_index, step,
                                [&](int64_t, int64_t, RowValues* out) {
                                  *out = local;
                                  return absl::OkStatus();
                                })
                      .ok());
    }
    for (auto& shard : shards_) {
      ASSERT_TRUE(shard->EndStep(0, step, nullptr).ok());
    }
  }

  // Every tensor whole, at version >= `version`.
  std::vector<std::vector<float>> Pull(int64_t version) {
    std::vector<std::vector<float>> out = {std::vector<float>(kSizes[0]),
                                           std::vector<float>(kSizes[1])};
    for (auto& shard : shards_) {
      EXPECT_TRUE(shard
                      ->Pull(version, 0, absl::Now() + absl::Seconds(5),
                             [&](const ChunkSpec& c, int64_t,
                                 absl::Span<const float> w) {
                               std::copy(w.begin(), w.end(),
                                         out[c.param_id].begin() + c.offset);
                             })
                      .ok());
    }
    return out;
  }

  // Each shard's file of checkpoint `step` under `dir`.
  std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>> Save(
      const std::string& dir, int64_t step) {
    std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>> files;
    for (size_t s = 0; s < shards_.size(); ++s) {
      absl::StatusOr<std::vector<ChunkSnapshot>> snap =
          shards_[s]->Snapshot(step);
      EXPECT_TRUE(snap.ok()) << snap.status();
      const std::string path = dir + "/shard-" + std::to_string(s);
      EXPECT_TRUE(WriteShardCheckpoint(path, *snap, static_cast<int>(s),
                                       static_cast<int>(shards_.size()), step)
                      .ok());
      absl::StatusOr<std::vector<ChunkSnapshot>> read =
          ReadShardCheckpoint(path);
      EXPECT_TRUE(read.ok()) << read.status();
      files.emplace_back(path, *std::move(read));
    }
    return files;
  }

 private:
  PartitionPlan plan_;
  int64_t partition_bytes_;
  std::vector<std::unique_ptr<ParameterShard>> shards_;
};

TEST(RowSparseCheckpointTest, ResumesExactlyOnAnotherShardCountAndPartition) {
  const std::string dir = ::testing::TempDir() + "/row_sparse_checkpoint";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::vector<float>> initial = {std::vector<float>(kSizes[0]),
                                             std::vector<float>(kSizes[1])};
  for (int64_t i = 0; i < kSizes[0]; ++i) initial[0][i] = 0.01f * i - 0.5f;
  for (int i = 0; i < 5; ++i) initial[1][i] = 0.2f * i;
  // 2 shards, chunks of 4 rows (48 bytes).
  Job original(2, 48);
  original.Init(initial);
  for (int64_t s = 0; s < 4; ++s) original.Step(s);
  absl::StatusOr<ModelState> state = Assemble(kSizes, original.Save(dir, 4));
  ASSERT_TRUE(state.ok()) << state.status();
  // Rows never touched before step 4 (e.g. row 20) kept zero moments.
  EXPECT_EQ(state->m[0][20 * kD], 0.0f);
  EXPECT_NE(state->m[0][1], 0.0f);  // row 0, touched at step 0
  // 3 shards, chunks of 7 rows (84 bytes).
  Job resumed(3, 84);
  resumed.Init(state->weights, &*state);
  for (int64_t s = 4; s < 9; ++s) {
    original.Step(s);
    resumed.Step(s);
  }
  const auto a = original.Pull(9), b = resumed.Pull(9);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(
        0, std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)))
        << "tensor " << t;
  }
  EXPECT_NE(a[0], initial[0]);
}

}  // namespace
}  // namespace pstrain
