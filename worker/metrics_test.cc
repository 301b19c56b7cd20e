#include "worker/metrics.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags_util.h"
#include "gtest/gtest.h"
#include "proto/tensorboard_event.pb.h"

namespace pstrain {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/metrics_test_", name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<std::string> Lines(const std::string& path) {
  std::string contents;
  EXPECT_TRUE(ReadFile(path, &contents).ok()) << path;
  std::vector<std::string> lines = absl::StrSplit(contents, '\n');
  EXPECT_EQ(lines.back(), "") << "the file ends with a newline";
  lines.pop_back();
  return lines;
}

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

TEST(StepMetricsTest, IntervalRowAveragesItsSteps) {
  StepMetrics metrics(/*batch_size=*/64, /*lr=*/1e-3f, kStart);
  metrics.AddStep(0.5, absl::Milliseconds(30), absl::Milliseconds(10));
  metrics.AddStep(0.25, absl::Milliseconds(50), absl::Milliseconds(30));
  EXPECT_EQ(metrics.steps_in_interval(), 2);
  const MetricsRow row =
      metrics.TakeInterval(/*step=*/2, /*epoch=*/0, kStart + absl::Seconds(2));
  EXPECT_EQ(row.step, 2);
  EXPECT_EQ(row.epoch, 0);
  EXPECT_DOUBLE_EQ(row.wall_time_s, 1700000002.0);
  EXPECT_DOUBLE_EQ(row.elapsed_s, 2.0);
  EXPECT_EQ(row.interval_steps, 2);
  EXPECT_DOUBLE_EQ(*row.loss, 0.375);
  // The float 1e-3f as the decimal it was given.
  EXPECT_EQ(*row.lr, 0.001);
  // 128 samples in 120 ms of steps.
  EXPECT_NEAR(*row.samples_per_sec, 128 / 0.120, 1e-9);
  EXPECT_DOUBLE_EQ(*row.compute_ms, 40);
  EXPECT_DOUBLE_EQ(*row.exchange_ms, 20);
  EXPECT_FALSE(row.job_samples_per_sec.has_value());
  EXPECT_FALSE(row.test_loss.has_value());
  EXPECT_FALSE(row.test_accuracy.has_value());

  // The next interval starts empty.
  EXPECT_EQ(metrics.steps_in_interval(), 0);
  metrics.AddStep(std::nullopt, absl::Milliseconds(10), absl::Milliseconds(10));
  const MetricsRow next = metrics.TakeInterval(3, 1, kStart + absl::Seconds(3));
  EXPECT_EQ(next.interval_steps, 1);
  EXPECT_FALSE(next.loss.has_value()) << "synthetic compute has no loss";
  EXPECT_DOUBLE_EQ(*next.samples_per_sec, 64 / 0.020);

  const MetricsRow empty = metrics.TakeInterval(3, 1, kStart);
  EXPECT_FALSE(empty.interval_steps.has_value());
  EXPECT_FALSE(empty.samples_per_sec.has_value());
  EXPECT_FALSE(empty.compute_ms.has_value());
}

TEST(StepMetricsTest, PhasesAreMeansOverStepsThatAllHaveThem) {
  StepMetrics metrics(/*batch_size=*/8, /*lr=*/1e-3f, kStart);
  StepPhases a;
  a.forward = absl::Milliseconds(4);
  a.backward = absl::Milliseconds(8);
  a.push = absl::Milliseconds(6);
  a.barrier_wait = absl::Milliseconds(2);
  a.pull = absl::Milliseconds(1);
  a.bytes_pushed = 1000;
  a.bytes_pulled = 3000;
  StepPhases b = a;
  b.forward = absl::Milliseconds(6);
  b.bytes_pushed = 2000;
  b.barrier_wait.reset();  // one step without: no mean
  metrics.AddStep(1.0, absl::Milliseconds(12), absl::Milliseconds(3), a);
  metrics.AddStep(1.0, absl::Milliseconds(14), absl::Milliseconds(3), b);
  const MetricsRow row = metrics.TakeInterval(2, 0, kStart);
  EXPECT_DOUBLE_EQ(*row.forward_ms, 5);
  EXPECT_DOUBLE_EQ(*row.backward_ms, 8);
  EXPECT_DOUBLE_EQ(*row.push_ms, 6);
  EXPECT_FALSE(row.barrier_wait_ms.has_value());
  EXPECT_DOUBLE_EQ(*row.pull_ms, 1);
  EXPECT_FALSE(row.allreduce_ms.has_value()) << "not an allreduce step";
  EXPECT_DOUBLE_EQ(*row.bytes_pushed, 1500);
  EXPECT_DOUBLE_EQ(*row.bytes_pulled, 3000);
  // The next interval starts from nothing.
  StepPhases allreduce;
  allreduce.allreduce = absl::Milliseconds(7);
  metrics.AddStep(1.0, absl::Milliseconds(12), absl::Milliseconds(3),
                  allreduce);
  const MetricsRow next = metrics.TakeInterval(3, 0, kStart);
  EXPECT_DOUBLE_EQ(*next.allreduce_ms, 7);
  EXPECT_FALSE(next.forward_ms.has_value());
  EXPECT_FALSE(next.bytes_pushed.has_value());
}

TEST(StepMetricsTest, EvaluationRowHasOnlyTestValues) {
  const StepMetrics metrics(64, 1e-3f, kStart);
  const MetricsRow row =
      metrics.EvaluationRow(30, 0, 0.61, 0.8702, kStart + absl::Seconds(9));
  EXPECT_EQ(row.step, 30);
  EXPECT_DOUBLE_EQ(*row.test_loss, 0.61);
  EXPECT_DOUBLE_EQ(*row.test_accuracy, 0.8702);
  EXPECT_FALSE(row.lr.has_value());
  EXPECT_FALSE(row.interval_steps.has_value());
  EXPECT_FALSE(row.loss.has_value());
}

TEST(FormatTest, Eta) {
  EXPECT_EQ(FormatEta(0), "0:00");
  EXPECT_EQ(FormatEta(45.2), "0:45");
  EXPECT_EQ(FormatEta(723), "12:03");
  EXPECT_EQ(FormatEta(3723), "1:02:03");
  EXPECT_EQ(FormatEta(-5), "0:00");
}

TEST(FormatTest, StepDetails) {
  MetricsRow row;
  row.step = 200;
  row.loss = 0.43214;
  row.lr = 0.001;
  // 736 steps left at 61.1413 ms per step: 45 s.
  row.compute_ms = 50;
  row.exchange_ms = 11.1413;
  EXPECT_EQ(FormatStepDetails(row, 936),
            ", loss 0.4321, lr 0.001, step 200/936, ETA 0:45");
  row.loss.reset();
  row.compute_ms.reset();
  EXPECT_EQ(FormatStepDetails(row, 936), ", lr 0.001, step 200/936");
}

TEST(MetricsWriterTest, WritesCsvJsonlAndTensorBoard) {
  const std::string dir = TestDir("files");
  auto writer = MetricsWriter::Create(dir, 1);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->csv_path(), dir + "/worker1.csv");
  EXPECT_EQ((*writer)->jsonl_path(), dir + "/worker1.jsonl");
  EXPECT_EQ((*writer)->events_path().rfind(dir + "/tb/worker1/events.out.", 0),
            0u)
      << (*writer)->events_path();

  StepMetrics metrics(32, 0.01f, kStart);
  metrics.AddStep(2.0, absl::Milliseconds(80), absl::Milliseconds(20));
  metrics.AddStep(1.0, absl::Milliseconds(80), absl::Milliseconds(20));
  MetricsRow interval = metrics.TakeInterval(2, 0, kStart + absl::Seconds(1));
  interval.job_samples_per_sec = 1234.5;
  ASSERT_TRUE((*writer)->Write(interval).ok());
  ASSERT_TRUE((*writer)
                  ->Write(metrics.EvaluationRow(2, 0, 0.75, 0.5,
                                                kStart + absl::Seconds(2)))
                  .ok());
  const std::string events_path = (*writer)->events_path();
  writer->reset();

  const std::vector<std::string> csv = Lines(dir + "/worker1.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0],
            "step,epoch,wall_time_s,elapsed_s,interval_steps,loss,lr,"
            "samples_per_sec,job_samples_per_sec,compute_ms,exchange_ms,"
            "test_loss,test_accuracy,forward_ms,backward_ms,push_ms,"
            "barrier_wait_ms,pull_ms,allreduce_ms,bytes_pushed,bytes_pulled,"
            "old_workers,workers,old_shards,shards,membership_change_ms");
  EXPECT_EQ(csv[0], MetricsWriter::CsvHeader());
  EXPECT_EQ(csv[1],
            "2,0,1700000001.000,1.000,2,1.5,0.01,320,1234.5,80,20,,,,,,,,,,"
            ",,,,,");
  // Empty cells where a value does not apply.
  EXPECT_EQ(csv[2], "2,0,1700000002.000,2.000,,,,,,,,0.75,0.5,,,,,,,,,,,,,");

  const std::vector<std::string> jsonl = Lines(dir + "/worker1.jsonl");
  ASSERT_EQ(jsonl.size(), 2u);
  const nlohmann::json first = nlohmann::json::parse(jsonl[0]);
  EXPECT_EQ(first["step"], 2);
  EXPECT_TRUE(first["step"].is_number_integer());
  EXPECT_TRUE(first["interval_steps"].is_number_integer());
  EXPECT_DOUBLE_EQ(first["loss"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(first["lr"].get<double>(), 0.01);
  EXPECT_DOUBLE_EQ(first["samples_per_sec"].get<double>(), 320);
  EXPECT_DOUBLE_EQ(first["wall_time_s"].get<double>(), 1700000001.0);
  EXPECT_TRUE(first["test_accuracy"].is_null());
  const nlohmann::json second = nlohmann::json::parse(jsonl[1]);
  EXPECT_TRUE(second["loss"].is_null());
  EXPECT_DOUBLE_EQ(second["test_accuracy"].get<double>(), 0.5);
  // The same keys as the CSV's columns, in their order (ordered_json keeps
  // the file's order; nlohmann::json would sort them).
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(jsonl[0]);
  std::vector<std::string> keys;
  for (const auto& item : ordered.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, std::vector<std::string>(
                      absl::StrSplit(MetricsWriter::CsvHeader(), ',')));

  std::string events_file;
  ASSERT_TRUE(ReadFile(events_path, &events_file).ok());
  auto records = ReadTfRecords(events_file);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);  // file_version, then one per row
  std::map<std::string, float> interval_scalars;
  tb::Event event;
  ASSERT_TRUE(event.ParseFromString((*records)[1]));
  EXPECT_EQ(event.step(), 2);
  EXPECT_DOUBLE_EQ(event.wall_time(), 1700000001.0);
  for (const auto& v : event.summary().value()) {
    interval_scalars[v.tag()] = v.simple_value();
  }
  EXPECT_EQ(interval_scalars, (std::map<std::string, float>{
                                  {"train/loss", 1.5f},
                                  {"train/lr", 0.01f},
                                  {"train/samples_per_sec", 320.0f},
                                  {"train/job_samples_per_sec", 1234.5f},
                                  {"time/compute_ms", 80.0f},
                                  {"time/exchange_ms", 20.0f}}));
  ASSERT_TRUE(event.ParseFromString((*records)[2]));
  ASSERT_EQ(event.summary().value_size(), 2);
  EXPECT_EQ(event.summary().value(0).tag(), "test/loss");
  EXPECT_EQ(event.summary().value(1).tag(), "test/accuracy");
  EXPECT_FLOAT_EQ(event.summary().value(1).simple_value(), 0.5f);
}

// An elastic job's membership change (issue 40): its own row with the
// counts before and after and the time taken, nothing else, and its
// TensorBoard series.
TEST(MetricsWriterTest, MembershipRowHasTheCountsAndTheTime) {
  const std::string dir = TestDir("membership");
  StepMetrics metrics(32, 0.01f, kStart);
  auto writer = MetricsWriter::Create(dir, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)
                  ->Write(metrics.MembershipRow(300, 0, {4, 4, 2, 3, 129.5},
                                                kStart + absl::Seconds(3)))
                  .ok());
  const std::string events_path = (*writer)->events_path();
  writer->reset();
  const std::vector<std::string> csv = Lines(dir + "/worker0.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv[1],
            "300,0,1700000003.000,3.000,,,,,,,,,,,,,,,,,,4,4,2,3,129.5");
  const nlohmann::json row =
      nlohmann::json::parse(Lines(dir + "/worker0.jsonl")[0]);
  EXPECT_EQ(row["shards"], 3);
  EXPECT_EQ(row["old_shards"], 2);
  EXPECT_DOUBLE_EQ(row["membership_change_ms"].get<double>(), 129.5);
  EXPECT_TRUE(row["loss"].is_null());
  std::string events_file;
  ASSERT_TRUE(ReadFile(events_path, &events_file).ok());
  auto records = ReadTfRecords(events_file);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  tb::Event event;
  ASSERT_TRUE(event.ParseFromString((*records)[1]));
  EXPECT_EQ(event.step(), 300);
  std::map<std::string, float> scalars;
  for (const auto& v : event.summary().value()) {
    scalars[v.tag()] = v.simple_value();
  }
  EXPECT_EQ(scalars,
            (std::map<std::string, float>{{"elastic/workers", 4.0f},
                                          {"elastic/shards", 3.0f},
                                          {"elastic/change_ms", 129.5f}}));
}

TEST(MetricsWriterTest, ResumedRunAppendsAfterTheRowsThere) {
  const std::string dir = TestDir("append");
  StepMetrics metrics(32, 0.01f, kStart);
  metrics.AddStep(1.0, absl::Milliseconds(10), absl::Milliseconds(10));
  {
    auto first = MetricsWriter::Create(dir, 0);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->Write(metrics.TakeInterval(1, 0, kStart)).ok());
  }
  {
    auto resumed = MetricsWriter::Create(dir, 0, /*append=*/true);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    metrics.AddStep(1.0, absl::Milliseconds(10), absl::Milliseconds(10));
    ASSERT_TRUE((*resumed)->Write(metrics.TakeInterval(2, 0, kStart)).ok());
  }
  const std::vector<std::string> csv = Lines(dir + "/worker0.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0], MetricsWriter::CsvHeader());
  EXPECT_EQ(csv[1].substr(0, 2), "1,");
  EXPECT_EQ(csv[2].substr(0, 2), "2,");
  EXPECT_EQ(Lines(dir + "/worker0.jsonl").size(), 2u);
  int event_files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir + "/tb/worker0")) {
    event_files += entry.is_regular_file();
  }
  EXPECT_EQ(event_files, 2);

  // Appending to a folder without files starts them with the header.
  const std::string fresh = TestDir("append_fresh");
  ASSERT_TRUE(MetricsWriter::Create(fresh, 3, /*append=*/true).ok());
  EXPECT_EQ(Lines(fresh + "/worker3.csv"),
            std::vector<std::string>{MetricsWriter::CsvHeader()});
}

TEST(MetricsWriterTest, FolderThatCannotBeMadeIsAnError) {
  const std::string dir = TestDir("blocked");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  auto writer = MetricsWriter::Create(dir + "/file/metrics", 0);
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.status().message().find(dir + "/file/metrics"),
            std::string::npos)
      << writer.status();
}

}  // namespace
}  // namespace pstrain
