// What worker 0 reports of a run, kept right across recoveries (issue 36):
// the samples/sec of its Step lines, the training seconds of its Epoch
// lines and the run's Runtime, and how many checkpoints the job wrote.
//
// Training time is wall time from construction on, less the pauses
// (evaluation); a recovery and the steps it redoes are training time. An
// epoch's seconds are the training time since the previous epoch's end (or
// the start), so the Epoch lines add up to the Runtime even when a rollback
// sends the run back into the epoch or the one before.
//
// Samples, counted one of two ways:
//   - on the worker (sync without backup workers, allreduce: every worker
//     trains every step): samples_per_step (num_workers x batch_size) per
//     step this worker trained, redone steps included;
//   - by shard 0's counter (async, backup workers: StatsResponse.samples).
//     A restarted shard 0 counts from 0 again and a restore rolls the job
//     back, so Recovered() starts a new window at the counter's value after
//     the recovery; the samples between the last reading and the failure are
//     not counted, and the window's time starts at the recovery too. The
//     rate is never negative: a counter below the window's start (a shard 0
//     that restarted unseen) goes on from its value. A window in which
//     shard 0 counted nothing yet has no rate and stays open: with backup
//     workers the others decide steps without worker 0, so a worker 0 left
//     behind (late, or just recovered) may jump to their version and reach a
//     Step line before shard 0 admitted any end since the window's start
//     (CI showed "Step405: 0.00 data/sec" after a recovery).
//
// Checkpoints: the job's count, checkpoints_before (those a previous worker
// 0 of the same job made durable: the newest manifest's checkpoint_count)
// plus this process's.
//
// Thread-compatible.
#ifndef PSTRAIN_WORKER_RUN_REPORT_H_
#define PSTRAIN_WORKER_RUN_REPORT_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace pstrain {

class RunReport {
 public:
  struct Options {
    // true: count samples on the worker; false: shard 0's counter.
    bool count_on_worker = true;
    // Samples every worker together trains per step (count_on_worker).
    int64_t samples_per_step = 0;
    // Checkpoints made durable by this job before this process.
    int64_t checkpoints_before = 0;
  };

  // The run's training starts at `now`; `counter`: shard 0's sample count
  // then (ignored when counting on the worker).
  RunReport(const Options& options, absl::Time now, int64_t counter);

  // This worker trained one step (redone ones included) of
  // `samples_per_step` samples of every worker together (an elastic job's
  // members x batch size); -1: Options::samples_per_step.
  void StepTrained(int64_t samples_per_step = -1);

  // Samples per second of every worker since the window's start (the last
  // call that returned a rate, Resume() or Recovered()), and a new window
  // from `now`. `counter`: shard 0's count now (ignored when counting on
  // the worker). Never negative; counting on the worker, 0 for an empty
  // window. Counting by shard 0: nullopt while the window holds no counted
  // sample (the window stays open; a counter below its start becomes its
  // start).
  std::optional<double> TakeWindowSamplesPerSec(absl::Time now,
                                                int64_t counter);

  // A recovery has ended: shard 0's count now starts a new window.
  void Recovered(absl::Time now, int64_t counter);

  // Evaluation: the training clock stops at Pause() and goes on at
  // Resume(), which starts a new window at `counter`.
  void Pause(absl::Time now);
  void Resume(absl::Time now, int64_t counter);

  // The training seconds since the previous call (or the start): the
  // epoch just ended.
  double TakeEpochSeconds(absl::Time now);

  // Training seconds so far (the Runtime), and the samples of every worker
  // counted so far, `counter` being shard 0's count now (the run's
  // throughput is their ratio).
  double training_seconds(absl::Time now) const;
  int64_t samples(int64_t counter) const;

  // The job's checkpoints, given this process's `completed`.
  int64_t checkpoints(int64_t completed) const {
    return options_.checkpoints_before + completed;
  }

 private:
  void NewWindow(absl::Time now, int64_t counter);
  // Samples in the window so far, by the counter's `counter`.
  int64_t WindowSamples(int64_t counter) const;

  const Options options_;
  // Training time before the current stretch, and the stretch's start
  // (none while paused).
  absl::Duration trained_;
  absl::Time stretch_start_;
  bool paused_ = false;
  double epoch_end_seconds_ = 0;  // training_seconds() at the last epoch
  // The window: its start, the counter then (shard path) and the steps
  // trained in it (worker path); samples of closed windows.
  absl::Time window_start_;
  int64_t window_counter_ = 0;
  int64_t window_steps_ = 0;
  int64_t window_step_samples_ = 0;  // counted on the worker
  int64_t closed_samples_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_RUN_REPORT_H_
