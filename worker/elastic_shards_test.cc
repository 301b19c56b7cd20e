// Elastic shards (issue 40; GradientExchange::ChangeShards): worker 0 moves
// a sync job's state in memory onto another number of shards at a step
// boundary, and the job goes on there. The acceptance's deterministic
// case: a job resized from 2 shards to 3 at step N ends with weights bit
// for bit those of a job that ran on 3 shards from a checkpoint of step N
// (and those of a job that never changed: the layout is not arithmetic).
// Gradients depend on the weights (a quadratic's, per worker), so every
// piece of state that moves (weights, Adam's m and v, versions, the
// BatchNorm-like buffer) shows in the final weights.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/partition.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "server/shard_checkpoint.h"
#include "worker/gradient_exchange.h"
#include "worker/topk_compression.h"

namespace pstrain {
namespace {

constexpr int kWorkers = 2;
// Three parameters and one buffer (the last tensor), cut into chunks of
// 64 elements so that 2 and 3 shards own different chunks.
const std::vector<int64_t> kSizes = {700, 300, 1000, 50};
constexpr int kBuffers = 1;
constexpr int64_t kPartitionBytes = 64 * sizeof(float);

// `count` sync shards behind their own gRPC servers; shards from
// `initial` on start outside the job's first layout (an elastic job's idle
// shard tasks), with every shard's checkpoint folder under `dir`.
class ShardPool {
 public:
  ShardPool(int count, int initial, const std::string& dir,
            OptimizerKind optimizer = OptimizerKind::kAdam) {
    for (int s = 0; s < count; ++s) {
      ShardOptions options;
      options.adam.kind = optimizer;
      options.job_id = "job";
      options.shard_index = s;
      options.num_shards = initial;
      options.num_workers = kWorkers;
      options.mode = SyncMode::kSync;
      options.checkpoint_dir = dir;
      shards_.push_back(std::make_unique<ParameterShard>(options));
      services_.push_back(
          std::make_unique<PsService>(shards_.back().get(), absl::Seconds(10)));
      absl::StatusOr<ListeningServer> listening =
          StartGrpcServer("127.0.0.1:0", services_.back().get(), "");
      EXPECT_TRUE(listening.ok()) << listening.status();
      addresses_.push_back("127.0.0.1:" + std::to_string(listening->port));
      servers_.push_back(std::move(listening->server));
    }
  }
  ~ShardPool() {
    for (auto& server : servers_) server->Shutdown();
  }
  // Shards [first, first + n).
  std::vector<std::string> Addresses(int first, int n) const {
    return {addresses_.begin() + first, addresses_.begin() + first + n};
  }
  const ParameterShard& shard(int s) const { return *shards_[s]; }
  // Payload bytes every shard sent in pulls.
  int64_t bytes_sent() const {
    int64_t sum = 0;
    for (const auto& service : services_) sum += service->counters().bytes_sent;
    return sum;
  }

 private:
  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<std::unique_ptr<PsService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

struct JobRun {
  std::vector<std::string> addresses;  // the shards at the start
  int64_t from_step = 0, to_step = 0;
  const ModelState* resume = nullptr;  // worker 0's, at from_step
  // Worker 0 changes the shards to `after` before step `change_at` (-1:
  // never); the other worker recovers onto them.
  int64_t change_at = -1;
  std::vector<std::string> after;
  // Worker 0 checkpoints step to_step at the end (-1: no).
  bool checkpoint_at_end = false;
  // Worker 0 applies a new membership (the same two workers, as a
  // membership change reopens the shards) before step `reopen_at` (-1:
  // never).
  int64_t reopen_at = -1;
  // Top-k pushes (Exchange()); 0: dense.
  double topk_ratio = 0;
  // PsClientOptions::delta_pulls and wire_dtype.
  bool delta_pulls = false;
  DType wire_dtype = DTYPE_FLOAT32;
  std::string checkpoint_dir;
};

// Worker `worker`'s exchange of `run` with the shards at `addresses`.
// run.topk_ratio > 0: top-k pushes with error feedback, each worker's
// residuals saved with checkpoints under run.checkpoint_dir (what a job
// with checkpoints runs; no checkpoint is taken here).
std::unique_ptr<GradientExchange> Exchange(
    const std::vector<std::string>& addresses, int worker, const JobRun& run) {
  const double topk_ratio = run.topk_ratio;
  const std::string& checkpoint_dir = run.checkpoint_dir;
  PsClientOptions options;
  options.delta_pulls = run.delta_pulls;
  options.wire_dtype = run.wire_dtype;
  options.addresses = addresses;
  options.job_id = "job";
  options.worker_id = worker;
  options.rpc_timeout = absl::Seconds(10);
  ExchangeCompression compression;
  if (topk_ratio > 0) {
    CompressionOptions topk;
    topk.topk_ratio = topk_ratio;
    compression.compressor = std::make_unique<TopKCompressor>(
        topk, std::vector<int64_t>(kSizes.begin(), kSizes.end() - kBuffers), 3);
    compression.step_dir = [checkpoint_dir](int64_t step) {
      return absl::StrCat(checkpoint_dir, "/step-", step);
    };
    compression.worker_id = worker;
    compression.num_workers = kWorkers;
    for (size_t t = 0; t + kBuffers < kSizes.size(); ++t) {
      compression.names.push_back(absl::StrCat("p", t));
    }
    options.compressor = compression.compressor.get();
  }
  absl::StatusOr<PartitionPlan> plan = PartitionPlan::Create(
      kSizes, kPartitionBytes, static_cast<int>(addresses.size()), kBuffers);
  EXPECT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Create(options, *plan);
  EXPECT_TRUE(client.ok()) << client.status();
  return CreatePsExchange(*std::move(client), /*sync=*/true,
                          /*chief=*/worker == 0, absl::Seconds(10),
                          /*staleness=*/0, /*backup_workers=*/false,
                          std::move(compression));
}

// Worker `rank`'s gradient at `step`: of 0.5 * (w - target)^2, target
// depending on the rank, the tensor and the element, plus a step term; the
// buffer's "gradient" is the worker's running value, averaged by the shards.
void Gradients(int rank, int64_t step, const std::vector<std::vector<float>>& w,
               std::vector<std::vector<float>>* g) {
  for (size_t t = 0; t < kSizes.size(); ++t) {
    for (int64_t i = 0; i < kSizes[t]; ++i) {
      const float target = 0.01f * static_cast<float>((i * 7 + t * 3) % 50) -
                           0.2f * static_cast<float>(rank);
      (*g)[t][i] = t + 1 == kSizes.size()
                       ? 0.9f * w[t][i] + 0.1f * target
                       : w[t][i] - target + 0.001f * static_cast<float>(step);
    }
  }
}

// Every worker's weights after `run`.
std::vector<std::vector<std::vector<float>>> Train(const JobRun& run) {
  std::vector<std::vector<std::vector<float>>> results(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GradientExchange> exchange =
          Exchange(run.addresses, r, run);
      std::vector<std::vector<float>> w, g;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        w.emplace_back(kSizes[t], 0.05f * static_cast<float>(t + 1));
        g.emplace_back(kSizes[t], 0.0f);
      }
      if (run.resume != nullptr) w = run.resume->weights;
      std::vector<absl::Span<float>> weights(w.begin(), w.end());
      std::vector<absl::Span<const float>> gradients(g.begin(), g.end());
      ASSERT_TRUE(exchange->Start(weights, r == 0 ? run.resume : nullptr).ok());
      int64_t step = run.from_step;
      // Worker 0's changes keep both workers, from the version settled.
      int64_t epoch = 0;
      const auto both_workers = [&epoch](int64_t v) {
        WorkerMembership m;
        m.workers = {0, 1};
        m.epoch = epoch;
        m.from_step = v;
        return m;
      };
      while (step < run.to_step) {
        if (r == 0 && step == run.change_at) {
          ++epoch;
          absl::StatusOr<int64_t> version = exchange->ChangeShards(
              run.after, both_workers, absl::Seconds(10));
          ASSERT_TRUE(version.ok()) << version.status();
          ASSERT_EQ(*version, step);
        }
        if (r == 0 && step == run.reopen_at) {
          ++epoch;
          absl::StatusOr<int64_t> version =
              exchange->ChangeMembership(both_workers, absl::Seconds(10));
          ASSERT_TRUE(version.ok()) << version.status();
          ASSERT_EQ(*version, step);
        }
        Gradients(r, step, w, &g);
        const absl::Status s = exchange->Step(gradients, 8);
        if (!s.ok()) {
          // Worker 0 closed the old layout under this step.
          ASSERT_NE(r, 0) << s;
          ASSERT_TRUE(absl::IsAborted(s)) << s;
          // The move aborts step change_at, or the pull of the one before
          // it (worker 0 may be that pull ahead).
          absl::StatusOr<int64_t> version = exchange->Recover(
              run.change_at >= 0 && step + 1 >= run.change_at ? run.after
                                                              : run.addresses,
              nullptr, absl::Seconds(10));
          ASSERT_TRUE(version.ok()) << version.status();
          step = *version;
          continue;
        }
        ++step;
      }
      if (r == 0 && run.checkpoint_at_end) {
        ASSERT_TRUE(exchange
                        ->Checkpoint(step, /*end_step=*/0, /*latest_step=*/-1,
                                     "",
                                     /*wait=*/false)
                        .ok());
        ASSERT_TRUE(exchange
                        ->Checkpoint(step, /*end_step=*/0, /*latest_step=*/-1,
                                     "",
                                     /*wait=*/true)
                        .ok());
      }
      results[r] = w;
      ASSERT_TRUE(exchange->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

ModelState ReadCheckpoint(const std::string& dir, int64_t step, int shards) {
  std::vector<std::pair<std::string, std::vector<ChunkSnapshot>>> files;
  for (int s = 0; s < shards; ++s) {
    const std::string path =
        absl::StrCat(dir, "/step-", step, "/shard-", s, ".safetensors");
    absl::StatusOr<std::vector<ChunkSnapshot>> chunks =
        ReadShardCheckpoint(path);
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    files.emplace_back(path, *std::move(chunks));
  }
  absl::StatusOr<ModelState> state = Assemble(kSizes, files);
  EXPECT_TRUE(state.ok()) << state.status();
  return *std::move(state);
}

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

constexpr int64_t kChangeAt = 7;
constexpr int64_t kSteps = 15;

TEST(ElasticShardsTest, GrowTwoToThreeEqualsThreeShardsFromACheckpoint) {
  // The job that grows: shards 0 and 1, then 0, 1 and 2 from step 7.
  ShardPool pool(3, 2, TempDir("grow"));
  JobRun grow;
  grow.addresses = pool.Addresses(0, 2);
  grow.to_step = kSteps;
  grow.change_at = kChangeAt;
  grow.after = pool.Addresses(0, 3);
  const auto grown = Train(grow);
  EXPECT_EQ(pool.shard(2).plan().num_shards(), 3);

  // 2 shards to step 7 and a checkpoint, then 3 fresh shards from it.
  const std::string dir = TempDir("grow_reference");
  ShardPool two(2, 2, dir);
  JobRun first;
  first.addresses = two.Addresses(0, 2);
  first.to_step = kChangeAt;
  first.checkpoint_at_end = true;
  Train(first);
  const ModelState state = ReadCheckpoint(dir, kChangeAt, 2);
  ShardPool three(3, 3, TempDir("grow_three"));
  JobRun second;
  second.addresses = three.Addresses(0, 3);
  second.from_step = kChangeAt;
  second.to_step = kSteps;
  second.resume = &state;
  const auto resumed = Train(second);

  // And a job that stayed on 2 shards.
  ShardPool unchanged(2, 2, TempDir("grow_unchanged"));
  JobRun stay;
  stay.addresses = unchanged.Addresses(0, 2);
  stay.to_step = kSteps;
  const auto stayed = Train(stay);

  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(grown[r], resumed[r]) << "worker " << r;
    EXPECT_EQ(grown[r], stayed[r]) << "worker " << r;
  }
  EXPECT_EQ(grown[0], grown[1]);
  // Training moved the weights (the comparison is not of initial values).
  EXPECT_NE(grown[0][0][0], 0.05f);
}

TEST(ElasticShardsTest, ShrinkThreeToTwoEqualsAJobThatNeverChanged) {
  ShardPool pool(3, 3, TempDir("shrink"));
  JobRun shrink;
  shrink.addresses = pool.Addresses(0, 3);
  shrink.to_step = kSteps;
  shrink.change_at = kChangeAt;
  shrink.after = pool.Addresses(0, 2);
  const auto shrunk = Train(shrink);
  // Shard 2 left the layout closed, holding the state of step 7.
  EXPECT_TRUE(pool.shard(2).closed());
  EXPECT_EQ(pool.shard(0).plan().num_shards(), 2);

  ShardPool unchanged(3, 3, TempDir("shrink_unchanged"));
  JobRun stay;
  stay.addresses = unchanged.Addresses(0, 3);
  stay.to_step = kSteps;
  const auto stayed = Train(stay);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(shrunk[r], stayed[r]) << "worker " << r;
  }
}

// Top-k pushes with error feedback, the job saving residuals with its
// checkpoints: the residuals are the workers' and stay with them across
// the move (worker 1, whose step 7 the move aborted, keeps its residual
// of the start of step 7 rather than a checkpoint's, which does not
// exist), so a job grown from 2 shards to 3, or shrunk from 3 to 2, ends
// bit for bit where a job that never changed does. (A worker that went on
// with zeros would not: the residuals of steps 0 to 6 would be lost.)
TEST(ElasticShardsTest, TopKResidualsStayWithTheirWorkersAcrossAMove) {
  for (const auto& [from, to] : {std::pair{2, 3}, std::pair{3, 2}}) {
    SCOPED_TRACE(absl::StrCat(from, " -> ", to, " shards"));
    const std::string dir = TempDir(absl::StrCat("topk_", from, "_", to));
    ShardPool pool(3, from, dir);
    JobRun change;
    change.addresses = pool.Addresses(0, from);
    change.to_step = kSteps;
    change.change_at = kChangeAt;
    change.after = pool.Addresses(0, to);
    change.topk_ratio = 0.1;
    change.checkpoint_dir = dir;
    const auto changed = Train(change);

    const std::string other = TempDir(absl::StrCat("topk_stay_", from));
    ShardPool unchanged(from, from, other);
    JobRun stay = change;
    stay.addresses = unchanged.Addresses(0, from);
    stay.change_at = -1;
    stay.checkpoint_dir = other;
    const auto stayed = Train(stay);
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(changed[r], stayed[r]) << "worker " << r;
    }
    EXPECT_NE(changed[0][0][0], 0.05f);
  }
}

// The same for a membership change (GradientExchange::ChangeMembership:
// the shards reopen in place at a new generation): residuals stay.
TEST(ElasticShardsTest, TopKResidualsStayWithTheirWorkersAcrossAReopen) {
  const std::string dir = TempDir("topk_reopen");
  ShardPool pool(2, 2, dir);
  JobRun reopen;
  reopen.addresses = pool.Addresses(0, 2);
  reopen.to_step = kSteps;
  reopen.reopen_at = kChangeAt;
  reopen.topk_ratio = 0.1;
  reopen.checkpoint_dir = dir;
  const auto reopened = Train(reopen);
  EXPECT_EQ(pool.shard(0).generation(), 1);

  const std::string other = TempDir("topk_reopen_stay");
  ShardPool unchanged(2, 2, other);
  JobRun stay = reopen;
  stay.addresses = unchanged.Addresses(0, 2);
  stay.reopen_at = -1;
  stay.checkpoint_dir = other;
  const auto stayed = Train(stay);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(reopened[r], stayed[r]) << "worker " << r;
  }
}

// Delta pulls (PsClientOptions::delta_pulls; issue 39): top-k pushes of
// 5% under plain SGD change at most 2 x 3 entries of each 64-element chunk
// a step, so every pull after the first sends those entries only. Across
// a reopen (step 4) and a move from 2 shards to 3 (step 7), each of which
// pulls whole again, the weights equal the dense-pull job's bit for bit,
// for fewer bytes pulled; over fp32 and bf16 wires (a delta's unchanged
// entries keep the bf16 rounding the worker holds).
TEST(ElasticShardsTest, DeltaPullsEqualWholePullsForFewerBytes) {
  for (DType wire : {DTYPE_FLOAT32, DTYPE_BFLOAT16}) {
    SCOPED_TRACE(WireDtypeSpelling(wire));
    JobRun run;
    run.to_step = kSteps;
    run.topk_ratio = 0.05;
    run.reopen_at = 4;
    run.change_at = kChangeAt;
    run.wire_dtype = wire;
    const std::string dense_dir = TempDir("delta_dense");
    ShardPool dense_pool(3, 2, dense_dir, OptimizerKind::kSgd);
    run.addresses = dense_pool.Addresses(0, 2);
    run.after = dense_pool.Addresses(0, 3);
    run.checkpoint_dir = dense_dir;
    const auto dense = Train(run);

    const std::string delta_dir = TempDir("delta");
    ShardPool delta_pool(3, 2, delta_dir, OptimizerKind::kSgd);
    run.addresses = delta_pool.Addresses(0, 2);
    run.after = delta_pool.Addresses(0, 3);
    run.checkpoint_dir = delta_dir;
    run.delta_pulls = true;
    const auto delta = Train(run);

    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(delta[r], dense[r]) << "worker " << r;
    }
    EXPECT_NE(delta[0][0][0], 0.05f);
    // 15 steps' pulls: 3 whole (start, reopen, move) and 12 deltas of the
    // parameters (4 + 4 or 2 bytes an entry, at most 6 of 64 entries a
    // chunk); the buffer always whole.
    EXPECT_LT(delta_pool.bytes_sent(), dense_pool.bytes_sent() / 2)
        << "dense " << dense_pool.bytes_sent();
  }
}

}  // namespace
}  // namespace pstrain
