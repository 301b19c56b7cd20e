// checkpoint_bench: what checkpoints cost (issue 20).
//
// Write: a checkpoint of each --models model written by the real writers
// (CheckpointWriter on one worker, --num_ps in-process shards behind gRPC on
// loopback: every shard's safetensors file, model.safetensors, manifest.json
// and DIR/latest, each fsynced and renamed, folders fsynced), against a plain
// sequential write+fsync of the same number of bytes into one file of the
// same folder, alternating which goes first, in the same run. The model's
// state is the checkpoint fixture's (tests/checkpoint_fixture.h), so every
// checkpoint read back is compared bit for bit with the state of its step.
//   bytes    = every file of the checkpoint folder (shards, model, manifest)
//   ckpt_ms  = Begin (snapshot on the shards, copy of the worker's weights)
//              to the end of the background write (Wait)
//   stall_ms = Begin alone: what the training thread waits
//   cpu_ms   = user + system time of every thread (shards and worker) from
//              Begin to Wait: what a checkpoint can take from training
//   MB/s     = bytes / time (10^6 bytes per MB)
//   ratio    = plain ms / ckpt ms (1.0: as fast as a plain write+fsync)
//   #wrong   = checkpoints that do not load, verify and equal their step's
//              state bit for bit (0 expected)
// Medians over --repeats (after one untimed round).
//
// Train (--train): the training step time of `pstrain run` (--pstrain) of
// --train_model with a checkpoint every --checkpoint_every steps against
// none, --train_repeats runs of each, alternating:
//   step      = the run's training wall time (evaluation excluded) / steps
//   cpu       = user + system seconds of every process of the run (with
//               OMP_WAIT_POLICY=passive: the work done, which the load of
//               a shared machine changes much less than the wall time)
//   cpu ratio = median cpu with checkpoints / median cpu without
//   ratio     = median step with checkpoints / median step without
//   within the runs: from the metrics rows (every 10 steps) of each
//   checkpointing run, the time of the interval that ends at a checkpoint
//   (its Begin) and of the 50 steps after it (its background write) beyond
//   as many of the run's median intervals; over the steps between two
//   checkpoints, that is the overhead on a machine whose load drifts
//   between runs.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/partition.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/shard_checkpoint.h"
#include "tests/checkpoint_fixture.h"

ABSL_FLAG(std::string, dir, "/tmp/checkpoint_bench",
          "Folder the checkpoints and the plain file are written into "
          "(emptied first).");
ABSL_FLAG(std::string, models,
          "lenet5:1x28x28:10,resnet18:3x32x32:10,resnet50:3x224x224:1000",
          "Write: comma-separated zoo models as name:CxHxW:classes.");
ABSL_FLAG(int, num_ps, 2, "Write: PS shards, each writing its own file.");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20, "Write: chunk bound, bytes.");
ABSL_FLAG(int, repeats, 5, "Write: timed checkpoints per model (median).");
ABSL_FLAG(bool, write, true, "Run the write benchmark.");
ABSL_FLAG(bool, train, false, "Run the training step-time benchmark.");
ABSL_FLAG(std::string, pstrain, "bazel-bin/cli/pstrain",
          "Train: the pstrain binary.");
ABSL_FLAG(std::string, train_model, "resnet18", "Train: model.");
ABSL_FLAG(int, image_size, 32, "Train: synthetic images are 3 x N x N.");
ABSL_FLAG(int, batch_size, 8, "Train: samples per step.");
ABSL_FLAG(int, train_steps, 460,
          "Train: steps per run (one epoch; 460: checkpoints at 200 and 400, "
          "each with 50 steps after it).");
ABSL_FLAG(int, checkpoint_every, 200, "Train: steps between checkpoints.");
ABSL_FLAG(int, train_repeats, 3, "Train: runs of each kind (median).");

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using testing::CheckpointRig;
using testing::ExpectedState;
using testing::FixtureModel;

// User + system seconds of this process (every thread) so far.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Writes `bytes` bytes of `block` over and over into a new file `path`,
// fsyncs and closes it: the plain baseline. Seconds.
absl::StatusOr<double> PlainWrite(const std::string& path, int64_t bytes,
                                  const std::vector<char>& block) {
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, path);
  int64_t written = 0;
  while (written < bytes) {
    const size_t n =
        static_cast<size_t>(std::min<int64_t>(block.size(), bytes - written));
    const ssize_t w = write(fd, block.data(), n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      return ErrnoToStatus(error, path);
    }
    written += w;
  }
  if (fsync(fd) != 0 || close(fd) != 0) return ErrnoToStatus(errno, path);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  fs::remove(path);
  return seconds;
}

// Bytes of every file in `folder`.
int64_t FolderBytes(const std::string& folder) {
  int64_t bytes = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) {
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  }
  return bytes;
}

// Reads DIR's latest checkpoint back and compares it with `expected`
// (advanced to its step): OK or what differs.
absl::Status Verify(const std::string& dir, const FixtureModel& model,
                    int64_t step, ExpectedState* expected) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadLatestCheckpoint(dir));
  if (manifest.step != step) {
    return absl::DataLossError(
        absl::StrCat("latest is step ", manifest.step, "; expected ", step));
  }
  ASSIGN_OR_RETURN(ModelState state,
                   LoadCheckpointState(manifest, model.names(), model.shapes(),
                                       model.num_buffers()));
  expected->AdvanceTo(step);
  RETURN_IF_ERROR(expected->Check(state));
  return model.CheckModelFile(manifest.dir, manifest.model_file,
                              expected->weights());
}

struct ModelSpec {
  std::string name;
  Shape chw;
  int classes = 0;
};

absl::StatusOr<std::vector<ModelSpec>> ParseModels(const std::string& text) {
  std::vector<ModelSpec> specs;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::vector<std::string> parts = absl::StrSplit(item, ':');
    ModelSpec spec;
    std::vector<std::string> dims;
    if (parts.size() == 3) dims = absl::StrSplit(parts[1], 'x');
    spec.chw.resize(dims.size());
    bool ok = parts.size() == 3 && dims.size() == 3 &&
              absl::SimpleAtoi(parts[2], &spec.classes);
    for (size_t d = 0; ok && d < dims.size(); ++d) {
      ok = absl::SimpleAtoi(dims[d], &spec.chw[d]);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--models: \"", item, "\" is not name:CxHxW:classes"));
    }
    spec.name = parts[0];
    specs.push_back(spec);
  }
  return specs;
}

// The writer's stages, each timed alone on the same state (seconds): every
// shard's file (WriteShardCheckpoint, one thread per shard, as the shards
// write them), the model file (SaveModelFile), both without their folder's
// fsync, as the writer has them; the fsync of the step folder and of DIR
// the writer then makes once; manifest and latest (WriteFileAtomically).
struct Stages {
  double shards = 0, model = 0, folders = 0, manifest = 0;
};

absl::Status FsyncFolder(const std::string& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, folder);
  const int synced = fsync(fd);
  const int error = errno;
  close(fd);
  return synced == 0 ? absl::OkStatus() : ErrnoToStatus(error, folder);
}

absl::StatusOr<Stages> TimeStages(const FixtureModel& model,
                                  const ExpectedState& state,
                                  const std::string& dir, int num_shards,
                                  int64_t partition_bytes) {
  ASSIGN_OR_RETURN(PartitionPlan plan,
                   PartitionPlan::Create(model.num_elements(), partition_bytes,
                                         num_shards, model.num_buffers()));
  std::vector<std::vector<ChunkSnapshot>> chunks(num_shards);
  const std::vector<std::vector<float>>& w = state.weights();
  for (const ChunkSpec& spec : plan.chunks()) {
    ChunkSnapshot c;
    c.spec = spec;
    c.is_buffer = plan.is_buffer(spec.param_id);
    c.version = state.step();
    const auto range = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + spec.offset,
                                v.begin() + spec.offset + spec.num_elements);
    };
    c.weights = range(w[spec.param_id]);
    if (!c.is_buffer) {
      // Stand-ins of m and v's size (the stage's cost is their bytes).
      c.m = c.weights;
      c.v = c.weights;
    }
    chunks[spec.shard].push_back(std::move(c));
  }
  const std::string folder = dir + "/stages";
  fs::remove_all(folder);
  fs::create_directories(folder);
  Stages t;
  safetensors::WriteOptions in_folder;
  in_folder.sync_folder = false;
  absl::Time start = absl::Now();
  std::vector<absl::Status> status(num_shards);
  std::vector<std::thread> threads;
  for (int s = 0; s < num_shards; ++s) {
    threads.emplace_back([&, s] {
      status[s] = WriteShardCheckpoint(
                      absl::StrCat(folder, "/shard-", s, ".safetensors"),
                      chunks[s], s, num_shards, state.step(), in_folder)
                      .status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  t.shards = absl::ToDoubleSeconds(absl::Now() - start);

  std::vector<std::vector<float>> copy = w;
  std::vector<absl::Span<float>> spans(copy.begin(), copy.end());
  const std::string model_path = folder + "/model.safetensors";
  start = absl::Now();
  RETURN_IF_ERROR(
      model.SaveModelFile(spans, model_path, state.step(), in_folder).status());
  t.model = absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  RETURN_IF_ERROR(FsyncFolder(folder));
  RETURN_IF_ERROR(FsyncFolder(dir));
  t.folders = absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  RETURN_IF_ERROR(
      WriteFileAtomically(folder + "/manifest.json", std::string(4096, ' ')));
  RETURN_IF_ERROR(WriteFileAtomically(folder + "/latest", "step-1\n"));
  t.manifest = absl::ToDoubleSeconds(absl::Now() - start);
  fs::remove_all(folder);
  return t;
}

absl::Status WriteBench() {
  const std::string root = absl::GetFlag(FLAGS_dir);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  ASSIGN_OR_RETURN(std::vector<ModelSpec> specs,
                   ParseModels(absl::GetFlag(FLAGS_models)));
  std::vector<char> block(8 << 20);
  std::mt19937 rng(1);
  for (char& c : block) c = static_cast<char>(rng());

  std::printf(
      "# Checkpoint write: real writer (%d shard files + model.safetensors + "
      "manifest, fsynced) vs plain write+fsync of the same bytes, folder %s\n"
      "#%9s %10s %9s %6s %9s %8s %9s %8s %6s %9s %9s %7s\n"
      "#%9s %10s %9s %6s %9s %8s %9s %8s %6s %9s %9s %7s\n",
      absl::GetFlag(FLAGS_num_ps), root.c_str(), "model", "elements", "bytes",
      "files", "ckpt", "ckpt", "plain", "plain", "ratio", "stall", "cpu",
      "#wrong", "", "(#)", "(MB)", "(#)", "(ms)", "(MB/s)", "(ms)", "(MB/s)",
      "(x)", "(ms)", "(ms)", "(#)");
  std::fflush(stdout);
  // What a copy into fresh memory costs here (page faults) against one
  // into memory already touched: the snapshot's and the copies' share.
  double first_touch_ms_per_mb = 0, warm_copy_ms_per_mb = 0;
  {
    const size_t n = 64 << 20;
    std::vector<char> source(n, 1);
    const absl::Time start = absl::Now();
    std::vector<char> fresh(source);
    const absl::Time copied = absl::Now();
    std::memcpy(fresh.data(), source.data(), n);
    const absl::Time end = absl::Now();
    first_touch_ms_per_mb = absl::ToDoubleMilliseconds(copied - start) / 64;
    warm_copy_ms_per_mb = absl::ToDoubleMilliseconds(end - copied) / 64;
  }
  double ratio_sum = 0;
  std::vector<std::string> stage_rows;
  for (const ModelSpec& spec : specs) {
    ASSIGN_OR_RETURN(std::unique_ptr<FixtureModel> model,
                     FixtureModel::Zoo(spec.name, spec.chw, spec.classes));
    const std::string dir = absl::StrCat(root, "/", spec.name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    testing::RigOptions options;
    options.checkpoint_dir = dir;
    options.keep_checkpoints = 2;
    options.num_shards = absl::GetFlag(FLAGS_num_ps);
    options.partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRig> rig,
                     CheckpointRig::Create(model.get(), options));
    ExpectedState expected(model.get(), options.adam);
    std::vector<double> ckpt_s, plain_s, stall_s, cpu_s;
    int64_t bytes = 0;
    int files = 0, wrong = 0;
    for (int r = -1; r < repeats; ++r) {  // r = -1: untimed warm-up.
      RETURN_IF_ERROR(rig->Step());
      auto checkpoint = [&]() -> absl::Status {
        const double cpu_start = ProcessCpuSeconds();
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(rig->BeginCheckpoint());
        const absl::Time begun = absl::Now();
        RETURN_IF_ERROR(rig->writer().Wait());
        const absl::Time end = absl::Now();
        const double cpu = ProcessCpuSeconds() - cpu_start;
        const std::string step_dir = CheckpointStepDir(dir, rig->step());
        bytes = FolderBytes(step_dir);
        files = static_cast<int>(std::distance(fs::directory_iterator(step_dir),
                                               fs::directory_iterator()));
        if (r >= 0) {
          ckpt_s.push_back(absl::ToDoubleSeconds(end - start));
          stall_s.push_back(absl::ToDoubleSeconds(begun - start));
          cpu_s.push_back(cpu);
        }
        return absl::OkStatus();
      };
      auto plain = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(
            double s,
            PlainWrite(dir + "/plain.bin", std::max<int64_t>(bytes, 1), block));
        if (r >= 0) plain_s.push_back(s);
        return absl::OkStatus();
      };
      // The checkpoint's size is known after the first one.
      if (r >= 0 && r % 2 == 1) {
        RETURN_IF_ERROR(plain());
        RETURN_IF_ERROR(checkpoint());
      } else {
        RETURN_IF_ERROR(checkpoint());
        RETURN_IF_ERROR(plain());
      }
      const absl::Status verified = Verify(dir, *model, rig->step(), &expected);
      if (!verified.ok()) {
        std::fprintf(stderr, "%s step %lld: %s\n", spec.name.c_str(),
                     static_cast<long long>(rig->step()),
                     verified.ToString().c_str());
        ++wrong;
      }
    }
    const double ckpt = Median(ckpt_s), plain = Median(plain_s);
    const double mb = static_cast<double>(bytes) / 1e6;
    ratio_sum += plain / ckpt;
    std::printf(
        " %9s %10lld %9.1f %6d %9.1f %8.0f %9.1f %8.0f %6.2f %9.1f %9.1f "
        "%7d\n",
        spec.name.c_str(), static_cast<long long>(model->total_elements()), mb,
        files, ckpt * 1e3, mb / ckpt, plain * 1e3, mb / plain, plain / ckpt,
        Median(stall_s) * 1e3, Median(cpu_s) * 1e3, wrong);
    std::fflush(stdout);
    rig.reset();
    std::vector<double> shards_s, model_s, folders_s, manifest_s;
    for (int r = 0; r < repeats; ++r) {
      ASSIGN_OR_RETURN(Stages t,
                       TimeStages(*model, expected, dir, options.num_shards,
                                  options.partition_bytes));
      shards_s.push_back(t.shards);
      model_s.push_back(t.model);
      folders_s.push_back(t.folders);
      manifest_s.push_back(t.manifest);
    }
    stage_rows.push_back(absl::StrFormat(
        " %9s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f", spec.name,
        Median(stall_s) * 1e3, Median(shards_s) * 1e3, Median(model_s) * 1e3,
        Median(folders_s) * 1e3, Median(manifest_s) * 1e3, ckpt * 1e3));
    fs::remove_all(dir);
  }
  std::printf("# Avg ratio vs write+fsync: %.2f (goal >= 0.8)\n",
              ratio_sum / specs.size());
  std::printf(
      "#\n# Where the time goes: Begin (the training thread's stall: shards' "
      "snapshot, copy of the weights), then each stage of the background "
      "write timed alone on the same state; fresh memory's first touch on "
      "this machine: %.2f ms/MB (memcpy into warm memory: %.2f ms/MB)\n"
      "#%9s %9s %9s %9s %9s %9s %9s\n#%9s %9s %9s %9s %9s %9s %9s\n",
      first_touch_ms_per_mb, warm_copy_ms_per_mb, "model", "stall", "shards",
      "model", "folder", "manifest", "ckpt", "", "(ms)", "(ms)", "(ms)",
      "fsyncs(ms)", "latest(ms)", "(ms)");
  for (const std::string& row : stage_rows) std::printf("%s\n", row.c_str());
  return absl::OkStatus();
}

// Metrics rows every kIntervalSteps; a checkpoint's cost is looked for in
// the kWindowSteps after it.
constexpr int kIntervalSteps = 10;
constexpr int kWindowSteps = 50;

struct TrainRun {
  double interval_ms = 0;  // Median interval away from checkpoints.
  double extra_ms_per_checkpoint = 0;
  double ms_per_step = 0;
  double cpu_s = 0;  // User + system, every process of the run.
  double compute_ms = 0, exchange_ms = 0;
  int64_t steps = 0;
  int checkpoints = 0;
};

absl::StatusOr<TrainRun> RunTraining(int checkpoint_every, int index) {
  const std::string root = absl::GetFlag(FLAGS_dir);
  const std::string ckpt_dir = absl::StrCat(root, "/train_ckpt");
  const std::string json_path = absl::StrCat(root, "/train.json");
  const std::string metrics_dir = absl::StrCat(root, "/train_metrics");
  fs::remove_all(ckpt_dir);
  fs::remove_all(metrics_dir);
  fs::remove(json_path);
  const int steps = absl::GetFlag(FLAGS_train_steps);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  // Passive OpenMP waits, so that CPU time counts work, not spinning
  // threads (which burn CPU for as long as a step waits, load included).
  std::string command = absl::StrCat(
      "OMP_WAIT_POLICY=passive ", absl::GetFlag(FLAGS_pstrain),
      " run --model=", absl::GetFlag(FLAGS_train_model),
      " --dataset=synthetic --num_classes=10 --image_size=",
      absl::GetFlag(FLAGS_image_size), " --synthetic_samples=", steps * batch,
      " --num_ps=1 --num_workers=1 --batch_size=", batch,
      " --epochs=1 --max_steps_per_epoch=", steps,
      " --log_every_steps=", kIntervalSteps, " --metrics_dir=", metrics_dir,
      " --results_json=", json_path);
  if (checkpoint_every > 0) {
    absl::StrAppend(&command, " --checkpoint_dir=", ckpt_dir,
                    " --checkpoint_every_steps=", checkpoint_every);
  }
  std::fprintf(stderr, "# run %d: %s\n", index, command.c_str());
  // CPU time of every process of the run (pstrain waits for its tasks, so
  // theirs reach us when it is reaped).
  auto children_cpu_s = [] {
    rusage usage{};
    getrusage(RUSAGE_CHILDREN, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  };
  const double cpu_before = children_cpu_s();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return ErrnoToStatus(errno, "popen");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output.append(buffer, n);
  }
  if (pclose(pipe) != 0) {
    return absl::InternalError(absl::StrCat("pstrain run failed:\n", output));
  }
  const double cpu_s = children_cpu_s() - cpu_before;
  std::string text;
  RETURN_IF_ERROR(ReadFile(json_path, &text));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    return absl::DataLossError(absl::StrCat(json_path, ": not JSON"));
  }
  TrainRun run;
  // Protobuf's JSON writes int64 fields as strings.
  if (j.contains("steps") && j["steps"].is_string()) {
    if (!absl::SimpleAtoi(j["steps"].get<std::string>(), &run.steps)) {
      return absl::DataLossError(
          absl::StrCat(json_path, ": steps is not an integer"));
    }
  } else if (j.contains("steps") && j["steps"].is_number_integer()) {
    run.steps = j["steps"].get<int64_t>();
  }
  const double runtime = j.value("runtime_seconds", 0.0);
  if (run.steps <= 0 || runtime <= 0) {
    return absl::DataLossError(absl::StrCat(json_path, ": no steps"));
  }
  run.ms_per_step = runtime * 1e3 / run.steps;
  run.cpu_s = cpu_s;
  run.compute_ms = j.value("compute_seconds_per_step", 0.0) * 1e3;
  run.exchange_ms = j.value("exchange_seconds_per_step", 0.0) * 1e3;
  std::smatch match;
  if (std::regex_search(output, match,
                        std::regex("Wrote (\\d+) checkpoints"))) {
    run.checkpoints = std::stoi(match[1]);
  }
  if (checkpoint_every > 0 && run.checkpoints == 0) {
    return absl::InternalError(
        absl::StrCat("the run wrote no checkpoint:\n", output));
  }
  // Within the run: the time of the intervals from the one that ends at a
  // checkpoint's step (its Begin) to kWindowSteps after it (its background
  // write), beyond what as many of the run's median intervals take.
  std::string rows;
  RETURN_IF_ERROR(ReadFile(metrics_dir + "/worker0.jsonl", &rows));
  std::vector<std::pair<int64_t, double>> intervals;  // (end step, seconds)
  double last_elapsed = -1;
  for (absl::string_view line : absl::StrSplit(rows, '\n')) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object() ||
        !row.contains("interval_steps") ||
        !row["interval_steps"].is_number_integer()) {
      continue;
    }
    const double elapsed = row.value("elapsed_s", 0.0);
    // The first interval (warm-up) and a short last one are left out.
    if (last_elapsed >= 0 &&
        row["interval_steps"].get<int64_t>() == kIntervalSteps) {
      intervals.push_back(
          {row.value("step", int64_t{0}), elapsed - last_elapsed});
    }
    last_elapsed = elapsed;
  }
  // The interval ending at a checkpoint's step holds its Begin; the next
  // kWindowSteps / kIntervalSteps its background write.
  auto in_window = [&](int64_t end_step) {
    return checkpoint_every > 0 && end_step >= checkpoint_every &&
           end_step % checkpoint_every <= kWindowSteps;
  };
  std::vector<double> quiet;
  for (const auto& [end, seconds] : intervals) {
    if (!in_window(end)) quiet.push_back(seconds);
  }
  run.interval_ms = Median(quiet) * 1e3;
  if (run.checkpoints > 0) {
    double extra = 0;
    for (const auto& [end, seconds] : intervals) {
      if (in_window(end)) extra += seconds * 1e3 - run.interval_ms;
    }
    run.extra_ms_per_checkpoint = extra / run.checkpoints;
  }
  return run;
}

absl::Status TrainBench() {
  fs::create_directories(absl::GetFlag(FLAGS_dir));
  const int every = absl::GetFlag(FLAGS_checkpoint_every);
  std::vector<double> none_ms, ckpt_ms, none_compute, ckpt_compute,
      none_exchange, ckpt_exchange, extra_ms, step_ms_quiet, none_cpu, ckpt_cpu;
  int checkpoints = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_train_repeats); ++r) {
    for (int with : {0, 1}) {
      // Alternate which goes first.
      const int kind = (r % 2 == 0) ? with : 1 - with;
      ASSIGN_OR_RETURN(TrainRun run,
                       RunTraining(kind == 1 ? every : 0, 2 * r + with));
      std::fprintf(stderr,
                   "#   %s: %.1f ms/step (%.1f away from checkpoints), %d "
                   "checkpoints, %.0f ms extra each, %.1f CPU s\n",
                   kind == 1 ? "checkpoints" : "none", run.ms_per_step,
                   run.interval_ms / kIntervalSteps, run.checkpoints,
                   run.extra_ms_per_checkpoint, run.cpu_s);
      (kind == 1 ? ckpt_ms : none_ms).push_back(run.ms_per_step);
      (kind == 1 ? ckpt_compute : none_compute).push_back(run.compute_ms);
      (kind == 1 ? ckpt_exchange : none_exchange).push_back(run.exchange_ms);
      (kind == 1 ? ckpt_cpu : none_cpu).push_back(run.cpu_s);
      if (kind == 1) {
        checkpoints = run.checkpoints;
        extra_ms.push_back(run.extra_ms_per_checkpoint);
        step_ms_quiet.push_back(run.interval_ms / kIntervalSteps);
      }
    }
  }
  std::printf(
      "# Training step time, pstrain run --model=%s (synthetic 3x%dx%d, batch "
      "%d, %d steps, 1 worker, 1 PS), a checkpoint every %d steps vs none; "
      "medians of %d runs each, alternating\n"
      "#%12s %9s %10s %11s %9s %12s %6s %9s\n"
      "#%12s %9s %10s %11s %9s %12s %6s %9s\n",
      absl::GetFlag(FLAGS_train_model).c_str(), absl::GetFlag(FLAGS_image_size),
      absl::GetFlag(FLAGS_image_size), absl::GetFlag(FLAGS_batch_size),
      absl::GetFlag(FLAGS_train_steps), every,
      absl::GetFlag(FLAGS_train_repeats), "checkpoints", "step", "compute",
      "exchange", "cpu", "checkpoints", "ratio", "cpu ratio", "", "(ms)",
      "(ms)", "(ms)", "(s)", "(#)", "(x)", "(x)");
  const double base = Median(none_ms), base_cpu = Median(none_cpu);
  std::printf(" %12s %9.1f %10.1f %11.1f %9.1f %12d %6.3f %9.3f\n", "none",
              base, Median(none_compute), Median(none_exchange), base_cpu, 0,
              1.0, 1.0);
  std::printf(" %12s %9.1f %10.1f %11.1f %9.1f %12d %6.3f %9.3f\n",
              absl::StrCat("every ", every).c_str(), Median(ckpt_ms),
              Median(ckpt_compute), Median(ckpt_exchange), Median(ckpt_cpu),
              checkpoints, Median(ckpt_ms) / base, Median(ckpt_cpu) / base_cpu);
  std::printf("# Step time with checkpoints / without: %.3f (goal <= 1.05)\n",
              Median(ckpt_ms) / base);
  // The same within each checkpointing run, less sensitive to a machine
  // whose load drifts between runs.
  const double extra = Median(extra_ms), step = Median(step_ms_quiet);
  std::printf(
      "# Within the runs: a checkpoint adds %.0f ms to the %d steps after it "
      "began (median; steps away from checkpoints: %.1f ms), i.e. %.3f of "
      "the %d steps between checkpoints\n",
      extra, kWindowSteps, step, 1 + extra / (every * step), every);
  return absl::OkStatus();
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "checkpoint_bench [--flags]: what checkpoints cost: --write (a "
      "checkpoint against write+fsync of the same bytes) and --train (step "
      "time with and without checkpoints).");
  pstrain::ParseFlagsOrExit(argc, argv, "checkpoint_bench",
                            "checkpoint_bench --help");
  pstrain::ExitOnFlagError(
      "checkpoint_bench",
      pstrain::FirstError(
          {pstrain::CheckFlagRange("num_ps", absl::GetFlag(FLAGS_num_ps), 1,
                                   64),
           pstrain::CheckFlagRange("partition_bytes",
                                   absl::GetFlag(FLAGS_partition_bytes), 4,
                                   int64_t{1} << 30, "bytes"),
           pstrain::CheckFlagRange("repeats", absl::GetFlag(FLAGS_repeats), 1,
                                   1000),
           pstrain::CheckFlagRange(
               "train_repeats", absl::GetFlag(FLAGS_train_repeats), 1, 1000)}));
  absl::Status status;
  if (absl::GetFlag(FLAGS_write)) status = pstrain::WriteBench();
  if (status.ok() && absl::GetFlag(FLAGS_train)) status = pstrain::TrainBench();
  if (!status.ok()) {
    pstrain::PrintError("checkpoint_bench", status.ToString());
    return 1;
  }
  return 0;
}
