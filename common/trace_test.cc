#include "common/trace.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace trace {
namespace {

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(TraceTest, OffRecordsNothingOnWritesCompleteEventsPerThread) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR")) + "/trace/worker0.json";
  { Scope before("not recorded", "test"); }
  ASSERT_FALSE(Enabled());
  TraceOptions options;
  options.path = path;
  options.process_name = "worker 0";
  options.pid = 100;
  options.flush_interval = absl::ZeroDuration();
  ASSERT_TRUE(Start(options).ok());
  EXPECT_TRUE(Enabled());
  SetThreadName("main");
  SetClockOffset(-1500, 80);
  {
    Scope s("forward", "compute", {{"step", 3}});
    s.AddArg("layer", 7);
  }
  std::thread other([] {
    SetThreadName("pusher");
    Complete("push", "ps", 1000, 1250, {{"param", 2}, {"chunk", 1}});
  });
  other.join();
  // A later thread of the same name shares its row.
  std::thread again([] {
    SetThreadName("pusher");
    Complete("push", "ps", 2000, 2100, {{"param", 3}});
  });
  again.join();
  ASSERT_TRUE(Stop().ok());
  EXPECT_FALSE(Enabled());
  { Scope after("not recorded either", "test"); }

  const nlohmann::json file = ReadJson(path);
  ASSERT_TRUE(file.is_array());
  int complete = 0;
  bool clock = false, process = false;
  int threads = 0;
  int forward_tid = -1, push_tid = -1, again_tid = -2;
  for (const nlohmann::json& e : file) {
    EXPECT_EQ(e["pid"], 100);
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] == "M" && e["name"] == "pstrain_clock") {
      clock = true;
      EXPECT_EQ(e["args"]["offset_us"], -1500);
      EXPECT_EQ(e["args"]["rtt_us"], 80);
    }
    if (e["ph"] == "M" && e["name"] == "process_name") {
      process = true;
      EXPECT_EQ(e["args"]["name"], "worker 0");
    }
    if (e["ph"] != "X") continue;
    ++complete;
    EXPECT_NE(e["name"], "not recorded");
    EXPECT_NE(e["name"], "not recorded either");
    if (e["name"] == "forward") {
      forward_tid = e["tid"];
      EXPECT_EQ(e["args"]["step"], 3);
      EXPECT_EQ(e["args"]["layer"], 7);
      EXPECT_GE(e["dur"].get<int64_t>(), 0);
    }
    if (e["name"] == "push" && e["args"]["param"] == 2) {
      push_tid = e["tid"];
      EXPECT_EQ(e["ts"], 1000);
      EXPECT_EQ(e["dur"], 250);
      EXPECT_EQ(e["args"]["chunk"], 1);
      EXPECT_EQ(e["cat"], "ps");
    }
    if (e["name"] == "push" && e["args"]["param"] == 3) {
      again_tid = e["tid"];
    }
  }
  EXPECT_TRUE(clock);
  EXPECT_TRUE(process);
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(threads, 2);
  EXPECT_NE(forward_tid, push_tid);
  EXPECT_EQ(push_tid, again_tid);
}

TEST(TraceTest, FlushAppendsOnlyNewEventsAndTheFileGrowsReadably) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR")) + "/trace/ps1.json";
  TraceOptions options;
  options.path = path;
  options.process_name = "ps 1";
  options.pid = 1;
  options.flush_interval = absl::ZeroDuration();
  ASSERT_TRUE(Start(options).ok());
  Complete("update", "shard", 10, 20, {{"step", 0}});
  ASSERT_TRUE(Flush().ok());
  // Mid-run: an array without its closing bracket, as viewers accept.
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json partial = nlohmann::json::parse(text.str() + "]");
  int updates = 0;
  for (const nlohmann::json& e : partial) updates += e["name"] == "update";
  EXPECT_EQ(updates, 1);
  Complete("update", "shard", 30, 40, {{"step", 1}});
  ASSERT_TRUE(Flush().ok());
  ASSERT_TRUE(Flush().ok());  // nothing new: nothing written
  ASSERT_TRUE(Stop().ok());
  std::vector<int64_t> steps;
  for (const nlohmann::json& e : ReadJson(path)) {
    if (e["name"] == "update") steps.push_back(e["args"]["step"]);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1})) << "each event once";
}

}  // namespace
}  // namespace trace
}  // namespace pstrain
