#include "worker/world_announcement.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::string Prefix(int64_t epoch) { return absl::StrCat("gloo-1-m", epoch); }

AwaitWorldOptions Options(int worker_id,
                          absl::Duration poll = absl::Milliseconds(500),
                          absl::Time deadline = absl::InfiniteFuture()) {
  AwaitWorldOptions options;
  options.worker_id = worker_id;
  options.poll = poll;
  options.deadline = deadline;
  return options;
}

WorkerMembership World(int64_t epoch, std::vector<int> workers) {
  WorkerMembership m;
  m.epoch = epoch;
  m.workers = std::move(workers);
  return m;
}

TEST(WorldAnnouncementTest, EncodesAndDecodesAWorldAndAPointer) {
  EXPECT_EQ(EncodeWorld(World(3, {0, 1, 4})), "3:0,1,4");
  absl::StatusOr<WorkerMembership> world = DecodeWorld("3:0,1,4", 3);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->epoch, 3);
  EXPECT_EQ(world->workers, (std::vector<int>{0, 1, 4}));
  absl::StatusOr<WorkerMembership> pointer = DecodeWorld("5", 2);
  ASSERT_TRUE(pointer.ok()) << pointer.status();
  EXPECT_EQ(pointer->epoch, 5);
  EXPECT_TRUE(pointer->workers.empty());
}

TEST(WorldAnnouncementTest, RefusesMalformedValues) {
  for (const auto& [value, key_epoch] :
       std::vector<std::pair<std::string, int64_t>>{
           {"", 1},          // no epoch
           {"x", 1},         // not a number
           {"1", 2},         // a pointer back in time
           {"3:0,1", 2},     // members of another epoch
           {"2:", 2},        // no members
           {"2:1,2", 2},     // worker 0 not first
           {"2:0,2,1", 2},   // not ascending
           {"2:0,a", 2},     // not a number
           {"2:0,5000", 2},  // past kMaxMembershipWorkers
       }) {
    EXPECT_EQ(DecodeWorld(value, key_epoch).status().code(),
              absl::StatusCode::kInvalidArgument)
        << value;
  }
  EXPECT_EQ(DecodeWorld("2:" + std::string(40000, '1'), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Worker 0 goes from world 1 straight to 3 (two Scale requests, the second
// ready first): a joiner that knew membership 2 still finds world 3.
TEST(WorldAnnouncementTest, AJoinerFindsTheWorldWorker0WentTo) {
  InProcessStore store;
  ASSERT_TRUE(AnnounceWorld(store, Prefix, -1, World(1, {0, 1})).ok());
  ASSERT_TRUE(AnnounceWorld(store, Prefix, 1, World(3, {0, 1, 2, 3})).ok());
  EXPECT_EQ(*store.Wait("gloo-1-m1/world", absl::ZeroDuration()), "1:0,1");
  EXPECT_EQ(*store.Wait("gloo-1-m2/world", absl::ZeroDuration()), "3");
  EXPECT_EQ(*store.Wait("gloo-1-m3/world", absl::ZeroDuration()), "3:0,1,2,3");
  // World 1 (applied) has no worker 2; 2 points at 3, which has it.
  for (int64_t applied : {1, 2, 3}) {
    absl::StatusOr<WorkerMembership> world = AwaitAnnouncedWorld(
        store, Prefix, [applied] { return applied; }, Options(2));
    ASSERT_TRUE(world.ok()) << world.status();
    EXPECT_EQ(world->epoch, 3);
    EXPECT_EQ(world->RankOf(2), 2);
  }
}

// A world without the joiner is passed over; the joiner waits for the
// next announcement and returns once worker 0 announces a world with it.
TEST(WorldAnnouncementTest, AJoinerWaitsPastWorldsWithoutIt) {
  InProcessStore store;
  ASSERT_TRUE(AnnounceWorld(store, Prefix, -1, World(0, {0, 1})).ok());
  std::atomic<bool> done{false};
  absl::StatusOr<WorkerMembership> world;
  std::thread joiner([&] {
    world = AwaitAnnouncedWorld(
        store, Prefix, [] { return int64_t{0}; },
        Options(2, absl::Milliseconds(20)));
    done = true;
  });
  ASSERT_TRUE(AnnounceWorld(store, Prefix, 0, World(1, {0})).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done.load());
  ASSERT_TRUE(AnnounceWorld(store, Prefix, 1, World(2, {0, 2})).ok());
  joiner.join();
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->epoch, 2);
  EXPECT_EQ(world->RankOf(2), 1);
}

// The coordinator drops the keys of ended worlds: a joiner that starts
// from an old applied epoch reads on from the newer one it is told.
TEST(WorldAnnouncementTest, AJoinerFollowsTheAppliedEpochPastDroppedKeys) {
  InProcessStore store;
  // Keys 1 to 4 were dropped; only world 5's is there.
  ASSERT_TRUE(AnnounceWorld(store, Prefix, 4, World(5, {0, 3})).ok());
  std::atomic<int> reads{0};
  absl::StatusOr<WorkerMembership> world = AwaitAnnouncedWorld(
      store, Prefix, [&reads] { return ++reads < 3 ? int64_t{1} : int64_t{5}; },
      Options(3, absl::Milliseconds(10)));
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->epoch, 5);
  EXPECT_GE(reads.load(), 3);
}

TEST(WorldAnnouncementTest, AMalformedAnnouncementIsInternalNamingTheKey) {
  InProcessStore store;
  ASSERT_TRUE(store.Set("gloo-1-m2/world", "2:0,0").ok());
  absl::StatusOr<WorkerMembership> world = AwaitAnnouncedWorld(
      store, Prefix, [] { return int64_t{2}; }, Options(1));
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(world.status().message().find("gloo-1-m2/world"), std::string::npos)
      << world.status();
}

// A survivor (worker_id -1) takes the first world announced, with it or
// not; nothing announced by the deadline is DEADLINE_EXCEEDED.
TEST(WorldAnnouncementTest, ASurvivorTakesTheFirstWorldAnnouncedOrTimesOut) {
  InProcessStore store;
  ASSERT_TRUE(AnnounceWorld(store, Prefix, 2, World(3, {0, 2})).ok());
  absl::StatusOr<WorkerMembership> world =
      AwaitAnnouncedWorld(store, Prefix, [] { return int64_t{3}; }, {});
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->workers, (std::vector<int>{0, 2}));
  const absl::Time began = absl::Now();
  world = AwaitAnnouncedWorld(
      store, Prefix, [] { return int64_t{4}; },
      Options(-1, absl::Milliseconds(20), began + absl::Milliseconds(100)));
  EXPECT_EQ(world.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(world.status().message().find("gloo-1-m4/world"), std::string::npos)
      << world.status();
  EXPECT_LT(absl::Now() - began, absl::Seconds(2));
}

// At most kMaxPendingMemberships pointers, however far the epochs apart.
TEST(WorldAnnouncementTest, AnnouncesAtMostThePendingMemberships) {
  InProcessStore store;
  ASSERT_TRUE(AnnounceWorld(store, Prefix, -1, World(1000, {0})).ok());
  EXPECT_FALSE(store.Wait("gloo-1-m934/world", absl::ZeroDuration()).ok());
  EXPECT_EQ(*store.Wait("gloo-1-m935/world", absl::ZeroDuration()), "1000");
}

}  // namespace
}  // namespace pstrain
