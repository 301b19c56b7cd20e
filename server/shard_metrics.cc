#include "server/shard_metrics.h"

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// One column: name (CSV header, JSON key), TensorBoard tag (null: none),
// integer or not, and its value in a row (nullopt: empty cell).
struct Column {
  const char* name;
  const char* tag;
  bool integer;
  std::optional<double> (*get)(const ShardMetricsRow&);
};

#define PSTRAIN_SHARD_FIELD(field) \
  [](const ShardMetricsRow& r) -> std::optional<double> { return r.field; }

const Column kColumns[] = {
    {"wall_time_s", nullptr, false, PSTRAIN_SHARD_FIELD(wall_time_s)},
    {"elapsed_s", nullptr, false, PSTRAIN_SHARD_FIELD(elapsed_s)},
    {"version", nullptr, true, PSTRAIN_SHARD_FIELD(version)},
    {"updates", nullptr, true, PSTRAIN_SHARD_FIELD(updates)},
    {"pushes", nullptr, true, PSTRAIN_SHARD_FIELD(pushes)},
    {"pulls", nullptr, true, PSTRAIN_SHARD_FIELD(pulls)},
    {"skipped", nullptr, true, PSTRAIN_SHARD_FIELD(skipped)},
    {"updates_per_sec", "shard/updates_per_sec", false,
     PSTRAIN_SHARD_FIELD(updates_per_sec)},
    {"bytes_received", "shard/bytes_received", true,
     PSTRAIN_SHARD_FIELD(bytes_received)},
    {"bytes_sent", "shard/bytes_sent", true, PSTRAIN_SHARD_FIELD(bytes_sent)},
    {"optimizer_ms", "shard/optimizer_ms", false,
     PSTRAIN_SHARD_FIELD(optimizer_ms)},
    {"optimizer_us_per_update", "shard/optimizer_us_per_update", false,
     PSTRAIN_SHARD_FIELD(optimizer_us_per_update)},
    {"pull_ms", "shard/pull_ms", false, PSTRAIN_SHARD_FIELD(pull_ms)},
    {"pushes_queued", "shard/pushes_queued", true,
     PSTRAIN_SHARD_FIELD(pushes_queued)},
    {"pulls_waiting", "shard/pulls_waiting", true,
     PSTRAIN_SHARD_FIELD(pulls_waiting)},
};

#undef PSTRAIN_SHARD_FIELD

absl::StatusOr<std::FILE*> OpenForWriting(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return ErrnoToStatus(errno, path);
  return file;
}

}  // namespace

ShardMetrics::ShardMetrics(const ShardStats& stats,
                           const PsService::Counters& counters,
                           absl::Time start)
    : start_(start),
      last_time_(start),
      last_stats_(stats),
      last_counters_(counters) {}

bool ShardMetrics::Changed(const ShardStats& stats) const {
  return stats.pushes != last_stats_.pushes || stats.pulls != last_stats_.pulls;
}

ShardMetricsRow ShardMetrics::TakeInterval(const ShardStats& stats,
                                           const PsService::Counters& counters,
                                           absl::Time now) {
  ShardMetricsRow row;
  row.wall_time_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  row.elapsed_s = absl::ToDoubleSeconds(now - start_);
  row.version = stats.min_version;
  row.updates = stats.updates - last_stats_.updates;
  row.pushes = stats.pushes - last_stats_.pushes;
  row.pulls = stats.pulls - last_stats_.pulls;
  row.skipped = stats.skipped - last_stats_.skipped;
  const double seconds = absl::ToDoubleSeconds(now - last_time_);
  row.updates_per_sec = seconds > 0 ? row.updates / seconds : 0;
  row.bytes_received = counters.bytes_received - last_counters_.bytes_received;
  row.bytes_sent = counters.bytes_sent - last_counters_.bytes_sent;
  row.optimizer_ms = (stats.optimizer_ns - last_stats_.optimizer_ns) / 1e6;
  if (row.updates > 0) {
    row.optimizer_us_per_update = row.optimizer_ms * 1e3 / row.updates;
  }
  const int64_t pulls_done = counters.pulls_done - last_counters_.pulls_done;
  if (pulls_done > 0) {
    row.pull_ms = (counters.pull_ns - last_counters_.pull_ns) / 1e6 /
                  static_cast<double>(pulls_done);
  }
  row.pushes_queued = counters.pushes_queued;
  row.pulls_waiting = counters.pulls_waiting;
  last_time_ = now;
  last_stats_ = stats;
  last_counters_ = counters;
  return row;
}

const char* ShardMetricsWriter::CsvHeader() {
  static const std::string* const header = [] {
    auto* h = new std::string;
    for (const Column& c : kColumns) {
      absl::StrAppend(h, h->empty() ? "" : ",", c.name);
    }
    return h;
  }();
  return header->c_str();
}

absl::StatusOr<std::unique_ptr<ShardMetricsWriter>> ShardMetricsWriter::Create(
    const std::string& dir, int shard) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return ErrnoToStatus(error.value(), absl::StrCat(dir, ": cannot create"));
  }
  std::unique_ptr<ShardMetricsWriter> writer(new ShardMetricsWriter);
  const std::string base = absl::StrCat(dir, "/ps", shard);
  writer->csv_path_ = base + ".csv";
  writer->jsonl_path_ = base + ".jsonl";
  ASSIGN_OR_RETURN(writer->csv_, OpenForWriting(writer->csv_path_));
  ASSIGN_OR_RETURN(writer->jsonl_, OpenForWriting(writer->jsonl_path_));
  ASSIGN_OR_RETURN(writer->tensorboard_, TensorBoardWriter::Create(absl::StrCat(
                                             dir, "/tb/ps", shard)));
  RETURN_IF_ERROR(writer->Append(writer->csv_, writer->csv_path_, CsvHeader()));
  return writer;
}

ShardMetricsWriter::~ShardMetricsWriter() {
  if (csv_ != nullptr) std::fclose(csv_);
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

absl::Status ShardMetricsWriter::Append(std::FILE* file,
                                        const std::string& path,
                                        const std::string& line) {
  if (!error_.ok()) return error_;
  if (std::fputs(line.c_str(), file) < 0 || std::fputc('\n', file) == EOF ||
      std::fflush(file) != 0) {
    error_ = ErrnoToStatus(errno, absl::StrCat(path, ": write"));
  }
  return error_;
}

absl::Status ShardMetricsWriter::Write(const ShardMetricsRow& row) {
  std::string csv;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  std::vector<TensorBoardScalar> scalars;
  for (const Column& c : kColumns) {
    const std::optional<double> value = c.get(row);
    std::string cell;
    if (!value) {
      json[c.name] = nullptr;
    } else if (c.integer) {
      cell = absl::StrCat(static_cast<int64_t>(*value));
      json[c.name] = static_cast<int64_t>(*value);
    } else {
      cell = absl::StrFormat("%.6g", *value);
      json[c.name] = *value;
    }
    if (c.name == kColumns[0].name || c.name == kColumns[1].name) {
      cell = absl::StrFormat("%.3f", *value);  // seconds, ms resolution
    }
    absl::StrAppend(&csv, &c == kColumns ? "" : ",", cell);
    if (value && c.tag != nullptr) {
      scalars.push_back({c.tag, static_cast<float>(*value)});
    }
  }
  RETURN_IF_ERROR(Append(csv_, csv_path_, csv));
  RETURN_IF_ERROR(Append(jsonl_, jsonl_path_, json.dump()));
  if (absl::Status s = tensorboard_->WriteScalars(
          row.version, scalars,
          absl::UnixEpoch() + absl::Seconds(row.wall_time_s));
      !s.ok() && error_.ok()) {
    error_ = s;
  }
  return error_;
}

}  // namespace pstrain
