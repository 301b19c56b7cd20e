// Early verdicts (issue 39; ParameterShard::NoteFiniteVerdict, proto/ps.proto
// StepVerdict): once every member said its step is finite, the step cannot
// be skipped, so a pull that asks for the decision hears it before the
// step's pushes and ends are in, and the chunks it then sends are those of
// the decision, bit for bit.
#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/parameter_shard.h"

namespace pstrain {
namespace {

// Sync Adam (lr 0.1), `capacity` workers, the first `initial` of them
// members (0: all). One parameter of 6 elements in 16-byte chunks (4 + 2),
// one of 2.
ShardOptions Options(int capacity, int initial = 0) {
  ShardOptions options;
  options.job_id = "job";
  options.num_workers = capacity;
  options.initial_workers = initial;
  options.adam.lr = 0.1f;
  return options;
}

std::vector<InitChunk> Chunks() {
  std::vector<InitChunk> chunks(3);
  chunks[0].values = {1, 2, 3, 4};
  chunks[1].chunk_index = 1;
  chunks[1].values = {5, 6};
  chunks[2].param_id = 1;
  chunks[2].values = {7, 8};
  return chunks;
}

// Worker `w`'s push of `value` to every chunk of `step`.
void PushAll(ParameterShard& shard, int w, int64_t step, float value) {
  ASSERT_TRUE(shard.Push(w, 0, 0, step, std::vector<float>(4, value)).ok());
  ASSERT_TRUE(shard.Push(w, 0, 1, step, std::vector<float>(2, value)).ok());
  ASSERT_TRUE(shard.Push(w, 1, 0, step, std::vector<float>(2, value)).ok());
}

// A pull of `min_version` on its own thread that asks for the decision
// (PullOrder::decided): which step was announced and how many chunks had
// been visited by then.
class AnnouncedPull {
 public:
  AnnouncedPull(ParameterShard& shard, int64_t min_version)
      : thread_([this, &shard, min_version] {
          PullOrder order;
          order.decided = [this](int64_t step) {
            visited_at_word_ = static_cast<int>(weights_.size());
            announced_.store(step);
            word_.Notify();
            return true;
          };
          status_ = shard.Pull(
              min_version, 0, absl::Now() + absl::Seconds(10),
              [this](const ChunkSpec&, int64_t, absl::Span<const float> w) {
                weights_.emplace_back(w.begin(), w.end());
              },
              nullptr, nullptr, 0, &skipped_, nullptr, {}, order);
        }) {}
  ~AnnouncedPull() { Join(); }

  // Whether the word came within `timeout`.
  bool Announced(absl::Duration timeout) {
    return word_.WaitForNotificationWithTimeout(timeout);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  int64_t announced() const { return announced_.load(); }
  // After Join().
  const absl::Status& status() const { return status_; }
  const std::vector<std::vector<float>>& weights() const { return weights_; }
  const SkippedStepInfo& skipped() const { return skipped_; }
  int visited_at_word() const { return visited_at_word_; }

 private:
  std::atomic<int64_t> announced_{-1};
  absl::Notification word_;
  int visited_at_word_ = -1;
  std::vector<std::vector<float>> weights_;
  SkippedStepInfo skipped_;
  absl::Status status_;
  std::thread thread_;
};

// The same two workers' step on a shard without verdicts: the weights a
// pull of version 1 sends.
std::vector<std::vector<float>> Reference(float g0, float g1) {
  ParameterShard shard(Options(2));
  EXPECT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  PushAll(shard, 0, 0, g0);
  PushAll(shard, 1, 0, g1);
  EXPECT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  EXPECT_TRUE(shard.EndStep(1, 0, nullptr).ok());
  AnnouncedPull pull(shard, 1);
  pull.Join();
  EXPECT_TRUE(pull.status().ok()) << pull.status();
  return pull.weights();
}

TEST(ShardVerdictTest, EveryVerdictAnnouncesTheStepBeforeItsPushes) {
  ParameterShard shard(Options(2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  AnnouncedPull pull(shard, 1);
  ASSERT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
  // One member's word settles nothing: worker 1 may still skip the step.
  EXPECT_FALSE(pull.Announced(absl::Milliseconds(200)));
  ASSERT_TRUE(shard.NoteFiniteVerdict(1, 0).ok());
  ASSERT_TRUE(pull.Announced(absl::Seconds(5)));
  EXPECT_EQ(pull.announced(), 0);
  EXPECT_EQ(pull.visited_at_word(), 0);  // no push was in
  EXPECT_EQ(shard.Stats().min_version, 0);
  PushAll(shard, 0, 0, 1.0f);
  PushAll(shard, 1, 0, 3.0f);
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  ASSERT_TRUE(shard.EndStep(1, 0, nullptr).ok());
  pull.Join();
  ASSERT_TRUE(pull.status().ok()) << pull.status();
  EXPECT_EQ(pull.skipped().step, -1);
  // The chunks after the word are the decision's, bit for bit.
  EXPECT_EQ(pull.weights(), Reference(1.0f, 3.0f));
  // A verdict of the decided step changes nothing.
  EXPECT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
}

TEST(ShardVerdictTest, AFiniteEndCountsAndANonFiniteOneWithholdsTheWord) {
  {
    ParameterShard shard(Options(2));
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
    AnnouncedPull pull(shard, 1);
    PushAll(shard, 0, 0, 1.0f);
    ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
    ASSERT_TRUE(shard.NoteFiniteVerdict(1, 0).ok());
    ASSERT_TRUE(pull.Announced(absl::Seconds(5)));
    PushAll(shard, 1, 0, 3.0f);
    ASSERT_TRUE(shard.EndStep(1, 0, nullptr).ok());
    pull.Join();
    ASSERT_TRUE(pull.status().ok()) << pull.status();
    EXPECT_EQ(pull.weights(), Reference(1.0f, 3.0f));
  }
  // Worker 1 ends with a non-finite value: no word, the step is skipped
  // and every chunk sent again as before the step.
  ParameterShard shard(Options(2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  AnnouncedPull pull(shard, 1);
  ASSERT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
  PushAll(shard, 0, 0, 1.0f);
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 0, 0).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 0, 1, 0).ok());
  ASSERT_TRUE(shard.PushSkipped(1, 1, 0, 0).ok());
  NonFiniteValue nan;
  nan.param_id = 0;
  nan.value = "nan";
  ASSERT_TRUE(shard.EndStep(1, 0, &nan).ok());
  pull.Join();
  ASSERT_TRUE(pull.status().ok()) << pull.status();
  EXPECT_EQ(pull.announced(), -1);
  EXPECT_EQ(pull.skipped().step, 0);
  EXPECT_EQ(pull.skipped().worker_id, 1);
  ASSERT_EQ(pull.weights().size(), 6u);  // each chunk, then again restored
  EXPECT_EQ(pull.weights()[3], (std::vector<float>{1, 2, 3, 4}));
}

TEST(ShardVerdictTest, AVerdictCannotBeTakenBack) {
  ParameterShard shard(Options(2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  ASSERT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
  absl::Status status = shard.PushSkipped(0, 0, 0, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "worker 0 skipped chunk (0, 0) of step 0 on shard 0 after its "
            "verdict that every value of the step was finite");
  PushAll(shard, 0, 0, 1.0f);
  NonFiniteValue inf;
  inf.value = "inf";
  status = shard.EndStep(0, 0, &inf);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "worker 0 ended step 0 on shard 0 with a non-finite value after "
            "its verdict that every value of the step was finite");
  // Nothing was recorded: the finite end is still worker 0's first.
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  PushAll(shard, 1, 0, 3.0f);
  ASSERT_TRUE(shard.EndStep(1, 0, nullptr).ok());
  AnnouncedPull pull(shard, 1);
  pull.Join();
  ASSERT_TRUE(pull.status().ok()) << pull.status();
  EXPECT_EQ(pull.skipped().step, -1);
  EXPECT_EQ(pull.weights(), Reference(1.0f, 3.0f));
}

TEST(ShardVerdictTest, RefusedWhereAVerdictSettlesNothing) {
  {
    ParameterShard shard(Options(2));
    EXPECT_EQ(shard.NoteFiniteVerdict(0, 0).message(),
              "verdict of step 0 on shard 0 before it was initialised");
  }
  ShardOptions async = Options(2);
  async.mode = SyncMode::kAsync;
  ShardOptions stale = Options(2);
  stale.staleness = 1;
  ShardOptions backups = Options(3);
  backups.replicas_to_aggregate = 2;
  ShardOptions clipping = Options(2);
  clipping.clip_grad_norm = 1.0;
  for (const ShardOptions& options : {async, stale, backups, clipping}) {
    ParameterShard shard(options);
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
    const absl::Status status = shard.NoteFiniteVerdict(0, 0);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(status.message(),
              "verdict of step 0 on shard 0: verdicts are for sync mode "
              "without staleness, backup workers or clipping");
  }
  ParameterShard shard(Options(2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  absl::Status status = shard.NoteFiniteVerdict(0, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "worker 0 sent the verdict of step 1 on shard 0, which is "
            "collecting the ends of step 0");
  EXPECT_EQ(shard.NoteFiniteVerdict(2, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard.NoteFiniteVerdict(0, 0, /*generation=*/1).code(),
            absl::StatusCode::kAborted);
  // None of them counted: worker 1's word alone announces nothing.
  AnnouncedPull pull(shard, 1);
  ASSERT_TRUE(shard.NoteFiniteVerdict(1, 0).ok());
  EXPECT_FALSE(pull.Announced(absl::Milliseconds(200)));
  PushAll(shard, 0, 0, 1.0f);
  PushAll(shard, 1, 0, 3.0f);
  ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
  ASSERT_TRUE(shard.EndStep(1, 0, nullptr).ok());
  pull.Join();
  EXPECT_TRUE(pull.status().ok()) << pull.status();
}

// A membership change planned at the step's decision (PlanReopen) names
// the generation the word carries, so the word waits for the decision;
// once every verdict is in, a plan for that decision is refused.
TEST(ShardVerdictTest, APlannedChangeAndEveryVerdictExcludeEachOther) {
  WorkerMembership three;
  three.workers = {0, 1, 2};
  three.epoch = 1;
  {
    ParameterShard shard(Options(4, 2));
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
    ASSERT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
    ASSERT_TRUE(shard.PlanReopen(1, 1, three).ok());  // replaced below
    ASSERT_TRUE(shard.NoteFiniteVerdict(1, 0).ok());
    AnnouncedPull pull(shard, 1);
    EXPECT_FALSE(pull.Announced(absl::Milliseconds(200)));
    PushAll(shard, 0, 0, 1.0f);
    PushAll(shard, 1, 0, 3.0f);
    ASSERT_TRUE(shard.EndStep(0, 0, nullptr).ok());
    ASSERT_TRUE(shard.EndStep(1, 0, nullptr).ok());
    ASSERT_TRUE(pull.Announced(absl::Seconds(5)));
    pull.Join();
    EXPECT_TRUE(pull.status().ok()) << pull.status();
    EXPECT_EQ(shard.generation(), 1);
  }
  ParameterShard shard(Options(4, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks()).ok());
  ASSERT_TRUE(shard.NoteFiniteVerdict(0, 0).ok());
  ASSERT_TRUE(shard.NoteFiniteVerdict(1, 0).ok());
  const absl::Status status = shard.PlanReopen(1, 1, three);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "shard 0 has every member's verdict of step 0, whose pulls "
            "announce it decided without a membership change; plan the "
            "change before worker 0's pushes of the step");
  EXPECT_EQ(shard.generation(), 0);
}

}  // namespace
}  // namespace pstrain
