// The step loop against a scripted exchange (worker/fake_exchange.h) and a
// compute that records the batches it trains: no gRPC, no processes. The
// recovery, checkpoint schedule and reporter are the real parts.
#include "worker/step_loop.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/fake_exchange.h"

namespace pstrain {
namespace {

constexpr int64_t kStepsPerEpoch = 4;
constexpr int kEpochs = 3;  // steps 0 to 11; the run ends at step 12
constexpr int kBatchSize = 8;
constexpr int kWorkers = 2;

// Records, for every Step(), the global step whose batch it trains
// (epoch x steps per epoch + the batch's index in the epoch).
class FakeCompute : public StepCompute {
 public:
  FakeCompute() : gradient_(4, 0.5f) {
    gradients_.push_back(absl::MakeConstSpan(gradient_));
  }
  const std::vector<absl::Span<const float>>& gradients() override {
    return gradients_;
  }
  void BeginEpoch(const EpochSlice& slice) override {
    epochs_begun.push_back(slice.epoch);
    epoch_ = slice.epoch;
    index_ = slice.offset / (int64_t{slice.members} * kBatchSize);
  }
  void SkipBatches(int64_t n) override { index_ += n; }
  absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) override {
    gradient_[0] = 0.5f;
    const int64_t batch = epoch_ * kStepsPerEpoch + index_;
    batches.push_back(batch);
    ++index_;
    const int tensor = 0;
    on_ready(absl::MakeConstSpan(&tensor, 1), nullptr);
    auto loss = losses.find(batch);
    return loss == losses.end() ? 1.0f : loss->second;
  }
  absl::Status LoadWeights() override {
    ++loads;
    return absl::OkStatus();
  }
  void SetLossScale(float scale) override { scales.push_back(scale); }

  std::map<int64_t, float> losses;  // by batch; otherwise 1
  std::vector<float> scales;        // SetLossScale's, in order
  std::vector<int64_t> batches;
  std::vector<int> epochs_begun;
  int loads = 0;

 private:
  std::vector<float> gradient_;
  std::vector<absl::Span<const float>> gradients_;
  int epoch_ = 0;
  int64_t index_ = 0;
};

struct EpochEnd {
  int epoch;
  int64_t step;
  double train_loss;
};

class StepLoopTest : public ::testing::Test {
 protected:
  // Runs the loop from `start` with the settings below; its status.
  absl::Status Run(int64_t start = 0) {
    exchange_.set_step(start);
    RecoveryOptions recovery_options;
    recovery_options.worker_id = 0;
    recovery_options.num_workers = kWorkers;
    recovery_options.max_restarts = 2;
    recovery_options.init_timeout = absl::Seconds(2);
    recovery_ = std::make_unique<Recovery>(
        recovery_options, &exchange_, ModelState(),
        [this] { return compute_.LoadWeights(); }, Say());
    schedule_ = std::make_unique<CheckpointSchedule>(
        CheckpointSchedule::Options{checkpoint_every_steps_, 0}, positions_,
        [this](int64_t step, const DataPosition& position) {
          checkpoints_.push_back(step);
          checkpoint_positions_.push_back(position);
          return absl::OkStatus();
        },
        absl::Now());
    Reporter::Options report;
    report.worker_id = 0;
    report.num_workers = kWorkers;
    report.backup_workers = backup_workers_;
    report.batch_size = kBatchSize;
    report.log_every_steps = log_every_steps_;
    report.total_steps = positions_.total_steps();
    report.count_on_worker = true;
    report.metrics_dir = metrics_dir_;
    report.say = Say();
    absl::StatusOr<std::unique_ptr<Reporter>> reporter =
        Reporter::Create(report, &exchange_, &result_);
    if (!reporter.ok()) return reporter.status();
    reporter_ = *std::move(reporter);
    StepLoop::Options options;
    options.worker_id = 0;
    options.batch_size = kBatchSize;
    options.max_nonfinite_steps = max_nonfinite_steps_;
    options.tensor_names = {"w"};
    options.inject_nonfinite = inject_;
    options.record_samples_dir = record_samples_dir_;
    StepLoop::Parts parts;
    parts.compute = &compute_;
    parts.exchange = &exchange_;
    parts.recovery = recovery_.get();
    parts.checkpoints = schedule_.get();
    parts.reporter = reporter_.get();
    parts.loss_scaler = loss_scaler_;
    parts.end_epoch = [this](int epoch, int64_t step, double train_seconds,
                             double train_loss) {
      epoch_ends_.push_back({epoch, step, train_loss});
      if (epoch == 1 && failed_evaluations_ > 0) {
        --failed_evaluations_;
        return absl::UnavailableError("shard 0 died");
      }
      Reporter::EpochEvaluation evaluation;
      evaluation.epoch = epoch;
      evaluation.step = step;
      evaluation.train_seconds = train_seconds;
      evaluation.train_loss = train_loss;
      evaluation.test_accuracy = 0.5;
      reporter_->PauseTraining();
      if (absl::Status s = reporter_->Evaluated(evaluation); !s.ok()) return s;
      return reporter_->ResumeTraining();
    };
    loop_ = std::make_unique<StepLoop>(options, positions_, std::move(parts));
    const absl::Status run = loop_->Run(start);
    if (!run.ok()) return run;
    return reporter_->Finish(loop_->step(), reporter_->TrainingSeconds());
  }

  LineFn Say() {
    return [this](const std::string& line) { lines_.push_back(line); };
  }
  // The console lines that begin with `prefix`.
  std::vector<std::string> LinesStarting(const std::string& prefix) const {
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.rfind(prefix, 0) == 0) found.push_back(line);
    }
    return found;
  }
  // Worker 0's "StepN: ..." lines: their steps.
  std::vector<int64_t> StepLines() const {
    std::vector<int64_t> steps;
    for (const std::string& line : LinesStarting("Step")) {
      steps.push_back(std::stoll(line.substr(4, line.find(':') - 4)));
    }
    return steps;
  }
  // Runs the loop with PSTRAIN_RECORD_SAMPLES's record: the steps of its
  // lines, in order.
  std::vector<int64_t> RecordedSteps() {
    record_samples_dir_ = ::testing::TempDir() + "/records";
    EXPECT_EQ(std::system(("rm -rf " + record_samples_dir_ + " && mkdir -p " +
                           record_samples_dir_)
                              .c_str()),
              0);
    EXPECT_TRUE(Run().ok());
    std::ifstream in(record_samples_dir_ + "/samples-0.txt");
    std::vector<int64_t> steps;
    for (std::string line; std::getline(in, line);) {
      const std::vector<std::string> fields = absl::StrSplit(line, ' ');
      steps.push_back(std::stoll(fields.at(1)));
    }
    return steps;
  }
  std::vector<int> EndedEpochs() const {
    std::vector<int> epochs;
    for (const EpochEnd& e : epoch_ends_) epochs.push_back(e.epoch);
    return epochs;
  }
  // Steps trained: the samples of every worker RunReport counted.
  int64_t StepsCounted() const {
    return reporter_->run_report().samples(0) / (kWorkers * kBatchSize);
  }
  static std::vector<int64_t> Steps(int64_t from, int64_t to) {
    std::vector<int64_t> steps;
    for (int64_t s = from; s < to; ++s) steps.push_back(s);
    return steps;
  }
  static std::vector<int64_t> Join(std::vector<int64_t> a,
                                   const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // No dataset: epochs of kStepsPerEpoch steps (max_steps_per_epoch).
  const DataPositions positions_{/*samples_per_epoch=*/0,
                                 kStepsPerEpoch,
                                 kEpochs,
                                 /*seed=*/1,
                                 kBatchSize,
                                 kWorkers};
  int64_t checkpoint_every_steps_ = 3;
  int log_every_steps_ = 4;
  int backup_workers_ = 0;
  int max_nonfinite_steps_ = 10;
  // Evaluations after epoch 1 that fail.
  int failed_evaluations_ = 0;
  LossScaler* loss_scaler_ = nullptr;
  NonFiniteInjection inject_;
  std::string metrics_dir_;
  std::string record_samples_dir_;

  FakeCompute compute_;
  FakeExchange exchange_;
  RunResult result_;
  std::unique_ptr<Recovery> recovery_;
  std::unique_ptr<CheckpointSchedule> schedule_;
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<StepLoop> loop_;
  std::vector<std::string> lines_;
  std::vector<int64_t> checkpoints_;
  std::vector<DataPosition> checkpoint_positions_;
  std::vector<EpochEnd> epoch_ends_;
};

TEST_F(StepLoopTest, TrainsEveryStepOnItsBatch) {
  ASSERT_TRUE(Run().ok());
  EXPECT_TRUE(LinesStarting("worker 0: the final weights").empty());
  EXPECT_EQ(exchange_.stepped, Steps(0, 12));
  EXPECT_EQ(compute_.batches, Steps(0, 12));
  EXPECT_EQ(exchange_.next_step_calls, Steps(0, 12));
  EXPECT_EQ(compute_.epochs_begun, (std::vector<int>{0, 1, 2}));
  // Each step's pulled weights, and the final ones (AwaitFinalWeights).
  EXPECT_EQ(compute_.loads, 13);
  EXPECT_EQ(exchange_.final_weights_calls, 1);
  EXPECT_EQ(exchange_.gradients_ready_calls, 12);
  EXPECT_EQ(loop_->step(), 12);
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(epoch_ends_[1].step, 8);
  EXPECT_DOUBLE_EQ(epoch_ends_[1].train_loss, 1.0);
  EXPECT_EQ(StepLines(), (std::vector<int64_t>{4, 8, 12}));
  EXPECT_EQ(LinesStarting("Epoch ").size(), 3u);
  EXPECT_EQ(StepsCounted(), 12);
  EXPECT_EQ(reporter_->timed_steps(), 11);  // step 0 is warm-up
  EXPECT_EQ(result_.steps(), 12);
  EXPECT_EQ(result_.epoch_results_size(), 3);
  EXPECT_EQ(exchange_.recover_calls.size(), 0u);
}

TEST_F(StepLoopTest, ACheckpointIsOfTheNextStepAndNeverOfTheLast) {
  checkpoint_every_steps_ = 4;
  ASSERT_TRUE(Run().ok());
  // Step 12 is a multiple of 4, but the run ends there.
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{4, 8}));
  ASSERT_EQ(checkpoint_positions_.size(), 2u);
  EXPECT_EQ(checkpoint_positions_[0].epoch, 1);
  EXPECT_EQ(checkpoint_positions_[0].step_in_epoch, 0);
  EXPECT_EQ(checkpoint_positions_[1].epoch, 2);
  EXPECT_EQ(checkpoint_positions_[1].steps_per_epoch, kStepsPerEpoch);
  EXPECT_EQ(checkpoint_positions_[1].num_workers, kWorkers);
}

// A recovery that goes on at the failed step with its batch (the shards
// reopened, or moved to another layout): the gradients computed are
// exchanged again, not computed anew.
TEST_F(StepLoopTest, AFailedStepRecoversAndIsExchangedAgain) {
  exchange_.step_errors[5].push_back(absl::UnavailableError("shard 1 died"));
  exchange_.recover_results.push_back(int64_t{5});  // reopened: no rollback
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 6), Steps(5, 12)));
  // Every batch computed once.
  EXPECT_EQ(compute_.batches, Steps(0, 12));
  // Epoch 1 goes on after step 5's batch.
  EXPECT_EQ(compute_.epochs_begun, (std::vector<int>{0, 1, 1, 2}));
  EXPECT_EQ(LinesStarting("worker 0: step 5 exchanged again with the "
                          "gradients computed before the recovery")
                .size(),
            1u);
  EXPECT_EQ(exchange_.recover_calls.size(), 1u);
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(StepsCounted(), 12);
  EXPECT_EQ(loop_->step(), 12);
}

// An exchange that fails again is recovered from as any; the step is then
// computed anew.
TEST_F(StepLoopTest, AStepWhoseSecondExchangeFailsIsRedone) {
  exchange_.step_errors[5].push_back(absl::UnavailableError("shard 1 died"));
  exchange_.step_errors[5].push_back(absl::UnavailableError("again"));
  exchange_.recover_results.push_back(int64_t{5});
  exchange_.recover_results.push_back(int64_t{5});
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 6), Join({5}, Steps(5, 12))));
  EXPECT_EQ(compute_.batches, Join(Steps(0, 6), Steps(5, 12)));
  EXPECT_EQ(exchange_.recover_calls.size(), 2u);
  // The second exchange's failure is not counted.
  EXPECT_EQ(recovery_->recoveries(), 1);
  EXPECT_EQ(LinesStarting("worker 0: step failed (UNAVAILABLE: again); "
                          "recovering (its second exchange: not counted)")
                .size(),
            1u);
  EXPECT_EQ(StepsCounted(), 12);
}

// The epoch's last step is computed anew after a recovery (its exchange
// is followed by the epoch's end, which the epoch loop runs).
TEST_F(StepLoopTest, AFailedStepRecoversAndIsRedone) {
  exchange_.step_errors[7].push_back(absl::UnavailableError("shard 1 died"));
  exchange_.recover_results.push_back(int64_t{7});  // reopened: no rollback
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 8), Steps(7, 12)));
  // The failed step computed its batch; the redone step the same batch.
  EXPECT_EQ(compute_.batches, Join(Steps(0, 8), Steps(7, 12)));
  // Epoch 1 begins again, at step 7's batch.
  EXPECT_EQ(compute_.epochs_begun, (std::vector<int>{0, 1, 1, 2}));
  EXPECT_EQ(exchange_.recover_calls.size(), 1u);
  EXPECT_EQ(recovery_->recoveries(), 1);
  EXPECT_EQ(LinesStarting("worker 0: step failed (UNAVAILABLE: shard 1 "
                          "died); recovering (1 of at most 6)")
                .size(),
            1u);
  EXPECT_EQ(LinesStarting("worker 0: recovered in ").size(), 1u);
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(StepsCounted(), 12);  // the failed step is not counted
  EXPECT_EQ(loop_->step(), 12);
}

// PSTRAIN_RECORD_SAMPLES: a step whose exchange failed is recorded once,
// when the recovery goes on past it (the shards applied it: a membership
// change reopened them while this worker pulled) or when it is redone.
TEST_F(StepLoopTest, ARecordedStepTheRecoveryWentPastIsWrittenOnce) {
  exchange_.step_errors[5].push_back(absl::UnavailableError("reopened"));
  exchange_.recover_results.push_back(int64_t{6});
  EXPECT_EQ(RecordedSteps(), Steps(0, 12));
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 6), Steps(6, 12)));
}

TEST_F(StepLoopTest, ARecordedStepThatIsRedoneIsWrittenOnce) {
  exchange_.step_errors[5].push_back(absl::UnavailableError("shard 1 died"));
  exchange_.recover_results.push_back(int64_t{5});
  EXPECT_EQ(RecordedSteps(), Steps(0, 12));
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 6), Steps(5, 12)));
}

// With staleness a step's exchange returns before the shards decide it;
// a reopen (a membership change) or a rollback to an earlier step undoes
// the steps from there, so their lines go, and the redone steps write
// theirs once.
TEST_F(StepLoopTest, RecordedStepsARecoveryUndidAreDropped) {
  exchange_.step_errors[7].push_back(absl::AbortedError("reopened"));
  exchange_.recover_results.push_back(int64_t{5});
  EXPECT_EQ(RecordedSteps(), Steps(0, 12));
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 8), Steps(5, 12)));
}

TEST_F(StepLoopTest, ARollbackGoesBackToTheRecoveredStepsEpoch) {
  exchange_.step_errors[7].push_back(absl::AbortedError("barrier broken"));
  // Restored to the checkpoint of step 3, in epoch 0.
  exchange_.recover_results.push_back(int64_t{3});
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 8), Steps(3, 12)));
  EXPECT_EQ(compute_.batches, Join(Steps(0, 8), Steps(3, 12)));
  EXPECT_EQ(compute_.epochs_begun, (std::vector<int>{0, 1, 0, 1, 2}));
  // Epoch 0 ends again after its redone step 3.
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 0, 1, 2}));
  EXPECT_EQ(epoch_ends_[1].step, 4);
  // The checkpoint of step 6 is written again on the way.
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{3, 6, 6, 9}));
  // Redone steps are trained samples; the failed one is not.
  EXPECT_EQ(StepsCounted(), 7 + 9);
  EXPECT_EQ(reporter_->timed_steps(), 7 + 9 - 1);
  EXPECT_EQ(StepLines(), (std::vector<int64_t>{4, 4, 8, 12}));
  EXPECT_EQ(result_.steps(), 12);
}

TEST_F(StepLoopTest, AFailedEvaluationIsRecoveredFrom) {
  // The evaluation after epoch 1 fails (a shard died); the job goes back
  // to step 6.
  failed_evaluations_ = 1;
  exchange_.recover_results.push_back(int64_t{6});
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 8), Steps(6, 12)));
  EXPECT_EQ(compute_.batches, Join(Steps(0, 8), Steps(6, 12)));
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 1, 2}));
  // The failed evaluation recorded nothing.
  EXPECT_EQ(result_.epoch_results_size(), 3);
  EXPECT_EQ(LinesStarting("Epoch ").size(), 3u);
  EXPECT_EQ(StepsCounted(), 8 + 6);
  EXPECT_EQ(loop_->step(), 12);
}

// The final weights' pull fails (a shard died) and the recovery lands on
// the last step (every step decided): the job ends again, with the final
// weights and the last evaluation, and redoes no step.
TEST_F(StepLoopTest, AFailedFinalPullThatRecoversAtTheEndEndsTheJobAgain) {
  exchange_.final_weights_errors.push_back(
      absl::UnavailableError("shard 1 died"));
  exchange_.recover_results.push_back(int64_t{12});
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Steps(0, 12));
  EXPECT_EQ(exchange_.final_weights_calls, 2);
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(compute_.loads, 12 + 1 + 1);  // the recovery's, the final one
  EXPECT_EQ(loop_->step(), 12);
}

// Final weights that may lack a member's pushes (async: no push for the
// init timeout) are still the job's end, with the exchange's word in the
// log.
TEST_F(StepLoopTest, FinalWeightsThatLackPushesAreSaidAndEndTheJob) {
  exchange_.final_weights_shortfall =
      "the final weights: worker(s) 1 had not ended their last step";
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(LinesStarting("worker 0: the final weights: worker(s) 1 had not "
                          "ended their last step")
                .size(),
            1u);
  EXPECT_EQ(EndedEpochs(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(compute_.loads, 13);
}

TEST_F(StepLoopTest, TheLastStepEndsTheRunWithItsRow) {
  metrics_dir_ = ::testing::TempDir() + "/step_loop_last_step";
  log_every_steps_ = 5;
  checkpoint_every_steps_ = 6;
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped.back(), 11);
  EXPECT_EQ(exchange_.next_step_calls.back(), 11);
  EXPECT_EQ(loop_->step(), 12);
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{6}));
  EXPECT_EQ(StepLines(), (std::vector<int64_t>{5, 10}));
  // Rows: steps 5 and 10 (log_every_steps), 12 (the run's last step, not
  // a multiple), and an evaluation row per epoch.
  std::ifstream csv(metrics_dir_ + "/worker0.csv");
  std::string line;
  std::vector<std::string> rows;
  std::getline(csv, line);  // header
  while (std::getline(csv, line)) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_GT(cells.size(), 4u) << line;
    rows.push_back(absl::StrCat(cells[0], cells[4].empty() ? "e" : "i"));
  }
  EXPECT_EQ(rows,
            (std::vector<std::string>{"4e", "5i", "8e", "10i", "12i", "12e"}));
}

TEST_F(StepLoopTest, ABackupWorkersJumpCheckpointsTheStepItLandsOn) {
  checkpoint_every_steps_ = 4;
  backup_workers_ = 1;
  // Left behind at step 2: the shards went on without this worker; it
  // goes on at their step 5 (steps 3 and 4 without it, over multiple 4).
  exchange_.jumps[2] = 5;
  exchange_.late_steps.insert(2);
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(exchange_.stepped, Join(Steps(0, 3), Steps(5, 12)));
  // Batches 3 and 4 skipped: step 5 trains its own batch.
  EXPECT_EQ(compute_.batches, Join(Steps(0, 3), Steps(5, 12)));
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{5, 8}));
  ASSERT_GE(checkpoint_positions_.size(), 1u);
  EXPECT_EQ(checkpoint_positions_[0].epoch, 1);
  EXPECT_EQ(checkpoint_positions_[0].step_in_epoch, 1);
  EXPECT_EQ(reporter_->late_steps(), 1);
  EXPECT_EQ(LinesStarting("worker 0: 1 steps ended late (their gradients "
                          "dropped: 1 of 2 workers per step)")
                .size(),
            1u);
  // Step 4 was jumped over: the line of the step it landed on instead.
  EXPECT_EQ(StepLines(), (std::vector<int64_t>{5, 8, 12}));
  EXPECT_EQ(StepsCounted(), 10);
  EXPECT_EQ(loop_->step(), 12);
}

TEST_F(StepLoopTest, AJumpWithinAnEpochOverAMultiple) {
  checkpoint_every_steps_ = 3;
  exchange_.jumps[4] = 7;  // steps 5 and 6 without this worker
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(compute_.batches, Join(Steps(0, 5), Steps(7, 12)));
  EXPECT_EQ(checkpoints_, (std::vector<int64_t>{3, 7, 9}));
  EXPECT_EQ(checkpoint_positions_[1].epoch, 1);
  EXPECT_EQ(checkpoint_positions_[1].step_in_epoch, 3);
}

TEST_F(StepLoopTest, SkippedStepsAreReportedAndTooManyEndTheRun) {
  max_nonfinite_steps_ = 1;
  SkippedStepInfo skip;
  skip.worker_id = 0;
  skip.nonfinite.param_id = 0;
  skip.nonfinite.element = 2;
  skip.nonfinite.value = "nan";
  skip.step = 1;
  exchange_.skips[1] = skip;
  skip.step = 3;
  exchange_.skips[3] = skip;
  skip.step = 4;
  exchange_.skips[4] = skip;
  compute_.losses[2] = std::nanf("");
  inject_.worker = 0;
  inject_.steps = {1};
  const absl::Status s = Run();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(s.message(),
            "2 consecutive steps skipped for non-finite values "
            "(--max_nonfinite_steps=1); the last: step 4: worker 0's "
            "element 2 of the gradient of w is nan");
  EXPECT_EQ(LinesStarting("worker 0: step 1: worker 0's element 2 of the "
                          "gradient of w is nan; the step is skipped on every "
                          "shard (1 in a row; at most 1)")
                .size(),
            1u);
  EXPECT_EQ(LinesStarting("worker 0: step 4: ").size(), 1u);
  // Not a task's death: no recovery.
  EXPECT_TRUE(exchange_.recover_calls.empty());
  EXPECT_EQ(exchange_.stepped, Steps(0, 5));
  // The NaN loss of step 2 went to the exchange; the injected NaN of step
  // 1 into the gradient of parameter 0.
  EXPECT_EQ(exchange_.marked_nonfinite, (std::vector<int64_t>{2}));
  ASSERT_EQ(exchange_.first_gradient.size(), 5u);
  EXPECT_TRUE(std::isnan(exchange_.first_gradient[1]));
  EXPECT_FALSE(std::isnan(exchange_.first_gradient[0]));
  EXPECT_FALSE(std::isnan(exchange_.first_gradient[2]));
}

// fp16 (issue 38): each step computes at the scaler's scale, and a step
// the exchange skipped halves it for the next (GradScaler's backoff).
TEST_F(StepLoopTest, ALossScalerBacksOffAfterEachSkippedStep) {
  LossScaler scaler;
  loss_scaler_ = &scaler;
  SkippedStepInfo skip;
  skip.worker_id = 1;
  skip.nonfinite.value = "inf";
  for (int64_t step : {1, 2, 5}) {
    skip.step = step;
    exchange_.skips[step] = skip;
  }
  ASSERT_TRUE(Run().ok());
  ASSERT_GE(compute_.scales.size(), 7u);
  EXPECT_EQ(
      std::vector<float>(compute_.scales.begin(), compute_.scales.begin() + 7),
      (std::vector<float>{65536, 65536, 32768, 16384, 16384, 16384, 8192}));
  EXPECT_EQ(scaler.scale(), 8192.0f);
  EXPECT_EQ(scaler.state().growth_tracker,
            static_cast<int64_t>(compute_.scales.size()) - 6);
}

TEST(NonFiniteInjectionTest, Parses) {
  absl::StatusOr<NonFiniteInjection> none = ParseNonFiniteInjection(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->At(0, 0));
  absl::StatusOr<NonFiniteInjection> some = ParseNonFiniteInjection("1:3,5");
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some->At(1, 5));
  EXPECT_FALSE(some->At(1, 4));
  EXPECT_FALSE(some->At(0, 5));
  absl::StatusOr<NonFiniteInjection> all = ParseNonFiniteInjection("0:all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->At(0, 123));
  EXPECT_FALSE(ParseNonFiniteInjection("x:1").ok());
  EXPECT_FALSE(ParseNonFiniteInjection("1:-2").ok());
}

}  // namespace
}  // namespace pstrain
