// CheckpointWriter's schedule against cuts that shard 0 picks (backup
// workers): a cut ahead of worker 0's step is not waited for by a later
// Begin() on the training thread (worker 0's own residual file of the cut
// is written there), and a cut at or past the job's end takes no
// checkpoint. The exchange is a script (FakeExchange) whose checkpoint
// wait ends only once "worker 0's residual" is written, as PsExchange's
// does (worker/residual_files.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "optim/loss_scaler.h"
#include "worker/checkpoint.h"
#include "worker/fake_exchange.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

// Shard 0's picks: Checkpoint(!wait) at worker 0's step answers `cut`
// (at least the step), or OUT_OF_RANGE at or past end_step; Checkpoint(
// wait) ends once `residual_written` is notified (else DEADLINE_EXCEEDED
// after 3 s, as the residual wait gives up).
class PickingExchange : public FakeExchange {
 public:
  int64_t cut = 0;
  absl::Notification residual_written;
  std::vector<int64_t> asked;  // the step of every Checkpoint(!wait)

  absl::StatusOr<std::vector<CheckpointResponse>> Checkpoint(
      int64_t step, int64_t end_step, int64_t /*latest_step*/,
      const std::string& step_dir, bool wait) override {
    CheckpointResponse reply;
    if (!wait) {
      asked.push_back(step);
      const int64_t picked = std::max(step, cut);
      if (end_step > 0 && picked >= end_step) {
        return absl::OutOfRangeError(
            absl::StrCat("cut ", picked, " at or past the end ", end_step));
      }
      reply.set_step(picked);
      return std::vector<CheckpointResponse>{reply};
    }
    if (!residual_written.WaitForNotificationWithTimeout(absl::Seconds(3))) {
      return absl::DeadlineExceededError(absl::StrCat(
          step_dir, ": no residual file of step ", step, " from worker(s) 0"));
    }
    reply.set_step(step);
    reply.set_size_bytes(64);  // what a manifest accepts; no file is read
    return std::vector<CheckpointResponse>{reply};
  }
};

class CheckpointWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* root = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(
        root != nullptr ? root : "/tmp", "/checkpoint_writer_test_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    CheckpointJobInfo job;
    job.model = "synthetic";
    job.dataset = "synthetic";
    job.num_shards = 1;
    job.partition_bytes = 1 << 20;
    job.tensor_names = {"w"};
    job.tensor_shapes = {{4}};
    writer_ = std::make_unique<CheckpointWriter>(
        dir_, /*keep=*/3, job, &exchange_,
        [](const std::vector<absl::Span<float>>&, const std::string& path,
           int64_t, const safetensors::WriteOptions&)
            -> absl::StatusOr<safetensors::WriteResult> {
          std::FILE* f = std::fopen(path.c_str(), "wb");
          if (f == nullptr) return absl::InternalError(path);
          std::fclose(f);
          safetensors::WriteResult written;
          written.size_bytes = 64;
          return written;
        });
  }

  DataPosition At(int64_t step) const {
    DataPosition p;
    p.steps_per_epoch = 100;
    p.epoch = step / 100;
    p.step_in_epoch = step % 100;
    p.batch_size = 8;
    p.num_workers = 2;
    return p;
  }

  std::string dir_;
  PickingExchange exchange_;
  std::vector<float> w_ = {1, 2, 3, 4};
  std::vector<absl::Span<float>> weights_ = {absl::MakeSpan(w_)};
  std::unique_ptr<CheckpointWriter> writer_;
};

TEST_F(CheckpointWriterTest, ACutAheadOfTheStepIsNotWaitedForByTheNextBegin) {
  // Worker 0 asks at step 350; the others are at 401.
  exchange_.cut = 401;
  ASSERT_TRUE(writer_->Begin(350, /*end_step=*/600, At(350), weights_).ok());
  EXPECT_EQ(writer_->begun_step(), 401);
  EXPECT_TRUE(fs::exists(CheckpointStepDir(dir_, 401)));
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir_, 350)));
  // Its step jumps to 400 (a multiple of the interval, before the cut):
  // the checkpoint of 401 in flight stands for it, at once.
  const absl::Time before = absl::Now();
  ASSERT_TRUE(writer_->Begin(400, 600, At(400), weights_).ok());
  EXPECT_LT(absl::Now() - before, absl::Seconds(1));
  EXPECT_EQ(writer_->begun_step(), 401);
  EXPECT_EQ(exchange_.asked, std::vector<int64_t>({350}));
  EXPECT_TRUE(writer_->InFlight());
  // Once its step reaches the cut its residual is written, and the
  // checkpoint becomes the latest.
  exchange_.residual_written.Notify();
  ASSERT_TRUE(writer_->Wait().ok());
  EXPECT_EQ(writer_->completed(), 1);
  EXPECT_EQ(writer_->latest_path(), CheckpointStepDir(dir_, 401));
  // The next due step, past the cut, begins a checkpoint of its own.
  ASSERT_TRUE(writer_->Begin(450, 600, At(450), weights_).ok());
  EXPECT_EQ(writer_->begun_step(), 450);
  ASSERT_TRUE(writer_->Wait().ok());
}

TEST_F(CheckpointWriterTest, TheLossScaleAtBeginIsInTheManifest) {
  exchange_.residual_written.Notify();
  // No scaler (fp32, bf16): no "loss_scaler".
  ASSERT_TRUE(writer_->Begin(100, 600, At(100), weights_).ok());
  ASSERT_TRUE(writer_->Wait().ok());
  absl::StatusOr<CheckpointManifest> m = ReadLatestCheckpoint(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->loss_scaler.has_value());
  // fp16: the state when Begin() ran, not what the scaler holds later.
  LossScaler::Options options;
  options.growth_interval = 3;
  LossScaler scaler(options);
  scaler.Update(/*skipped=*/true);  // 32768
  scaler.Update(false);
  scaler.Update(false);  // 2 good steps since the back-off
  writer_->set_loss_scaler(&scaler);
  ASSERT_TRUE(writer_->Begin(200, 600, At(200), weights_).ok());
  scaler.Update(false);  // grows to 65536 while the checkpoint is written
  ASSERT_TRUE(writer_->Wait().ok());
  m = ReadLatestCheckpoint(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->loss_scaler.has_value());
  EXPECT_EQ(m->loss_scaler->scale, 32768.0f);
  EXPECT_EQ(m->loss_scaler->growth_tracker, 2);
  EXPECT_EQ(scaler.scale(), 65536.0f);
}

TEST_F(CheckpointWriterTest, ACutAtTheJobsEndIsNoCheckpoint) {
  // The other workers ended every step while worker 0 fell behind.
  exchange_.cut = 600;
  exchange_.residual_written.Notify();
  ASSERT_TRUE(writer_->Begin(550, /*end_step=*/600, At(550), weights_).ok());
  EXPECT_EQ(writer_->begun_step(), -1);
  EXPECT_FALSE(writer_->InFlight());
  EXPECT_TRUE(writer_->Wait().ok());
  EXPECT_EQ(writer_->completed(), 0);
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir_, 550)));
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir_, 600)));
}

}  // namespace
}  // namespace pstrain
