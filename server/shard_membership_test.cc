// An elastic job's membership on a shard (issue 40): a reopen that names
// other workers changes whose pushes a step waits for and averages, from
// the reopen's version on, and nothing else.
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/parameter_shard.h"

namespace pstrain {
namespace {

// Sync SGD (lr 0.1, no state, so that a shard initialised from another's
// weights is that shard) with a capacity of `capacity` workers, the first
// `initial` of them members. One parameter of 6 elements in 16-byte
// chunks (4 + 2), one of 2.
ShardOptions Options(int capacity, int initial, int replicas = 0) {
  ShardOptions options;
  options.job_id = "job";
  options.num_workers = capacity;
  options.initial_workers = initial;
  options.replicas_to_aggregate = replicas;
  options.adam.kind = OptimizerKind::kSgd;
  options.adam.lr = 0.1f;
  return options;
}

std::vector<InitChunk> Chunks(const std::vector<std::vector<float>>& values,
                              int64_t version) {
  std::vector<InitChunk> chunks(3);
  const int keys[3][2] = {{0, 0}, {0, 1}, {1, 0}};
  for (int i = 0; i < 3; ++i) {
    chunks[i].param_id = keys[i][0];
    chunks[i].chunk_index = keys[i][1];
    chunks[i].values = values[i];
    chunks[i].version = version;
  }
  return chunks;
}

std::vector<std::vector<float>> Initial() {
  return {{1, 2, 3, 4}, {5, 6}, {7, 8}};
}

// Worker `w`'s push of `value` everywhere and its end of `step`.
void Step(ParameterShard& shard, int w, int64_t step, float value,
          int64_t generation) {
  ASSERT_TRUE(
      shard.Push(w, 0, 0, step, std::vector<float>(4, value), generation).ok());
  ASSERT_TRUE(
      shard.Push(w, 0, 1, step, std::vector<float>(2, value), generation).ok());
  ASSERT_TRUE(
      shard.Push(w, 1, 0, step, std::vector<float>(2, value), generation).ok());
  ASSERT_TRUE(shard.EndStep(w, step, nullptr, generation).ok());
}

std::vector<std::vector<float>> Pull(ParameterShard& shard, int64_t version,
                                     int64_t generation) {
  std::vector<std::vector<float>> out;
  absl::Status s = shard.Pull(
      version, 0, absl::Now() + absl::Seconds(5),
      [&](const ChunkSpec&, int64_t, absl::Span<const float> w) {
        out.emplace_back(w.begin(), w.end());
      },
      nullptr, nullptr, generation);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

WorkerMembership Members(std::vector<int> workers, int64_t epoch) {
  WorkerMembership m;
  m.workers = std::move(workers);
  m.epoch = epoch;
  m.data_offset = 40;
  return m;
}

// 2 workers grow to 3 at step 1, then shrink to worker 0 alone at step 2:
// each step equals a shard that had that many workers from the start of
// it (initialised from the weights before it), bit for bit.
TEST(ShardMembershipTest, EachStepAveragesItsGenerationsMembers) {
  ParameterShard shard(Options(4, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  EXPECT_EQ(shard.membership().workers, (std::vector<int>{0, 1}));
  // Worker 2 is inside the capacity but not a member yet.
  absl::Status refused = shard.Push(2, 1, 0, 0, std::vector<float>(2, 1.0f));
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_NE(refused.message().find("worker 2 is not a member"),
            std::string::npos)
      << refused;
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 3.0f, 0);
  const std::vector<std::vector<float>> after0 = Pull(shard, 1, 0);

  // A joining worker waits until a generation has it.
  EXPECT_EQ(shard.WaitReady(absl::Now() + absl::Milliseconds(50), 0, 2).code(),
            absl::StatusCode::kDeadlineExceeded);
  const WorkerMembership three = Members({0, 1, 2}, 1);
  absl::StatusOr<int64_t> v = shard.Reopen(1, -1, &three);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1);
  EXPECT_TRUE(shard.WaitReady(absl::Now() + absl::Seconds(1), 0, 2).ok());
  EXPECT_EQ(shard.membership().workers, three.workers);
  EXPECT_EQ(shard.membership().from_step, 1);
  EXPECT_EQ(shard.membership().data_offset, 40);
  EXPECT_EQ(shard.EndsToDecide(), 3);
  Step(shard, 0, 1, 1.0f, 1);
  Step(shard, 1, 1, 2.0f, 1);
  Step(shard, 2, 1, 6.0f, 1);
  const std::vector<std::vector<float>> after1 = Pull(shard, 2, 1);

  ParameterShard three_from_one(Options(3, 3));
  ASSERT_TRUE(three_from_one.Initialize({6, 2}, 16, Chunks(after0, 1)).ok());
  Step(three_from_one, 0, 1, 1.0f, 0);
  Step(three_from_one, 1, 1, 2.0f, 0);
  Step(three_from_one, 2, 1, 6.0f, 0);
  EXPECT_EQ(Pull(three_from_one, 2, 0), after1);
  EXPECT_FLOAT_EQ(after1[2][0], 7.0f - 0.2f - 0.3f);

  const WorkerMembership one = Members({0}, 2);
  ASSERT_TRUE(shard.Reopen(2, -1, &one).ok());
  EXPECT_EQ(shard.Push(1, 1, 0, 2, std::vector<float>(2, 1.0f), 2).code(),
            absl::StatusCode::kAborted);
  Step(shard, 0, 2, 5.0f, 2);
  EXPECT_FLOAT_EQ(Pull(shard, 3, 2)[2][0], after1[2][0] - 0.5f);
}

// The linear scaling rule (ShardOptions::linear_lr_scaling): 2 workers
// grow to 4 at step 1 and shrink to 1 at step 2; each generation's SGD
// step equals a fixed shard of that many workers whose lr is the base lr
// times members / 2, bit for bit, and without the rule the lr stays.
TEST(ShardMembershipTest, LinearScalingFollowsTheMembers) {
  ShardOptions scaled = Options(4, 2);
  scaled.linear_lr_scaling = true;
  ParameterShard shard(scaled);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 3.0f, 0);
  const std::vector<std::vector<float>> after0 = Pull(shard, 1, 0);
  // lr 0.1 at 2 workers (the initial members): 7 - 0.1 x 2.
  EXPECT_FLOAT_EQ(after0[2][0], 7.0f - 0.2f);

  const WorkerMembership four = Members({0, 1, 2, 3}, 1);
  ASSERT_TRUE(shard.Reopen(1, -1, &four).ok());
  for (int w = 0; w < 4; ++w) Step(shard, w, 1, 1.0f + w, 1);
  const std::vector<std::vector<float>> after1 = Pull(shard, 2, 1);
  ShardOptions fixed4 = Options(4, 4);
  fixed4.adam.lr = 0.1f * 4 / 2;
  ParameterShard reference(fixed4);
  ASSERT_TRUE(reference.Initialize({6, 2}, 16, Chunks(after0, 1)).ok());
  for (int w = 0; w < 4; ++w) Step(reference, w, 1, 1.0f + w, 0);
  EXPECT_EQ(Pull(reference, 2, 0), after1);

  const WorkerMembership one = Members({0}, 2);
  ASSERT_TRUE(shard.Reopen(2, -1, &one).ok());
  Step(shard, 0, 2, 4.0f, 2);
  // lr 0.1 x 1 / 2.
  EXPECT_FLOAT_EQ(Pull(shard, 3, 2)[2][0], after1[2][0] - 0.05f * 4.0f);

  // Without the rule the grown job keeps lr 0.1.
  ParameterShard plain(Options(4, 2));
  ASSERT_TRUE(plain.Initialize({6, 2}, 16, Chunks(after0, 1)).ok());
  ASSERT_TRUE(plain.Reopen(1, -1, &four).ok());
  for (int w = 0; w < 4; ++w) Step(plain, w, 1, 2.0f, 1);
  EXPECT_FLOAT_EQ(Pull(plain, 2, 1)[2][0], after0[2][0] - 0.1f * 2.0f);
}

// The step in flight when the membership changes is dropped, as a reopen
// after a failure drops it: the old members' pushes of it do not count.
TEST(ShardMembershipTest, TheStepInFlightIsRedoneByTheNewMembers) {
  ParameterShard shard(Options(3, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  Step(shard, 0, 0, 1.0f, 0);  // worker 1 has not pushed step 0
  const WorkerMembership grown = Members({0, 1, 2}, 1);
  ASSERT_EQ(*shard.Reopen(1, -1, &grown), 0);
  for (int w = 0; w < 3; ++w) Step(shard, w, 0, 3.0f, 1);
  EXPECT_FLOAT_EQ(Pull(shard, 1, 1)[2][0], 7.0f - 0.3f);
}

// Bounded staleness 2: worker 1 ran two steps ahead of worker 0 (steps 1
// and 2 pushed and ended, not decided) when worker 0 reopens the shard for
// a third worker at its step 1. The reopen drops worker 1's steps, so step
// 1 equals a shard that had the three workers from step 1 on, bit for bit;
// an old generation's push is refused, and a checkpoint cut deferred to
// step 2 ends ABORTED instead of waiting for a version of the old
// generation.
TEST(ShardMembershipTest, WithStalenessTheStepsRunAheadAreRedone) {
  ShardOptions stale = Options(3, 2);
  stale.staleness = 2;
  ParameterShard shard(stale);
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 3.0f, 0);
  const std::vector<std::vector<float>> after0 = Pull(shard, 1, 0);
  Step(shard, 1, 1, 100.0f, 0);
  Step(shard, 1, 2, 100.0f, 0);
  std::vector<ChunkSnapshot> cut;
  ASSERT_TRUE(shard.BeginDeferredSnapshot(2, &cut).ok());

  const WorkerMembership three = Members({0, 1, 2}, 1);
  absl::StatusOr<int64_t> v = shard.Reopen(1, -1, &three);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(
      shard.AwaitDeferredSnapshot(2, absl::Now() + absl::Seconds(5)).code(),
      absl::StatusCode::kAborted);
  EXPECT_EQ(shard.Push(1, 1, 0, 2, std::vector<float>(2, 1.0f), 0).code(),
            absl::StatusCode::kAborted);
  Step(shard, 0, 1, 1.0f, 1);
  Step(shard, 1, 1, 2.0f, 1);
  Step(shard, 2, 1, 6.0f, 1);
  const std::vector<std::vector<float>> after1 = Pull(shard, 2, 1);

  ShardOptions fixed = Options(3, 3);
  fixed.staleness = 2;
  ParameterShard three_from_one(fixed);
  ASSERT_TRUE(three_from_one.Initialize({6, 2}, 16, Chunks(after0, 1)).ok());
  Step(three_from_one, 0, 1, 1.0f, 0);
  Step(three_from_one, 1, 1, 2.0f, 0);
  Step(three_from_one, 2, 1, 6.0f, 0);
  EXPECT_EQ(Pull(three_from_one, 2, 0), after1);
  EXPECT_FLOAT_EQ(after1[2][0], after0[2][0] - 0.1f * 3.0f);
}

// A change planned ahead (PlanReopen): the step in flight is the old
// members', none of it dropped; the shard takes the new generation and
// members in the decision of that step, waking a joiner's WaitReady; the
// old members' pulls of the next version are still answered (and say the
// generation taken), any other request of the old generation is ABORTED;
// and the next step averages the new members', bit for bit as a shard
// that had them from there.
TEST(ShardMembershipTest, APlannedChangeIsTakenAtTheDecisionOfItsStep) {
  ParameterShard shard(Options(4, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 3.0f, 0);
  ASSERT_EQ(Pull(shard, 1, 0).size(), 3u);

  const WorkerMembership three = Members({0, 1, 2}, 1);
  // Refused, nothing changed: not the next generation, not the step whose
  // ends are collected (step 1's), a membership without worker 0.
  EXPECT_EQ(shard.PlanReopen(2, 2, three).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.PlanReopen(1, 3, three).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.PlanReopen(1, 1, three).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.PlanReopen(1, 2, Members({1, 2}, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard.PlanReopen(1, 2, three).ok());
  EXPECT_EQ(shard.generation(), 0);
  EXPECT_EQ(shard.last_switch().from, -1);

  absl::Status joined = absl::UnknownError("not run");
  std::thread joiner(
      [&] { joined = shard.WaitReady(absl::Now() + absl::Seconds(10), 0, 2); });
  // Step 1 is the old members': worker 2 is not one yet.
  EXPECT_EQ(shard.Push(2, 1, 0, 1, std::vector<float>(2, 1.0f), 0).code(),
            absl::StatusCode::kAborted);
  Step(shard, 0, 1, 2.0f, 0);
  EXPECT_EQ(shard.generation(), 0);
  Step(shard, 1, 1, 4.0f, 0);
  joiner.join();
  EXPECT_TRUE(joined.ok()) << joined;
  EXPECT_EQ(shard.generation(), 1);
  EXPECT_EQ(shard.membership().workers, three.workers);
  EXPECT_EQ(shard.membership().from_step, 2);
  EXPECT_EQ(shard.membership().data_offset, 40);
  EXPECT_EQ(shard.EndsToDecide(), 3);
  const ParameterShard::GenerationSwitch taken = shard.last_switch();
  EXPECT_EQ(taken.from, 0);
  EXPECT_EQ(taken.to, 1);
  EXPECT_EQ(taken.version, 2);
  // The old generation's pull of version 2 is answered, as the new one's.
  const std::vector<std::vector<float>> after1 = Pull(shard, 2, 0);
  EXPECT_EQ(Pull(shard, 2, 1), after1);
  // Both workers' step 1 counted: 7 - 0.1 x (2 + 4) / 2 after step 0's.
  EXPECT_FLOAT_EQ(after1[2][0], 7.0f - 0.2f - 0.3f);
  EXPECT_EQ(shard.Push(0, 1, 0, 2, std::vector<float>(2, 1.0f), 0).code(),
            absl::StatusCode::kAborted);
  int64_t generation = -1;
  EXPECT_EQ(shard.membership(&generation).workers, three.workers);
  EXPECT_EQ(generation, 1);

  Step(shard, 0, 2, 1.0f, 1);
  Step(shard, 1, 2, 2.0f, 1);
  Step(shard, 2, 2, 6.0f, 1);
  ParameterShard three_from_two(Options(3, 3));
  ASSERT_TRUE(three_from_two.Initialize({6, 2}, 16, Chunks(after1, 2)).ok());
  Step(three_from_two, 0, 2, 1.0f, 0);
  Step(three_from_two, 1, 2, 2.0f, 0);
  Step(three_from_two, 2, 2, 6.0f, 0);
  EXPECT_EQ(Pull(shard, 3, 1), Pull(three_from_two, 3, 0));
}

// A reopen after a failure that takes back the decision a planned change
// was taken at (another shard had not decided that step) goes back to the
// members before it; a reopen before the decision drops the plan. A
// member's stream breaking with the generation a change just left breaks
// the new generation's barrier.
TEST(ShardMembershipTest, AReopenUndoesOrDropsAPlannedChange) {
  ParameterShard shard(Options(4, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  const WorkerMembership three = Members({0, 1, 2}, 1);
  ASSERT_TRUE(shard.PlanReopen(1, 1, three).ok());
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 3.0f, 0);
  ASSERT_EQ(shard.generation(), 1);
  absl::StatusOr<int64_t> v = shard.Reopen(2, /*expected_version=*/0);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 0);
  EXPECT_EQ(shard.membership().workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(shard.last_switch().from, -1);
  EXPECT_EQ(Pull(shard, 0, 2), Initial());

  // Planned, then a reopen before the decision: the old members go on.
  ASSERT_TRUE(shard.PlanReopen(3, 1, three).ok());
  ASSERT_TRUE(shard.Reopen(4).ok());
  Step(shard, 0, 0, 1.0f, 4);
  Step(shard, 1, 0, 3.0f, 4);
  EXPECT_EQ(shard.generation(), 4);
  EXPECT_EQ(shard.membership().workers, (std::vector<int>{0, 1}));

  // Taken at step 1; worker 1's stream (still of generation 4) breaks.
  ASSERT_TRUE(shard.PlanReopen(5, 2, three).ok());
  Step(shard, 0, 1, 1.0f, 4);
  Step(shard, 1, 1, 3.0f, 4);
  ASSERT_EQ(shard.generation(), 5);
  shard.BreakBarrier(4, "worker 1's stream broke");
  EXPECT_EQ(shard.Push(0, 1, 0, 2, std::vector<float>(2, 1.0f), 5).code(),
            absl::StatusCode::kAborted);
}

// Only sync shards without staleness or backup workers decide each step
// on every member's push: the others refuse a plan (the caller reopens).
TEST(ShardMembershipTest, OtherPoliciesRefuseAPlannedChange) {
  const WorkerMembership three = Members({0, 1, 2}, 1);
  ShardOptions async = Options(3, 2);
  async.mode = SyncMode::kAsync;
  ShardOptions stale = Options(3, 2);
  stale.staleness = 1;
  for (const ShardOptions& options :
       {async, stale, Options(3, 3, /*replicas=*/2)}) {
    ParameterShard shard(options);
    ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
    EXPECT_EQ(shard.PlanReopen(1, 1, three).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  ParameterShard uninitialised(Options(3, 2));
  EXPECT_EQ(uninitialised.PlanReopen(1, 1, three).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Backup workers keep their count b: R = members - b (at least 1).
TEST(ShardMembershipTest, BackupWorkersKeepTheirCount) {
  ParameterShard shard(Options(5, 3, /*replicas=*/2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  EXPECT_EQ(shard.EndsToDecide(), 2);
  const WorkerMembership five = Members({0, 1, 2, 3, 4}, 1);
  ASSERT_TRUE(shard.Reopen(1, -1, &five).ok());
  EXPECT_EQ(shard.EndsToDecide(), 4);
  const WorkerMembership one = Members({0}, 2);
  ASSERT_TRUE(shard.Reopen(2, -1, &one).ok());
  EXPECT_EQ(shard.EndsToDecide(), 1);
}

// A malformed membership is refused before anything changes.
TEST(ShardMembershipTest, AMalformedMembershipChangesNothing) {
  ParameterShard shard(Options(3, 2));
  ASSERT_TRUE(shard.Initialize({6, 2}, 16, Chunks(Initial(), 0)).ok());
  for (const std::vector<int>& bad :
       {std::vector<int>{}, std::vector<int>{1, 2}, std::vector<int>{0, 3},
        std::vector<int>{0, 2, 1}, std::vector<int>{0, 0}}) {
    const WorkerMembership m = Members(bad, 1);
    absl::StatusOr<int64_t> v = shard.Reopen(1, -1, &m);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
        << v.status();
  }
  EXPECT_EQ(shard.generation(), 0);
  EXPECT_EQ(shard.membership().workers, (std::vector<int>{0, 1}));
  Step(shard, 0, 0, 1.0f, 0);
  Step(shard, 1, 0, 1.0f, 0);
  EXPECT_EQ(Pull(shard, 1, 0).size(), 3u);
}

// Async (no decided step; workers come and go): a membership change keeps
// every update applied and each chunk's version, takes the membership from
// the step worker 0 sends, refuses the old generation's and the removed
// worker's pushes, and applies the new member's at once. The buffer (the
// second tensor: the average of the members' latest values) forgets the
// worker that left. Without a membership (a failure) an async shard does
// not reopen: it restores the checkpoint; for a move of its state it
// closes as it is.
TEST(ShardMembershipTest, AsyncKeepsItsStateAndTakesWorkerZerosStep) {
  ShardOptions async = Options(3, 2);
  async.mode = SyncMode::kAsync;
  ParameterShard shard(async);
  ASSERT_TRUE(shard
                  .Initialize({6, 2}, 16, Chunks(Initial(), 0),
                              /*num_buffers=*/1)
                  .ok());
  auto push = [&](int w, float value, int64_t generation) {
    absl::Status a =
        shard.Push(w, 0, 0, 0, std::vector<float>(4, value), generation);
    absl::Status b =
        shard.Push(w, 0, 1, 0, std::vector<float>(2, value), generation);
    absl::Status c =
        shard.Push(w, 1, 0, 0, std::vector<float>(2, value), generation);
    return a.ok() && b.ok() ? c : (a.ok() ? b : a);
  };
  ASSERT_TRUE(push(0, 1.0f, 0).ok());
  ASSERT_TRUE(push(1, 3.0f, 0).ok());
  const std::vector<std::vector<float>> before = Pull(shard, 0, 0);
  // SGD lr 0.1: two pushes applied one by one; the buffer is the average.
  EXPECT_FLOAT_EQ(before[0][0], 1.0f - 0.1f - 0.3f);
  EXPECT_FLOAT_EQ(before[2][0], 2.0f);

  EXPECT_EQ(shard.Reopen(1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  WorkerMembership grown = Members({0, 2}, 1);
  grown.from_step = 57;
  absl::StatusOr<int64_t> v = shard.Reopen(1, /*expected_version=*/5, &grown);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 2);  // two pushes per chunk, kept
  EXPECT_EQ(shard.membership().from_step, 57);
  EXPECT_EQ(shard.membership().workers, grown.workers);
  EXPECT_EQ(Pull(shard, 0, 1), before);
  EXPECT_EQ(push(0, 1.0f, 0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(push(1, 1.0f, 1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Pull(shard, 0, 1), before);
  ASSERT_TRUE(shard.WaitReady(absl::Now() + absl::Seconds(1), 1, 2).ok());
  ASSERT_TRUE(push(2, 5.0f, 1).ok());
  const std::vector<std::vector<float>> after = Pull(shard, 0, 1);
  EXPECT_FLOAT_EQ(after[0][0], before[0][0] - 0.5f);
  // Worker 0's 1 (its latest) and worker 2's 5; worker 1's 3 forgotten.
  EXPECT_FLOAT_EQ(after[2][0], 3.0f);

  // A move of its state to other shards (PsService Export): closed at a
  // new generation as it is, the membership kept.
  absl::StatusOr<int64_t> closed = shard.Reopen(2, -1, nullptr, true);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_TRUE(shard.closed());
  EXPECT_EQ(*closed, 3);
  EXPECT_EQ(shard.membership().workers, grown.workers);
  EXPECT_EQ(push(2, 1.0f, 1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(shard.WaitReady(absl::Now() + absl::Milliseconds(50), 2).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pstrain
