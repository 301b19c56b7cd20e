#include "cli/trace_merge.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::string Dir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(TraceMergeTest, ShiftsEachTaskByItsOffsetOntoOneOrigin) {
  const std::string dir = Dir("merge");
  // Worker 0's clock is 1000 us behind the coordinator's; shard 0's 500
  // ahead. Shard 0's file is still open (no closing bracket).
  Write(dir + "/worker0.json", R"([
{"ph":"M","name":"process_name","pid":100,"tid":0,"args":{"name":"worker 0"}},
{"ph":"M","name":"pstrain_clock","pid":100,"tid":0,"args":{"offset_us":1000,"rtt_us":60}},
{"ph":"X","name":"push","cat":"ps","pid":100,"tid":1,"ts":10000,"dur":50,"args":{"step":0}},
{"ph":"M","name":"pstrain_dropped","pid":100,"tid":0,"args":{"events":0}}
]
)");
  Write(dir + "/ps0.json", R"([
{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"ps 0"}},
{"ph":"M","name":"pstrain_clock","pid":0,"tid":0,"args":{"offset_us":-500,"rtt_us":80}},
{"ph":"X","name":"update","cat":"shard","pid":0,"tid":3,"ts":11600,"dur":20,"args":{"step":0}})");
  const std::string out = dir + "/../merged.json";
  absl::StatusOr<TraceMergeSummary> summary = MergeTraces(dir, out);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->files.size(), 2u);
  EXPECT_EQ(summary->events, 2);
  EXPECT_EQ(summary->max_rtt_us, 80);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json merged = nlohmann::json::parse(text.str());
  // Coordinator clock: push at 11000, update at 11100; origin 11000.
  EXPECT_EQ(merged["otherData"]["origin_unix_us"], 11000);
  int64_t push_ts = -1, update_ts = -1;
  for (const nlohmann::json& e : merged["traceEvents"]) {
    if (e["name"] == "push") push_ts = e["ts"];
    if (e["name"] == "update") update_ts = e["ts"];
  }
  EXPECT_EQ(push_ts, 0);
  EXPECT_EQ(update_ts, 100);
  ASSERT_EQ(merged["otherData"]["tasks"].size(), 2u);
  EXPECT_EQ(merged["otherData"]["tasks"][0]["task"], "ps 0");
  EXPECT_EQ(merged["otherData"]["tasks"][0]["clock_offset_us"], -500);
}

TEST(TraceMergeTest, NoTraceIsNotFoundAndAStrayFileIsNamed) {
  const std::string empty = Dir("empty");
  EXPECT_TRUE(absl::IsNotFound(MergeTraces(empty, empty + "/m.json").status()));
  const std::string stray = Dir("stray");
  Write(stray + "/notes.json", "{\"hello\": 1}");
  const absl::Status s = MergeTraces(stray, stray + "/../m.json").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("notes.json"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace pstrain
