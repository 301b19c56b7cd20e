#include "cli/compare.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collective.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

CompareRun MakeRun(const std::string& mode, int num_ps, int workers,
                   double throughput, double exchange_s) {
  CompareRun run;
  run.mode = mode;
  run.num_ps = num_ps;
  run.num_workers = workers;
  run.num_nodes = num_ps + workers;
  run.batch_size = 32;
  run.result.set_compute("synthetic");
  run.result.set_model("synthetic");
  run.result.set_batch_size(32);
  run.result.set_steps(10);
  run.result.set_runtime_seconds(2.5);
  run.result.set_throughput_samples_per_sec(throughput);
  run.result.set_model_bytes(100000000);
  run.result.set_exchange_seconds_per_step(exchange_s);
  run.result.set_compute_seconds_per_step(0.1);
  return run;
}

TEST(BoundsTest, MatchTheBytePsFormulas) {
  const double link = 125e6;  // 1 Gbit/s, bytes/s
  // Allreduce: 2 (n-1)/n M / B: 4 workers, 100 MB -> 1.5 * 0.8 s.
  EXPECT_DOUBLE_EQ(AllreduceBoundSeconds(100000000, 4, link), 1.2);
  EXPECT_DOUBLE_EQ(AllreduceBoundSeconds(100000000, 1, link), 0.0);
  // PS: max(M, n M / k) / B.
  EXPECT_DOUBLE_EQ(PsBoundSeconds(100000000, 4, 4, link), 0.8);
  EXPECT_DOUBLE_EQ(PsBoundSeconds(100000000, 4, 2, link), 1.6);
  EXPECT_DOUBLE_EQ(PsBoundSeconds(100000000, 2, 4, link), 0.8);
  EXPECT_DOUBLE_EQ(PsBoundSeconds(100000000, 4, 2, 0), 0.0);
  EXPECT_DOUBLE_EQ(BoundSeconds(MakeRun("allreduce", 0, 4, 1, 1), link), 1.2);
  EXPECT_DOUBLE_EQ(BoundSeconds(MakeRun("ps_sync", 2, 4, 1, 1), link), 1.6);
  EXPECT_DOUBLE_EQ(BoundSeconds(MakeRun("allreduce_nccl", 0, 4, 1, 1), link),
                   1.2);
}

TEST(ScalingTableTest, SpeedupAndPsOverAllreduce) {
  const std::vector<CompareRun> runs = {MakeRun("ps_sync", 2, 1, 100, 0.5),
                                        MakeRun("ps_sync", 2, 4, 300, 0.9),
                                        MakeRun("allreduce", 0, 1, 110, 0.0),
                                        MakeRun("allreduce", 0, 4, 200, 1.3)};
  const std::string table = FormatScalingTable(runs);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0],
            "| #Nodes | #Workers | Mode | #PS | Batchsize | Steps | Runtime | "
            "Throughput (samples/sec) | CV | Speedup | PS/allreduce | "
            "Test accuracy |");
  // 300 / 100 = 3.00x over 1 worker; 300 / 200 = 1.50x over allreduce;
  // synthetic compute has no accuracy.
  EXPECT_EQ(lines[3],
            "| 6 | 4 | ps_sync | 2 | 32 | 10 | 2.50 s | 300.00 | - | 3.00x | "
            "1.50x | - |");
  EXPECT_EQ(lines[2],
            "| 3 | 1 | ps_sync | 2 | 32 | 10 | 2.50 s | 100.00 | - | 1.00x | "
            "0.91x | - |");
  EXPECT_EQ(lines[5],
            "| 4 | 4 | allreduce | 0 | 32 | 10 | 2.50 s | 200.00 | - | 1.82x | "
            "- | - |");
}

// With both allreduces in a comparison, the PS is set against NCCL's (the
// stronger baseline where there are GPUs).
TEST(ScalingTableTest, PsOverAllreducePrefersNccl) {
  const std::vector<CompareRun> runs = {
      MakeRun("ps_sync", 2, 4, 300, 0.9), MakeRun("allreduce", 0, 4, 200, 1.3),
      MakeRun("allreduce_nccl", 0, 4, 250, 1.0)};
  const std::vector<std::string> lines =
      absl::StrSplit(FormatScalingTable(runs), '\n');
  ASSERT_GE(lines.size(), 5u);
  EXPECT_THAT(lines[2], HasSubstr("| 300.00 | - | - | 1.20x | - |"));
  EXPECT_THAT(lines[4], HasSubstr("| allreduce_nccl | 0 |"));
  EXPECT_THAT(lines[4], HasSubstr("| 250.00 | - | - | - |"));
}

// --wire_dtype=fp32,bf16: a 16-bit PS row (compressed or not) is set
// against the allreduce of the same wire; an allreduce+bf16 row is an
// allreduce row (no PS/allreduce ratio of its own).
TEST(ScalingTableTest, PsOverAllreduceOfTheSameWire) {
  const std::vector<CompareRun> runs = {
      MakeRun("ps_sync", 2, 4, 300, 0.9),
      MakeRun("ps_sync+bf16", 2, 4, 400, 0.7),
      MakeRun("ps_sync+topk:0.01+bf16", 2, 4, 480, 0.6),
      MakeRun("allreduce", 0, 4, 200, 1.3),
      MakeRun("allreduce+bf16", 0, 4, 320, 0.8)};
  const std::vector<std::string> lines =
      absl::StrSplit(FormatScalingTable(runs), '\n');
  ASSERT_GE(lines.size(), 7u);
  EXPECT_THAT(lines[2], HasSubstr("| 300.00 | - | - | 1.50x | - |"));
  EXPECT_THAT(lines[3], HasSubstr("| 400.00 | - | - | 1.25x | - |"));
  EXPECT_THAT(lines[4], HasSubstr("| 480.00 | - | - | 1.50x | - |"));
  EXPECT_THAT(lines[6], HasSubstr("| allreduce+bf16 | 0 |"));
  EXPECT_THAT(lines[6], HasSubstr("| 320.00 | - | - | - |"));
}

// Top-k in allreduce (a sparse allgather): an allreduce row, no ratio of
// its own; a compressed PS row is still set against the dense allreduce.
TEST(ScalingTableTest, AllreduceTopKRowIsAnAllreduceRow) {
  const std::vector<CompareRun> runs = {
      MakeRun("ps_sync+topk:0.01", 2, 4, 300, 0.9),
      MakeRun("allreduce", 0, 4, 200, 1.3),
      MakeRun("allreduce+topk:0.01", 0, 4, 400, 0.6)};
  EXPECT_TRUE(IsAllreduce("allreduce+topk:0.01"));
  const std::vector<std::string> lines =
      absl::StrSplit(FormatScalingTable(runs), '\n');
  ASSERT_GE(lines.size(), 5u);
  EXPECT_THAT(lines[2], HasSubstr("| 300.00 | - | - | 1.50x | - |"));
  EXPECT_THAT(lines[4], HasSubstr("| allreduce+topk:0.01 | 0 |"));
  EXPECT_THAT(lines[4], HasSubstr("| 400.00 | - | - | - |"));
}

TEST(ScalingTableTest, NoOneWorkerRunMeansNoSpeedup) {
  CompareRun run = MakeRun("ps_async", 1, 2, 50, 0.1);
  run.result.set_compute("model");
  run.result.set_test_accuracy(0.8596);
  const std::string table = FormatScalingTable({run});
  EXPECT_THAT(table, HasSubstr("| 50.00 | - | - | - | 0.8596 |"));
}

TEST(CommunicationTableTest, RatioToBound) {
  const double link = 125e6;
  const std::string table = FormatCommunicationTable(
      {MakeRun("ps_sync", 4, 4, 1, 0.88), MakeRun("allreduce", 0, 4, 1, 1.32)},
      link);
  EXPECT_THAT(table, HasSubstr("| 4 | ps_sync | 4 | 100000000 | 100.0 ms | "
                               "880.0 ms | - | - | 800.0 ms | 1.10x |"));
  EXPECT_THAT(table, HasSubstr("| 4 | allreduce | 0 | 100000000 | 100.0 ms | "
                               "1320.0 ms | - | - | 1200.0 ms | 1.10x |"));
  // Without a link rate there are no bound columns.
  EXPECT_THAT(FormatCommunicationTable({MakeRun("ps_sync", 4, 4, 1, 0.88)}, 0),
              ::testing::Not(HasSubstr("Bound")));
}

// A PS row's measured bytes per step (worker 0's), in MB; in the CSV as
// bytes.
TEST(CommunicationTableTest, BytesPushedAndPulled) {
  CompareRun run = MakeRun("ps_sync+topk:0.01", 1, 2, 1, 0.01);
  run.result.set_bytes_pushed_per_step(823000);
  run.result.set_bytes_pulled_per_step(10512000);
  EXPECT_THAT(FormatCommunicationTable({run}, 0),
              HasSubstr("| 10.0 ms | 0.82 MB | 10.51 MB |\n"));
  EXPECT_THAT(CompareCsv({run}, 0), HasSubstr(",10.000,823000,10512000,,"));
}

TEST(CsvTest, OneLinePerRunWithEveryColumn) {
  const std::string csv = CompareCsv(
      {MakeRun("ps_sync", 2, 1, 100, 0.5), MakeRun("ps_sync", 2, 2, 150, 0.6)},
      125e6);
  const std::vector<std::string> lines =
      absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  const size_t columns =
      std::vector<std::string>(absl::StrSplit(lines[0], ',')).size();
  EXPECT_EQ(columns, 23u);
  for (const std::string& line : lines) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(line, ',')).size(),
              columns)
        << line;
  }
  EXPECT_THAT(lines[2], HasSubstr("ps_sync,2,2,4,synthetic,synthetic,32,10,"));
  // speedup 1.5, bound max(M, 2M/2)/B = 0.8 s.
  EXPECT_THAT(lines[2], HasSubstr(",1.5000,"));
  EXPECT_THAT(lines[2], HasSubstr(",800.000,"));
  // No allreduce run: ps_over_allreduce is empty, and so is the spread of
  // a configuration run once.
  EXPECT_THAT(lines[2], HasSubstr(",1.5000,,"));
  EXPECT_THAT(lines[2], ::testing::EndsWith(",1,,,"));
  // Without a link rate the bound is empty too, never 0.
  const std::string no_link =
      CompareCsv({MakeRun("ps_sync", 2, 2, 150, 0.6)}, 0);
  EXPECT_THAT(no_link, ::testing::Not(HasSubstr("0.0000")));
  EXPECT_THAT(no_link, ::testing::EndsWith(",,1,,,\n"));
}

// A run of a --batch_sizes sweep: `batch` samples per worker.
CompareRun WithBatch(CompareRun run, int batch) {
  run.batch_size = batch;
  run.result.set_batch_size(batch);
  return run;
}

TEST(BatchSweepTest, SpeedupAndRatiosWithinOneBatchSize) {
  const std::vector<CompareRun> runs = {
      WithBatch(MakeRun("ps_sync", 2, 1, 100, 0.5), 32),
      WithBatch(MakeRun("ps_sync", 2, 2, 150, 0.5), 32),
      WithBatch(MakeRun("allreduce", 0, 2, 300, 0.5), 32),
      WithBatch(MakeRun("ps_sync", 2, 1, 200, 0.5), 128),
      WithBatch(MakeRun("ps_sync", 2, 2, 380, 0.5), 128),
      WithBatch(MakeRun("allreduce", 0, 2, 190, 0.5), 128)};
  EXPECT_TRUE(HasBatchSweep(runs));
  EXPECT_FALSE(HasBatchSweep({runs[0], runs[1], runs[2]}));
  const std::vector<std::string> lines =
      absl::StrSplit(FormatScalingTable(runs), '\n');
  ASSERT_GE(lines.size(), 8u);
  // Each batch size's speedup is over its own 1-worker run (150/100 and
  // 380/200, not 380/100), and PS/allreduce over the allreduce run of the
  // same batch size (150/300 and 380/190).
  EXPECT_THAT(lines[3], HasSubstr("| 32 | 10 |"));
  EXPECT_THAT(lines[3], HasSubstr("| 1.50x | 0.50x |"));
  EXPECT_THAT(lines[6], HasSubstr("| 128 | 10 |"));
  EXPECT_THAT(lines[6], HasSubstr("| 1.90x | 2.00x |"));
  EXPECT_THAT(FormatCommunicationTable(runs, 0),
              HasSubstr("| 2 | ps_sync | 2 | 128 | 100000000 |"));
  // Throughput against workers: one line per batch size, named with it, each
  // with its own ideal line.
  const std::string workers_plot = GnuplotScript(runs, "t.png", "t");
  EXPECT_THAT(workers_plot, HasSubstr("title \"ps_sync (2 PS), batch 128\""));
  EXPECT_THAT(workers_plot, HasSubstr("x * 100.000"));
  EXPECT_THAT(workers_plot, HasSubstr("x * 200.000"));
  // Throughput against batch size: one line per mode, #PS and workers,
  // points in batch order on a log2 axis.
  const std::string batch_plot = GnuplotBatchScript(runs, "b.png", "t");
  EXPECT_THAT(batch_plot, HasSubstr("set logscale x 2"));
  EXPECT_THAT(batch_plot, HasSubstr("batch size per worker (samples)"));
  EXPECT_THAT(batch_plot, HasSubstr("title \"ps_sync (2 PS), 2 workers\""));
  EXPECT_THAT(batch_plot, HasSubstr("title \"allreduce, 2 workers\""));
  EXPECT_THAT(batch_plot,
              HasSubstr("$b1 << EOD\n32 150.000 0.000\n128 380.000 0.000\n"));
}

CompareRun Repeated(CompareRun run, std::vector<double> throughputs) {
  run.throughputs = std::move(throughputs);
  return run;
}

TEST(RepeatsTest, MedianAndCoefficientOfVariation) {
  EXPECT_EQ(MedianIndex({}), -1);
  EXPECT_EQ(MedianIndex({5}), 0);
  EXPECT_EQ(MedianIndex({9, 3, 5}), 2);
  EXPECT_EQ(MedianIndex({9, 3, 5, 7}), 2);  // The lower middle one.
  // 90, 100, 110: mean 100, sample stddev 10, CV 10%.
  const CompareRun run =
      Repeated(MakeRun("ps_sync", 2, 2, 100, 0.6), {110, 90, 100});
  const Spread spread = SpreadOf(run);
  EXPECT_EQ(spread.repeats, 3);
  EXPECT_DOUBLE_EQ(spread.mean, 100);
  EXPECT_DOUBLE_EQ(spread.stddev, 10);
  EXPECT_DOUBLE_EQ(spread.cv, 0.1);
  EXPECT_EQ(SpreadOf(MakeRun("ps_sync", 2, 2, 100, 0.6)).repeats, 1);
  EXPECT_THAT(FormatScalingTable({run}), HasSubstr("| 100.00 | 10.0% (n=3) |"));
  EXPECT_THAT(CompareCsv({run}, 0),
              ::testing::EndsWith(",3,100.00,10.00,0.1000\n"));
  EXPECT_THAT(CompareJson({run}, 0),
              HasSubstr("\"repeats\": 3, \"throughput_mean\": 100.000, "
                        "\"throughput_stddev\": 10.000, \"throughput_cv\": "
                        "0.10000"));
}

// JSON numbers are numbers: RunResult's int64 fields are not strings.
TEST(JsonTest, Int64FieldsAreNumbers) {
  const std::string json = CompareJson({MakeRun("ps_sync", 2, 1, 100, 0.5)}, 0);
  EXPECT_THAT(json, HasSubstr("\"steps\": 10,"));
  EXPECT_THAT(json, HasSubstr("\"model_bytes\": 100000000"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("\"steps\": \"")));
}

TEST(JsonTest, HoldsEveryRun) {
  const std::string json = CompareJson(
      {MakeRun("ps_sync", 2, 1, 100, 0.5), MakeRun("allreduce", 0, 1, 90, 0.1)},
      125e6);
  EXPECT_THAT(json, HasSubstr("\"link_mbit\": 1000.000"));
  EXPECT_THAT(json, HasSubstr("\"mode\": \"allreduce\""));
  EXPECT_THAT(json, HasSubstr("\"throughput_samples_per_sec\": 100"));
}

TEST(GnuplotTest, OneSeriesPerModeWithDashedIdealLine) {
  const std::string script = GnuplotScript(
      {MakeRun("ps_sync", 2, 1, 100, 0.5), MakeRun("ps_sync", 2, 2, 150, 0.6),
       MakeRun("allreduce", 0, 1, 90, 0.1),
       MakeRun("allreduce", 0, 2, 170, 0.1)},
      "/tmp/x.png", "t");
  EXPECT_THAT(script, HasSubstr("set output \"/tmp/x.png\""));
  EXPECT_THAT(script, HasSubstr("set ylabel \"throughput (samples/sec)\""));
  EXPECT_THAT(script, ::testing::Not(HasSubstr("data/sec")));
  EXPECT_THAT(script,
              HasSubstr("$s0 << EOD\n1 100.000 0.000\n2 150.000 0.000\nEOD\n"));
  EXPECT_THAT(script,
              HasSubstr("$s1 << EOD\n1 90.000 0.000\n2 170.000 0.000\nEOD\n"));
  // The ideal lines as wide as the measured ones, without legend entries
  // of their own: one entry explains the dashes (no doubled legend).
  EXPECT_THAT(script,
              HasSubstr("x * 100.000 with lines dt 2 lw 2 lc 1 notitle"));
  EXPECT_THAT(script,
              HasSubstr("x * 90.000 with lines dt 2 lw 2 lc 2 notitle"));
  EXPECT_THAT(script, HasSubstr("title \"ps_sync (2 PS)\""));
  size_t titles = 0;
  for (size_t at = script.find(" title \"", script.find("plot "));
       at != std::string::npos; at = script.find(" title \"", at + 1)) {
    ++titles;
  }
  EXPECT_EQ(titles, 3u);  // Two series and one "ideal" entry.
  EXPECT_THAT(script, HasSubstr(" using 1:2 with linespoints"));
  EXPECT_THAT(script, ::testing::Not(HasSubstr("yerrorlines")));
}

TEST(GnuplotTest, ErrorBarsWithRepeatsAndLongTitlesWrap) {
  const std::string title =
      "synthetic compute 50 ms, 44.7 MB of gradients (the last 60% of compute "
      "a backward pass that allreduce overlaps), 1000 Mbit/s links, one "
      "network namespace per task";
  const std::string script = GnuplotScript(
      {Repeated(MakeRun("ps_sync", 2, 1, 100, 0.5), {90, 100, 110}),
       Repeated(MakeRun("ps_sync", 2, 2, 150, 0.6), {150, 150, 150})},
      "x.png", title);
  EXPECT_THAT(script,
              HasSubstr("$s0 << EOD\n1 100.000 10.000\n2 150.000 0.000\n"));
  EXPECT_THAT(script, HasSubstr("$s0 using 1:2:3 with yerrorlines"));
  // Broken at ", " into lines of at most 90 characters.
  const size_t start = script.find("set title \"") + 11;
  const std::string shown =
      script.substr(start, script.find('"', start) - start);
  EXPECT_THAT(shown, HasSubstr(",\\n"));
  for (absl::string_view line : absl::StrSplit(shown, "\\n")) {
    EXPECT_LE(line.size(), 90u) << line;
  }
}

TEST(ScalingTest, StrongSplitsTheStepsAcrossWorkers) {
  EXPECT_EQ(StepsPerWorker(100, 1, Scaling::kStrong), 100);
  EXPECT_EQ(StepsPerWorker(100, 2, Scaling::kStrong), 50);
  EXPECT_EQ(StepsPerWorker(100, 3, Scaling::kStrong), 34);  // ceil
  EXPECT_EQ(StepsPerWorker(100, 4, Scaling::kWeak), 100);
  EXPECT_TRUE(ParseScaling("weak").ok());
  EXPECT_EQ(*ParseScaling("strong"), Scaling::kStrong);
  EXPECT_THAT(std::string(ParseScaling("linear").status().message()),
              HasSubstr("--scaling=linear: expected weak"));
}

TEST(PresetTest, EveryPresetNamesALayoutAndFlags) {
  ASSERT_GE(ComparePresets().size(), 3u);
  for (const ComparePreset& preset : ComparePresets()) {
    absl::StatusOr<const ComparePreset*> found = FindComparePreset(preset.name);
    ASSERT_TRUE(found.ok()) << preset.name;
    EXPECT_EQ(*found, &preset);
    EXPECT_NE(preset.layout, ReportLayout::kNone) << preset.name;
    EXPECT_FALSE(preset.flags.empty()) << preset.name;
  }
  const absl::Status unknown = FindComparePreset("imagenet").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()),
              HasSubstr("--preset=imagenet: no such preset; expected one of "
                        "mnist_resnet, dlperf, tiny_imagenet, bert"));
}

// Runs of a real model on one machine, as the presets make them.
CompareRun ModelRun(const std::string& mode, int workers, int batch,
                    int64_t steps, double runtime_s, double throughput) {
  CompareRun run =
      MakeRun(mode, mode == "allreduce" ? 0 : 1, workers, throughput, 0.1);
  run.num_nodes = 1;
  run.batch_size = batch;
  run.result.set_compute("model");
  run.result.set_model("resnet18");
  run.result.set_backend("cpu");
  run.result.set_train_samples(60000);
  run.result.set_batch_size(batch);
  run.result.set_steps(steps);
  run.result.set_runtime_seconds(runtime_s);
  return run;
}

TEST(ReportTableTest, EpochRuntimeLayout) {
  // Strong scaling: 100 steps of batch 64 at 1 worker, 50 each at 2.
  const std::vector<CompareRun> runs = {
      ModelRun("ps_sync", 1, 64, 100, 100.0, 64.0),
      ModelRun("ps_sync", 2, 64, 50, 3725.0, 1.72),
      ModelRun("allreduce", 1, 64, 100, 90.0, 71.1)};
  const std::string table =
      FormatReportTable(runs, ReportLayout::kEpochRuntime);
  EXPECT_THAT(table,
              HasSubstr("**ps_sync, 1 PS**\n\n| #Nodes | #CPU workers | Epoch "
                        "| Batchsize | Steps | Runtime | Speedup |\n"
                        "|---:|---:|---:|---:|---:|---:|---:|\n"
                        "| 1 | 1 | 0.11 | 64 | 100 | 1:40 | 1.00x |\n"
                        "| 1 | 2 | 0.11 | 64 | 50 | 1:02:05 | 0.03x |\n\n"
                        "**allreduce**\n\n"));
  EXPECT_THAT(table, HasSubstr("| 1 | 1 | 0.11 | 64 | 100 | 1:30 | 1.00x |"));
  EXPECT_EQ(FormatReportTable(runs, ReportLayout::kNone), "");
}

TEST(ReportTableTest, DlperfLayoutSaysGpuOnCuda) {
  std::vector<CompareRun> runs = {ModelRun("ps_sync", 1, 128, 20, 10, 400),
                                  ModelRun("ps_sync", 2, 128, 20, 10, 700)};
  for (CompareRun& run : runs) run.result.set_backend("cuda");
  // One host per task: every worker a node, one device per node.
  runs[1].num_nodes = 3;
  EXPECT_THAT(FormatReportTable(runs, ReportLayout::kDlperf),
              HasSubstr("| num_nodes | gpu_num_per_node | "
                        "batch_size_per_device | throughput | speedup |\n"
                        "|---:|---:|---:|---:|---:|\n"
                        "| 1 | 1 | 128 | 400.00 | 1.00x |\n"
                        "| 2 | 1 | 128 | 700.00 | 1.75x |\n"));
}

TEST(ReportTableTest, NodesImagesLayoutWithRepeats) {
  std::vector<CompareRun> runs = {ModelRun("ps_sync", 1, 32, 20, 10, 100),
                                  ModelRun("ps_sync", 2, 32, 20, 10, 150),
                                  ModelRun("ps_sync", 1, 64, 20, 10, 120)};
  runs[0].throughputs = {90, 100, 110};
  const std::string table = FormatReportTable(runs, ReportLayout::kNodesImages);
  EXPECT_THAT(table, HasSubstr("**resnet18 on cpu, ps_sync, 1 PS**\n\n"
                               "| #Nodes | Batch size | Images/sec | CV | "
                               "Speedup |\n|---:|---:|---:|---:|---:|\n"
                               "| 1 | 32 | 100.00 | 10.0% | 1.00x |\n"
                               "| 2 | 32 | 150.00 | - | 1.50x |\n"
                               "| 1 | 64 | 120.00 | - | 1.00x |\n"));
  EXPECT_THAT(table, HasSubstr("One worker per node"));
}

// The seeds' BERT table (issue 41): per device, with the PS series over
// allreduce's at the same workers.
TEST(ReportTableTest, PerDeviceLayout) {
  std::vector<CompareRun> runs = {ModelRun("ps_sync", 1, 8, 5, 10, 20),
                                  ModelRun("ps_sync", 2, 8, 5, 10, 30),
                                  ModelRun("allreduce", 1, 8, 5, 10, 25),
                                  ModelRun("allreduce", 2, 8, 5, 10, 24)};
  runs[1].throughputs = {27, 30, 33};
  const std::string table = FormatReportTable(runs, ReportLayout::kPerDevice);
  EXPECT_THAT(
      table, HasSubstr("**ps_sync, 1 PS**\n\n"
                       "| #CPU workers | Batch size per worker | Samples/sec | "
                       "Samples/sec per worker | CV | Speedup | vs allreduce "
                       "|\n|---:|---:|---:|---:|---:|---:|---:|\n"
                       "| 1 | 8 | 20.00 | 20.00 | - | 1.00x | 0.80x |\n"
                       "| 2 | 8 | 30.00 | 15.00 | 10.0% | 1.50x | 1.25x |\n"));
  EXPECT_THAT(table, HasSubstr("**allreduce**\n\n"));
  EXPECT_THAT(table, HasSubstr("| 2 | 8 | 24.00 | 12.00 | - | 0.96x | - |\n"));
  for (CompareRun& run : runs) run.result.set_backend("cuda");
  EXPECT_THAT(FormatReportTable(runs, ReportLayout::kPerDevice),
              HasSubstr("| #GPUs | Batch size per GPU | Samples/sec | "
                        "Samples/sec per GPU |"));
}

TEST(ParseTest, ListsAndModes) {
  EXPECT_EQ(*ParsePositiveList("workers", "1,2,4"),
            (std::vector<int>{1, 2, 4}));
  EXPECT_THAT(ParsePositiveList("workers", "1,x").status().message(),
              HasSubstr("--workers=1,x: \"x\" is not a positive integer"));
  EXPECT_THAT(ParsePositiveList("workers", "0").status().message(),
              HasSubstr("\"0\" is not a positive integer"));
  EXPECT_THAT(ParsePositiveList("workers", "2,2").status().message(),
              HasSubstr("2 is repeated"));
  EXPECT_EQ(ParseCompareMode("ps_sync")->mode, MODE_SYNC);
  EXPECT_EQ(ParseCompareMode("ps_sync")->collective, COLLECTIVE_NONE);
  EXPECT_EQ(ParseCompareMode("ps_async")->mode, MODE_ASYNC);
  EXPECT_EQ(ParseCompareMode("allreduce")->mode, MODE_ALLREDUCE);
  EXPECT_EQ(ParseCompareMode("allreduce")->collective, COLLECTIVE_GLOO);
  EXPECT_EQ(ParseCompareMode("allreduce")->label, "allreduce");
  if (Collective::HasNccl()) {
    EXPECT_EQ(ParseCompareMode("allreduce_nccl")->mode, MODE_ALLREDUCE);
    EXPECT_EQ(ParseCompareMode("allreduce_nccl")->collective, COLLECTIVE_NCCL);
  } else {
    EXPECT_THAT(ParseCompareMode("allreduce_nccl").status().message(),
                HasSubstr("--modes=allreduce_nccl: this build has no NCCL "
                          "collective (build with bazel build --config=cuda"));
  }
  EXPECT_TRUE(IsAllreduce("allreduce"));
  EXPECT_TRUE(IsAllreduce("allreduce_nccl"));
  EXPECT_FALSE(IsAllreduce("ps_sync"));
  EXPECT_THAT(ParseCompareMode("ring").status().message(),
              HasSubstr("\"ring\" is not a mode"));
}

}  // namespace
}  // namespace pstrain
