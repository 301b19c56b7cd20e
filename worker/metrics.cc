#include "worker/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// One column of the files: its name (CSV header, JSON key), its TensorBoard
// tag (null: not a scalar series), how it is printed in the CSV, and where
// it lives in a row.
enum class Format { kInteger, kSeconds, kValue };
struct Column {
  const char* name;
  const char* tag;
  Format format;
  std::optional<double> (*get)(const MetricsRow&);
};

#define PSTRAIN_ROW_FIELD(field) \
  [](const MetricsRow& r) -> std::optional<double> { return r.field; }

const Column kColumns[] = {
    {"step", nullptr, Format::kInteger, PSTRAIN_ROW_FIELD(step)},
    {"epoch", nullptr, Format::kInteger, PSTRAIN_ROW_FIELD(epoch)},
    {"wall_time_s", nullptr, Format::kSeconds, PSTRAIN_ROW_FIELD(wall_time_s)},
    {"elapsed_s", nullptr, Format::kSeconds, PSTRAIN_ROW_FIELD(elapsed_s)},
    {"interval_steps", nullptr, Format::kInteger,
     [](const MetricsRow& r) -> std::optional<double> {
       if (!r.interval_steps) return std::nullopt;
       return static_cast<double>(*r.interval_steps);
     }},
    {"loss", "train/loss", Format::kValue, PSTRAIN_ROW_FIELD(loss)},
    {"lr", "train/lr", Format::kValue, PSTRAIN_ROW_FIELD(lr)},
    {"samples_per_sec", "train/samples_per_sec", Format::kValue,
     PSTRAIN_ROW_FIELD(samples_per_sec)},
    {"job_samples_per_sec", "train/job_samples_per_sec", Format::kValue,
     PSTRAIN_ROW_FIELD(job_samples_per_sec)},
    {"compute_ms", "time/compute_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(compute_ms)},
    {"exchange_ms", "time/exchange_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(exchange_ms)},
    {"test_loss", "test/loss", Format::kValue, PSTRAIN_ROW_FIELD(test_loss)},
    {"test_accuracy", "test/accuracy", Format::kValue,
     PSTRAIN_ROW_FIELD(test_accuracy)},
    {"forward_ms", "time/forward_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(forward_ms)},
    {"backward_ms", "time/backward_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(backward_ms)},
    {"push_ms", "time/push_ms", Format::kValue, PSTRAIN_ROW_FIELD(push_ms)},
    {"barrier_wait_ms", "time/barrier_wait_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(barrier_wait_ms)},
    {"pull_ms", "time/pull_ms", Format::kValue, PSTRAIN_ROW_FIELD(pull_ms)},
    {"allreduce_ms", "time/allreduce_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(allreduce_ms)},
    {"bytes_pushed", "bytes/pushed", Format::kValue,
     PSTRAIN_ROW_FIELD(bytes_pushed)},
    {"bytes_pulled", "bytes/pulled", Format::kValue,
     PSTRAIN_ROW_FIELD(bytes_pulled)},
    {"old_workers", nullptr, Format::kInteger, PSTRAIN_ROW_FIELD(old_workers)},
    {"workers", "elastic/workers", Format::kInteger,
     PSTRAIN_ROW_FIELD(workers)},
    {"old_shards", nullptr, Format::kInteger, PSTRAIN_ROW_FIELD(old_shards)},
    {"shards", "elastic/shards", Format::kInteger, PSTRAIN_ROW_FIELD(shards)},
    {"membership_change_ms", "elastic/change_ms", Format::kValue,
     PSTRAIN_ROW_FIELD(membership_change_ms)},
};

// StepMetrics' phases, in StepPhases' order, and where their means go.
std::optional<double> MetricsRow::*const kPhaseFields[] = {
    &MetricsRow::forward_ms,   &MetricsRow::backward_ms,
    &MetricsRow::push_ms,      &MetricsRow::barrier_wait_ms,
    &MetricsRow::pull_ms,      &MetricsRow::allreduce_ms,
    &MetricsRow::bytes_pushed, &MetricsRow::bytes_pulled};

#undef PSTRAIN_ROW_FIELD

std::string CsvCell(const Column& column, std::optional<double> value) {
  if (!value) return "";
  switch (column.format) {
    case Format::kInteger:
      return absl::StrCat(static_cast<int64_t>(*value));
    case Format::kSeconds:
      return absl::StrFormat("%.3f", *value);
    case Format::kValue:
      break;
  }
  return absl::StrFormat("%.6g", *value);
}

// `path` emptied, or (append) positioned at its end.
absl::StatusOr<std::FILE*> OpenForWriting(const std::string& path,
                                          bool append) {
  std::FILE* file = std::fopen(path.c_str(), append ? "a" : "w");
  if (file == nullptr) return ErrnoToStatus(errno, path);
  if (append && std::fseek(file, 0, SEEK_END) != 0) {
    const int error = errno;
    std::fclose(file);
    return ErrnoToStatus(error, path);
  }
  return file;
}

}  // namespace

StepMetrics::StepMetrics(int batch_size, float lr, absl::Time start)
    : batch_size_(batch_size),
      lr_(std::stod(absl::StrFormat("%.7g", lr))),
      start_(start) {}

void StepMetrics::AddStep(std::optional<double> loss, absl::Duration compute,
                          absl::Duration exchange, const StepPhases& phases) {
  ++steps_;
  if (loss) {
    loss_sum_ += *loss;
    ++loss_steps_;
  }
  compute_ += compute;
  exchange_ += exchange;
  const std::optional<absl::Duration> times[] = {
      phases.forward,      phases.backward, phases.push,
      phases.barrier_wait, phases.pull,     phases.allreduce};
  static_assert(std::size(kPhaseFields) == kNumPhases);
  int i = 0;
  for (const std::optional<absl::Duration>& t : times) {
    if (t) {
      phase_sum_[i] += absl::ToDoubleMilliseconds(*t);
      ++phase_steps_[i];
    }
    ++i;
  }
  for (const std::optional<int64_t>& bytes :
       {phases.bytes_pushed, phases.bytes_pulled}) {
    if (bytes) {
      phase_sum_[i] += static_cast<double>(*bytes);
      ++phase_steps_[i];
    }
    ++i;
  }
}

MetricsRow StepMetrics::Row(int64_t step, int epoch, absl::Time now) const {
  MetricsRow row;
  row.step = step;
  row.epoch = epoch;
  row.wall_time_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  row.elapsed_s = absl::ToDoubleSeconds(now - start_);
  return row;
}

MetricsRow StepMetrics::TakeInterval(int64_t step, int epoch, absl::Time now) {
  MetricsRow row = Row(step, epoch, now);
  row.lr = lr_;
  if (steps_ > 0) {
    row.interval_steps = steps_;
    if (loss_steps_ > 0) row.loss = loss_sum_ / loss_steps_;
    const double seconds = absl::ToDoubleSeconds(compute_ + exchange_);
    if (seconds > 0) {
      row.samples_per_sec = static_cast<double>(batch_size_) * steps_ / seconds;
    }
    row.compute_ms = absl::ToDoubleMilliseconds(compute_) / steps_;
    row.exchange_ms = absl::ToDoubleMilliseconds(exchange_) / steps_;
    for (int i = 0; i < kNumPhases; ++i) {
      if (phase_steps_[i] == steps_) {
        row.*kPhaseFields[i] = phase_sum_[i] / steps_;
      }
    }
  }
  std::fill(std::begin(phase_sum_), std::end(phase_sum_), 0.0);
  std::fill(std::begin(phase_steps_), std::end(phase_steps_), 0);
  steps_ = 0;
  loss_steps_ = 0;
  loss_sum_ = 0;
  compute_ = absl::ZeroDuration();
  exchange_ = absl::ZeroDuration();
  return row;
}

MetricsRow StepMetrics::EvaluationRow(int64_t step, int epoch, double test_loss,
                                      double test_accuracy,
                                      absl::Time now) const {
  MetricsRow row = Row(step, epoch, now);
  row.test_loss = test_loss;
  row.test_accuracy = test_accuracy;
  return row;
}

MetricsRow StepMetrics::MembershipRow(int64_t step, int epoch,
                                      const MembershipChange& change,
                                      absl::Time now) const {
  MetricsRow row = Row(step, epoch, now);
  row.old_workers = change.old_workers;
  row.workers = change.workers;
  row.old_shards = change.old_shards;
  row.shards = change.shards;
  row.membership_change_ms = change.ms;
  return row;
}

std::string FormatEta(double seconds) {
  const int64_t s =
      seconds > 0 ? static_cast<int64_t>(std::llround(seconds)) : 0;
  if (s >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  }
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string FormatStepDetails(const MetricsRow& row, int64_t total_steps) {
  std::string out;
  if (row.loss) absl::StrAppendFormat(&out, ", loss %.4f", *row.loss);
  if (row.lr) absl::StrAppendFormat(&out, ", lr %g", *row.lr);
  absl::StrAppendFormat(&out, ", step %d/%d", row.step, total_steps);
  if (row.compute_ms && row.exchange_ms) {
    const double step_seconds = (*row.compute_ms + *row.exchange_ms) / 1e3;
    absl::StrAppend(
        &out, ", ETA ",
        FormatEta(static_cast<double>(total_steps - row.step) * step_seconds));
  }
  return out;
}

const char* MetricsWriter::CsvHeader() {
  static const std::string* const header = [] {
    auto* h = new std::string;
    for (const Column& c : kColumns) {
      absl::StrAppend(h, h->empty() ? "" : ",", c.name);
    }
    return h;
  }();
  return header->c_str();
}

absl::StatusOr<std::unique_ptr<MetricsWriter>> MetricsWriter::Create(
    const std::string& dir, int worker_id, bool append) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return ErrnoToStatus(error.value(), absl::StrCat(dir, ": cannot create"));
  }
  std::unique_ptr<MetricsWriter> writer(new MetricsWriter);
  const std::string base = absl::StrCat(dir, "/worker", worker_id);
  writer->csv_path_ = base + ".csv";
  writer->jsonl_path_ = base + ".jsonl";
  ASSIGN_OR_RETURN(writer->csv_, OpenForWriting(writer->csv_path_, append));
  ASSIGN_OR_RETURN(writer->jsonl_, OpenForWriting(writer->jsonl_path_, append));
  ASSIGN_OR_RETURN(writer->tensorboard_, TensorBoardWriter::Create(absl::StrCat(
                                             dir, "/tb/worker", worker_id)));
  // Positioned at the end: 0 only for an empty file.
  if (std::ftell(writer->csv_) <= 0) {
    RETURN_IF_ERROR(
        writer->Append(writer->csv_, writer->csv_path_, CsvHeader()));
  }
  return writer;
}

MetricsWriter::~MetricsWriter() {
  if (csv_ != nullptr) std::fclose(csv_);
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

absl::Status MetricsWriter::Append(std::FILE* file, const std::string& path,
                                   const std::string& line) {
  if (!error_.ok()) return error_;
  if (std::fputs(line.c_str(), file) < 0 || std::fputc('\n', file) == EOF ||
      std::fflush(file) != 0) {
    error_ = ErrnoToStatus(errno, absl::StrCat(path, ": write"));
  }
  return error_;
}

absl::Status MetricsWriter::Write(const MetricsRow& row) {
  std::string csv;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  std::vector<TensorBoardScalar> scalars;
  for (const Column& c : kColumns) {
    const std::optional<double> value = c.get(row);
    absl::StrAppend(&csv, &c == kColumns ? "" : ",", CsvCell(c, value));
    if (!value) {
      json[c.name] = nullptr;
    } else if (c.format == Format::kInteger) {
      json[c.name] = static_cast<int64_t>(*value);
    } else {
      json[c.name] = *value;
    }
    if (value && c.tag != nullptr) {
      scalars.push_back({c.tag, static_cast<float>(*value)});
    }
  }
  RETURN_IF_ERROR(Append(csv_, csv_path_, csv));
  RETURN_IF_ERROR(Append(jsonl_, jsonl_path_, json.dump()));
  if (absl::Status s = tensorboard_->WriteScalars(
          row.step, scalars,
          absl::UnixEpoch() + absl::Seconds(row.wall_time_s));
      !s.ok() && error_.ok()) {
    error_ = s;
  }
  return error_;
}

}  // namespace pstrain
