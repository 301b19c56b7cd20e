// nonfinite_bench: what the non-finite check (issue 22) costs a training
// step. Every PS worker scans each gradient chunk for a NaN or an infinity
// as it pushes it (common/nonfinite.h, FindNonFinite); this times that scan
// over a zoo model's PS tensors (every parameter's gradient and buffer)
// against the model's own step, forward + backward on one batch on the CPU
// backend, measured in the same run on the same threads (the baseline). The
// shards' side adds no pass over the data (an update is written into a
// second buffer instead of in place, its new weights are checked in the
// optimizer's own loop, and a step end is one small message per shard).
//
// Columns: step = median ms of one forward + backward; check = median ms of
// one scan of every PS tensor (one thread, as a pusher thread does it);
// check/step = the ratio in percent (goal: under 1%); GB/s = the scan's
// speed; found = a NaN written at a random element of a random tensor is
// found at that element, in every repeat (the correctness column).
//
//   bazel-bin/bench/nonfinite_bench --models=lenet5,resnet18 --batch_size=64
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/nonfinite.h"
#include "models/model.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"

ABSL_FLAG(std::string, models, "lenet5,resnet18",
          "Comma-separated zoo models to time.");
ABSL_FLAG(int, batch_size, 64, "Samples per step.");
ABSL_FLAG(int, repeats, 15, "Timed steps and scans per model (medians).");
ABSL_FLAG(int, threads, 0, "CPU threads for the step (0: all cores).");

namespace pstrain {
namespace {

constexpr char kProgram[] = "nonfinite_bench";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main() {
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = omp_get_num_procs();
  omp_set_num_threads(threads);
  absl::StatusOr<Dataset> dataset = LoadDatasetFromFlags();
  if (!dataset.ok()) {
    PrintError(kProgram, dataset.status().message());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = Backend::Create("cpu", 0);
  if (!backend.ok()) {
    PrintError(kProgram, backend.status().message());
    return 2;
  }
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (batch < 1 || repeats < 1) {
    PrintError(kProgram, "--batch_size and --repeats must be >= 1");
    return 2;
  }
  std::printf(
      "| model | parameters | batch | threads | step (ms) | check (ms) | "
      "check/step | GB/s | found |\n|---|---:|---:|---:|---:|---:|---:|---:|"
      "---|\n");
  std::mt19937 random(7);
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  for (const std::string& name : names) {
    absl::StatusOr<std::unique_ptr<Model>> model =
        Model::Create(name, dataset->train.chw, dataset->num_classes,
                      ModelOptions(), backend->get());
    if (!model.ok()) {
      PrintError(kProgram, model.status().message());
      return 2;
    }
    Model& m = **model;
    std::vector<SampleIndex> order(dataset->train.count);
    for (int64_t i = 0; i < dataset->train.count; ++i) order[i] = i;
    Tensor images;
    std::vector<int32_t> labels;
    GatherBatch(dataset->train, order, 0, batch, &images, &labels);
    std::vector<double> step_ms, check_ms;
    bool found_all = true;
    int64_t bytes = 0;
    for (int r = 0; r < repeats + 1; ++r) {
      const absl::Time start = absl::Now();
      absl::StatusOr<float> loss = m.ForwardBackward(images, labels);
      if (!loss.ok()) {
        PrintError(kProgram, loss.status().message());
        return 1;
      }
      const absl::Time stepped = absl::Now();
      int64_t hits = 0;
      bytes = 0;
      for (const absl::Span<const float>& g : m.HostGradients()) {
        hits += FindNonFinite(g) >= 0 ? 1 : 0;
        bytes += static_cast<int64_t>(g.size() * sizeof(float));
      }
      const absl::Time checked = absl::Now();
      if (r == 0) continue;  // warm-up
      step_ms.push_back(absl::ToDoubleMilliseconds(stepped - start));
      check_ms.push_back(absl::ToDoubleMilliseconds(checked - stepped));
      if (hits != 0) found_all = false;  // a real gradient held one
      // Correctness: a NaN at a random place is found exactly there.
      const auto& grads = m.HostGradients();
      const size_t t =
          std::uniform_int_distribution<size_t>(0, grads.size() - 1)(random);
      std::vector<float> copy(grads[t].begin(), grads[t].end());
      const size_t at =
          std::uniform_int_distribution<size_t>(0, copy.size() - 1)(random);
      copy[at] = std::nanf("");
      if (FindNonFinite(copy) != static_cast<int64_t>(at)) found_all = false;
    }
    const double step = Median(step_ms), check = Median(check_ms);
    std::printf("| %s | %lld | %d | %d | %.1f | %.3f | %.2f%% | %.1f | %s |\n",
                name.c_str(), static_cast<long long>(m.NumParameters()), batch,
                threads, step, check, 100.0 * check / step,
                bytes / (check * 1e-3) / 1e9, found_all ? "yes" : "NO");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  pstrain::ParseFlagsOrExit(argc, argv, "nonfinite_bench",
                            "nonfinite_bench --help");
  return pstrain::Main();
}
