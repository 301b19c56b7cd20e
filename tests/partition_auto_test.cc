// --partition_bytes=auto (worker/partition_tuner.h): a sync PS job whose
// partition worker 0 chose by timing ends with the same weights, bit for
// bit, as the job run with the chosen size fixed; the trials' updates
// leave no trace. Top-k compression selects per chunk, so a job at another
// size ends elsewhere: the comparison sees the partition. Real shards
// behind gRPC on loopback, the workers as threads of this process, the
// synthetic workload (2 MiB of fixed gradients in 1 MiB tensors:
// candidates 256 KiB and 1 MiB).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/local_shards.h"
#include "worker/partition_tuner.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

constexpr int kWorkers = 2;

struct JobRun {
  std::vector<std::vector<float>> weights;
  RunResult result;
  std::vector<std::string> lines;
};

// `partition_bytes` 0: auto.
JobRun Train(int64_t partition_bytes, int shards = 2) {
  ShardOptions shard_options;
  shard_options.num_workers = kWorkers;
  LocalShards local(shards, shard_options);
  std::vector<absl::StatusOr<TrainerOutput>> outputs(kWorkers);
  absl::Mutex lines_mu;
  JobRun run;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      TrainerOptions options;
      options.worker_id = w;
      options.num_workers = kWorkers;
      options.ps_addresses = local.addresses();
      options.compute = COMPUTE_SYNTHETIC;
      options.model_bytes = 2 << 20;
      options.max_steps_per_epoch = 3;
      options.epochs = 2;
      options.batch_size = 4;
      options.evaluate = false;
      options.partition_bytes_auto = partition_bytes == 0;
      if (partition_bytes > 0) options.partition_bytes = partition_bytes;
      options.compression.topk_ratio = 0.05;
      options.log_line = [&](const std::string& line) {
        absl::MutexLock lock(&lines_mu);
        run.lines.push_back(line);
      };
      outputs[w] = RunWorker(options, Dataset());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(outputs[w].ok()) << outputs[w].status();
    if (!outputs[w].ok()) return run;
  }
  // Every worker ends with the same weights.
  EXPECT_EQ(outputs[1]->final_weights, outputs[0]->final_weights);
  run.weights = outputs[0]->final_weights;
  run.result = outputs[0]->result;
  return run;
}

TEST(PartitionCandidatesTest, CappedByTheLargestTensor) {
  // 192 KB: 256 KiB cuts nothing already.
  EXPECT_EQ(PartitionCandidates({48000, 120}),
            std::vector<int64_t>({256 << 10}));
  // 1 MiB tensors: 256 KiB cuts them, 1 MiB is the first that does not.
  EXPECT_EQ(PartitionCandidates({1 << 18, 1 << 18}),
            std::vector<int64_t>({256 << 10, 1 << 20}));
  EXPECT_EQ(PartitionCandidates({25 << 20}),
            std::vector<int64_t>({256 << 10, 1 << 20, 4 << 20, 16 << 20}));
}

TEST(PartitionCandidatesTest, DescribesTheChoice) {
  PartitionChoice choice;
  choice.partition_bytes = 1 << 20;
  choice.trials = {{256 << 10, 1.5}, {1 << 20, 1.25}};
  EXPECT_EQ(DescribePartitionChoice(choice),
            "partition_bytes auto: tried 256 KiB (1.50 ms/step), 1 MiB "
            "(1.25 ms/step); chose 1 MiB");
  EXPECT_EQ(FormatPartitionBytes(1000), "1000 B");
}

TEST(PartitionAutoTest, EqualsTheChosenSizeFixedBitForBit) {
  const JobRun tuned = Train(0);
  ASSERT_FALSE(tuned.weights.empty());
  const int64_t chosen = tuned.result.partition_bytes();
  ASSERT_TRUE(chosen == (256 << 10) || chosen == (1 << 20)) << chosen;
  ASSERT_EQ(tuned.result.partition_trials_size(), 2);
  EXPECT_EQ(tuned.result.partition_trials(0).partition_bytes(), 256 << 10);
  EXPECT_EQ(tuned.result.partition_trials(1).partition_bytes(), 1 << 20);
  int printed = 0;
  for (const std::string& line : tuned.lines) {
    if (absl::StartsWith(line, "partition_bytes auto: tried 256 KiB (")) {
      ++printed;
      EXPECT_TRUE(absl::EndsWith(
          line, absl::StrCat("; chose ", FormatPartitionBytes(chosen))))
          << line;
    }
  }
  EXPECT_EQ(printed, 1);

  const JobRun fixed = Train(chosen);
  ASSERT_FALSE(fixed.weights.empty());
  EXPECT_EQ(fixed.result.partition_bytes(), chosen);
  EXPECT_EQ(fixed.result.partition_trials_size(), 0);
  EXPECT_EQ(tuned.weights, fixed.weights);

  // The partition matters to top-k: the other size ends elsewhere.
  const JobRun other = Train(chosen == (1 << 20) ? 256 << 10 : 1 << 20);
  ASSERT_FALSE(other.weights.empty());
  EXPECT_NE(other.weights, fixed.weights);
}

// One shard: every chunk re-laid out on the same shard.
TEST(PartitionAutoTest, OneShard) {
  const JobRun tuned = Train(0, 1);
  ASSERT_FALSE(tuned.weights.empty());
  const JobRun fixed = Train(tuned.result.partition_bytes(), 1);
  EXPECT_EQ(tuned.weights, fixed.weights);
}

}  // namespace
}  // namespace pstrain
