// A worker's training metrics as data: one MetricsRow per logging interval
// (every log_every_steps steps, and the steps left at the end of the run)
// and per evaluation, written as CSV, JSON Lines and TensorBoard scalars
// (MetricsWriter); worker 0's console step line is a view of the same row
// (FormatStepDetails).
//
// Files, for worker j under a metrics folder DIR (the job's metrics_dir):
//   DIR/workerJ.csv     header + one line per row; an empty cell where a
//                       value does not apply (see MetricsRow)
//   DIR/workerJ.jsonl   one JSON object per row, the same keys, null where
//                       the CSV cell is empty; numbers as JSON numbers
//   DIR/tb/workerJ/events.out.tfevents.*   TensorBoard scalars
//                       (common/tensorboard.h), the row's values that apply,
//                       at the row's step: train/loss, train/lr,
//                       train/samples_per_sec, train/job_samples_per_sec,
//                       time/compute_ms, time/exchange_ms, test/loss,
//                       test/accuracy, and on membership rows
//                       elastic/workers, elastic/shards,
//                       elastic/change_ms
// The CSV and JSONL files are replaced when a run starts, or appended to
// when it resumes from a checkpoint; event files are new files beside older
// ones (TensorBoard reads them as one run). Every row is flushed to the OS when
// written (a run can be watched while it trains); nothing is fsynced.
//
// Per-phase times (ms, the mean per step of the interval): compute_ms is
// the step's compute (forward and backward, with the wait for the
// prefetched batch) and exchange_ms the time after it until the new
// weights are in the model (the rest of the pushes, the barrier in sync
// mode, the pull, the copy into the model). Measured where they happen:
//   forward_ms, backward_ms   models/model.h last_forward_time() and
//                             last_backward_time() (absent with synthetic
//                             compute, which has no model);
//   push_ms, barrier_wait_ms, pull_ms   worker/ps_client.h PsStepTimes
//                             (PS modes; barrier_wait_ms sync only): push
//                             overlaps backward, and barrier_wait + pull
//                             is the time from the last push's end to the
//                             last pulled chunk's arrival;
//   allreduce_ms              the communication thread's time in the
//                             step's bucket allreduces (allreduce mode;
//                             it overlaps backward);
//   bytes_pushed, bytes_pulled   per step, the serialized PushPull messages
//                             (PS modes).
// A phase a mode does not have is empty in the CSV and null in the JSONL,
// and has no TensorBoard series (time/forward_ms, time/backward_ms,
// time/push_ms, time/barrier_wait_ms, time/pull_ms, time/allreduce_ms,
// bytes/pushed, bytes/pulled). The shards' optimizer time is in the
// shards' own rows (server/shard_metrics.h).
//
// Thread-compatible: StepMetrics and MetricsWriter are used by one training
// thread each.
#ifndef PSTRAIN_WORKER_METRICS_H_
#define PSTRAIN_WORKER_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensorboard.h"

namespace pstrain {

struct MetricsRow {
  // This worker's steps done when the row was taken (the TensorBoard x
  // axis), and the epoch they belong to (0-based).
  int64_t step = 0;
  int epoch = 0;
  // When the row was taken: seconds since the Unix epoch, and since the
  // worker's training began.
  double wall_time_s = 0;
  double elapsed_s = 0;
  // Interval rows: the steps since the previous row; the mean training loss
  // of this worker's batches over them (absent with synthetic compute); the
  // learning rate (Adam's, constant for now); this worker's samples/sec
  // (batch size x steps over the steps' time); the mean time per step of
  // compute and of the exchange, ms. Absent on evaluation rows.
  std::optional<int64_t> interval_steps;
  std::optional<double> loss;
  std::optional<double> lr;
  std::optional<double> samples_per_sec;
  std::optional<double> compute_ms;
  std::optional<double> exchange_ms;
  // Interval rows: the phases' mean per step (see the file comment);
  // absent where the mode has no such phase.
  std::optional<double> forward_ms;
  std::optional<double> backward_ms;
  std::optional<double> push_ms;
  std::optional<double> barrier_wait_ms;
  std::optional<double> pull_ms;
  std::optional<double> allreduce_ms;
  std::optional<double> bytes_pushed;
  std::optional<double> bytes_pulled;
  // Worker 0's interval rows at log_every_steps: every worker's samples/sec
  // (shard 0's sample counter, or all workers' in allreduce mode), the
  // console's "data/sec". Absent elsewhere.
  std::optional<double> job_samples_per_sec;
  // Evaluation rows (worker 0, after each epoch): the test set's mean loss
  // and accuracy (0..1). Absent on interval rows.
  std::optional<double> test_loss;
  std::optional<double> test_accuracy;
  // Membership rows (an elastic job's worker 0, issue 40): a change applied
  // at `step`, the workers and PS shards before and after it, and the time
  // it took (ms, worker 0's: from the step boundary to training on with
  // the new members). Absent on other rows.
  std::optional<double> old_workers, workers, old_shards, shards;
  std::optional<double> membership_change_ms;
};

// One step's phases beside compute and exchange; absent: not measured
// in this mode.
struct StepPhases {
  std::optional<absl::Duration> forward, backward;
  std::optional<absl::Duration> push, barrier_wait, pull, allreduce;
  std::optional<int64_t> bytes_pushed, bytes_pulled;
};

// Accumulates the steps of the current interval and turns them into rows.
class StepMetrics {
 public:
  // `lr` is kept as the decimal it was given (a float's 7 digits), so that
  // 1e-3f reads 0.001 in every file.
  StepMetrics(int batch_size, float lr, absl::Time start = absl::Now());

  // One step: its training loss (nullopt where there is none), the time
  // of its compute and of its exchange.
  // A phase gets a mean in the row only if every step of the interval
  // had it.
  void AddStep(std::optional<double> loss, absl::Duration compute,
               absl::Duration exchange, const StepPhases& phases = {});
  int64_t steps_in_interval() const { return steps_; }

  // The interval row ending at `step` of `epoch`; the next interval starts.
  // With no step in the interval, only step, epoch, times and lr are set.
  MetricsRow TakeInterval(int64_t step, int epoch,
                          absl::Time now = absl::Now());
  // An evaluation row.
  MetricsRow EvaluationRow(int64_t step, int epoch, double test_loss,
                           double test_accuracy,
                           absl::Time now = absl::Now()) const;
  // A membership row (see MetricsRow): counts before and after, ms taken.
  struct MembershipChange {
    int old_workers = 0, workers = 0, old_shards = 0, shards = 0;
    double ms = 0;
  };
  MetricsRow MembershipRow(int64_t step, int epoch,
                           const MembershipChange& change,
                           absl::Time now = absl::Now()) const;

 private:
  MetricsRow Row(int64_t step, int epoch, absl::Time now) const;

  const int batch_size_;
  const double lr_;
  const absl::Time start_;
  int64_t steps_ = 0;
  int64_t loss_steps_ = 0;
  double loss_sum_ = 0;
  absl::Duration compute_;
  absl::Duration exchange_;
  // Per phase (the order of kPhaseColumns in metrics.cc): its sum over the
  // interval (ms, or bytes) and the steps that had it.
  static constexpr int kNumPhases = 8;
  double phase_sum_[kNumPhases] = {};
  int64_t phase_steps_[kNumPhases] = {};
};

// What worker 0's console line adds after "StepN: X data/sec":
// ", loss 0.4321, lr 0.001, step 200/936, ETA 0:45" (", loss ..." only with
// a loss; ETA: the steps left at the row's mean step time, M:SS or
// H:MM:SS; without a step time, no ETA).
std::string FormatStepDetails(const MetricsRow& row, int64_t total_steps);

// "0:45", "12:03", "1:02:03"; negative durations read 0:00.
std::string FormatEta(double seconds);

class MetricsWriter {
 public:
  // Creates `dir` (and dir/tb/worker<worker_id>), replaces
  // dir/worker<worker_id>.csv and .jsonl (writing the CSV header) and opens
  // a new event file. Errors name the path (NOT_FOUND, PERMISSION_DENIED,
  // INTERNAL). With `append` (a resumed run), rows go after those already
  // in the CSV and JSONL files (the header only if the CSV is empty).
  static absl::StatusOr<std::unique_ptr<MetricsWriter>> Create(
      const std::string& dir, int worker_id, bool append = false);
  ~MetricsWriter();

  // Appends `row` to the three files. The first failure is returned by
  // this call and every later one.
  absl::Status Write(const MetricsRow& row);

  const std::string& csv_path() const { return csv_path_; }
  const std::string& jsonl_path() const { return jsonl_path_; }
  const std::string& events_path() const { return tensorboard_->path(); }

  // The CSV header line (without its newline): the column names, which are
  // also the JSONL keys.
  static const char* CsvHeader();

 private:
  MetricsWriter() = default;
  absl::Status Append(std::FILE* file, const std::string& path,
                      const std::string& line);

  std::string csv_path_;
  std::string jsonl_path_;
  std::FILE* csv_ = nullptr;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  absl::Status error_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_METRICS_H_
