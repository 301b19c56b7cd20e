#include "worker/fake_exchange.h"

#include <utility>

namespace pstrain {

absl::Status FakeExchange::Start(const std::vector<absl::Span<float>>&,
                                 const ModelState*) {
  started = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FakeExchange::NextRecovery(bool rejoin,
                                                   const ModelState* restore,
                                                   absl::Duration timeout) {
  recover_calls.push_back({restore != nullptr, timeout, rejoin});
  if (recover_results.empty()) {
    return absl::FailedPreconditionError("FakeExchange: no recovery scripted");
  }
  const absl::StatusOr<int64_t> result = recover_results.front();
  recover_results.pop_front();
  if (!result.ok()) return result.status();
  step_ = result.value();
  return step_;
}

absl::StatusOr<int64_t> FakeExchange::Recover(const std::vector<std::string>&,
                                              const ModelState* restore,
                                              absl::Duration timeout) {
  return NextRecovery(/*rejoin=*/false, restore, timeout);
}

absl::StatusOr<int64_t> FakeExchange::Rejoin(
    const std::vector<absl::Span<float>>&, const std::vector<std::string>&,
    const ModelState* restore, absl::Duration timeout) {
  return NextRecovery(/*rejoin=*/true, restore, timeout);
}

void FakeExchange::GradientsReady(const std::vector<absl::Span<const float>>&,
                                  int64_t, absl::Span<const int>,
                                  std::shared_ptr<CopyFence>) {
  ++gradients_ready_calls;
}

absl::Status FakeExchange::Step(
    const std::vector<absl::Span<const float>>& gradients, int64_t samples) {
  stepped.push_back(step_);
  last_stepped_ = step_;
  first_gradient.push_back(gradients.empty() || gradients[0].empty()
                               ? 0.0f
                               : gradients[0][0]);
  auto errors = step_errors.find(step_);
  if (errors != step_errors.end() && !errors->second.empty()) {
    absl::Status error = std::move(errors->second.front());
    errors->second.pop_front();
    return error;
  }
  this->samples += samples;
  return absl::OkStatus();
}

void FakeExchange::MarkStepNonFinite(const NonFiniteValue&) {
  marked_nonfinite.push_back(step_);
}

std::optional<SkippedStepInfo> FakeExchange::SkippedStep() const {
  auto skip = skips.find(last_stepped_);
  if (skip == skips.end()) return std::nullopt;
  return skip->second;
}

int64_t FakeExchange::NextStep(int64_t step) const {
  next_step_calls.push_back(step);
  auto jump = jumps.find(step);
  step_ = jump == jumps.end() ? step + 1 : jump->second;
  return step_;
}

bool FakeExchange::LastStepLate() const {
  return late_steps.count(last_stepped_) > 0;
}

absl::Status FakeExchange::BeforePause() {
  ++pauses;
  return absl::OkStatus();
}

absl::Status FakeExchange::Finish() {
  finished = true;
  return absl::OkStatus();
}

}  // namespace pstrain
