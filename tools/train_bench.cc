// train_bench: training throughput of one zoo model on one backend, without
// the parameter server: forward + backward + an Adam update of every
// parameter (the PS's update, server/adam.h, applied on the host), on one
// fixed batch, timed over --steps after --warmup steps.
//
// With --compare_pytorch, the same model (tools/torch_models.py: same
// architecture and parameter count) is timed in PyTorch in the same run
// (python3 tools/torch_bench.py; Debian's python3-torch on CPU, PyTorch with
// CUDA on a GPU machine), with the same number of threads, and the ratio
// pstrain / PyTorch is printed. Prints one Markdown table row per run.
//
//   bazel-bin/tools/train_bench --model=resnet18 --dataset=fashion_mnist
//       --batch_size=64 --steps=20 --compare_pytorch
//   bazel-bin/tools/train_bench --model=resnet50 --backend=cuda
//       --dataset=synthetic --image_size=224 --num_classes=1000
//       --batch_size=64 --steps=50 --compare_pytorch
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "models/model.h"
#include "server/adam.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"

ABSL_FLAG(std::string, model, "resnet18", "Zoo model to time.");
ABSL_FLAG(int, batch_size, 64, "Samples per step.");
ABSL_FLAG(int, steps, 20, "Timed steps.");
ABSL_FLAG(int, warmup, 3, "Untimed steps first.");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all cores).");
ABSL_FLAG(
    bool, compare_pytorch, false,
    "Also time the same model in PyTorch (python3 tools/torch_bench.py).");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "Python with torch for --compare_pytorch.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "train_bench";

// tools/torch_bench.py next to the binary's runfiles or in the source tree.
std::string FindTorchBench() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::vector<std::string> candidates;
  if (n > 0) {
    buf[n] = '\0';
    candidates.push_back(
        absl::StrCat(buf, ".runfiles/pstrain/tools/torch_bench.py"));
  }
  candidates.push_back("tools/torch_bench.py");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return "";
}

struct TorchResult {
  bool ok = false;
  double samples_per_sec = 0;
  int64_t params = 0;
  std::string loss, device, error;
};

TorchResult RunTorch(const std::string& model, const Shape& chw, int classes,
                     int batch, int steps, int warmup, int threads,
                     const std::string& device) {
  TorchResult r;
  const std::string script = FindTorchBench();
  if (script.empty()) {
    r.error = "tools/torch_bench.py not found";
    return r;
  }
  const std::string cmd = absl::StrCat(
      absl::GetFlag(FLAGS_python), " ", script, " --model ", model,
      " --channels ", chw[0], " --image_size ", chw[1], " --num_classes ",
      classes, " --batch_size ", batch, " --steps ", steps, " --warmup ",
      warmup, " --device ", device, " --threads ", threads, " 2>&1");
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
    }
  }
  if (!r.ok) r.error = "unexpected output: " + out;
  return r;
}

int Main() {
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (batch <= 0 || steps <= 0 || warmup < 0) {
    PrintError(kProgram,
               absl::StrCat("--batch_size=", batch, " --steps=", steps,
                            " --warmup=", warmup, ": expected positive sizes"));
    return 2;
  }
  if (!Model::IsKnown(model_name)) {
    PrintError(kProgram, absl::StrCat("--model=", model_name,
                                      ": unknown model; expected one of: ",
                                      Model::KnownModels()));
    return 2;
  }
  if (absl::Status s = CheckBackendFlags(); !s.ok()) {
    PrintError(kProgram, s.message());
    return 2;
  }
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = omp_get_num_procs();
  omp_set_num_threads(threads);
  absl::StatusOr<Dataset> dataset = LoadDatasetFromFlags();
  if (!dataset.ok()) {
    PrintError(kProgram, dataset.status().message());
    return 2;
  }
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      Backend::Create(backend_name, absl::GetFlag(FLAGS_gpu));
  if (!backend.ok()) {
    PrintError(kProgram, backend.status().message());
    return 2;
  }
  const Shape chw = dataset->train.chw;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(
      model_name, chw, dataset->num_classes, ModelOptions(), backend->get());
  if (!model.ok()) {
    PrintError(kProgram, model.status().message());
    return 2;
  }
  Model& m = **model;
  std::vector<int64_t> order(dataset->train.count);
  for (int64_t i = 0; i < dataset->train.count; ++i) order[i] = i;
  Tensor images;
  std::vector<int32_t> labels;
  GatherBatch(dataset->train, order, 0, batch, &images, &labels);

  // Adam state on the host, as a PS shard keeps it.
  AdamOptions adam;
  std::vector<std::vector<float>> adam_m, adam_v;
  for (size_t i = 0; i < m.params().size(); ++i) {
    adam_m.emplace_back(m.HostWeights()[i].size());
    adam_v.emplace_back(m.HostWeights()[i].size());
  }
  int64_t adam_step = 0;
  float first_loss = NAN, last_loss = NAN;
  absl::Time start;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) start = absl::Now();
    absl::StatusOr<float> loss = m.ForwardBackward(images, labels);
    if (!loss.ok()) {
      PrintError(kProgram, loss.status().ToString());
      return 1;
    }
    if (s == 0) first_loss = *loss;
    last_loss = *loss;
    ++adam_step;
    for (size_t i = 0; i < m.params().size(); ++i) {
      AdamUpdate(adam, adam_step, m.HostWeights()[i].data(),
                 m.HostGradients()[i].data(), adam_m[i].data(),
                 adam_v[i].data(), m.HostWeights()[i].size());
    }
    if (absl::Status st = m.LoadHostWeights(); !st.ok()) {
      PrintError(kProgram, st.ToString());
      return 1;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double rate = static_cast<double>(batch) * steps / seconds;
  const bool loss_ok = std::isfinite(first_loss) && std::isfinite(last_loss) &&
                       last_loss < first_loss;

  std::printf(
      "| model | input | backend | threads | batch | params | MFLOPs/sample "
      "| pstrain samples/sec | loss step 0 -> %d | PyTorch samples/sec | "
      "PyTorch params | ratio |\n",
      warmup + steps - 1);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string torch_rate = "-", torch_params = "-", ratio = "-";
  if (absl::GetFlag(FLAGS_compare_pytorch)) {
    TorchResult t = RunTorch(
        model_name, chw, dataset->num_classes, batch, steps, warmup, threads,
        backend_name == "cuda" ? absl::StrCat("cuda:", absl::GetFlag(FLAGS_gpu))
                               : "cpu");
    if (t.ok) {
      torch_rate = absl::StrFormat("%.1f", t.samples_per_sec);
      torch_params = absl::StrCat(
          t.params, t.params == m.NumParameters() ? " (same)" : " (DIFFERENT)");
      ratio = absl::StrFormat("%.2fx", rate / t.samples_per_sec);
    } else {
      torch_rate = absl::StrCat("error: ", t.error);
    }
  }
  std::printf(
      "| %s | %s | %s | %d | %d | %lld | %.1f | %.1f | %.3f -> %.3f%s "
      "| %s | %s | %s |\n",
      model_name.c_str(), ShapeToString(chw).c_str(),
      (*backend)->name().c_str(), threads, batch,
      static_cast<long long>(m.NumParameters()),
      2.0 * m.ForwardMacsPerSample() / 1e6, rate, first_loss, last_loss,
      loss_ok ? " (falls)" : " (DOES NOT FALL)", torch_rate.c_str(),
      torch_params.c_str(), ratio.c_str());
  return loss_ok ? 0 : 1;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Training throughput of a zoo model; --compare_pytorch times PyTorch "
      "too.");
  absl::ParseCommandLine(argc, argv);
  return pstrain::Main();
}
