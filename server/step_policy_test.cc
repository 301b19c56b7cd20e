#include "server/step_policy.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

using Cut = StepPolicy::Cut;
using Kind = StepPolicy::Kind;
using Members = StepPolicy::Members;
using Rejoin = StepPolicy::Rejoin;
using Update = StepPolicy::Update;

ShardOptions Options(int shard_index = 0) {
  ShardOptions options;
  options.shard_index = shard_index;
  options.num_shards = 2;
  options.num_workers = 4;
  return options;
}

ShardOptions Staleness(int s) {
  ShardOptions options = Options();
  options.staleness = s;
  return options;
}

ShardOptions Backups(int replicas, int shard_index = 0) {
  ShardOptions options = Options(shard_index);
  options.replicas_to_aggregate = replicas;
  return options;
}

ShardOptions Async() {
  ShardOptions options = Options();
  options.mode = SyncMode::kAsync;
  return options;
}

ShardOptions Clipped(ShardOptions options) {
  options.clip_grad_norm = 1.5;
  return options;
}

TEST(StepPolicyTest, SyncDecidesAtEveryWorkersEndAndUndoesASkip) {
  const StepPolicy p(Options());
  EXPECT_EQ(p.kind(), Kind::kSync);
  EXPECT_EQ(p.Describe(), "sync");
  EXPECT_TRUE(p.has_steps());
  EXPECT_EQ(p.staleness(), 0);
  EXPECT_EQ(p.open_steps(), 1);
  EXPECT_EQ(p.ends_to_decide(), 4);
  EXPECT_FALSE(p.admits());
  EXPECT_FALSE(p.admission_arbiter());
  EXPECT_EQ(p.averages(), Members::kEveryWorker);
  EXPECT_FALSE(p.drops_late_pushes());
  EXPECT_FALSE(p.samples_from_admitted_ends());
  EXPECT_EQ(p.update(), Update::kAtBarrier);
  EXPECT_FALSE(p.clipping());
  EXPECT_EQ(p.norm_members(), Members::kOwnPush);
  EXPECT_EQ(p.checkpoint_cut(), Cut::kImmediate);
  EXPECT_FALSE(p.deferred_snapshot());
  EXPECT_FALSE(p.picks_checkpoint_step());
  EXPECT_EQ(p.rejoin(), Rejoin::kReopenInPlace);
}

TEST(StepPolicyTest, SyncWithClippingAppliesAtTheNormsDecision) {
  const StepPolicy p(Clipped(Options()));
  EXPECT_EQ(p.kind(), Kind::kSync);
  EXPECT_EQ(p.Describe(), "sync, clipping by global norm 1.5");
  EXPECT_EQ(p.ends_to_decide(), 4);
  EXPECT_EQ(p.update(), Update::kAtDecision);
  EXPECT_TRUE(p.clipping());
  EXPECT_EQ(p.clip_grad_norm(), 1.5);
  EXPECT_EQ(p.norm_members(), Members::kEveryWorker);
  EXPECT_EQ(p.checkpoint_cut(), Cut::kImmediate);
  EXPECT_EQ(p.rejoin(), Rejoin::kReopenInPlace);
}

TEST(StepPolicyTest, StalenessCollectsSPlusOneStepsAndDefersItsCut) {
  const StepPolicy p(Staleness(2));
  EXPECT_EQ(p.kind(), Kind::kStaleness);
  EXPECT_EQ(p.Describe(), "sync with staleness 2");
  EXPECT_TRUE(p.has_steps());
  EXPECT_EQ(p.staleness(), 2);
  EXPECT_EQ(p.open_steps(), 3);
  EXPECT_EQ(p.ends_to_decide(), 4);
  EXPECT_FALSE(p.admits());
  EXPECT_EQ(p.averages(), Members::kEveryWorker);
  EXPECT_FALSE(p.drops_late_pushes());
  EXPECT_FALSE(p.samples_from_admitted_ends());
  EXPECT_EQ(p.update(), Update::kAtBarrier);
  EXPECT_EQ(p.checkpoint_cut(), Cut::kDeferred);
  EXPECT_TRUE(p.deferred_snapshot());
  EXPECT_FALSE(p.picks_checkpoint_step());
  // A reopen drops every open step's pushes.
  EXPECT_EQ(p.rejoin(), Rejoin::kReopenInPlace);
  EXPECT_TRUE(p.reopens());

  const StepPolicy clipped(Clipped(Staleness(2)));
  EXPECT_EQ(clipped.update(), Update::kAtDecision);
  EXPECT_EQ(clipped.norm_members(), Members::kEveryWorker);
  EXPECT_EQ(clipped.open_steps(), 3);
  EXPECT_EQ(clipped.checkpoint_cut(), Cut::kDeferred);
}

TEST(StepPolicyTest, BackupsDecideAtShardZerosRAdmissions) {
  const StepPolicy p(Backups(3));
  EXPECT_EQ(p.kind(), Kind::kBackups);
  EXPECT_EQ(p.Describe(), "sync with backup workers (3 of 4)");
  EXPECT_TRUE(p.has_steps());
  EXPECT_EQ(p.staleness(), 0);
  EXPECT_EQ(p.open_steps(), 1);
  EXPECT_EQ(p.ends_to_decide(), 3);
  EXPECT_TRUE(p.admits());
  EXPECT_TRUE(p.admission_arbiter());
  EXPECT_EQ(p.averages(), Members::kAdmitted);
  EXPECT_TRUE(p.drops_late_pushes());
  EXPECT_TRUE(p.samples_from_admitted_ends());
  EXPECT_EQ(p.update(), Update::kAtDecision);
  EXPECT_EQ(p.norm_members(), Members::kOwnPush);
  EXPECT_EQ(p.checkpoint_cut(), Cut::kPickedByShardZero);
  EXPECT_TRUE(p.deferred_snapshot());
  EXPECT_TRUE(p.picks_checkpoint_step());
  EXPECT_EQ(p.rejoin(), Rejoin::kReopenInPlace);

  // Shard 1 takes shard 0's admissions and its cut.
  const StepPolicy other(Backups(3, /*shard_index=*/1));
  EXPECT_TRUE(other.admits());
  EXPECT_FALSE(other.admission_arbiter());
  EXPECT_FALSE(other.picks_checkpoint_step());
  EXPECT_EQ(other.checkpoint_cut(), Cut::kPickedByShardZero);

  // The norm's partial is of the admitted workers' average.
  const StepPolicy clipped(Clipped(Backups(3)));
  EXPECT_EQ(clipped.norm_members(), Members::kAdmitted);
  EXPECT_EQ(clipped.update(), Update::kAtDecision);
}

TEST(StepPolicyTest, EveryReplicaOrNoneIsPlainSync) {
  for (int r : {0, 4}) {
    const StepPolicy p(Backups(r));
    EXPECT_EQ(p.kind(), Kind::kSync) << r;
    EXPECT_EQ(p.ends_to_decide(), 4) << r;
    EXPECT_FALSE(p.admits()) << r;
  }
}

TEST(StepPolicyTest, BackupsWithStalenessAdmitSeveralStepsAndRestore) {
  ShardOptions options = Backups(3);
  options.staleness = 2;
  const StepPolicy p(options);
  EXPECT_EQ(p.kind(), Kind::kBackups);
  EXPECT_EQ(p.staleness(), 2);
  EXPECT_EQ(p.open_steps(), 3);
  EXPECT_EQ(p.ends_to_decide(), 3);
  EXPECT_EQ(p.checkpoint_cut(), StepPolicy::Cut::kPickedByShardZero);
  // Pushes of several steps are pending: a reopen drops them all.
  EXPECT_EQ(p.rejoin(), StepPolicy::Rejoin::kReopenInPlace);
  EXPECT_EQ(p.Describe(), "sync with backup workers (3 of 4) and staleness 2");
}

TEST(StepPolicyTest, AsyncAppliesEachPushAndIgnoresTheSyncOptions) {
  ShardOptions options = Clipped(Async());
  options.staleness = 2;
  options.replicas_to_aggregate = 3;
  const StepPolicy p(options);
  EXPECT_EQ(p.kind(), Kind::kAsync);
  EXPECT_EQ(p.Describe(), "async");
  EXPECT_FALSE(p.has_steps());
  EXPECT_EQ(p.staleness(), 0);
  EXPECT_EQ(p.open_steps(), 1);
  EXPECT_EQ(p.ends_to_decide(), 0);
  EXPECT_FALSE(p.admits());
  EXPECT_FALSE(p.admission_arbiter());
  EXPECT_EQ(p.averages(), Members::kOwnPush);
  EXPECT_FALSE(p.drops_late_pushes());
  EXPECT_FALSE(p.samples_from_admitted_ends());
  EXPECT_EQ(p.update(), Update::kEachPush);
  EXPECT_FALSE(p.clipping());
  EXPECT_EQ(p.clip_grad_norm(), 0);
  EXPECT_EQ(p.norm_members(), Members::kOwnPush);
  EXPECT_EQ(p.checkpoint_cut(), Cut::kPerChunk);
  EXPECT_FALSE(p.deferred_snapshot());
  EXPECT_FALSE(p.picks_checkpoint_step());
  EXPECT_EQ(p.rejoin(), Rejoin::kRestoreCheckpoint);
  EXPECT_FALSE(p.reopens());
}

}  // namespace
}  // namespace pstrain
