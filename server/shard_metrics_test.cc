#include "server/shard_metrics.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(text.str(), '\n');
  EXPECT_EQ(lines.back(), "") << "the file ends with a newline";
  lines.pop_back();
  return lines;
}

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

TEST(ShardMetricsTest, RowsAreIntervalDifferencesAndGauges) {
  ShardStats stats;
  PsService::Counters counters;
  ShardMetrics metrics(stats, counters, kStart);
  EXPECT_FALSE(metrics.Changed(stats));
  stats.min_version = 10;
  stats.updates = 40;
  stats.pushes = 80;
  stats.pulls = 20;
  stats.optimizer_ns = 8'000'000;
  counters.bytes_received = 4000;
  counters.bytes_sent = 2000;
  counters.pulls_done = 20;
  counters.pull_ns = 100'000'000;
  counters.pushes_queued = 3;
  counters.pulls_waiting = 1;
  EXPECT_TRUE(metrics.Changed(stats));
  ShardMetricsRow row =
      metrics.TakeInterval(stats, counters, kStart + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(row.wall_time_s, 1700000002.0);
  EXPECT_DOUBLE_EQ(row.elapsed_s, 2.0);
  EXPECT_EQ(row.version, 10);
  EXPECT_EQ(row.updates, 40);
  EXPECT_DOUBLE_EQ(row.updates_per_sec, 20);
  EXPECT_EQ(row.bytes_received, 4000);
  EXPECT_DOUBLE_EQ(row.optimizer_ms, 8);
  EXPECT_DOUBLE_EQ(*row.optimizer_us_per_update, 200);
  EXPECT_DOUBLE_EQ(*row.pull_ms, 5);
  EXPECT_EQ(row.pushes_queued, 3);
  EXPECT_EQ(row.pulls_waiting, 1);

  // The next interval: only what happened since.
  EXPECT_FALSE(metrics.Changed(stats));
  stats.pushes += 4;
  counters.bytes_received += 100;
  counters.pushes_queued = 0;
  row = metrics.TakeInterval(stats, counters, kStart + absl::Seconds(3));
  EXPECT_EQ(row.pushes, 4);
  EXPECT_EQ(row.updates, 0);
  EXPECT_EQ(row.bytes_received, 100);
  EXPECT_FALSE(row.optimizer_us_per_update.has_value());
  EXPECT_FALSE(row.pull_ms.has_value());
  EXPECT_EQ(row.pushes_queued, 0);
}

TEST(ShardMetricsWriterTest, WritesCsvAndJsonlWithEmptyCells) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/m";
  auto writer = ShardMetricsWriter::Create(dir, 1);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ShardMetricsRow row;
  row.wall_time_s = 1700000001.25;
  row.elapsed_s = 1.25;
  row.version = 7;
  row.updates = 12;
  row.updates_per_sec = 9.6;
  row.bytes_received = 4096;
  row.optimizer_ms = 1.5;
  row.optimizer_us_per_update = 125;
  row.pulls_waiting = 2;
  ASSERT_TRUE((*writer)->Write(row).ok());
  writer->reset();
  const std::vector<std::string> csv = Lines(dir + "/ps1.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv[0],
            "wall_time_s,elapsed_s,version,updates,pushes,pulls,skipped,"
            "updates_per_sec,bytes_received,bytes_sent,optimizer_ms,"
            "optimizer_us_per_update,pull_ms,pushes_queued,pulls_waiting");
  EXPECT_EQ(csv[1], "1700000001.250,1.250,7,12,0,0,0,9.6,4096,0,1.5,125,,0,2");
  const std::vector<std::string> jsonl = Lines(dir + "/ps1.jsonl");
  ASSERT_EQ(jsonl.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(jsonl[0]);
  EXPECT_TRUE(j["version"].is_number_integer());
  EXPECT_EQ(j["bytes_received"], 4096);
  EXPECT_TRUE(j["pull_ms"].is_null());
  EXPECT_DOUBLE_EQ(j["optimizer_us_per_update"].get<double>(), 125);
}

}  // namespace
}  // namespace pstrain
