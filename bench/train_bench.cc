// train_bench: training throughput of one zoo model on one backend, without
// the parameter server: forward + backward + an Adam update of every
// parameter (optim/adam.h's formula), on one fixed batch, timed over
// --steps after --warmup steps. --update=device keeps the update on the
// backend (Model::AdamStep: a fused kernel on CUDA, as PyTorch's loop keeps
// torch.optim.Adam on the GPU); --update=host does what a PS worker's step
// costs without the network: gradients to the host, Adam there, weights
// back to the device.
//
// --memory_plan (default) places layer outputs and gradients by the model's
// memory plan (models/model.h ModelOptions::memory_plan); --nomemory_plan
// keeps every one in its own memory, as before the plan, to compare in one
// run. --fuse_add_relu (default) runs each ResNet residual add and its ReLU
// as one layer (ModelOptions::fuse_add_relu); --nofuse_add_relu as two.
// --nomemory_plan --nofuse_add_relu is the path before both. Memory: on CUDA
// the device memory in use after the timed steps above what was in use before
// the model was made; on the CPU the process's peak resident set (VmHWM, reset
// through /proc/self/clear_refs before the model is made) above its resident
// set then. "activations (MiB)" is the model's own output, gradient and scratch
// memory (Model::ActivationBytes).
//
// With --compare_pytorch, the same model (tools/torch/torch_models.py: same
// architecture and parameter count) is timed in PyTorch in the same run
// (python3 tools/torch/torch_bench.py; Debian's python3-torch on CPU, PyTorch
// with CUDA on a GPU machine), with the same number of threads, and the ratio
// pstrain / PyTorch is printed. Prints one Markdown table row per run.
//
//   bazel-bin/bench/train_bench --model=resnet18 --dataset=fashion_mnist
//       --batch_size=64 --steps=20 --compare_pytorch
//   bazel-bin/bench/train_bench --model=resnet50 --backend=cuda
//       --dataset=synthetic --image_size=224 --num_classes=1000
//       --batch_size=64 --steps=50 --compare_pytorch
//
// --precision (worker/data_flags.h; README "Mixed precision") picks what
// convolutions and linear layers compute in, on both sides: PyTorch gets
// allow_tf32 for tf32 and torch.autocast for bf16 and fp16 (fp16 with
// GradScaler; ours with optim/loss_scaler.h). The table's precision column
// says which ran.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catalog/catalog.h"
#include "catalog/job_config.h"
#include "common/flags_util.h"
#include "common/status_macros.h"
#include "models/backend_factory.h"
#include "models/model.h"
#include "optim/adam.h"
#include "optim/loss_scaler.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"
#include "worker/token_dataset.h"

ABSL_FLAG(std::string, model, "resnet18", "Zoo model to time.");
ABSL_FLAG(int, batch_size, 64, "Samples per step.");
ABSL_FLAG(int, steps, 20, "Timed steps.");
ABSL_FLAG(int, warmup, 3, "Untimed steps first.");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all cores).");
ABSL_FLAG(double, lr, 1e-3,
          "Adam's learning rate (both sides; BERT-base wants about 1e-4).");
ABSL_FLAG(bool, compare_pytorch, false,
          "Also time the same model in PyTorch (python3 "
          "tools/torch/torch_bench.py).");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "Python with torch for --compare_pytorch.");
ABSL_FLAG(std::string, update, "device",
          "Where Adam runs: device (on the backend, as PyTorch's loop) or "
          "host (gradients copied to the host and weights back, as a PS "
          "worker's step without the network).");
ABSL_FLAG(bool, memory_plan, true,
          "Place layer outputs and gradients by the memory plan (shared "
          "slots, in-place ReLU); --nomemory_plan: each in its own memory.");
ABSL_FLAG(bool, fuse_add_relu, true,
          "ResNets: each residual add and its ReLU as one layer (one pass "
          "each way); --nofuse_add_relu: two layers.");
ABSL_FLAG(bool, layer_times, false,
          "After the timed steps, profile up to 10 more with the backend "
          "synchronized after every layer and print a per-layer time table "
          "(ms per step).");

namespace pstrain {
namespace {

constexpr char kProgram[] = "train_bench";

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); -1 when absent.
int64_t ProcStatusBytes(const std::string& field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t bytes = -1;
  const std::string prefix = field + ":";
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::string(line).rfind(prefix, 0) == 0) {
      long long kib = 0;
      if (std::sscanf(line + prefix.size(), "%lld", &kib) == 1) {
        bytes = kib * 1024;
      }
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

// Resets the process's peak resident set (VmHWM) to its current size
// (Linux 4.0+); false where the kernel does not allow it.
bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// tools/torch/torch_bench.py next to the binary's runfiles, beside its
// folder (the GPU bundle's bench/ and tools/, scripts/gpu_bundle.sh) or in
// the source tree.
std::string FindTorchBench() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::vector<std::string> candidates;
  if (n > 0) {
    buf[n] = '\0';
    candidates.push_back(
        absl::StrCat(buf, ".runfiles/pstrain/tools/torch/torch_bench.py"));
    const std::string exe(buf);
    const size_t slash = exe.rfind('/');
    if (slash != std::string::npos) {
      candidates.push_back(absl::StrCat(exe.substr(0, slash),
                                        "/../tools/torch/torch_bench.py"));
    }
  }
  candidates.push_back("tools/torch/torch_bench.py");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return "";
}

struct TorchResult {
  bool ok = false;
  double samples_per_sec = 0;
  int64_t params = 0;
  std::string loss, device, memory_mib = "-", error;
};

TorchResult RunTorch(const std::string& model, const Shape& chw, int classes,
                     int batch, int steps, int warmup, int threads,
                     const std::string& device, PrecisionKind precision) {
  TorchResult r;
  const std::string script = FindTorchBench();
  if (script.empty()) {
    r.error = "tools/torch/torch_bench.py not found";
    return r;
  }
  const std::string cmd = absl::StrCat(
      absl::GetFlag(FLAGS_python), " ", script, " --model ", model,
      chw.size() == 1
          ? absl::StrCat(" --seq_len ", chw[0])
          : absl::StrCat(" --channels ", chw[0], " --image_size ", chw[1]),
      " --num_classes ", classes, " --batch_size ", batch, " --steps ", steps,
      " --warmup ", warmup, " --lr ", absl::GetFlag(FLAGS_lr), " --device ",
      device, " --threads ", threads, " --precision ", Spelling(precision),
      " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    r.error = "cannot start " + cmd;
    return r;
  }
  std::string out;
  char line[4096];
  while (fgets(line, sizeof(line), pipe) != nullptr) out += line;
  const int status = pclose(pipe);
  if (status != 0) {
    std::vector<std::string> lines =
        absl::StrSplit(out, '\n', absl::SkipEmpty());
    r.error = lines.empty() ? "python failed" : lines.back();
    return r;
  }
  for (absl::string_view field :
       absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(field, '=');
    if (kv.first == "samples_per_sec") {
      r.ok = absl::SimpleAtod(kv.second, &r.samples_per_sec);
    } else if (kv.first == "params") {
      (void)absl::SimpleAtoi(kv.second, &r.params);
    } else if (kv.first == "loss") {
      r.loss = kv.second;
    } else if (kv.first == "device") {
      r.device = kv.second;
    } else if (kv.first == "memory_mib") {
      // "123_(peak_RSS)" on the CPU: one field on the line.
      r.memory_mib = absl::StrReplaceAll(kv.second, {{"_", " "}});
    }
  }
  if (!r.ok) r.error = "unexpected output: " + out;
  return r;
}

// Prints the profile of `steps` steps (Model::LayerTimes and the host
// update's `update_seconds`) as two Markdown tables in ms per step: the sums
// by layer type with the host update, and the 20 slowest layers.
void PrintLayerTimes(const Model& m, int steps, double update_seconds,
                     int batch, bool host_update) {
  struct TypeSum {
    std::string type;
    int layers = 0;
    double forward_ms = 0, backward_ms = 0;
  };
  auto total = [](const auto& t) { return t.forward_ms + t.backward_ms; };
  auto slower = [&](const auto& a, const auto& b) {
    return total(a) > total(b);
  };
  std::vector<LayerTime> layers = m.LayerTimes();
  const double update_ms = update_seconds * 1e3;
  double total_ms = update_ms;
  std::map<std::string, TypeSum> by_type;
  for (const LayerTime& l : layers) {
    total_ms += total(l);
    TypeSum& t = by_type[l.type];
    t.type = l.type;
    ++t.layers;
    t.forward_ms += l.forward_ms;
    t.backward_ms += l.backward_ms;
  }
  if (steps <= 0 || total_ms <= 0) return;
  auto per_step = [&](double sum_ms) { return sum_ms / steps; };
  auto share = [&](double sum_ms) { return 100 * sum_ms / total_ms; };
  std::printf(
      "\nPer-layer times: %s, batch %d, on %s; ms per step, mean of %d "
      "steps with the backend synchronized after every layer (%.2f ms/step "
      "in all)\n\n",
      m.name().c_str(), batch, m.backend()->name().c_str(), steps,
      per_step(total_ms));
  std::vector<TypeSum> types;
  for (const auto& [type, t] : by_type) types.push_back(t);
  std::sort(types.begin(), types.end(), slower);
  std::printf(
      "| layer type | layers | forward (ms) | backward (ms) | total (ms) | "
      "share |\n|---|---:|---:|---:|---:|---:|\n");
  for (const TypeSum& t : types) {
    std::printf("| %s | %d | %.3f | %.3f | %.3f | %.1f%% |\n", t.type.c_str(),
                t.layers, per_step(t.forward_ms), per_step(t.backward_ms),
                per_step(total(t)), share(total(t)));
  }
  std::printf("| %s | - | - | - | %.3f | %.1f%% |\n",
              host_update
                  ? "host update (Adam on the host, weights copied to the "
                    "device)"
                  : "device update (Adam on the backend)",
              per_step(update_ms), share(update_ms));
  std::sort(layers.begin(), layers.end(), slower);
  const size_t shown = std::min<size_t>(layers.size(), 20);
  std::printf(
      "\n| slowest layers | layer | forward (ms) | backward (ms) | total (ms) "
      "| share |\n|---|---|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < shown; ++i) {
    const LayerTime& l = layers[i];
    std::printf("| %s | %s | %.3f | %.3f | %.3f | %.1f%% |\n", l.name.c_str(),
                l.spec.c_str(), per_step(l.forward_ms), per_step(l.backward_ms),
                per_step(total(l)), share(total(l)));
  }
  if (layers.size() > shown) {
    std::printf("| (%zu more layers) | | | | | |\n", layers.size() - shown);
  }
}

// The sizes, model, backend and update the flags ask for; INVALID_ARGUMENT
// naming the first bad one.
absl::Status CheckBenchFlags() {
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (batch <= 0 || steps <= 0 || warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size=", batch, " --steps=", steps,
                     " --warmup=", warmup, ": expected positive sizes"));
  }
  if (!IsKnownModel(model_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model=", model_name,
                     ": unknown model; expected one of: ", KnownModels()));
  }
  RETURN_IF_ERROR(CheckBackendFlags());
  const std::string update_where = absl::GetFlag(FLAGS_update);
  if (update_where != "device" && update_where != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat("--update=", update_where, ": expected device or host"));
  }
  return absl::OkStatus();
}

// Trains `model` on one fixed batch (the first `batch` training samples;
// a token dataset's masked as a worker's first epoch masks them) over and
// over: forward and backward, then Adam on the host
// (`host_update`: state kept on the host, as a PS shard keeps it; weights
// copied back to the device) or on the backend (Model::AdamStep, no host
// staging). Not thread-safe.
class BenchTrainer {
 public:
  // `masker`: a token dataset's masking (null for images).
  BenchTrainer(Model* model, const Dataset& dataset, int batch,
               const MlmMasker* masker, bool host_update)
      : m_(*model),
        host_update_(host_update),
        scaled_(model->backend()->precision() == PRECISION_FP16) {
    std::vector<SampleIndex> order(dataset.train.count);
    for (int64_t i = 0; i < dataset.train.count; ++i) order[i] = i;
    if (masker != nullptr) {
      MlmBatch tokens = TokenBatch(dataset.tokens->train, order, 0, batch,
                                   *masker, /*seed=*/1, /*epoch=*/0);
      images_ = std::move(tokens.ids);
      padding_mask_ = std::move(tokens.padding_mask);
      labels_ = std::move(tokens.labels);
      sequences_ = true;
    } else {
      GatherBatch(dataset.train, order, 0, batch, &images_, &labels_);
    }
    if (host_update_) {
      for (size_t i = 0; i < m_.params().size(); ++i) {
        adam_m_.emplace_back(m_.HostWeights()[i].size());
        adam_v_.emplace_back(m_.HostWeights()[i].size());
      }
    } else {
      m_.set_stage_gradients(false);
    }
  }

  // Steps `first` to `first + count - 1` (step 0's loss is the first
  // loss); adds the seconds of their updates (host: Adam +
  // LoadHostWeights; device: the Adam kernels, the backend synchronized
  // after them) to *update_seconds. The first failing step's error.
  absl::Status Run(int first, int count, double* update_seconds) {
    for (int s = first; s < first + count; ++s) {
      absl::StatusOr<double> update = Step(s);
      if (!update.ok()) return update.status();
      *update_seconds += *update;
    }
    return absl::OkStatus();
  }

  float first_loss() const { return first_loss_; }
  float last_loss() const { return last_loss_; }
  // fp16: steps skipped for an overflow, and the loss scale now.
  int64_t skipped_steps() const { return skipped_; }
  float loss_scale() const { return scaler_.scale(); }

 private:
  absl::StatusOr<double> Step(int s) {
    if (scaled_) m_.set_loss_scale(scaler_.scale());
    absl::StatusOr<float> loss =
        sequences_ ? m_.ForwardBackward(images_, padding_mask_, labels_)
                   : m_.ForwardBackward(images_, labels_);
    if (!loss.ok()) return loss.status();
    if (s == 0) first_loss_ = *loss;
    last_loss_ = *loss;
    const absl::Time update_start = absl::Now();
    if (scaled_) {
      // GradScaler.step(): no update for a gradient that overflowed.
      ASSIGN_OR_RETURN(const bool finite, m_.GradientsFinite());
      scaler_.Update(!finite);
      if (!finite) {
        ++skipped_;
        return absl::ToDoubleSeconds(absl::Now() - update_start);
      }
    }
    ++adam_step_;
    if (host_update_) {
      for (size_t i = 0; i < m_.params().size(); ++i) {
        AdamUpdate(adam_, adam_step_, m_.HostWeights()[i].data(),
                   m_.HostGradients()[i].data(), adam_m_[i].data(),
                   adam_v_[i].data(), m_.HostWeights()[i].size());
      }
      RETURN_IF_ERROR(m_.LoadHostWeights());
    } else {
      absl::Status st = m_.AdamStep(adam_);
      if (st.ok()) st = m_.backend()->Synchronize();
      if (!st.ok()) return st;
    }
    return absl::ToDoubleSeconds(absl::Now() - update_start);
  }

  Model& m_;
  const bool host_update_;
  const bool scaled_;  // fp16: dynamic loss scaling
  LossScaler scaler_;
  int64_t skipped_ = 0;
  Tensor images_;                // a token dataset's ids [N, S]
  Tensor padding_mask_;          // [N, S]; a token dataset's only
  std::vector<int32_t> labels_;  // N (images) or N * S (tokens)
  bool sequences_ = false;
  AdamOptions adam_ = [] {
    AdamOptions adam;
    adam.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
    return adam;
  }();
  std::vector<std::vector<float>> adam_m_, adam_v_;
  int64_t adam_step_ = 0;
  float first_loss_ = NAN, last_loss_ = NAN;
};

// Where the memory a model takes is read: the device's memory in use
// before the model exists (the CUDA context's, other processes'), else on
// the CPU the resident set with the peak reset to it.
struct MemoryBaseline {
  absl::StatusOr<int64_t> device;
  bool peak_rss = false;  // VmHWM was reset
  int64_t rss = -1;       // VmRSS
};

MemoryBaseline MemoryBefore(Backend& backend) {
  MemoryBaseline before;
  before.device = backend.DeviceMemoryInUseBytes();
  before.peak_rss = !before.device.ok() && ResetPeakRss();
  before.rss = ProcStatusBytes("VmRSS");
  return before;
}

// The table's "memory (MiB)": in use on the device above the baseline
// (allocations are kept from the first step on, so read once, outside the
// timing, as torch_bench.py does), else the peak resident set above it
// ("N (peak RSS)"), else "-".
std::string MemoryAbove(const MemoryBaseline& before, Backend& backend) {
  if (before.device.ok()) {
    absl::StatusOr<int64_t> used = backend.DeviceMemoryInUseBytes();
    if (!used.ok()) return "-";
    return absl::StrFormat("%.0f", (*used - *before.device) / 1048576.0);
  }
  if (before.peak_rss && before.rss >= 0) {
    const int64_t peak = ProcStatusBytes("VmHWM");
    if (peak < 0) return "-";
    return absl::StrFormat("%.0f (peak RSS)", (peak - before.rss) / 1048576.0);
  }
  return "-";
}

// One timed run, as its table row shows it.
struct BenchRun {
  std::string model_name;
  Shape chw;
  int num_classes = 0;
  int threads = 0;
  int batch = 0;
  int steps = 0;
  int warmup = 0;
  bool on_gpu = false;
  double samples_per_sec = 0;
  double update_seconds = 0;  // summed over the timed steps
  std::string memory;         // MemoryAbove
  float first_loss = NAN, last_loss = NAN;

  bool LossFalls() const {
    return std::isfinite(first_loss) && std::isfinite(last_loss) &&
           last_loss < first_loss;
  }
};

// The PyTorch columns of the row: "-" without --compare_pytorch.
struct TorchColumns {
  std::string rate = "-", memory = "-", params = "-", ratio = "-";
};

// The same model, batch, steps and threads timed by torch_bench.py.
TorchColumns CompareWithTorch(const BenchRun& run, const Model& m,
                              const Backend& backend) {
  TorchColumns columns;
  TorchResult t = RunTorch(run.model_name, run.chw, run.num_classes, run.batch,
                           run.steps, run.warmup, run.threads,
                           absl::GetFlag(FLAGS_backend) == BACKEND_CUDA
                               ? absl::StrCat("cuda:", absl::GetFlag(FLAGS_gpu))
                               : "cpu",
                           backend.precision());
  if (!t.ok) {
    columns.rate = absl::StrCat("error: ", t.error);
    return columns;
  }
  columns.rate = absl::StrFormat("%.1f", t.samples_per_sec);
  columns.params = absl::StrCat(
      t.params, t.params == m.NumParameters() ? " (same)" : " (DIFFERENT)");
  columns.ratio =
      absl::StrFormat("%.2fx", run.samples_per_sec / t.samples_per_sec);
  columns.memory = t.memory_mib;
  return columns;
}

// The table's header, its loss column naming the last step.
void PrintHeader(int last_step) {
  std::printf(
      "| model | input | backend | precision | threads | batch | params | "
      "MFLOPs/sample | update | memory plan, fusion | pstrain samples/sec | "
      "update "
      "(ms/step) | memory (MiB) | activations (MiB) | loss step 0 -> %d | "
      "PyTorch samples/sec | PyTorch "
      "memory (MiB) | PyTorch params | ratio |\n",
      last_step);
  std::printf(
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
      "---|---|\n");
}

void PrintRow(const BenchRun& run, const Model& m, const Backend& backend,
              const TorchColumns& torch) {
  std::printf(
      "| %s | %s | %s | %s | %d | %d | %lld | %.1f | %s | %s | %.1f | %.2f | "
      "%s | %.0f | %.3f -> %.3f%s | %s | %s | %s | %s |\n",
      run.model_name.c_str(), ShapeToString(run.chw).c_str(),
      backend.name().c_str(),
      // Backend::SetPrecision; torch_bench.py --precision runs the same
      // (allow_tf32, torch.autocast).
      std::string(Spelling(backend.precision())).c_str(), run.threads,
      run.batch, static_cast<long long>(m.NumParameters()),
      2.0 * m.ForwardMacsPerSample() / 1e6, absl::GetFlag(FLAGS_update).c_str(),
      absl::StrCat(absl::GetFlag(FLAGS_memory_plan) ? "on" : "off", ", ",
                   absl::GetFlag(FLAGS_fuse_add_relu) ? "add+relu" : "none")
          .c_str(),
      run.samples_per_sec, run.update_seconds * 1e3 / run.steps,
      run.memory.c_str(), m.ActivationBytes() / 1048576.0, run.first_loss,
      run.last_loss, run.LossFalls() ? " (falls)" : " (DOES NOT FALL)",
      torch.rate.c_str(), torch.memory.c_str(), torch.params.c_str(),
      torch.ratio.c_str());
}

int Main() {
  if (absl::Status s = CheckBenchFlags(); !s.ok()) {
    PrintError(kProgram, s.message());
    return 2;
  }
  BenchRun run;
  run.model_name = absl::GetFlag(FLAGS_model);
  run.batch = absl::GetFlag(FLAGS_batch_size);
  run.steps = absl::GetFlag(FLAGS_steps);
  run.warmup = absl::GetFlag(FLAGS_warmup);
  const bool host_update = absl::GetFlag(FLAGS_update) == "host";
  run.threads = absl::GetFlag(FLAGS_threads);
  if (run.threads <= 0) run.threads = omp_get_num_procs();
  omp_set_num_threads(run.threads);
  absl::StatusOr<Dataset> dataset = LoadDatasetFromFlags();
  if (!dataset.ok()) {
    PrintError(kProgram, dataset.status().message());
    return 2;
  }
  if (absl::Status takes = CheckModelTakesDataset(run.model_name, *dataset);
      !takes.ok()) {
    PrintError(kProgram, takes.message());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_gpu));
  if (!backend.ok()) {
    PrintError(kProgram, backend.status().message());
    return 2;
  }
  if (const PrecisionKind precision = absl::GetFlag(FLAGS_precision);
      precision != PRECISION_UNSPECIFIED) {
    if (absl::Status s = (*backend)->SetPrecision(precision); !s.ok()) {
      PrintError(kProgram, s.message());
      return 2;
    }
  }
  const MemoryBaseline memory_before = MemoryBefore(**backend);
  run.on_gpu = memory_before.device.ok();
  run.chw = dataset->train.chw;
  run.num_classes = dataset->num_classes;
  ModelOptions model_options;
  model_options.memory_plan = absl::GetFlag(FLAGS_memory_plan);
  model_options.fuse_add_relu = absl::GetFlag(FLAGS_fuse_add_relu);
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(
      run.model_name, run.chw, run.num_classes, model_options, backend->get());
  if (!model.ok()) {
    PrintError(kProgram, model.status().message());
    return 2;
  }
  Model& m = **model;
  std::optional<MlmMasker> masker;
  if (dataset->tokens != nullptr) {
    absl::StatusOr<MlmMasker> created =
        MlmMasker::Create(dataset->tokens->vocab_size, {});
    if (!created.ok()) {
      PrintError(kProgram, created.status().message());
      return 2;
    }
    masker = *std::move(created);
  }
  BenchTrainer trainer(&m, *dataset, run.batch,
                       masker.has_value() ? &*masker : nullptr, host_update);
  double warmup_update_seconds = 0;
  absl::Status trained = trainer.Run(0, run.warmup, &warmup_update_seconds);
  const absl::Time start = absl::Now();
  if (trained.ok()) {
    trained = trainer.Run(run.warmup, run.steps, &run.update_seconds);
  }
  if (!trained.ok()) {
    PrintError(kProgram, trained.ToString());
    return 1;
  }
  run.samples_per_sec = static_cast<double>(run.batch) * run.steps /
                        absl::ToDoubleSeconds(absl::Now() - start);
  run.memory = MemoryAbove(memory_before, **backend);
  run.first_loss = trainer.first_loss();
  run.last_loss = trainer.last_loss();

  // The per-layer profile, after (not inside) the timed steps.
  const int profile_steps = std::min(run.steps, 10);
  double profile_update_seconds = 0;
  if (absl::GetFlag(FLAGS_layer_times)) {
    m.EnableLayerTiming(true);
    if (absl::Status s = trainer.Run(run.warmup + run.steps, profile_steps,
                                     &profile_update_seconds);
        !s.ok()) {
      PrintError(kProgram, s.ToString());
      return 1;
    }
  }
  PrintHeader(run.warmup + run.steps - 1);
  const TorchColumns torch = absl::GetFlag(FLAGS_compare_pytorch)
                                 ? CompareWithTorch(run, m, **backend)
                                 : TorchColumns{};
  PrintRow(run, m, **backend, torch);
  if (trainer.skipped_steps() > 0 ||
      (*backend)->precision() == PRECISION_FP16) {
    std::printf(
        "\nfp16 loss scaling: %lld steps skipped for overflow; scale "
        "now %g\n",
        static_cast<long long>(trainer.skipped_steps()), trainer.loss_scale());
  }
  if (absl::GetFlag(FLAGS_layer_times)) {
    PrintLayerTimes(m, profile_steps, profile_update_seconds, run.batch,
                    host_update);
  }
  return run.LossFalls() ? 0 : 1;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Training throughput of a zoo model; --compare_pytorch times PyTorch "
      "too.");
  pstrain::ParseFlagsOrExit(argc, argv, "train_bench", "train_bench --help");
  return pstrain::Main();
}
