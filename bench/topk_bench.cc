// topk_bench: what a top-k push (issue 39, `--compression=topk:R`) costs a
// worker's CPU per step. The worker compresses each chunk of a parameter's
// gradient (the partition plan's chunks, --partition_bytes) on a pusher
// thread: adds the residual, selects the k largest magnitudes
// (worker/topk_compression.h, SelectTopK: a sampled threshold, or a radix
// select where the sample misleads) and keeps the rest as the next
// residual. This times, over a zoo model's real gradients (one forward +
// backward on a Fashion-MNIST batch, CPU backend), on one thread:
//
//   nth_element  the baseline, measured in the same run: the selection as
//                the standard library does it, std::nth_element over every
//                index with the same order (larger |value|, then the lower
//                index), then sorted (what SelectTopK was until 2026-11-29)
//   select       SelectTopK over the same chunks
//   compress     TopKCompressor::Compress over every chunk of a step (the
//                residual added and written back, error feedback on)
//   link         the pushed bytes' time at --link_mbit (index and value,
//                8 bytes an entry), for scale: what the selection buys
//
// Columns are medians of --repeats; speedup = nth_element / select; same =
// SelectTopK's indices equal the baseline's in every chunk of every repeat
// (the correctness column).
//
//   bazel-bin/bench/topk_bench --models=lenet5,resnet18 --ratios=0.01,0.001
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "common/partition.h"
#include "models/model.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"
#include "worker/topk_compression.h"

ABSL_FLAG(std::string, models, "lenet5,resnet18",
          "Comma-separated zoo models whose gradients are compressed.");
ABSL_FLAG(std::string, ratios, "0.01,0.001",
          "Comma-separated fractions pushed (topk:R).");
ABSL_FLAG(int64_t, partition_bytes, 4 << 20,
          "Largest chunk of a tensor, bytes (the job's --partition_bytes).");
ABSL_FLAG(int, batch_size, 64,
          "Samples of the batch whose gradients are used.");
ABSL_FLAG(int, repeats, 7, "Timed repeats (medians).");
ABSL_FLAG(double, link_mbit, 250, "Link speed for the link column, Mbit/s.");

namespace pstrain {
namespace {

constexpr char kProgram[] = "topk_bench";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The baseline selection: std::nth_element over every index.
void NthElementTopK(absl::Span<const float> values, int64_t k,
                    std::vector<uint32_t>* indices) {
  indices->resize(values.size());
  std::iota(indices->begin(), indices->end(), 0u);
  if (k >= static_cast<int64_t>(values.size())) return;
  auto before = [&values](uint32_t a, uint32_t b) {
    const float fa = std::fabs(values[a]);
    const float fb = std::fabs(values[b]);
    return fa > fb || (fa == fb && a < b);
  };
  std::nth_element(indices->begin(), indices->begin() + k, indices->end(),
                   before);
  indices->resize(k);
  std::sort(indices->begin(), indices->end());
}

int Main() {
  omp_set_num_threads(1);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int64_t partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  const double link_mbit = absl::GetFlag(FLAGS_link_mbit);
  if (batch < 1 || repeats < 1 || partition_bytes < 4 ||
      partition_bytes % 4 != 0 || !(link_mbit > 0)) {
    PrintError(kProgram,
               "--batch_size and --repeats must be >= 1, --partition_bytes a "
               "positive multiple of 4, --link_mbit > 0");
    return 2;
  }
  std::vector<double> ratios;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_ratios), ',')) {
    double r = 0;
    if (!absl::SimpleAtod(text, &r) || !(r > 0 && r <= 1)) {
      PrintError(kProgram, absl::StrCat("--ratios: \"", text,
                                        "\"; expected numbers in (0, 1]"));
      return 2;
    }
    ratios.push_back(r);
  }
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
  std::printf(
      "| model | elements | chunks | ratio | pushed | nth_element (ms) | "
      "select (ms) | speedup | select ns/element | compress (ms) | link (ms) | "
      "same |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
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
    std::iota(order.begin(), order.end(), SampleIndex{0});
    Tensor images;
    std::vector<int32_t> labels;
    GatherBatch(dataset->train, order, 0, batch, &images, &labels);
    absl::StatusOr<float> loss = m.ForwardBackward(images, labels);
    if (!loss.ok()) {
      PrintError(kProgram, loss.status().message());
      return 1;
    }
    // The parameters' gradients (not the buffers: they go dense), copied
    // out of the host staging, and their chunks.
    const size_t num_params = m.params().size();
    std::vector<std::vector<float>> gradients;
    std::vector<int64_t> sizes;
    for (size_t t = 0; t < num_params; ++t) {
      const absl::Span<const float> g = m.HostGradients()[t];
      gradients.emplace_back(g.begin(), g.end());
      sizes.push_back(static_cast<int64_t>(g.size()));
    }
    absl::StatusOr<PartitionPlan> plan =
        PartitionPlan::Create(sizes, partition_bytes, 1);
    if (!plan.ok()) {
      PrintError(kProgram, plan.status().message());
      return 2;
    }
    const int64_t elements =
        std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    for (double ratio : ratios) {
      CompressionOptions options;
      options.topk_ratio = ratio;
      TopKCompressor compressor(options, sizes, 2);
      std::vector<double> nth_ms, radix_ms, compress_ms;
      bool same = true;
      int64_t pushed = 0;
      std::vector<uint32_t> expected, got, indices;
      std::vector<float> values;
      for (int r = 0; r < repeats + 1; ++r) {
        double nth = 0, radix = 0;
        pushed = 0;
        for (const ChunkSpec& c : plan->chunks()) {
          const absl::Span<const float> chunk(
              gradients[c.param_id].data() + c.offset, c.num_elements);
          const int64_t k = TopKCount(ratio, c.num_elements);
          pushed += k;
          absl::Time start = absl::Now();
          NthElementTopK(chunk, k, &expected);
          nth += absl::ToDoubleMilliseconds(absl::Now() - start);
          start = absl::Now();
          SelectTopK(chunk, k, &got);
          radix += absl::ToDoubleMilliseconds(absl::Now() - start);
          if (got != expected) same = false;
        }
        const absl::Time start = absl::Now();
        compressor.BeginStep(r);
        for (const ChunkSpec& c : plan->chunks()) {
          compressor.Compress(
              c.param_id, c.offset,
              absl::MakeConstSpan(gradients[c.param_id].data() + c.offset,
                                  c.num_elements),
              &indices, &values);
        }
        compressor.CommitStep(r);
        const double compress = absl::ToDoubleMilliseconds(absl::Now() - start);
        if (r == 0) continue;  // warm-up
        nth_ms.push_back(nth);
        radix_ms.push_back(radix);
        compress_ms.push_back(compress);
      }
      const double nth = Median(nth_ms), radix = Median(radix_ms);
      const double link_ms = pushed * 8.0 * 8.0 / (link_mbit * 1e6) * 1e3;
      std::printf(
          "| %s | %lld | %zu | %g | %lld | %.2f | %.2f | %.1fx | %.2f | %.2f | "
          "%.2f | %s |\n",
          name.c_str(), static_cast<long long>(elements), plan->chunks().size(),
          ratio, static_cast<long long>(pushed), nth, radix, nth / radix,
          radix * 1e6 / elements, Median(compress_ms), link_ms,
          same ? "yes" : "NO");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  pstrain::ParseFlagsOrExit(argc, argv, "topk_bench", "topk_bench --help");
  return pstrain::Main();
}
