// A GradientExchange that follows a script, for the tests of the trainer's
// parts (worker/step_loop_test, worker/recovery_test): no shards, no gRPC,
// no other process. Thread-compatible.
//
// It follows the global step as a sync PS exchange sees it: Start() (or
// set_step()) sets it, NextStep(step) moves it to the step it returns, and
// a successful Recover() or Rejoin() to the version it returns. A Step()
// is of that step: it fails with the errors scripted for it (one per
// call, in order), reports the skip scripted for it, and then, after
// NextStep, LastStepLate() says whether it is scripted late.
#ifndef PSTRAIN_WORKER_FAKE_EXCHANGE_H_
#define PSTRAIN_WORKER_FAKE_EXCHANGE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/gradient_exchange.h"

namespace pstrain {

class FakeExchange : public GradientExchange {
 public:
  // The script.
  // Step() at a step fails with these errors, one per call, in order.
  std::map<int64_t, std::deque<absl::Status>> step_errors;
  // NextStep(step): the step given here (a backup worker's jump), else
  // step + 1.
  std::map<int64_t, int64_t> jumps;
  // Steps the shards drop as late (LastStepLate after them).
  std::set<int64_t> late_steps;
  // Steps skipped for a non-finite value (SkippedStep after them).
  std::map<int64_t, SkippedStepInfo> skips;
  // What Recover() and Rejoin() return, in order (used up:
  // FAILED_PRECONDITION), and what RecoveredInPlace() and ReopenRefusal()
  // say.
  std::deque<absl::StatusOr<int64_t>> recover_results;
  bool recovered_in_place = false;
  std::string reopen_refusal;
  // AwaitFinalWeights() fails with these errors, one per call, in order.
  std::deque<absl::Status> final_weights_errors;
  // What FinalWeightsShortfall() says.
  std::string final_weights_shortfall;
  // SamplesSoFar(): this, plus the samples of every successful Step().
  int64_t samples = 0;

  // What happened.
  // The step of every Step() call (failed ones included), in order.
  std::vector<int64_t> stepped;
  // Every NextStep() call's step (NextStep is const: mutable).
  mutable std::vector<int64_t> next_step_calls;
  // Recover() and Rejoin() calls: whether each had a state to restore (worker
  // 0) and how long it might wait; Rejoin() calls among them.
  struct RecoverCall {
    bool restore = false;
    absl::Duration timeout;
    bool rejoin = false;
  };
  std::vector<RecoverCall> recover_calls;
  // Steps marked non-finite (MarkStepNonFinite) and gradients announced
  // (GradientsReady calls).
  std::vector<int64_t> marked_nonfinite;
  int64_t gradients_ready_calls = 0;
  // The first value of tensor 0's gradient at each Step() call.
  std::vector<float> first_gradient;
  bool started = false;
  bool finished = false;
  int64_t final_weights_calls = 0;
  int64_t pauses = 0;

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  absl::Status Start(const std::vector<absl::Span<float>>& weights,
                     const ModelState* resume) override;
  absl::StatusOr<int64_t> Recover(const std::vector<std::string>& addresses,
                                  const ModelState* restore,
                                  absl::Duration timeout) override;
  absl::StatusOr<int64_t> Rejoin(const std::vector<absl::Span<float>>& weights,
                                 const std::vector<std::string>& addresses,
                                 const ModelState* restore,
                                 absl::Duration timeout) override;
  bool RecoveredInPlace() const override { return recovered_in_place; }
  std::string ReopenRefusal() const override { return reopen_refusal; }
  void GradientsReady(const std::vector<absl::Span<const float>>& gradients,
                      int64_t samples, absl::Span<const int> tensors,
                      std::shared_ptr<CopyFence> fence) override;
  absl::Status Step(const std::vector<absl::Span<const float>>& gradients,
                    int64_t samples) override;
  void MarkStepNonFinite(const NonFiniteValue& value) override;
  std::optional<SkippedStepInfo> SkippedStep() const override;
  int64_t NextStep(int64_t step) const override;
  bool LastStepLate() const override;
  absl::Status AwaitFinalWeights() override {
    ++final_weights_calls;
    if (final_weights_errors.empty()) return absl::OkStatus();
    absl::Status error = final_weights_errors.front();
    final_weights_errors.pop_front();
    return error;
  }
  std::string FinalWeightsShortfall() const override {
    return final_weights_shortfall;
  }
  absl::StatusOr<int64_t> SamplesSoFar() override { return samples; }
  absl::Status BeforePause() override;
  absl::Status Finish() override;

 private:
  absl::StatusOr<int64_t> NextRecovery(bool rejoin, const ModelState* restore,
                                       absl::Duration timeout);

  // The step followed (NextStep moves it), and that of the last Step().
  mutable int64_t step_ = 0;
  int64_t last_stepped_ = -1;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_FAKE_EXCHANGE_H_
