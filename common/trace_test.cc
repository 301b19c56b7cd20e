#include "common/trace.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>  // NOLINT(build/c++11)

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
  EXPECT_EQ(file["otherData"]["clock_offset_us"], -1500);
  EXPECT_EQ(file["otherData"]["clock_rtt_us"], 80);
  EXPECT_EQ(file["otherData"]["task"], "worker 0");
  int complete = 0;
  int threads = 0;
  int forward_tid = -1, push_tid = -1, again_tid = -2;
  for (const nlohmann::json& e : file["traceEvents"]) {
    EXPECT_EQ(e["pid"], 100);
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
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
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(threads, 2);
  EXPECT_NE(forward_tid, push_tid);
  EXPECT_EQ(push_tid, again_tid);
}

}  // namespace
}  // namespace trace
}  // namespace pstrain
