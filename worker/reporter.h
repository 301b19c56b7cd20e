// What a worker reports of its run (issue 36: a part of RunWorker,
// worker/trainer.h):
//   - console lines: worker 0's step lines ("Step200: 8123.45 data/sec",
//     with FormatStepDetails' loss, lr, step and ETA; every
//     log_every_steps steps) and epoch lines (after each evaluation), the
//     checkpoints it wrote, and this worker's late steps (backup workers)
//     at the end; the step and epoch lines and the end's only when
//     verbose;
//   - metrics rows (worker/metrics.h): one per log_every_steps steps, one
//     for the steps left at the run's last step, one per evaluation;
//   - the trace's "exchange" span of each step (common/trace.h; the step
//     loop opens the step's own span);
//   - the run's figures in RunResult (proto/results.proto): the epochs'
//     evaluations, the steps, the runtime, the mean compute and exchange
//     time per step (step 0, the warm-up, left out unless the run has one
//     step), and worker 0's throughput;
//   - TrainerOptions' on_progress and on_epoch calls.
// The figures that must stay right across recoveries (samples/sec of the
// step lines, the epochs' training seconds, the runtime, the job's
// checkpoint count) are RunReport's (worker/run_report.h), which this
// class feeds; the step interval's figures are StepMetrics'.
//
// Thread-compatible: the training thread's.
#ifndef PSTRAIN_WORKER_REPORTER_H_
#define PSTRAIN_WORKER_REPORTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "optim/optimizer.h"
#include "proto/results.pb.h"
#include "worker/gradient_exchange.h"
#include "worker/metrics.h"
#include "worker/run_report.h"

namespace pstrain {

// A console line (without its newline).
using LineFn = std::function<void(const std::string&)>;

// Lines to `log_line`, or to stdout (flushed) when it is unset.
LineFn ConsoleLines(std::function<void(const std::string&)> log_line);

class Reporter {
 public:
  struct Options {
    int worker_id = 0;
    int num_workers = 1;
    int backup_workers = 0;
    int batch_size = 64;
    int log_every_steps = 200;
    bool verbose = true;
    // The run's last step (the ETA's total; the last metrics row).
    int64_t total_steps = 0;
    // Its lr schedule gives the rows' lr.
    OptimizerOptions adam;
    // RunReport's: samples counted on the worker (sync without backup
    // workers, allreduce: every worker trains every step) or by shard 0's
    // counter (GradientExchange::SamplesSoFar, read by worker 0); the
    // job's checkpoints before this process.
    bool count_on_worker = true;
    int64_t checkpoints_before = 0;
    // Metrics files' folder ("" none), appended to (a resumed or rejoined
    // run) or replaced.
    std::string metrics_dir;
    bool append_metrics = false;
    LineFn say;
    std::function<void(int64_t steps, double samples_per_sec)> on_progress;
    std::function<void(const RunResult& so_far)> on_epoch;
  };

  // Training starts now. `exchange` (not owned) counts the job's samples;
  // `result` (not owned) gets the evaluations and Finish()'s figures. Both
  // outlive the reporter. Errors: shard 0's counter's, the metrics files'.
  static absl::StatusOr<std::unique_ptr<Reporter>> Create(
      const Options& options, GradientExchange* exchange, RunResult* result);

  // A console line, verbose or not.
  void Say(const std::string& line) const { options_.say(line); }

  // An epoch's steps begin (again, after a recovery): on_progress's rate
  // is over the steps since.
  void EpochBegan();

  // The trace's span of step `step`'s exchange.
  void TraceExchange(int64_t step, absl::Time computed, absl::Time exchanged);
  // One step trained: `step`, started at `start`, its compute done at
  // `computed`, its new weights in the model at `exchanged`; its loss
  // (none: skipped, or no loss to report) and whether the shards dropped
  // it as late.
  struct StepTimes {
    int64_t step = 0;
    absl::Time start, computed, exchanged;
    StepPhases phases;
    std::optional<double> loss;
    bool late = false;
    // An elastic job: the workers of the step (0: the job's num_workers).
    int members = 0;
  };
  void StepExchanged(const StepTimes& times);
  // Then (after its checkpoint, if any): the step just trained,
  // `trained`, the step to train next, `next` (trained + 1, or later when
  // backup workers left this worker behind and it jumps to the shards'
  // step), the epoch being trained and the step's index in it. Writes the
  // interval's row (and worker 0's step line, named by `next`) when
  // (trained, next] holds a multiple of log_every_steps (a jump over a
  // multiple logs the step it lands on, as CheckpointSchedule checkpoints
  // it), or `next` is the run's last step with metrics files; the metrics
  // files' error.
  absl::Status StepEnded(int64_t trained, int64_t next, int epoch,
                         int64_t index);

  // A recovery has ended (shard 0's counter starts a new window).
  absl::Status Recovered();

  // The epoch's steps are done: its training seconds (RunReport).
  double EpochEnded();

  // Worker 0's evaluation after an epoch: the training clock stops at
  // PauseTraining() and goes on at ResumeTraining() (a new window from
  // shard 0's count), or at ResumeAfterFailure() when the evaluation
  // failed (a recovery is training time).
  void PauseTraining();
  absl::Status ResumeTraining();
  void ResumeAfterFailure();
  // The evaluation's result: the RunResult's epoch, on_epoch, the metrics
  // row and the epoch line. The metrics files' error.
  struct EpochEvaluation {
    int epoch = 0;
    int64_t step = 0;
    double train_seconds = 0, test_seconds = 0;
    double train_loss = 0, test_loss = 0, test_accuracy = 0;
  };
  absl::Status Evaluated(const EpochEvaluation& evaluation);

  // Worker 0 of an elastic job applied a membership at `step` of `epoch`
  // (worker/elastic.h): a membership row in the metrics files
  // (worker/metrics.h). The metrics files' error, if any.
  absl::Status MembershipChanged(int64_t step, int epoch,
                                 const StepMetrics::MembershipChange& change);

  // The run's training seconds so far (the Runtime).
  double TrainingSeconds() const;
  // Worker 0's checkpoint writer is done: this process made `completed`
  // checkpoints durable, the newest at `latest_path`.
  void CheckpointsWritten(int64_t completed, const std::string& latest_path);
  // The run ended at `steps` after `train_seconds`: the late steps' line
  // and the RunResult's figures. Shard 0's counter's error.
  absl::Status Finish(int64_t steps, double train_seconds);

  // Steps dropped as late, steps in the per-step means, and RunReport.
  int64_t late_steps() const { return late_steps_; }
  int64_t timed_steps() const { return timed_steps_; }
  const RunReport& run_report() const { return report_; }

 private:
  Reporter(const Options& options, GradientExchange* exchange,
           RunResult* result, int64_t samples_at_start);
  bool chief() const { return options_.worker_id == 0; }
  // Shard 0's count where RunReport reads it (worker 0, shard counter);
  // 0 otherwise.
  absl::StatusOr<int64_t> ShardSamples() const;

  const Options options_;
  GradientExchange* const exchange_;
  RunResult* const result_;
  RunReport report_;
  StepMetrics step_metrics_;
  std::unique_ptr<MetricsWriter> metrics_;
  absl::Time epoch_start_;
  int64_t late_steps_ = 0;
  // The last step's workers (StepTimes::members).
  int last_members_ = 0;
  absl::Duration compute_time_;
  absl::Duration exchange_time_;
  int64_t timed_steps_ = 0;
  // The timed steps' bytes (PS modes), and how many steps measured them.
  double bytes_pushed_ = 0, bytes_pulled_ = 0;
  int64_t byte_steps_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_REPORTER_H_
