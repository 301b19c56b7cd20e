// A traced job end to end (issue 24): `pstrain run --trace` with 2 shards
// and 2 sync workers training LeNet-5 on synthetic data, then `pstrain
// trace` merges the four task timelines onto the coordinator's clock. The
// merged trace must parse and order each step's events as the protocol
// does:
//   - a chunk's push starts after the backward of the layer that produced
//     its gradient ended (same process: exact);
//   - a shard's update of a chunk starts after it received every worker's
//     push of it (same process: exact), and after every worker began that
//     push (across processes: within the clock offsets' uncertainty);
//   - every pulled chunk ends after the shard's update of it (across
//     processes, within the same uncertainty).
// The shards' metrics files count every chunk update of the run.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace {

using pstrain::testing::ReadTextFile;
using pstrain::testing::RunCommand;
using pstrain::testing::TempDir;

constexpr int kSteps = 6;
constexpr int kWorkers = 2;

struct Event {
  std::string name;
  int pid;
  int64_t ts;
  int64_t end;
  nlohmann::json args;
  int64_t Arg(const char* key) const { return args.at(key).get<int64_t>(); }
};

TEST(TraceTest, MergedTimelineOrdersPushesUpdatesAndPulls) {
  const std::string dir = TempDir() + "/traced";
  std::filesystem::remove_all(dir);
  const auto run = RunCommand(
      "cli/pstrain run --model=lenet5 --dataset=synthetic "
      "--synthetic_samples=512 --num_classes=10 --image_size=28 "
      "--batch_size=16 --epochs=1 --max_steps_per_epoch=6 --num_ps=2 "
      "--num_workers=2 --mode=sync --partition_bytes=40000 "
      "--log_every_steps=3 --trace --metrics_dir=" +
      dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto merged = RunCommand("cli/pstrain trace " + dir);
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_NE(merged.output.find("Merged 4 task traces"), std::string::npos)
      << merged.output;

  const nlohmann::json trace =
      nlohmann::json::parse(ReadTextFile(dir + "/trace.json"));
  // Per task: the measured offset lies within half its round trip of the
  // true one, 0 on one host.
  std::map<int, int64_t> rtt_of;  // pid -> us
  for (const nlohmann::json& task : trace["otherData"]["tasks"]) {
    const int64_t offset = task["clock_offset_us"].get<int64_t>();
    const int64_t rtt = task["clock_rtt_us"].get<int64_t>();
    ASSERT_GE(rtt, 0) << task;
    EXPECT_LE(std::abs(offset), rtt / 2 + 100) << task;
    const std::string file = task["file"];
    const int pid = file.rfind("ps", 0) == 0 ? std::stoi(file.substr(2))
                                             : 100 + std::stoi(file.substr(6));
    rtt_of[pid] = rtt;
  }
  ASSERT_EQ(rtt_of.size(), 4u);
  auto tolerance = [&](int a, int b) {
    return (rtt_of[a] + rtt_of[b]) / 2 + 200;
  };

  std::vector<Event> events;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    events.push_back({e["name"], e["pid"], e["ts"].get<int64_t>(),
                      e["ts"].get<int64_t>() + e["dur"].get<int64_t>(),
                      e["args"]});
  }
  // Worker steps, backward layers, pushes and pulls; shard pushes received
  // and updates.
  std::map<std::pair<int, int64_t>, const Event*> step_of;  // (pid, step)
  std::vector<const Event*> backward, push, pull, shard_push, update;
  for (const Event& e : events) {
    if (e.pid >= 100 && e.name == "step") step_of[{e.pid, e.Arg("step")}] = &e;
    if (e.pid >= 100 && e.name == "backward") backward.push_back(&e);
    if (e.pid >= 100 && e.name == "push") push.push_back(&e);
    if (e.pid >= 100 && e.name == "pull") pull.push_back(&e);
    if (e.pid < 100 && e.name == "push") shard_push.push_back(&e);
    if (e.pid < 100 && e.name == "update") update.push_back(&e);
  }
  ASSERT_EQ(step_of.size(), size_t{kWorkers * kSteps});
  std::set<std::pair<int64_t, int64_t>> chunks;
  for (const Event* p : push) chunks.insert({p->Arg("param"), p->Arg("chunk")});
  ASSERT_GT(chunks.size(), 8u) << "LeNet-5's 10 tensors in 40 kB chunks";
  EXPECT_EQ(push.size(), chunks.size() * kWorkers * kSteps);
  EXPECT_EQ(update.size(), chunks.size() * kSteps);

  // A push starts after its layer's backward of the same step ended.
  for (const Event* p : push) {
    const Event* step = step_of.at({p->pid, p->Arg("step")});
    const Event* layer = nullptr;
    for (const Event* b : backward) {
      if (b->pid == p->pid && b->ts >= step->ts && b->end <= step->end &&
          b->Arg("params") > 0 && b->Arg("first_param") <= p->Arg("param") &&
          p->Arg("param") < b->Arg("first_param") + b->Arg("params")) {
        layer = b;
      }
    }
    ASSERT_NE(layer, nullptr) << p->args;
    EXPECT_GE(p->ts, layer->end) << p->args << " " << layer->args;
  }

  // Keyed by (param, chunk, step).
  using Key = std::tuple<int64_t, int64_t, int64_t>;
  std::map<Key, const Event*> update_of;
  for (const Event* u : update) {
    update_of[{u->Arg("param"), u->Arg("chunk"), u->Arg("step")}] = u;
  }
  ASSERT_EQ(update_of.size(), update.size()) << "one update per chunk and step";
  for (const Event* s : shard_push) {
    const Event* u =
        update_of.at({s->Arg("param"), s->Arg("chunk"), s->Arg("step")});
    EXPECT_EQ(s->pid, u->pid);
    EXPECT_GE(u->ts, s->ts) << s->args;
  }
  std::map<Key, int> shard_pushes;
  for (const Event* s : shard_push) {
    ++shard_pushes[{s->Arg("param"), s->Arg("chunk"), s->Arg("step")}];
  }
  for (const auto& [key, u] : update_of) {
    EXPECT_EQ(shard_pushes[key], kWorkers) << "every worker's push received";
  }
  for (const Event* p : push) {
    const Event* u =
        update_of.at({p->Arg("param"), p->Arg("chunk"), p->Arg("step")});
    EXPECT_GE(u->ts + tolerance(p->pid, u->pid), p->ts)
        << "update before a push began: " << p->args;
  }
  // A pulled chunk of version v carries the update of step v - 1.
  int pulls_checked = 0;
  for (const Event* p : pull) {
    const int64_t version = p->Arg("version");
    if (version < 1) continue;  // the initial weights
    const Event* u =
        update_of.at({p->Arg("param"), p->Arg("chunk"), version - 1});
    EXPECT_GE(p->end + tolerance(p->pid, u->pid), u->end) << p->args;
    ++pulls_checked;
  }
  EXPECT_EQ(pulls_checked, static_cast<int>(chunks.size()) * kWorkers * kSteps);

  // The shards' metrics rows count every update and received byte.
  int64_t updates = 0;
  for (int k = 0; k < 2; ++k) {
    std::istringstream jsonl(
        ReadTextFile(dir + "/ps" + std::to_string(k) + ".jsonl"));
    int rows = 0;
    for (std::string line; std::getline(jsonl, line); ++rows) {
      const nlohmann::json row = nlohmann::json::parse(line);
      updates += row["updates"].get<int64_t>();
      EXPECT_GE(row["pushes_queued"].get<int64_t>(), 0);
    }
    EXPECT_GE(rows, 1) << "ps" << k;
    EXPECT_TRUE(
        std::filesystem::exists(dir + "/ps" + std::to_string(k) + ".csv"));
  }
  EXPECT_EQ(updates, static_cast<int64_t>(chunks.size()) * kSteps);
}

}  // namespace
