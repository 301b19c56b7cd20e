// A parameter-server shard's metrics as data: one ShardMetricsRow per
// interval, written as CSV, JSON Lines and TensorBoard scalars, the
// shard's side of worker/metrics.h.
//
// Files, for shard k under the job's metrics folder DIR:
//   DIR/psK.csv      header + one line per row
//   DIR/psK.jsonl    one JSON object per row, the same keys, null where the
//                    CSV cell is empty; numbers as JSON numbers
//   DIR/tb/psK/events.out.tfevents.*   TensorBoard scalars at the row's
//                    version: shard/updates_per_sec, shard/optimizer_ms,
//                    shard/optimizer_us_per_update, shard/bytes_received,
//                    shard/bytes_sent, shard/pushes_queued,
//                    shard/pulls_waiting, shard/pull_ms
// pstrain_ps (server/ps_main.cc) takes a row every second while the shard
// is busy (no row for an interval without a push or pull) and one when it
// exits. The files are replaced when the shard starts; every row is
// flushed to the OS (not fsynced).
//
// Columns (interval: since the previous row):
//   wall_time_s, elapsed_s   seconds since the Unix epoch; since the first
//                            row's baseline (the shard's start)
//   version                  the smallest version of the shard's chunks
//                            (sync: steps completed); the TensorBoard step
//   updates, pushes, pulls, skipped   in the interval (ShardStats)
//   updates_per_sec          updates / the interval's seconds
//   bytes_received, bytes_sent   tensor payload bytes in the interval
//                            (PsService::Counters)
//   optimizer_ms             time in the optimizer in the interval (sum
//                            over chunks, ShardStats::optimizer_ns)
//   optimizer_us_per_update  optimizer_ms / updates (empty without updates)
//   pull_ms                  the mean time a pull completed in the interval
//                            spent in the shard (sync: mostly waiting for
//                            the barrier; empty without pulls)
//   pushes_queued            pushes read and not yet taken by the shard,
//                            at the row (the push queue's depth)
//   pulls_waiting            pulls inside the shard at the row (sync:
//                            workers waiting at the barrier)
//
// Thread-compatible: one thread writes the rows.
#ifndef PSTRAIN_SERVER_SHARD_METRICS_H_
#define PSTRAIN_SERVER_SHARD_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensorboard.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"

namespace pstrain {

struct ShardMetricsRow {
  double wall_time_s = 0;
  double elapsed_s = 0;
  int64_t version = 0;
  int64_t updates = 0;
  int64_t pushes = 0;
  int64_t pulls = 0;
  int64_t skipped = 0;
  double updates_per_sec = 0;
  int64_t bytes_received = 0;
  int64_t bytes_sent = 0;
  double optimizer_ms = 0;
  std::optional<double> optimizer_us_per_update;
  std::optional<double> pull_ms;
  int64_t pushes_queued = 0;
  int64_t pulls_waiting = 0;
};

// Turns the shard's running totals into interval rows.
class ShardMetrics {
 public:
  // The baseline: the totals at `start` (normally all zero).
  ShardMetrics(const ShardStats& stats, const PsService::Counters& counters,
               absl::Time start = absl::Now());

  // Whether anything happened since the last row (a push or a pull).
  bool Changed(const ShardStats& stats) const;
  // The row for the interval ending `now`; the next interval starts.
  ShardMetricsRow TakeInterval(const ShardStats& stats,
                               const PsService::Counters& counters,
                               absl::Time now = absl::Now());

 private:
  const absl::Time start_;
  absl::Time last_time_;
  ShardStats last_stats_;
  PsService::Counters last_counters_;
};

class ShardMetricsWriter {
 public:
  // Creates `dir` and dir/tb/ps<shard>, replaces dir/ps<shard>.csv (with
  // its header) and .jsonl, opens a new event file. Errors name the path.
  static absl::StatusOr<std::unique_ptr<ShardMetricsWriter>> Create(
      const std::string& dir, int shard);
  ~ShardMetricsWriter();

  // Appends `row` to the three files; the first failure is returned by
  // this call and every later one.
  absl::Status Write(const ShardMetricsRow& row);

  const std::string& csv_path() const { return csv_path_; }
  const std::string& jsonl_path() const { return jsonl_path_; }
  static const char* CsvHeader();

 private:
  ShardMetricsWriter() = default;
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

#endif  // PSTRAIN_SERVER_SHARD_METRICS_H_
