// Kill -9 during checkpoint writing leaves no torn checkpoint: a child
// process (tests/checkpoint_crash_writer) trains a job whose state at every
// step is known (tests/checkpoint_fixture.h) and writes a checkpoint after
// every step through the real writers (the shards' files, the model file,
// the manifest, DIR/latest); it is killed with SIGKILL at 100 random moments
// (seeded, uniform over a window of a few checkpoint writes after it is
// ready), and after each kill the checkpoint DIR/latest names is read with
// the real readers (every file's size and crc32) and must equal, bit for
// bit, the state of its step: weights, Adam m and v, buffers, chunk
// versions, the model file and the data position. The next child resumes
// from it, so the kills also cover every restart's leftovers. Four models of
// different sizes and shard counts, 25 kills each.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/checkpoint_fixture.h"
#include "tests/cli_test_util.h"

namespace pstrain::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kWriter[] = "tests/checkpoint_crash_writer";
constexpr int kKeep = 3;

struct CrashConfig {
  std::string name;
  std::string model = "synthetic";  // Or a zoo model (inputs 1x28x28).
  std::vector<int64_t> sizes;       // synthetic
  int buffers = 0;                  // synthetic
  int num_ps = 2;
  int64_t partition_bytes = 4 << 20;
  int kills = 25;
  uint64_t seed = 1;
};

std::vector<std::string> WriterArgv(const CrashConfig& c,
                                    const std::string& dir, int64_t steps) {
  return {kWriter,
          "--dir=" + dir,
          "--model=" + c.model,
          "--sizes=" + absl::StrJoin(c.sizes, ","),
          absl::StrCat("--buffers=", c.buffers),
          absl::StrCat("--num_ps=", c.num_ps),
          absl::StrCat("--partition_bytes=", c.partition_bytes),
          absl::StrCat("--keep_checkpoints=", kKeep),
          absl::StrCat("--steps=", steps)};
}

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(TempDir(), "/", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Steps of DIR's step-<N> folders, ascending, and the temporary files
// anywhere in DIR (what a killed write leaves).
struct Listing {
  std::vector<int64_t> steps;
  int temporary_files = 0;
};

Listing List(const std::string& dir) {
  Listing listing;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (absl::StrContains(name, ".tmp")) ++listing.temporary_files;
    int64_t step = 0;
    if (e.is_directory() && e.path().parent_path() == fs::path(dir) &&
        absl::StartsWith(name, "step-") &&
        absl::SimpleAtoi(absl::string_view(name).substr(5), &step)) {
      listing.steps.push_back(step);
    }
  }
  std::sort(listing.steps.begin(), listing.steps.end());
  return listing;
}

// Where in the checkpoint cycle the kill fell, from what it left.
std::string Phase(const std::string& dir, const Listing& listing,
                  int64_t latest) {
  if (listing.steps.empty()) return "before the first folder";
  const int64_t newest = listing.steps.back();
  const std::string step_dir = CheckpointStepDir(dir, newest);
  if (newest == latest) {
    return static_cast<int>(listing.steps.size()) > kKeep
               ? "removing old checkpoints"
               : "between checkpoints (training step)";
  }
  if (fs::exists(step_dir + "/manifest.json")) return "latest not yet moved";
  if (fs::exists(step_dir + "/model.safetensors")) return "writing manifest";
  for (const fs::directory_entry& e : fs::directory_iterator(step_dir)) {
    if (absl::StrContains(e.path().filename().string(), ".tmp")) {
      return "writing a shard or model file";
    }
  }
  return "folder made, between its files";
}

// Waits for the child's "ready" line; false if it exits or takes > 60 s.
bool WaitReady(Process& child, const std::string& log) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (absl::StrContains(ReadTextFile(log), "ready ")) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// Mean ms of one checkpoint of `config` (a child that writes 5 and exits).
double CalibrateCheckpointMs(const CrashConfig& config) {
  const std::string dir = NewDir(config.name + "_calibrate");
  const std::string log = dir + ".log";
  Process child(WriterArgv(config, dir, 5), log);
  EXPECT_EQ(child.Wait(120), 0) << ReadTextFile(log);
  const std::string out = ReadTextFile(log);
  const size_t at = out.find("checkpoint_ms ");
  double ms = 0;
  if (at != std::string::npos) {
    const std::string value = out.substr(at + 14);
    EXPECT_TRUE(absl::SimpleAtod(
        absl::StripAsciiWhitespace(value.substr(0, value.find('\n'))), &ms))
        << out;
  }
  fs::remove_all(dir);
  return ms;
}

// Checks the checkpoint DIR/latest names (`manifest`, as read) against the
// fixture's state at its step; advances `expected` to it.
absl::Status CheckLatest(const std::string& dir, const CrashConfig& config,
                         const FixtureModel& model,
                         const absl::StatusOr<CheckpointManifest>& manifest,
                         int64_t last_step, ExpectedState* expected) {
  if (!manifest.ok()) return manifest.status();
  std::string latest;
  RETURN_IF_ERROR(ReadFile(dir + "/latest", &latest));
  if (absl::StripAsciiWhitespace(latest) !=
      absl::StrCat("step-", manifest->step)) {
    return absl::DataLossError(absl::StrCat("latest is \"", latest,
                                            "\" but its manifest says step ",
                                            manifest->step));
  }
  if (manifest->step < last_step) {
    return absl::DataLossError(absl::StrCat("latest went back from step ",
                                            last_step, " to ", manifest->step));
  }
  for (const CheckpointManifest::File& f : manifest->shard_files) {
    if (absl::StrContains(f.name, ".tmp")) {
      return absl::DataLossError("the manifest names a temporary file");
    }
  }
  ASSIGN_OR_RETURN(ModelState state,
                   LoadCheckpointState(*manifest, model.names(), model.shapes(),
                                       model.num_buffers()));
  expected->AdvanceTo(manifest->step);
  RETURN_IF_ERROR(expected->Check(state));
  RETURN_IF_ERROR(model.CheckModelFile(manifest->dir, manifest->model_file,
                                       expected->weights()));
  const DataPosition want = FixturePosition(manifest->step);
  const DataPosition& got = manifest->position;
  if (got.epoch != want.epoch || got.step_in_epoch != want.step_in_epoch ||
      got.steps_per_epoch != want.steps_per_epoch) {
    return absl::DataLossError("data position differs from its step's");
  }
  if (manifest->job.model != model.name() ||
      manifest->job.num_shards != config.num_ps) {
    return absl::DataLossError("job description differs");
  }
  return absl::OkStatus();
}

struct Totals {
  int kills = 0, verified = 0, none_yet = 0, torn = 0;
};
Totals totals;

class CheckpointCrashTest : public ::testing::TestWithParam<CrashConfig> {
 public:
  static void TearDownTestSuite() {
    std::printf(
        "total: %d kills -9 during checkpoint writing, %d latest checkpoints "
        "loaded and verified bit for bit, %d killed before their first, %d "
        "torn\n",
        totals.kills, totals.verified, totals.none_yet, totals.torn);
  }
};

TEST_P(CheckpointCrashTest, LatestAlwaysLoadsAndEqualsItsStep) {
  const CrashConfig& config = GetParam();
  std::unique_ptr<FixtureModel> model;
  if (config.model == "synthetic") {
    model = FixtureModel::Synthetic(config.sizes, config.buffers);
  } else {
    absl::StatusOr<std::unique_ptr<FixtureModel>> zoo =
        FixtureModel::Zoo(config.model, {1, 28, 28}, 10);
    ASSERT_TRUE(zoo.ok()) << zoo.status();
    model = *std::move(zoo);
  }
  ExpectedState expected(model.get(), AdamOptions());

  const double checkpoint_ms = CalibrateCheckpointMs(config);
  ASSERT_GT(checkpoint_ms, 0);
  // Kill moments: uniform over about four checkpoints after the child is
  // ready (its first checkpoint write begins right after).
  const double window_ms = std::min(std::max(4 * checkpoint_ms, 2.0), 3000.0);

  const std::string dir = NewDir(config.name);
  const std::string log = dir + ".log";
  std::mt19937_64 rng(config.seed);
  std::uniform_real_distribution<double> delay_ms(0, window_ms);
  std::map<std::string, int> phases;
  int verified = 0, torn = 0, none_yet = 0, most_folders = 0,
      most_temporary = 0;
  int64_t last_step = 0;
  for (int k = 0; k < config.kills; ++k) {
    SCOPED_TRACE(absl::StrCat(config.name, " kill ", k));
    {
      fs::remove(log);  // So that the last child's "ready" is not read.
      Process child(WriterArgv(config, dir, 0), log);
      ASSERT_TRUE(WaitReady(child, log)) << ReadTextFile(log);
      absl::SleepFor(absl::Milliseconds(delay_ms(rng)));
      child.Kill(SIGKILL);
      ASSERT_EQ(child.Wait(30), -SIGKILL)
          << "the child ended before the kill: " << ReadTextFile(log);
    }
    const Listing listing = List(dir);
    most_folders =
        std::max(most_folders, static_cast<int>(listing.steps.size()));
    most_temporary = std::max(most_temporary, listing.temporary_files);
    EXPECT_LE(static_cast<int>(listing.steps.size()), kKeep + 1)
        << "step folders: " << absl::StrJoin(listing.steps, ", ");

    absl::StatusOr<CheckpointManifest> manifest = ReadLatestCheckpoint(dir);
    if (!fs::exists(dir + "/latest") && last_step == 0) {
      // Killed before its first checkpoint was durable: none exists yet.
      ++none_yet;
      ++phases[Phase(dir, listing, 0)];
      continue;
    }
    const absl::Status check =
        CheckLatest(dir, config, *model, manifest, last_step, &expected);
    if (!check.ok()) {
      ADD_FAILURE() << "torn checkpoint: " << check;
      ++torn;
      continue;
    }
    ++phases[Phase(dir, listing, manifest->step)];
    last_step = manifest->step;
    ++verified;
  }

  // After the last kill a child resumes and finishes cleanly.
  Process child(WriterArgv(config, dir, 2), log);
  ASSERT_EQ(child.Wait(120), 0) << ReadTextFile(log);
  absl::StatusOr<CheckpointManifest> final_manifest = ReadLatestCheckpoint(dir);
  ASSERT_TRUE(final_manifest.ok()) << final_manifest.status();
  EXPECT_EQ(final_manifest->step, last_step + 2);
  EXPECT_LE(static_cast<int>(List(dir).steps.size()), kKeep);

  std::string phase_counts;
  for (const auto& [phase, count] : phases) {
    absl::StrAppend(&phase_counts, "\n    ", count, "  ", phase);
  }
  std::printf(
      "%s: %lld elements in %zu tensors on %d shards, %.1f ms a checkpoint; "
      "%d kills (uniform over %.0f ms), %d latest checkpoints verified (up "
      "to step %lld), %d before the first, %d torn; at most %d step folders "
      "and %d temporary files left; kills fell:%s\n",
      config.name.c_str(), static_cast<long long>(model->total_elements()),
      model->names().size(), config.num_ps, checkpoint_ms, config.kills,
      window_ms, verified, static_cast<long long>(last_step), none_yet, torn,
      most_folders, most_temporary, phase_counts.c_str());
  EXPECT_EQ(verified + none_yet, config.kills);
  totals.kills += config.kills;
  totals.verified += verified;
  totals.none_yet += none_yet;
  totals.torn += torn;
}

// The check has teeth: a writer that points DIR/latest at a checkpoint
// before its files are written (--early_latest), killed right after it did,
// is caught as torn.
TEST(CheckpointCrashControl, CatchesALatestMovedBeforeTheFiles) {
  CrashConfig config;
  config.name = "early_latest";
  config.sizes = {1000000, 1000};
  config.buffers = 1;
  std::unique_ptr<FixtureModel> model =
      FixtureModel::Synthetic(config.sizes, config.buffers);
  int torn = 0;
  const int kKills = 10;
  for (int k = 0; k < kKills; ++k) {
    const std::string dir = NewDir(config.name);
    const std::string log = dir + ".log";
    fs::remove(log);
    std::vector<std::string> argv = WriterArgv(config, dir, 0);
    argv.push_back("--early_latest");
    Process child(argv, log);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!absl::StrContains(ReadTextFile(log), "early ") &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(200));
    }
    child.Kill(SIGKILL);
    ASSERT_EQ(child.Wait(30), -SIGKILL) << ReadTextFile(log);
    ExpectedState expected(model.get(), AdamOptions());
    if (!CheckLatest(dir, config, *model, ReadLatestCheckpoint(dir), 0,
                     &expected)
             .ok()) {
      ++torn;
    }
  }
  std::printf(
      "negative control (latest moved before the files, killed then): %d of "
      "%d latest checkpoints caught as torn\n",
      torn, kKills);
  EXPECT_GE(torn, 1);
}

std::vector<CrashConfig> Configs() {
  std::vector<CrashConfig> configs(4);
  configs[0].name = "lenet5";
  configs[0].model = "lenet5";
  configs[0].num_ps = 2;
  configs[0].partition_bytes = 16 << 10;
  configs[0].seed = 1;
  configs[1].name = "small";
  configs[1].sizes = {3000, 700, 64, 32};
  configs[1].buffers = 2;
  configs[1].num_ps = 1;
  configs[1].partition_bytes = 4 << 10;
  configs[1].seed = 2;
  configs[2].name = "medium";
  configs[2].sizes = {250000, 60000, 512, 512};
  configs[2].buffers = 2;
  configs[2].num_ps = 3;
  configs[2].partition_bytes = 64 << 10;
  configs[2].seed = 3;
  configs[3].name = "large";
  configs[3].sizes = {800000, 200000, 2048, 2048};
  configs[3].buffers = 2;
  configs[3].num_ps = 2;
  configs[3].partition_bytes = 1 << 20;
  configs[3].seed = 4;
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Sizes, CheckpointCrashTest,
                         ::testing::ValuesIn(Configs()),
                         [](const ::testing::TestParamInfo<CrashConfig>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace pstrain::testing
