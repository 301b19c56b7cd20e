// The sync-mode invariant (DESIGN.md): for a model without BatchNorm, W
// workers of batch b over the same samples reach the same weights as one
// worker of batch W*b, to float rounding. Runs real shards behind real gRPC
// servers on loopback, with the workers as threads of this process.
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/local_shards.h"
#include "tests/quadrant_dataset.h"
#include "worker/collective.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

Dataset MakeDataset(int64_t count) {
  return testing::MakeQuadrantDataset(count, 256, 42);
}

// `mode` MODE_SYNC (two shards) or MODE_ALLREDUCE (Gloo, no shards);
// `optimizer` (Adam by default) with gradient clipping by global norm at
// `clip` (0: none).
std::vector<std::vector<float>> Train(
    const Dataset& data, const std::string& model, int workers, int batch_size,
    int steps, Mode mode = MODE_SYNC,
    const OptimizerOptions& optimizer = OptimizerOptions(), double clip = 0) {
  ShardOptions shard_options;
  shard_options.num_workers = workers;
  shard_options.adam = optimizer;
  shard_options.clip_grad_norm = clip;
  LocalShards shards(2, shard_options);
  InProcessStore store;
  std::vector<absl::StatusOr<TrainerOutput>> outputs(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<Collective> collective;
      if (mode == MODE_ALLREDUCE) {
        absl::StatusOr<std::unique_ptr<Collective>> c = Collective::CreateGloo(
            w, workers, "127.0.0.1", &store, "eq", absl::Seconds(60));
        if (!c.ok()) {
          outputs[w] = c.status();
          return;
        }
        collective = *std::move(c);
      }
      TrainerOptions options;
      options.mode = mode;
      options.adam = optimizer;
      options.clip_grad_norm = clip;
      options.collective = collective.get();
      // Several buckets per step (the shards' Adam is the default one too).
      options.bucket_bytes = 64 << 10;
      options.worker_id = w;
      options.num_workers = workers;
      options.ps_addresses = shards.addresses();
      options.model = model;
      options.batch_size = batch_size;
      options.epochs = 1;
      options.max_steps_per_epoch = steps;
      options.evaluate = false;
      options.verbose = false;
      // Small chunks so tensors span several chunks and both shards.
      options.partition_bytes = 16 << 10;
      outputs[w] = RunWorker(options, data);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < workers; ++w) {
    EXPECT_TRUE(outputs[w].ok()) << outputs[w].status();
    if (!outputs[w].ok()) return {};
    EXPECT_EQ(outputs[w]->result.steps(), steps);
  }
  // Every worker ends with the same pulled weights.
  for (int w = 1; w < workers; ++w) {
    EXPECT_EQ(outputs[w]->final_weights, outputs[0]->final_weights);
  }
  return outputs[0]->final_weights;
}

double RelativeDifference(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (size_t p = 0; p < a.size(); ++p) {
    for (size_t i = 0; i < a[p].size(); ++i) {
      diff += std::pow(double{a[p][i]} - b[p][i], 2);
      norm += std::pow(double{a[p][i]}, 2);
    }
  }
  return std::sqrt(diff / norm);
}

class SyncEquivalenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SyncEquivalenceTest, TwoWorkersOfBatch32EqualOneWorkerOfBatch64) {
  const Dataset data = MakeDataset(64 * 50);
  const auto one = Train(data, GetParam(), 1, 64, 50);
  const auto two = Train(data, GetParam(), 2, 32, 50);
  ASSERT_FALSE(one.empty());
  ASSERT_EQ(one.size(), two.size());
  const double relative = RelativeDifference(one, two);
  std::printf("%s: relative difference of weights after 50 steps: %.3g\n",
              GetParam(), relative);
  EXPECT_LT(relative, 1e-5) << GetParam();
  // The weights did move: 50 Adam steps of lr 1e-3 from the initial model.
  const Dataset same = data;
  const auto zero_steps_apart =
      RelativeDifference(one, Train(same, GetParam(), 1, 64, 1));
  EXPECT_GT(zero_steps_apart, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Models, SyncEquivalenceTest,
                         ::testing::Values("mlp", "lenet5"));

// Allreduce mode trains the same model as sync PS mode: the same 30 steps
// of mlp (no BatchNorm) on 2 and 3 workers reach the same weights.
TEST(AllreduceEquivalence, AllreduceEqualsSyncPsOnTheSameSteps) {
  const Dataset data = MakeDataset(96 * 30);
  for (int workers : {2, 3}) {
    const auto ps = Train(data, "mlp", workers, 32, 30, MODE_SYNC);
    const auto allreduce = Train(data, "mlp", workers, 32, 30, MODE_ALLREDUCE);
    ASSERT_FALSE(ps.empty());
    ASSERT_EQ(ps.size(), allreduce.size());
    const double relative = RelativeDifference(ps, allreduce);
    std::printf(
        "mlp, %d workers: relative difference sync PS vs allreduce "
        "after 30 steps: %.3g\n",
        workers, relative);
    EXPECT_LT(relative, 1e-5) << workers << " workers";
    EXPECT_GT(RelativeDifference(
                  ps, Train(data, "mlp", workers, 32, 1, MODE_ALLREDUCE)),
              1e-3);
  }
}

// Gradient clipping by global norm (issue 25) on the PS, where the shards
// agree on each step's norm through the workers, trains the same model as
// in allreduce, where each worker has every gradient: LeNet-5 (its tensors
// span both shards) with SGD and momentum, clipped at 0.5, for 20 steps.
TEST(AllreduceEquivalence, ClippingOnThePsEqualsClippingInAllreduce) {
  const Dataset data = MakeDataset(64 * 20);
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 0.05f;
  sgd.momentum = 0.9f;
  const auto ps = Train(data, "lenet5", 2, 32, 20, MODE_SYNC, sgd, 0.5);
  const auto allreduce =
      Train(data, "lenet5", 2, 32, 20, MODE_ALLREDUCE, sgd, 0.5);
  const auto unclipped = Train(data, "lenet5", 2, 32, 20, MODE_SYNC, sgd, 0);
  ASSERT_FALSE(ps.empty());
  ASSERT_EQ(ps.size(), allreduce.size());
  const double relative = RelativeDifference(ps, allreduce);
  const double clipping = RelativeDifference(ps, unclipped);
  std::printf(
      "lenet5, 2 workers, clip 0.5: relative difference sync PS vs "
      "allreduce after 20 steps: %.3g (clipped vs unclipped: %.3g)\n",
      relative, clipping);
  EXPECT_LT(relative, 1e-5);
  EXPECT_GT(clipping, 1e-3) << "the clipping did not act";
}

// ResNet-18's 20 BatchNorm layers end to end: their running statistics
// travel to the PS as buffers and come back (averaged; the arithmetic is in
// server/parameter_shard_test), so both workers end with identical buffers
// (Train checks every PS tensor is equal), moved from their initial 0
// (mean) and 1 (variance).
TEST(BatchNormOnPs, WorkersEndWithTheSameAveragedRunningStatistics) {
  const Dataset data = MakeDataset(64);
  const auto weights = Train(data, "resnet18", 2, 4, 2);
  ASSERT_GE(weights.size(), 40u);
  const size_t first_buffer = weights.size() - 40;
  double mean_moved = 0, var_moved = 0;
  for (size_t b = first_buffer; b < weights.size(); ++b) {
    const bool is_var = (b - first_buffer) % 2 == 1;
    for (float v : weights[b]) {
      (is_var ? var_moved : mean_moved) += std::fabs(v - (is_var ? 1.0 : 0.0));
    }
  }
  EXPECT_GT(mean_moved, 1e-3);
  EXPECT_GT(var_moved, 1e-3);
}

}  // namespace
}  // namespace pstrain
