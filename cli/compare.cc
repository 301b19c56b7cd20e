#include "cli/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/job_commands.h"
#include "common/flags_util.h"
#include "worker/collective.h"
#include "worker/metrics.h"

namespace pstrain {
namespace {

const RunResult* FindRun(const std::vector<CompareRun>& runs,
                         const std::string& mode, int num_ps, int workers,
                         int batch_size) {
  for (const CompareRun& run : runs) {
    if (run.mode == mode && run.num_ps == num_ps &&
        run.num_workers == workers && run.batch_size == batch_size) {
      return &run.result;
    }
  }
  return nullptr;
}

// Throughput over the 1-worker run of the same series; 0 without one.
double Speedup(const std::vector<CompareRun>& runs, const CompareRun& run) {
  const RunResult* one = FindRun(runs, run.mode, run.num_ps, 1, run.batch_size);
  if (one == nullptr || one->throughput_samples_per_sec() <= 0) return 0;
  return run.result.throughput_samples_per_sec() /
         one->throughput_samples_per_sec();
}

// A row's 16-bit wire as its mode names it ("+bf16", "+fp16"), else "".
std::string WireSuffix(const std::string& mode) {
  for (const char* suffix : {"+bf16", "+fp16"}) {
    if (absl::EndsWith(mode, suffix)) return suffix;
  }
  return "";
}

// A PS run's throughput over allreduce's at the same workers and wire
// (NCCL's where there is one, else Gloo's); 0 if none.
double PsOverAllreduce(const std::vector<CompareRun>& runs,
                       const CompareRun& run) {
  if (IsAllreduce(run.mode)) return 0;
  const std::string wire = WireSuffix(run.mode);
  const RunResult* ar = FindRun(runs, "allreduce_nccl" + wire, 0,
                                run.num_workers, run.batch_size);
  if (ar == nullptr) {
    ar = FindRun(runs, "allreduce" + wire, 0, run.num_workers, run.batch_size);
  }
  if (ar == nullptr || ar->throughput_samples_per_sec() <= 0) return 0;
  return run.result.throughput_samples_per_sec() /
         ar->throughput_samples_per_sec();
}

std::string Ratio(double x) {
  return x > 0 ? absl::StrFormat("%.2fx", x) : "-";
}

bool Synthetic(const RunResult& r) {
  return ParseCompute(r.compute()).value_or(COMPUTE_UNSPECIFIED) ==
         COMPUTE_SYNTHETIC;
}

// "ps_sync (2 PS)", "allreduce"; with `batch`, ", batch 64" after it.
std::string SeriesName(const CompareRun& run, bool batch) {
  return absl::StrCat(IsAllreduce(run.mode)
                          ? run.mode
                          : absl::StrCat(run.mode, " (", run.num_ps, " PS)"),
                      batch ? absl::StrCat(", batch ", run.batch_size) : "");
}

// "" where a value does not apply (x <= 0), else x with `decimals`.
std::string OrEmpty(double x, int decimals) {
  return x > 0 ? absl::StrFormat("%.*f", decimals, x) : std::string();
}

// Bytes as MB (10^6) with two decimals; "-" for 0 (not measured).
std::string Megabytes(double bytes) {
  return bytes > 0 ? absl::StrFormat("%.2f MB", bytes / 1e6) : std::string("-");
}

// `title` broken into lines of about `width` characters at ", ", as a
// gnuplot double-quoted string's contents ("\n" between lines).
std::string WrapTitle(const std::string& title, size_t width) {
  std::string out;
  size_t line = 0;
  for (absl::string_view part : absl::StrSplit(title, ", ")) {
    if (!out.empty()) {
      if (line + 2 + part.size() > width) {
        absl::StrAppend(&out, ",\\n");
        line = 0;
      } else {
        absl::StrAppend(&out, ", ");
        line += 2;
      }
    }
    absl::StrAppend(&out, part);
    line += part.size();
  }
  return out;
}

// The gnuplot data block `$name` of (x, throughput, stddev) rows, sorted by
// x; sets `repeated` when any point has repeats.
std::string DataBlock(const std::string& name,
                      std::vector<std::pair<int, const CompareRun*>> points,
                      bool* repeated) {
  std::sort(points.begin(), points.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = absl::StrCat("$", name, " << EOD\n");
  for (const auto& [x, run] : points) {
    const Spread spread = SpreadOf(*run);
    *repeated |= spread.repeats > 1;
    absl::StrAppend(&out,
                    absl::StrFormat("%d %.3f %.3f\n", x,
                                    run->result.throughput_samples_per_sec(),
                                    spread.stddev));
  }
  absl::StrAppend(&out, "EOD\n");
  return out;
}

// The plot clause of one measured series: error bars (one standard
// deviation) when it has repeats.
std::string SeriesPlot(const std::string& name, bool repeated, size_t colour,
                       const std::string& title) {
  return absl::StrCat("$", name,
                      repeated ? " using 1:2:3 with yerrorlines"
                               : " using 1:2 with linespoints",
                      " lw 2 pt 7 ps 1.2 lc ", colour, " title \"", title,
                      "\"");
}

// The script's header: terminal, output, wrapped title, axes, key.
std::string PlotHeader(const std::string& png_path, const std::string& title,
                       const std::string& xlabel) {
  return absl::StrCat("set terminal pngcairo size 1000,650 font \"sans,11\"\n",
                      "set output \"", png_path, "\"\n", "set title \"",
                      WrapTitle(title, 90), "\" noenhanced font \"sans,11\"\n",
                      "set xlabel \"", xlabel, "\"\n",
                      "set ylabel \"throughput (samples/sec)\"\n",
                      "set key top left noenhanced box opaque\n", "set grid\n",
                      "set yrange [0:*]\n");
}

}  // namespace

int MedianIndex(const std::vector<double>& throughputs) {
  if (throughputs.empty()) return -1;
  std::vector<int> order(throughputs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return throughputs[a] < throughputs[b]; });
  return order[(order.size() - 1) / 2];
}

Spread SpreadOf(const CompareRun& run) {
  Spread spread;
  const std::vector<double>& x = run.throughputs;
  if (x.size() < 2) return spread;
  spread.repeats = static_cast<int>(x.size());
  double sum = 0;
  for (double v : x) sum += v;
  spread.mean = sum / x.size();
  double squares = 0;
  for (double v : x) squares += (v - spread.mean) * (v - spread.mean);
  spread.stddev = std::sqrt(squares / (x.size() - 1));
  spread.cv = spread.mean > 0 ? spread.stddev / spread.mean : 0;
  return spread;
}

namespace {

// The labels of --modes and what each runs.
struct CompareModeLabel {
  absl::string_view label;
  Mode mode;
  CollectiveKind collective;
};
constexpr CompareModeLabel kCompareModes[] = {
    {"ps_sync", MODE_SYNC, COLLECTIVE_NONE},
    {"ps_async", MODE_ASYNC, COLLECTIVE_NONE},
    {"allreduce", MODE_ALLREDUCE, COLLECTIVE_GLOO},
    {"allreduce_nccl", MODE_ALLREDUCE, COLLECTIVE_NCCL},
};

const CompareModeLabel* FindCompareMode(absl::string_view label) {
  for (const CompareModeLabel& known : kCompareModes) {
    if (known.label == label) return &known;
  }
  return nullptr;
}

}  // namespace

bool IsAllreduce(const std::string& compare_mode) {
  // A row's mode may name its compression or wire after a '+'.
  const CompareModeLabel* known =
      FindCompareMode(compare_mode.substr(0, compare_mode.find('+')));
  return known != nullptr && known->mode == MODE_ALLREDUCE;
}

absl::StatusOr<CompareMode> ParseCompareMode(const std::string& label) {
  const CompareModeLabel* known = FindCompareMode(label);
  if (known == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--modes: \"", label,
                     "\" is not a mode; expected ps_sync, ps_async, "
                     "allreduce or allreduce_nccl"));
  }
  if (known->collective == COLLECTIVE_NCCL && !Collective::HasNccl()) {
    return absl::InvalidArgumentError(
        "--modes=allreduce_nccl: this build has no NCCL collective (build "
        "with bazel build --config=cuda, and run with --backend=cuda); "
        "expected ps_sync, ps_async or allreduce (Gloo)");
  }
  return CompareMode{label, known->mode, known->collective};
}

absl::StatusOr<std::vector<int>> ParsePositiveList(const std::string& flag,
                                                   const std::string& text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", text, ": \"", part,
                       "\" is not a positive integer; expected a list like "
                       "1,2,4"));
    }
    if (std::find(values.begin(), values.end(), value) != values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", text, ": ", value, " is repeated"));
    }
    values.push_back(value);
  }
  if (values.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": ", values.size(), " entries; expected at most 64"));
  }
  return values;
}

double AllreduceBoundSeconds(int64_t model_bytes, int workers,
                             double link_bytes_per_sec) {
  if (workers <= 1 || link_bytes_per_sec <= 0) return 0;
  return 2.0 * (workers - 1) / workers * static_cast<double>(model_bytes) /
         link_bytes_per_sec;
}

double PsBoundSeconds(int64_t model_bytes, int workers, int servers,
                      double link_bytes_per_sec) {
  if (servers <= 0 || link_bytes_per_sec <= 0) return 0;
  const double m = static_cast<double>(model_bytes);
  return std::max(m, m * workers / servers) / link_bytes_per_sec;
}

double BoundSeconds(const CompareRun& run, double link_bytes_per_sec) {
  if (IsAllreduce(run.mode)) {
    return AllreduceBoundSeconds(run.result.model_bytes(), run.num_workers,
                                 link_bytes_per_sec);
  }
  return PsBoundSeconds(run.result.model_bytes(), run.num_workers, run.num_ps,
                        link_bytes_per_sec);
}

std::string FormatScalingTable(const std::vector<CompareRun>& runs) {
  std::string out =
      "| #Nodes | #Workers | Mode | #PS | Batchsize | Steps | Runtime | "
      "Throughput (samples/sec) | CV | Speedup | PS/allreduce | "
      "Test accuracy |\n"
      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const CompareRun& run : runs) {
    const RunResult& r = run.result;
    const Spread spread = SpreadOf(run);
    absl::StrAppend(
        &out, absl::StrFormat(
                  "| %d | %d | %s | %d | %d | %d | %.2f s | %.2f | %s | %s | "
                  "%s | %s |\n",
                  run.num_nodes, run.num_workers, run.mode, run.num_ps,
                  r.batch_size(), r.steps(), r.runtime_seconds(),
                  r.throughput_samples_per_sec(),
                  spread.repeats > 1
                      ? absl::StrFormat("%.1f%% (n=%d)", spread.cv * 100,
                                        spread.repeats)
                      : std::string("-"),
                  Ratio(Speedup(runs, run)), Ratio(PsOverAllreduce(runs, run)),
                  FormatTestAccuracy(r)));
  }
  return out;
}

std::string FormatCommunicationTable(const std::vector<CompareRun>& runs,
                                     double link_bytes_per_sec) {
  const bool bounds = link_bytes_per_sec > 0;
  const bool batch = HasBatchSweep(runs);
  std::string out = absl::StrCat(
      "| #Workers | Mode | #PS |", batch ? " Batchsize |" : "",
      " Model bytes | Compute/step | Exchange/step | "
      "Pushed/step | Pulled/step |",
      bounds ? " Bound/step | Exchange/bound |" : "", "\n", "|---:|---|---:|",
      batch ? "---:|" : "", "---:|---:|---:|---:|---:|",
      bounds ? "---:|---:|" : "", "\n");
  for (const CompareRun& run : runs) {
    const RunResult& r = run.result;
    absl::StrAppend(
        &out,
        absl::StrFormat("| %d | %s | %d |%s %d | %.1f ms | %.1f ms |",
                        run.num_workers, run.mode, run.num_ps,
                        batch ? absl::StrCat(" ", run.batch_size, " |") : "",
                        r.model_bytes(), r.compute_seconds_per_step() * 1e3,
                        r.exchange_seconds_per_step() * 1e3));
    absl::StrAppend(&out, " ", Megabytes(r.bytes_pushed_per_step()), " | ",
                    Megabytes(r.bytes_pulled_per_step()), " |");
    if (bounds) {
      const double bound = BoundSeconds(run, link_bytes_per_sec);
      absl::StrAppend(
          &out,
          absl::StrFormat(
              " %.1f ms | %s |", bound * 1e3,
              Ratio(bound > 0 ? r.exchange_seconds_per_step() / bound : 0)));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string CompareCsv(const std::vector<CompareRun>& runs,
                       double link_bytes_per_sec) {
  std::string out =
      "mode,num_ps,num_workers,num_nodes,model,compute,batch_size,steps,"
      "runtime_s,throughput_samples_per_sec,speedup,ps_over_allreduce,"
      "test_accuracy,model_bytes,compute_ms_per_step,exchange_ms_per_step,"
      "bytes_pushed_per_step,bytes_pulled_per_step,"
      "bound_ms_per_step,repeats,throughput_mean,throughput_stddev,"
      "throughput_cv\n";
  for (const CompareRun& run : runs) {
    const RunResult& r = run.result;
    const Spread spread = SpreadOf(run);
    const bool spread_applies = spread.repeats > 1;
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "%s,%d,%d,%d,%s,%s,%d,%d,%.3f,%.2f,%s,%s,%s,%d,"
            "%.3f,%.3f,%s,%s,%s,%d,%s,%s,%s\n",
            run.mode, run.num_ps, run.num_workers, run.num_nodes, r.model(),
            r.compute(), r.batch_size(), r.steps(), r.runtime_seconds(),
            r.throughput_samples_per_sec(), OrEmpty(Speedup(runs, run), 4),
            OrEmpty(PsOverAllreduce(runs, run), 4),
            r.has_test_accuracy() ? absl::StrFormat("%.4f", r.test_accuracy())
                                  : std::string(""),
            r.model_bytes(), r.compute_seconds_per_step() * 1e3,
            r.exchange_seconds_per_step() * 1e3,
            OrEmpty(r.bytes_pushed_per_step(), 0),
            OrEmpty(r.bytes_pulled_per_step(), 0),
            OrEmpty(BoundSeconds(run, link_bytes_per_sec) * 1e3, 3),
            spread.repeats,
            spread_applies ? absl::StrFormat("%.2f", spread.mean) : "",
            spread_applies ? absl::StrFormat("%.2f", spread.stddev) : "",
            spread_applies ? absl::StrFormat("%.4f", spread.cv) : ""));
  }
  return out;
}

std::string CompareJson(const std::vector<CompareRun>& runs,
                        double link_bytes_per_sec) {
  std::string out = absl::StrFormat("{\n\"link_mbit\": %.3f,\n\"runs\": [",
                                    link_bytes_per_sec * 8 / 1e6);
  for (size_t i = 0; i < runs.size(); ++i) {
    const CompareRun& run = runs[i];
    absl::StrAppend(
        &out, i == 0 ? "\n" : ",\n",
        absl::StrFormat("{\"mode\": \"%s\", \"num_ps\": %d, \"num_workers\": "
                        "%d, \"num_nodes\": %d, \"speedup\": %.4f, "
                        "\"ps_over_allreduce\": %.4f, "
                        "\"bound_seconds_per_step\": %.6f, \"repeats\": %d, "
                        "\"throughput_mean\": %.3f, \"throughput_stddev\": "
                        "%.3f, \"throughput_cv\": %.5f,\n\"result\": ",
                        run.mode, run.num_ps, run.num_workers, run.num_nodes,
                        Speedup(runs, run), PsOverAllreduce(runs, run),
                        BoundSeconds(run, link_bytes_per_sec),
                        SpreadOf(run).repeats, SpreadOf(run).mean,
                        SpreadOf(run).stddev, SpreadOf(run).cv),
        ResultJson(run.result), "}");
  }
  absl::StrAppend(&out, "\n]\n}\n");
  return out;
}

std::string GnuplotScript(const std::vector<CompareRun>& runs,
                          const std::string& png_path,
                          const std::string& title) {
  const bool batch = HasBatchSweep(runs);
  // One series per (mode, #PS, batch size), in the order the runs came.
  std::vector<std::tuple<std::string, int, int>> series;
  for (const CompareRun& run : runs) {
    std::tuple<std::string, int, int> key{run.mode, run.num_ps, run.batch_size};
    if (std::find(series.begin(), series.end(), key) == series.end()) {
      series.push_back(key);
    }
  }
  int max_workers = 1;
  for (const CompareRun& run : runs) {
    max_workers = std::max(max_workers, run.num_workers);
  }
  std::string out = absl::StrCat(
      PlotHeader(png_path, title, "workers"),
      absl::StrFormat("set xrange [0.5:%d.5]\n", max_workers), "set xtics 1\n");
  std::string plots;
  bool has_ideal = false;
  for (size_t s = 0; s < series.size(); ++s) {
    const auto& [mode, num_ps, batch_size] = series[s];
    std::vector<std::pair<int, const CompareRun*>> points;
    for (const CompareRun& run : runs) {
      if (run.mode == mode && run.num_ps == num_ps &&
          run.batch_size == batch_size) {
        points.emplace_back(run.num_workers, &run);
      }
    }
    bool repeated = false;
    const std::string name = absl::StrCat("s", s);
    absl::StrAppend(&out, DataBlock(name, points, &repeated));
    absl::StrAppend(&plots, plots.empty() ? "plot " : ", \\\n     ",
                    SeriesPlot(name, repeated, s + 1,
                               SeriesName(*points.front().second, batch)));
    const RunResult* one = FindRun(runs, mode, num_ps, 1, batch_size);
    if (one != nullptr) {
      // Its ideal scaling, dashed and as wide as the measured line, with no
      // legend entry of its own (one entry below explains the dashes).
      absl::StrAppend(
          &plots, ", \\\n     ",
          absl::StrFormat("x * %.3f", one->throughput_samples_per_sec()),
          " with lines dt 2 lw 2 lc ", s + 1, " notitle");
      has_ideal = true;
    }
  }
  if (has_ideal) {
    absl::StrAppend(&plots,
                    ", \\\n     NaN with lines dt 2 lw 2 lc rgb \"gray40\" "
                    "title \"ideal (linear scaling from 1 worker)\"");
  }
  absl::StrAppend(&out, plots, "\n");
  return out;
}

bool HasBatchSweep(const std::vector<CompareRun>& runs) {
  for (const CompareRun& run : runs) {
    if (run.batch_size != runs.front().batch_size) return true;
  }
  return false;
}

std::string GnuplotBatchScript(const std::vector<CompareRun>& runs,
                               const std::string& png_path,
                               const std::string& title) {
  // One series per (mode, #PS, workers), in the order the runs came.
  std::vector<std::tuple<std::string, int, int>> series;
  int min_batch = 0;
  int max_batch = 0;
  for (const CompareRun& run : runs) {
    std::tuple<std::string, int, int> key{run.mode, run.num_ps,
                                          run.num_workers};
    if (std::find(series.begin(), series.end(), key) == series.end()) {
      series.push_back(key);
    }
    min_batch =
        min_batch == 0 ? run.batch_size : std::min(min_batch, run.batch_size);
    max_batch = std::max(max_batch, run.batch_size);
  }
  std::string out = absl::StrCat(
      PlotHeader(png_path, title, "batch size per worker (samples)"),
      "set logscale x 2\n",
      absl::StrFormat("set xrange [%.3f:%.3f]\n", min_batch / 1.4,
                      max_batch * 1.4));
  std::string plots;
  for (size_t s = 0; s < series.size(); ++s) {
    const auto& [mode, num_ps, workers] = series[s];
    std::vector<std::pair<int, const CompareRun*>> points;
    for (const CompareRun& run : runs) {
      if (run.mode == mode && run.num_ps == num_ps &&
          run.num_workers == workers) {
        points.emplace_back(run.batch_size, &run);
      }
    }
    bool repeated = false;
    const std::string name = absl::StrCat("b", s);
    absl::StrAppend(&out, DataBlock(name, points, &repeated));
    absl::StrAppend(
        &plots, plots.empty() ? "plot " : ", \\\n     ",
        SeriesPlot(
            name, repeated, s + 1,
            absl::StrCat(SeriesName(*points.front().second, false), ", ",
                         workers, workers == 1 ? " worker" : " workers")));
  }
  absl::StrAppend(&out, plots, "\n");
  return out;
}

}  // namespace pstrain

namespace pstrain {

absl::StatusOr<Scaling> ParseScaling(const std::string& text) {
  if (text == "weak") return Scaling::kWeak;
  if (text == "strong") return Scaling::kStrong;
  return absl::InvalidArgumentError(absl::StrCat(
      "--scaling=", text,
      ": expected weak (--steps per worker) or strong (--steps split "
      "across the workers)"));
}

int StepsPerWorker(int steps, int workers, Scaling scaling) {
  if (scaling == Scaling::kWeak || workers <= 1) return steps;
  return (steps + workers - 1) / workers;
}

const std::vector<ComparePreset>& ComparePresets() {
  static const auto* presets = new std::vector<ComparePreset>{
      {"mnist_resnet",
       "ResNets on MNIST and bigMNIST (| #Nodes | #GPUs | Epoch | Batchsize "
       "| Steps | Runtime | Speedup |): ResNet-18 on Fashion-MNIST "
       "(--dataset=mnist --data_dir=DIR for MNIST or a bigmnist set), the "
       "same work (100 steps of batch 64, about a ninth of an epoch) split "
       "across 1 and 2 workers, sync PS with 1 shard and Gloo allreduce",
       ReportLayout::kEpochRuntime,
       {{"model", "resnet18", ""},
        {"dataset", "fashion_mnist", ""},
        {"modes", "ps_sync,allreduce", ""},
        {"num_ps", "1", ""},
        {"workers", "1,2", ""},
        {"batch_size", "64", ""},
        {"steps", "100", "epochs"},
        {"scaling", "strong", ""}}},
      {"dlperf",
       "DLPerf (| num_nodes | gpu_num_per_node | batch_size_per_device | "
       "throughput | speedup |, the median of repeats): ResNet-50 on "
       "synthetic 32x32 images (224x224 on a GPU: --image_size=224 "
       "--batch_size=128 --backend=cuda), batch 16 per worker, 10 steps, 1 "
       "and 2 workers, sync PS with 1 shard and Gloo allreduce, 3 repeats",
       ReportLayout::kDlperf,
       {{"model", "resnet50", ""},
        {"dataset", "synthetic", ""},
        {"image_size", "32", ""},
        {"num_classes", "1000", ""},
        {"modes", "ps_sync,allreduce", ""},
        {"num_ps", "1", ""},
        {"workers", "1,2", ""},
        {"batch_size", "16", ""},
        {"steps", "10", "epochs"},
        {"repeats", "3", ""}}},
      {"tiny_imagenet",
       "AlexNet, ResNet-18 and VGG-16 on tiny-ImageNet, CPU and GPU nodes "
       "(images/sec against nodes with the CV of repeats, and the batch-size "
       "sweep): AlexNet (--model=resnet18 or vgg16 for the others) on "
       "64x64 images of 200 classes, synthetic unless --dataset=image_folder "
       "--data_dir=tiny-imagenet-200, batch 32 and 64 per worker, 20 steps, "
       "1 and 2 workers, sync PS with 1 shard, 3 repeats",
       ReportLayout::kNodesImages,
       {{"model", "alexnet", ""},
        {"dataset", "synthetic", ""},
        {"image_size", "64", ""},
        {"num_classes", "200", ""},
        {"modes", "ps_sync", ""},
        {"num_ps", "1", ""},
        {"workers", "1,2", ""},
        {"batch_sizes", "32,64", "batch_size"},
        {"steps", "20", "epochs"},
        {"repeats", "3", ""}}},
      {"bert",
       "The seeds' BERT table (| #GPUs | Batch size per GPU | Samples/sec | "
       "Samples/sec per GPU | CV | Speedup |, 7 repeats a row; issue 41): "
       "BERT-base with an untied MLM head (bert_base_untied) on synthetic "
       "token streams of 128 tokens, its token table row-sparse on the PS "
       "(--sparse_embeddings: sync, 1 shard) against dense Gloo allreduce, "
       "1 and 2 workers of batch 2, 2 steps (--batch_size=96 --backend=cuda "
       "for the report's GPUs; --model=bert_tiny_untied for a CPU run that "
       "takes minutes)",
       ReportLayout::kPerDevice,
       {{"model", "bert_base_untied", ""},
        {"dataset", "synthetic_tokens", ""},
        {"modes", "ps_sync,allreduce", ""},
        {"num_ps", "1", ""},
        {"workers", "1,2", ""},
        {"batch_size", "2", ""},
        {"steps", "2", "epochs"},
        {"sparse_embeddings", "true", ""},
        {"repeats", "7", ""}}},
  };
  return *presets;
}

absl::StatusOr<const ComparePreset*> FindComparePreset(
    const std::string& name) {
  std::string names;
  for (const ComparePreset& preset : ComparePresets()) {
    if (preset.name == name) return &preset;
    absl::StrAppend(&names, names.empty() ? "" : ", ", preset.name);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--preset=", name, ": no such preset; expected one of ", names));
}

namespace {

bool OnCuda(const CompareRun& run) {
  return ParseBackend(run.result.backend()).value_or(BACKEND_UNSPECIFIED) ==
         BACKEND_CUDA;
}

// "ps_sync, 2 PS" / "allreduce"; with `model`, "resnet18 on cpu, " first.
std::string ReportSeries(const CompareRun& run, bool model) {
  return absl::StrCat(model ? absl::StrCat(run.result.model(), " on ",
                                           OnCuda(run) ? "cuda" : "cpu", ", ")
                            : "",
                      IsAllreduce(run.mode)
                          ? run.mode
                          : absl::StrCat(run.mode, ", ", run.num_ps, " PS"));
}

// Under a minute in seconds, else as the console's ETA (m:ss, h:mm:ss).
std::string Runtime(double seconds) {
  if (std::llround(seconds) < 60) return absl::StrFormat("%.1f s", seconds);
  return FormatEta(seconds);
}

std::string CvCell(const CompareRun& run) {
  const Spread spread = SpreadOf(run);
  return spread.repeats > 1 ? absl::StrFormat("%.1f%%", spread.cv * 100)
                            : std::string("-");
}

}  // namespace

std::string FormatReportTable(const std::vector<CompareRun>& runs,
                              ReportLayout layout) {
  if (layout == ReportLayout::kNone || runs.empty()) return "";
  const bool by_model = layout == ReportLayout::kNodesImages;
  // Series in the order they first appear.
  std::vector<std::string> series;
  for (const CompareRun& run : runs) {
    const std::string name = ReportSeries(run, by_model);
    if (std::find(series.begin(), series.end(), name) == series.end()) {
      series.push_back(name);
    }
  }
  const bool cuda = OnCuda(runs.front());
  std::string out;
  for (const std::string& name : series) {
    absl::StrAppend(&out, "**", name, "**\n\n");
    switch (layout) {
      case ReportLayout::kEpochRuntime:
        absl::StrAppend(&out, "| #Nodes | ", cuda ? "#GPUs" : "#CPU workers",
                        " | Epoch | Batchsize | Steps | Runtime | Speedup |\n",
                        "|---:|---:|---:|---:|---:|---:|---:|\n");
        break;
      case ReportLayout::kDlperf:
        absl::StrAppend(&out, "| num_nodes | ",
                        cuda ? "gpu_num_per_node" : "cpu_worker_num_per_node",
                        " | batch_size_per_device | throughput | speedup |\n",
                        "|---:|---:|---:|---:|---:|\n");
        break;
      case ReportLayout::kPerDevice:
        absl::StrAppend(
            &out, "| ", cuda ? "#GPUs" : "#CPU workers", " | Batch size per ",
            cuda ? "GPU" : "worker", " | Samples/sec | Samples/sec per ",
            cuda ? "GPU" : "worker", " | CV | Speedup | vs allreduce |\n",
            "|---:|---:|---:|---:|---:|---:|---:|\n");
        break;
      default:
        absl::StrAppend(&out,
                        "| #Nodes | Batch size | Images/sec | CV | Speedup |\n",
                        "|---:|---:|---:|---:|---:|\n");
        break;
    }
    for (const CompareRun& run : runs) {
      if (ReportSeries(run, by_model) != name) continue;
      const RunResult& r = run.result;
      const bool one_host_per_task = run.num_nodes > 1;
      const int nodes = one_host_per_task ? run.num_workers : 1;
      const int per_node = one_host_per_task ? 1 : run.num_workers;
      switch (layout) {
        case ReportLayout::kEpochRuntime: {
          const double samples =
              static_cast<double>(r.steps()) * run.num_workers * r.batch_size();
          absl::StrAppend(
              &out,
              absl::StrFormat(
                  "| %d | %d | %s | %d | %d | %s | %s |\n", nodes, per_node,
                  r.train_samples() > 0
                      ? absl::StrFormat("%.2f", samples / r.train_samples())
                      : std::string("-"),
                  r.batch_size(), r.steps(), Runtime(r.runtime_seconds()),
                  Ratio(Speedup(runs, run))));
          break;
        }
        case ReportLayout::kDlperf:
          absl::StrAppend(
              &out,
              absl::StrFormat("| %d | %d | %d | %.2f | %s |\n", nodes, per_node,
                              r.batch_size(), r.throughput_samples_per_sec(),
                              Ratio(Speedup(runs, run))));
          break;
        case ReportLayout::kPerDevice:
          absl::StrAppend(
              &out,
              absl::StrFormat("| %d | %d | %.2f | %.2f | %s | %s | %s |\n",
                              run.num_workers, r.batch_size(),
                              r.throughput_samples_per_sec(),
                              r.throughput_samples_per_sec() / run.num_workers,
                              CvCell(run), Ratio(Speedup(runs, run)),
                              Ratio(PsOverAllreduce(runs, run))));
          break;
        default:
          absl::StrAppend(
              &out,
              absl::StrFormat("| %d | %d | %.2f | %s | %s |\n", run.num_workers,
                              r.batch_size(), r.throughput_samples_per_sec(),
                              CvCell(run), Ratio(Speedup(runs, run))));
          break;
      }
    }
    absl::StrAppend(&out, "\n");
  }
  const bool one_machine = runs.front().num_nodes <= 1;
  switch (layout) {
    case ReportLayout::kEpochRuntime:
      absl::StrAppend(
          &out,
          "Epoch: samples trained over the training set; Steps: per worker; "
          "Runtime: the training epochs' wall time (evaluation excluded); "
          "Speedup: samples/sec over the 1-worker run's.\n");
      break;
    case ReportLayout::kDlperf:
      absl::StrAppend(&out,
                      "throughput: samples/sec summed over the workers (the "
                      "median of the repeats); speedup: over the 1-worker "
                      "run's.\n");
      break;
    case ReportLayout::kPerDevice:
      absl::StrAppend(
          &out,
          "Samples/sec: sequences a second summed over the workers (the "
          "median of the repeats), and per worker; CV: the coefficient of "
          "variation of the repeats; Speedup: over the 1-worker run's; vs "
          "allreduce: a PS row's samples/sec over allreduce's at the same "
          "workers.\n");
      break;
    default:
      absl::StrAppend(
          &out,
          "Images/sec: summed over the workers (the median of the repeats); "
          "CV: the coefficient of variation of the repeats; Speedup: over "
          "the 1-worker run's at the same batch size.",
          one_machine ? " One worker per node, as the report ran; here every "
                        "node is a process on one machine."
                      : "",
          "\n");
      break;
  }
  return out;
}

namespace {

// Runs `gnuplot SCRIPT` in `dir` (the script names its PNG relative to
// it); its errors are printed by gnuplot itself.
absl::Status RunGnuplot(const std::string& dir, const std::string& script) {
  const std::string command =
      absl::StrCat("cd '", dir, "' && gnuplot '", script, "' 2>&1");
  const int status = std::system(command.c_str());
  if (status != 0) {
    return absl::InternalError(absl::StrCat("gnuplot ", dir, "/", script,
                                            " failed (status ", status, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCompareReport(const CompareReportOptions& options,
                                const std::vector<CompareRun>& done) {
  const double link_bytes_per_sec = options.link_mbit * 1e6 / 8;
  const std::string scaling_table = FormatScalingTable(done);
  const std::string communication =
      FormatCommunicationTable(done, link_bytes_per_sec);
  const RunResult& first = done.front().result;
  const std::string title = absl::StrCat(
      Synthetic(first)
          ? absl::StrCat(
                absl::StrFormat("synthetic compute %.0f ms, %.1f MB of "
                                "gradients",
                                options.compute_ms, first.model_bytes() / 1e6),
                options.backward_fraction > 0
                    ? absl::StrFormat(
                          " (the last %.0f%% of compute a backward pass "
                          "that allreduce overlaps: its Exchange/step is "
                          "what is left after compute)",
                          options.backward_fraction * 100)
                    : "")
          : absl::StrCat(first.model(), " on ", first.dataset()),
      options.link_mbit > 0
          ? absl::StrFormat(", %.0f Mbit/s links", options.link_mbit)
          : "",
      options.netns ? ", one network namespace per task" : ", one machine",
      options.wire_dtype.empty() || options.wire_dtype == "fp32"
          ? ""
          : absl::StrCat(", gradients in ", options.wire_dtype,
                         " on the wire in every row"));
  const std::string published = FormatReportTable(done, options.layout);
  const std::string report = absl::StrCat(
      "# pstrain compare: ", title, "\n\n", "Command: `", options.command_line,
      "`\n\n", options.preset_line, published.empty() ? "" : published,
      published.empty() ? "" : "\n", scaling_table, "\n", communication);
  std::printf("\n%s", report.c_str());
  std::fflush(stdout);
  // Relative to options.out_dir, so the committed script runs anywhere.
  const std::string png = "throughput.png";
  const std::string script = absl::StrCat(options.out_dir, "/throughput.gp");
  for (const auto& [path, text] :
       {std::pair<std::string, std::string>{
            absl::StrCat(options.out_dir, "/results.md"), report},
        {absl::StrCat(options.out_dir, "/results.csv"),
         CompareCsv(done, link_bytes_per_sec)},
        {absl::StrCat(options.out_dir, "/results.json"),
         CompareJson(done, link_bytes_per_sec)},
        {script, GnuplotScript(done, png, title)}}) {
    if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) {
      return absl::InternalError(s.ToString());
    }
  }
  std::vector<std::string> scripts = {"throughput"};
  if (HasBatchSweep(done)) {
    // The sweep's second plot: samples/sec against the batch size.
    if (absl::Status s = WriteFileAtomically(
            absl::StrCat(options.out_dir, "/batch_size.gp"),
            GnuplotBatchScript(done, "batch_size.png", title));
        !s.ok()) {
      return absl::InternalError(s.ToString());
    }
    scripts.push_back("batch_size");
  }
  std::string wrote;
  for (const std::string& name : scripts) {
    if (options.plot) {
      if (absl::Status s =
              RunGnuplot(options.out_dir, absl::StrCat(name, ".gp"));
          !s.ok()) {
        return s;
      }
    }
    absl::StrAppend(&wrote, ", ", name, ".gp", options.plot ? ", " : "",
                    options.plot ? absl::StrCat(name, ".png") : "");
  }
  std::printf("\nwrote %s/results.md, results.csv, results.json%s\n",
              options.out_dir.c_str(), wrote.c_str());
  return absl::OkStatus();
}

}  // namespace pstrain
