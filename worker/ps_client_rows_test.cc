// PsClient's row-sparse tables over real gRPC shards (issue 41): a sync job
// whose workers push only the rows they touched and pull only the rows the
// next step reads ends, under SGD without momentum, with the same table as
// the job that pushes and pulls everything dense (bit for bit), with far
// fewer bytes; rows not asked for stay as the worker had them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/local_shards.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

// A table of 64 rows of 4 and a dense tensor of 3, in 64-byte chunks (4
// rows each) over 2 shards; 2 sync workers, SGD lr 0.1.
constexpr int64_t kRows = 64, kD = 4;
constexpr int kWorkers = 2, kSteps = 4;

struct JobResult {
  std::vector<std::vector<float>> weights;  // worker 0's, after the last pull
  int64_t bytes = 0;  // pushed and pulled by worker 0 but in the last step
};

// Rows of step `step` for worker `w`: a fixed pseudo-random set.
std::vector<uint32_t> RowsOf(int step, int w) {
  std::mt19937 rng(100 * step + w);
  std::vector<uint32_t> rows;
  for (uint32_t r = 0; r < kRows; ++r) {
    if (rng() % 8 == 0) rows.push_back(r);
  }
  return rows;
}

std::vector<absl::Span<float>> Spans(std::vector<float>& a,
                                     std::vector<float>& b) {
  return {absl::MakeSpan(a), absl::MakeSpan(b)};
}

JobResult RunJob(bool by_rows) {
  ShardOptions options;
  options.job_id = "job";
  options.num_workers = kWorkers;
  options.mode = SyncMode::kSync;
  options.adam.kind = OptimizerKind::kSgd;
  options.adam.lr = 0.1f;
  LocalShards shards(2, options);
  absl::StatusOr<PartitionPlan> plan = PartitionPlan::Create(
      {kRows * kD, 3}, 64, 2, 0,
      by_rows ? std::vector<int64_t>{kD, 0} : std::vector<int64_t>{});
  EXPECT_TRUE(plan.ok());
  std::vector<float> table0(kRows * kD), dense0 = {1, 2, 3};
  for (int64_t i = 0; i < kRows * kD; ++i) table0[i] = 0.01f * i - 1.0f;
  JobResult result;
  // No client goes away before every worker's last pull returned: its
  // streams end cancelled, and a member's ended stream breaks the shards'
  // barrier, which failed the other worker's last pull (ABORTED) when it
  // came later (CI, 2026-11-28).
  absl::Mutex mu;
  int finished = 0;  // workers past their last pull (or failed)
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      PsClientOptions client_options;
      client_options.addresses = shards.addresses();
      client_options.job_id = "job";
      client_options.worker_id = w;
      absl::StatusOr<std::unique_ptr<PsClient>> client =
          PsClient::Create(client_options, *plan);
      absl::Cleanup together = [&mu, &finished] {
        absl::MutexLock lock(&mu);
        ++finished;
        mu.Await(absl::Condition(
            +[](int* n) { return *n == kWorkers; }, &finished));
      };
      ASSERT_TRUE(client.ok()) << client.status();
      if (w == 0) {
        ASSERT_TRUE((*client)->Initialize({table0, dense0}).ok());
      }
      ASSERT_TRUE((*client)->WaitReady(absl::Seconds(10)).ok());
      std::vector<float> table(kRows * kD, 0.0f), dense(3, 0.0f);
      ASSERT_TRUE((*client)->PushPull(0, {}, 0, 0, Spans(table, dense)).ok());
      int64_t bytes = 0;
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<uint32_t> touched = RowsOf(step, w);
        // The last step asks for every row, to compare whole tables.
        std::vector<uint32_t> next = RowsOf(step + 1, w);
        if (step == kSteps - 1) {
          next.clear();
          for (uint32_t r = 0; r < kRows; ++r) next.push_back(r);
        }
        std::vector<float> grad(kRows * kD, 0.0f);
        for (uint32_t r : touched) {
          for (int64_t j = 0; j < kD; ++j) {
            grad[r * kD + j] = std::sin(0.1f * (r * kD + j) + step + w);
          }
        }
        const std::vector<float> dense_grad = {0.5f, -0.5f, 0.25f * w};
        if (by_rows) (*client)->SetStepRows({touched, {}}, {next, {}});
        const std::vector<float> before = table;
        const absl::StatusOr<int64_t> pulled = (*client)->PushPull(
            step, {grad, dense_grad}, step + 1, 1, Spans(table, dense));
        ASSERT_TRUE(pulled.ok())
            << "worker " << w << ", step " << step << ": " << pulled.status();
        if (step < kSteps - 1) {  // the last pulls every row
          bytes += (*client)->last_step_times().bytes_pushed +
                   (*client)->last_step_times().bytes_pulled;
        }
        if (by_rows && step < kSteps - 1) {
          // Rows not asked for keep what the worker had.
          for (uint32_t r = 0; r < kRows; ++r) {
            if (std::binary_search(next.begin(), next.end(), r)) continue;
            EXPECT_EQ(0, std::memcmp(&table[r * kD], &before[r * kD],
                                     kD * sizeof(float)))
                << "row " << r;
          }
        }
      }
      if (w == 0) {
        result.weights = {table, dense};
        result.bytes = bytes;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  return result;
}

TEST(PsClientRowsTest, RowPushesAndPullsEqualTheDenseJobUnderSgd) {
  const JobResult rows = RunJob(true);
  const JobResult dense = RunJob(false);
  ASSERT_EQ(rows.weights.size(), 2u);
  ASSERT_EQ(dense.weights.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(rows.weights[t].size(), dense.weights[t].size());
    EXPECT_EQ(0, std::memcmp(rows.weights[t].data(), dense.weights[t].data(),
                             rows.weights[t].size() * sizeof(float)))
        << "tensor " << t;
  }
  // The table moved, and the row job sent well under half the bytes.
  EXPECT_NE(rows.weights[0][0] + rows.weights[0][100], -1.0f + 0.0f);
  EXPECT_LT(rows.bytes * 2, dense.bytes) << rows.bytes << " vs " << dense.bytes;
}

}  // namespace
}  // namespace pstrain
