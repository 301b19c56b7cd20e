#include "worker/run_report.h"

#include <algorithm>

namespace pstrain {

RunReport::RunReport(const Options& options, absl::Time now, int64_t counter)
    : options_(options), stretch_start_(now) {
  window_start_ = now;
  window_counter_ = counter;
}

void RunReport::StepTrained(int64_t samples_per_step) {
  ++window_steps_;
  window_step_samples_ +=
      samples_per_step >= 0 ? samples_per_step : options_.samples_per_step;
}

int64_t RunReport::WindowSamples(int64_t counter) const {
  if (options_.count_on_worker) {
    return window_step_samples_;
  }
  return std::max<int64_t>(0, counter - window_counter_);
}

void RunReport::NewWindow(absl::Time now, int64_t counter) {
  window_start_ = now;
  window_counter_ = counter;
  window_steps_ = 0;
  window_step_samples_ = 0;
}

std::optional<double> RunReport::TakeWindowSamplesPerSec(absl::Time now,
                                                         int64_t counter) {
  const int64_t samples = WindowSamples(counter);
  if (!options_.count_on_worker && samples == 0) {
    window_counter_ = std::min(window_counter_, counter);
    return std::nullopt;
  }
  const double seconds = absl::ToDoubleSeconds(now - window_start_);
  closed_samples_ += samples;
  NewWindow(now, counter);
  return seconds > 0 ? samples / seconds : 0;
}

void RunReport::Recovered(absl::Time now, int64_t counter) {
  // Counting on the worker, the window goes on. Shard 0's counter: the
  // samples since the window's start cannot be read any more.
  if (!options_.count_on_worker) NewWindow(now, counter);
}

void RunReport::Pause(absl::Time now) {
  if (paused_) return;
  trained_ += now - stretch_start_;
  paused_ = true;
}

void RunReport::Resume(absl::Time now, int64_t counter) {
  if (paused_) {
    stretch_start_ = now;
    paused_ = false;
  }
  closed_samples_ += WindowSamples(counter);
  NewWindow(now, counter);
}

double RunReport::TakeEpochSeconds(absl::Time now) {
  const double total = training_seconds(now);
  const double epoch = total - epoch_end_seconds_;
  epoch_end_seconds_ = total;
  return epoch;
}

double RunReport::training_seconds(absl::Time now) const {
  const absl::Duration t =
      paused_ ? trained_ : trained_ + (now - stretch_start_);
  return absl::ToDoubleSeconds(t);
}

int64_t RunReport::samples(int64_t counter) const {
  return closed_samples_ + WindowSamples(counter);
}

}  // namespace pstrain
