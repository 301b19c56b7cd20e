#include "worker/recovery.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/fake_exchange.h"

namespace pstrain {
namespace {

class RecoveryTest : public ::testing::Test {
 protected:
  std::unique_ptr<Recovery> Make(int worker_id, bool sync, int max_restarts) {
    RecoveryOptions options;
    options.worker_id = worker_id;
    options.num_workers = 4;
    options.sync = sync;
    options.max_restarts = max_restarts;
    options.init_timeout = absl::Seconds(3);
    options.ps_addresses_fn =
        [this]() -> absl::StatusOr<std::vector<std::string>> {
      ++address_calls_;
      return std::vector<std::string>{"127.0.0.1:1"};
    };
    return std::make_unique<Recovery>(
        options, &exchange_, ModelState(),
        [this] {
          ++loads_;
          return absl::OkStatus();
        },
        [this](const std::string& line) { lines_.push_back(line); });
  }
  std::string Lines() const {
    std::string all;
    for (const std::string& line : lines_) all += line + "\n";
    return all;
  }

  FakeExchange exchange_;
  int address_calls_ = 0;
  int loads_ = 0;
  std::vector<std::string> lines_;
};

TEST_F(RecoveryTest, SyncGoesOnFromTheVersionPulled) {
  std::unique_ptr<Recovery> recovery = Make(/*worker_id=*/0, true, 1);
  exchange_.recover_results.push_back(int64_t{12});
  absl::StatusOr<int64_t> step =
      recovery->Recover(absl::UnavailableError("shard 1 died"));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 12);
  EXPECT_EQ(recovery->recoveries(), 1);
  EXPECT_EQ(loads_, 1);
  EXPECT_EQ(address_calls_, 1);
  ASSERT_EQ(exchange_.recover_calls.size(), 1u);
  EXPECT_TRUE(exchange_.recover_calls[0].restore);  // worker 0 restores
  EXPECT_FALSE(exchange_.recover_calls[0].rejoin);
  EXPECT_LE(exchange_.recover_calls[0].timeout, absl::Seconds(5));
  ASSERT_EQ(lines_.size(), 3u) << Lines();
  EXPECT_EQ(lines_[0],
            "worker 0: step failed (UNAVAILABLE: shard 1 died); recovering "
            "(1 of at most 4)");
  EXPECT_EQ(lines_[1],
            "Restored the shards to the initial weights (no checkpoint yet)");
  EXPECT_EQ(lines_[2].rfind("worker 0: recovered in ", 0), 0u) << lines_[2];
  EXPECT_NE(lines_[2].find("going on from step 12 (version 12)"),
            std::string::npos)
      << lines_[2];
}

TEST_F(RecoveryTest, AsyncGoesOnFromEachWorkersShareOfTheVersion) {
  std::unique_ptr<Recovery> recovery = Make(/*worker_id=*/2, false, 1);
  exchange_.recover_results.push_back(int64_t{41});
  absl::StatusOr<int64_t> step =
      recovery->Recover(absl::AbortedError("barrier broken"));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);  // 41 / 4 workers
  ASSERT_EQ(exchange_.recover_calls.size(), 1u);
  EXPECT_FALSE(exchange_.recover_calls[0].restore);  // not worker 0
  // Only worker 0 says how the shards were restored.
  EXPECT_EQ(Lines().find("Restored"), std::string::npos) << Lines();
}

TEST_F(RecoveryTest, Worker0SaysTheShardsWereReopenedOrWhyNot) {
  std::unique_ptr<Recovery> recovery = Make(0, true, 2);
  exchange_.recovered_in_place = true;
  exchange_.recover_results.push_back(int64_t{7});
  ASSERT_TRUE(recovery->Recover(absl::CancelledError("gone")).ok());
  EXPECT_EQ(lines_[1],
            "Reopened the shards at their own state, version 7 (no rollback)");
  exchange_.recovered_in_place = false;
  exchange_.reopen_refusal = "shard 1 holds no state";
  exchange_.recover_results.push_back(int64_t{4});
  ASSERT_TRUE(recovery->Recover(absl::CancelledError("gone")).ok());
  EXPECT_EQ(lines_[4],
            "Restored the shards to the initial weights (no checkpoint yet) "
            "(shard 1 holds no state)");
}

TEST_F(RecoveryTest, OtherErrorsAndRecoveryOffEndTheRun) {
  std::unique_ptr<Recovery> recovery = Make(0, true, 1);
  const absl::Status internal = absl::InternalError("a bug");
  EXPECT_EQ(recovery->Recover(internal).status(), internal);
  std::unique_ptr<Recovery> off = Make(0, true, 0);
  EXPECT_FALSE(off->enabled());
  const absl::Status died = absl::UnavailableError("shard died");
  EXPECT_EQ(off->Recover(died).status(), died);
  EXPECT_TRUE(exchange_.recover_calls.empty());
  EXPECT_TRUE(lines_.empty()) << Lines();
}

TEST_F(RecoveryTest, GivesUpAfter2MaxRestartsPlus2) {
  std::unique_ptr<Recovery> recovery = Make(1, true, 1);
  for (int i = 0; i < 4; ++i) {
    exchange_.recover_results.push_back(int64_t{i});
    ASSERT_TRUE(recovery->Recover(absl::UnavailableError("died")).ok());
  }
  const absl::Status last =
      recovery->Recover(absl::UnavailableError("died")).status();
  EXPECT_TRUE(absl::IsUnavailable(last)) << last;
  EXPECT_EQ(last.message(), "gave up after 4 recoveries: died");
  EXPECT_EQ(recovery->recoveries(), 4);
}

TEST_F(RecoveryTest, AFailedReconnectIsRetriedThenANewCause) {
  std::unique_ptr<Recovery> recovery = Make(1, true, 1);
  // A stale address, then the shards back: one recovery, two attempts.
  exchange_.recover_results.push_back(absl::UnavailableError("stale"));
  exchange_.recover_results.push_back(int64_t{5});
  absl::StatusOr<int64_t> step = recovery->Recover(absl::AbortedError("x"));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_EQ(exchange_.recover_calls.size(), 2u);
  EXPECT_EQ(address_calls_, 2);
  EXPECT_EQ(recovery->recoveries(), 1);
  // A reconnect that fails for good (not a death) ends the run, naming
  // the reconnect.
  exchange_.recover_results.push_back(absl::PermissionDeniedError("no"));
  const absl::Status s = recovery->Recover(absl::AbortedError("x")).status();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(s.message(), "reconnecting to the shards for 3s: no");
}

TEST_F(RecoveryTest, ARestartedTaskRejoinsAtTheVersionsStep) {
  std::unique_ptr<Recovery> recovery = Make(3, true, 1);
  exchange_.recover_results.push_back(int64_t{9});
  std::vector<float> w(4);
  absl::StatusOr<int64_t> step = recovery->Rejoin({absl::MakeSpan(w)});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 9);
  ASSERT_EQ(exchange_.recover_calls.size(), 1u);
  EXPECT_TRUE(exchange_.recover_calls[0].rejoin);
  EXPECT_EQ(loads_, 0);  // the caller loads the weights, as after Start()
  EXPECT_EQ(recovery->recoveries(), 0);
  ASSERT_EQ(lines_.size(), 1u) << Lines();
  EXPECT_EQ(lines_[0], "worker 3 rejoined the job at step 9");
}

}  // namespace
}  // namespace pstrain
