#include "worker/reporter.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/trace.h"

namespace pstrain {
namespace {

RunReport::Options RunReportOptions(const Reporter::Options& options) {
  RunReport::Options report;
  report.count_on_worker = options.count_on_worker;
  report.samples_per_step = int64_t{options.num_workers} * options.batch_size;
  report.checkpoints_before = options.checkpoints_before;
  return report;
}

}  // namespace

LineFn ConsoleLines(std::function<void(const std::string&)> log_line) {
  if (log_line) return log_line;
  return [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
}

absl::StatusOr<std::unique_ptr<Reporter>> Reporter::Create(
    const Options& options, GradientExchange* exchange, RunResult* result) {
  int64_t samples_at_start = 0;
  if (options.worker_id == 0 && !options.count_on_worker) {
    ASSIGN_OR_RETURN(samples_at_start, exchange->SamplesSoFar());
  }
  auto reporter = absl::WrapUnique(
      new Reporter(options, exchange, result, samples_at_start));
  if (!options.metrics_dir.empty()) {
    ASSIGN_OR_RETURN(
        reporter->metrics_,
        MetricsWriter::Create(options.metrics_dir, options.worker_id,
                              options.append_metrics));
  }
  return reporter;
}

Reporter::Reporter(const Options& options, GradientExchange* exchange,
                   RunResult* result, int64_t samples_at_start)
    : options_(options),
      exchange_(exchange),
      result_(result),
      report_(RunReportOptions(options), absl::Now(), samples_at_start),
      step_metrics_(options.batch_size, options.adam.lr),
      epoch_start_(absl::Now()) {}

absl::StatusOr<int64_t> Reporter::ShardSamples() const {
  if (!chief() || options_.count_on_worker) return 0;
  return exchange_->SamplesSoFar();
}

void Reporter::EpochBegan() { epoch_start_ = absl::Now(); }

void Reporter::TraceExchange(int64_t step, absl::Time computed,
                             absl::Time exchanged) {
  trace::Complete("exchange", "step", absl::ToUnixMicros(computed),
                  absl::ToUnixMicros(exchanged), {{"step", step}});
}

void Reporter::StepExchanged(const StepTimes& times) {
  last_members_ = times.members;
  const absl::Duration compute = times.computed - times.start;
  const absl::Duration exchange = times.exchanged - times.computed;
  step_metrics_.AddStep(times.loss, compute, exchange, times.phases);
  // The first step (connections, first allocations) is warm-up.
  if (times.step > 0 || options_.total_steps == 1) {
    compute_time_ += compute;
    exchange_time_ += exchange;
    ++timed_steps_;
    if (times.phases.bytes_pushed.has_value()) {
      bytes_pushed_ += static_cast<double>(*times.phases.bytes_pushed);
      bytes_pulled_ +=
          static_cast<double>(times.phases.bytes_pulled.value_or(0));
      ++byte_steps_;
    }
  }
  if (times.late) ++late_steps_;
}

absl::Status Reporter::StepEnded(int64_t trained, int64_t next, int epoch,
                                 int64_t index) {
  report_.StepTrained(
      last_members_ > 0 ? int64_t{last_members_} * options_.batch_size : -1);
  if (options_.on_progress) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start_);
    options_.on_progress(
        next, options_.batch_size * (index + 1) / std::max(seconds, 1e-9));
  }
  const bool log_step =
      options_.log_every_steps > 0 && next > trained &&
      next / options_.log_every_steps > trained / options_.log_every_steps;
  if (!log_step && (metrics_ == nullptr || next != options_.total_steps)) {
    return absl::OkStatus();
  }
  MetricsRow row = step_metrics_.TakeInterval(next, epoch);
  // The scheduled lr of the interval's last update, as StepMetrics keeps a
  // float's decimal.
  row.lr = std::stod(absl::StrFormat(
      "%.7g", static_cast<float>(ScheduledLr(options_.adam, next - 1))));
  if (chief() && log_step) {
    ASSIGN_OR_RETURN(const int64_t samples, ShardSamples());
    row.job_samples_per_sec =
        report_.TakeWindowSamplesPerSec(absl::Now(), samples);
    if (options_.verbose) {
      // "-": shard 0 counted no sample since the last rate (RunReport);
      // the next line's covers this window too.
      Say(absl::StrCat("Step", next, ": ",
                       row.job_samples_per_sec.has_value()
                           ? absl::StrFormat("%.2f", *row.job_samples_per_sec)
                           : "-",
                       " data/sec") +
          FormatStepDetails(row, options_.total_steps));
    }
  }
  if (metrics_ != nullptr) RETURN_IF_ERROR(metrics_->Write(row));
  return absl::OkStatus();
}

absl::Status Reporter::Recovered() {
  ASSIGN_OR_RETURN(const int64_t samples, ShardSamples());
  report_.Recovered(absl::Now(), samples);
  return absl::OkStatus();
}

double Reporter::EpochEnded() { return report_.TakeEpochSeconds(absl::Now()); }

void Reporter::PauseTraining() { report_.Pause(absl::Now()); }

absl::Status Reporter::ResumeTraining() {
  // Evaluation time is not training time: a new throughput window.
  ASSIGN_OR_RETURN(const int64_t samples, ShardSamples());
  report_.Resume(absl::Now(), samples);
  return absl::OkStatus();
}

void Reporter::ResumeAfterFailure() { report_.Resume(absl::Now(), 0); }

absl::Status Reporter::MembershipChanged(
    int64_t step, int epoch, const StepMetrics::MembershipChange& change) {
  if (metrics_ == nullptr) return absl::OkStatus();
  return metrics_->Write(step_metrics_.MembershipRow(step, epoch, change));
}

absl::Status Reporter::Evaluated(const EpochEvaluation& evaluation) {
  EpochResult* e = result_->add_epoch_results();
  e->set_epoch(evaluation.epoch);
  e->set_train_seconds(evaluation.train_seconds);
  e->set_test_seconds(evaluation.test_seconds);
  e->set_test_accuracy(evaluation.test_accuracy);
  e->set_test_loss(evaluation.test_loss);
  e->set_train_loss(evaluation.train_loss);
  result_->set_test_accuracy(evaluation.test_accuracy);
  if (options_.on_epoch) options_.on_epoch(*result_);
  if (metrics_ != nullptr) {
    RETURN_IF_ERROR(metrics_->Write(step_metrics_.EvaluationRow(
        evaluation.step, evaluation.epoch, evaluation.test_loss,
        evaluation.test_accuracy)));
  }
  if (options_.verbose) {
    Say(absl::StrFormat(
        "Epoch %d in %.2f sec, test time %.2f sec, test accuracy: %.4f",
        evaluation.epoch, evaluation.train_seconds, evaluation.test_seconds,
        evaluation.test_accuracy));
  }
  return absl::OkStatus();
}

double Reporter::TrainingSeconds() const {
  return report_.training_seconds(absl::Now());
}

void Reporter::CheckpointsWritten(int64_t completed,
                                  const std::string& latest_path) {
  if (options_.verbose && completed > 0) {
    Say(absl::StrCat("Wrote ", report_.checkpoints(completed),
                     " checkpoints; the newest: ", latest_path));
  }
}

absl::Status Reporter::Finish(int64_t steps, double train_seconds) {
  if (late_steps_ > 0 && options_.verbose) {
    Say(absl::StrCat("worker ", options_.worker_id, ": ", late_steps_,
                     " steps ended late (their gradients dropped: ",
                     options_.num_workers - options_.backup_workers, " of ",
                     options_.num_workers, " workers per step)"));
  }
  result_->set_steps(steps);
  result_->set_runtime_seconds(train_seconds);
  if (timed_steps_ > 0) {
    result_->set_compute_seconds_per_step(absl::ToDoubleSeconds(compute_time_) /
                                          timed_steps_);
    result_->set_exchange_seconds_per_step(
        absl::ToDoubleSeconds(exchange_time_) / timed_steps_);
  }
  if (byte_steps_ > 0) {
    result_->set_bytes_pushed_per_step(bytes_pushed_ / byte_steps_);
    result_->set_bytes_pulled_per_step(bytes_pulled_ / byte_steps_);
  }
  if (chief()) {
    // Samples of every worker, redone steps included (RunReport).
    ASSIGN_OR_RETURN(const int64_t samples, ShardSamples());
    result_->set_throughput_samples_per_sec(report_.samples(samples) /
                                            std::max(train_seconds, 1e-9));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
