// `pstrain compare`: the reports of a scaling study, from the RunResults of
// its runs (each mode at each worker count, and each PS count for the PS
// modes). The runs themselves are made by cli/pstrain.cc; this file only
// turns results into the tables, CSV, JSON and gnuplot script this field
// publishes, and holds the bandwidth bounds the emulated-link runs are
// compared with.
//
// Thread-safety: pure functions.
#ifndef PSTRAIN_CLI_COMPARE_H_
#define PSTRAIN_CLI_COMPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catalog/job_config.h"
#include "proto/results.pb.h"

namespace pstrain {

// One configuration of a comparison and what its run measured.
struct CompareRun {
  // "ps_sync", "ps_async", "allreduce" (Gloo) or "allreduce_nccl", then
  // "+topk:R" for a compressed PS row and "+bf16"/"+fp16" for a 16-bit
  // wire ("ps_sync+topk:0.01+bf16", "allreduce+bf16").
  std::string mode;
  int num_ps = 0;  // 0 for allreduce
  int num_workers = 1;
  // Samples per step per worker (--batch_size, or one of --batch_sizes).
  int batch_size = 0;
  // Machines the run used: 1 on one machine; with one host per task,
  // num_ps + num_workers.
  int num_nodes = 1;
  // With --repeats=N > 1: the run whose throughput is the median of the N
  // (the lower middle one for even N), and every run's samples/sec in the
  // order they ran. Empty (or one entry): one run, no spread.
  RunResult result;
  std::vector<double> throughputs;
};

// The spread of a configuration's repeated throughputs, samples/sec: mean,
// sample standard deviation (n - 1) and coefficient of variation
// (stddev / mean); all 0 with fewer than 2 repeats.
struct Spread {
  int repeats = 1;
  double mean = 0;
  double stddev = 0;
  double cv = 0;
};
Spread SpreadOf(const CompareRun& run);

// The index in `throughputs` of the median (lower middle for even sizes);
// -1 when empty.
int MedianIndex(const std::vector<double>& throughputs);

// A `--modes` entry: its label (the report's: "ps_sync", "ps_async",
// "allreduce", "allreduce_nccl"), the job mode it runs and that job's
// collective (COLLECTIVE_NONE in the PS modes).
struct CompareMode {
  std::string label;
  Mode mode = MODE_SYNC;
  CollectiveKind collective = COLLECTIVE_NONE;
};

// Parses a `--modes` entry: ps_sync (MODE_SYNC), ps_async (MODE_ASYNC),
// allreduce (MODE_ALLREDUCE over Gloo) or allreduce_nccl (MODE_ALLREDUCE
// over NCCL). INVALID_ARGUMENT naming the flag for anything else; for
// allreduce_nccl in a build without CUDA, says that this build has no NCCL
// collective.
absl::StatusOr<CompareMode> ParseCompareMode(const std::string& label);

// Whether the label `compare_mode` runs an allreduce (Gloo or NCCL).
bool IsAllreduce(const std::string& compare_mode);

// "1,2,4" -> {1, 2, 4}: positive, distinct, at most 64 entries.
// INVALID_ARGUMENT naming `flag` and the bad entry.
absl::StatusOr<std::vector<int>> ParsePositiveList(const std::string& flag,
                                                   const std::string& text);

// Lower bounds on the communication time of one step, seconds, for
// `model_bytes` of gradients per worker, `workers` workers and links of
// `link_bytes_per_sec` per direction (full duplex, every host on its own
// link, a non-blocking switch between them); from the BytePS analysis
// (Jiang et al., "A Unified Architecture for Accelerating Distributed DNN
// Training in Heterogeneous GPU/CPU Clusters", OSDI 2020, section 3.1):
//   ring allreduce: each worker sends and receives 2(n-1)/n of the model:
//     2 (n-1)/n * M / B;
//   PS with k server hosts: each worker pushes M and pulls M (one each way),
//     and each server receives and sends n/k of M: max(M, n M / k) / B.
double AllreduceBoundSeconds(int64_t model_bytes, int workers,
                             double link_bytes_per_sec);
double PsBoundSeconds(int64_t model_bytes, int workers, int servers,
                      double link_bytes_per_sec);
// The bound of `run`'s scheme; 0 when link_bytes_per_sec <= 0.
double BoundSeconds(const CompareRun& run, double link_bytes_per_sec);

// The published table, one row per run in order:
// | #Nodes | #Workers | Mode | #PS | Batchsize | Steps | Runtime |
// Throughput (samples/sec) | CV | Speedup | PS/allreduce | Test accuracy |
// Throughput: the median run's with repeats; CV its coefficient of
// variation over the repeats in percent ("-" for one run).
// Speedup: throughput over the 1-worker run of the same mode, #PS and
// batch size ("-" without one). PS/allreduce: a PS row's throughput over
// the allreduce run's with the same workers and batch size ("-"
// otherwise). Test accuracy "-" for
// synthetic compute.
std::string FormatScalingTable(const std::vector<CompareRun>& runs);

// Per step, ms: | #Workers | Mode | #PS | Compute/step | Exchange/step |
// Pushed/step | Pulled/step | Bound/step | Exchange/bound |, the last two
// only when link_bytes_per_sec > 0. Exchange: push+barrier+pull, or
// allreduce+Adam. Pushed and pulled: worker 0's measured bytes per step in
// MB (10^6), PS rows ("-" for allreduce, whose ring sends and receives
// 2 (W - 1) / W of the gradient's bytes, as Bound/step counts them).
std::string FormatCommunicationTable(const std::vector<CompareRun>& runs,
                                     double link_bytes_per_sec);

// Every column above, one line per run, with a header line; a value that
// does not apply (no 1-worker run, no allreduce run, no link rate, no
// repeats, synthetic accuracy) is empty, not 0.
std::string CompareCsv(const std::vector<CompareRun>& runs,
                       double link_bytes_per_sec);
// {"link_mbit": ..., "runs": [{"mode": ..., "num_ps": ..., "result": {...}
// , "bound_seconds_per_step": ...}]}
std::string CompareJson(const std::vector<CompareRun>& runs,
                        double link_bytes_per_sec);

// A gnuplot script (its data inline, as in CompareCsv) that draws
// throughput (samples/sec) against workers into `png_path`, one line per
// mode, #PS and (when the runs have more than one) batch size, with error
// bars (one standard deviation) where it has
// repeats, and each line's ideal linear scaling (its 1-worker throughput
// times the workers) dashed in the same colour; one legend entry per
// series plus one for the ideal lines. A long `title` is broken into lines
// at ", " so that it fits.
std::string GnuplotScript(const std::vector<CompareRun>& runs,
                          const std::string& png_path,
                          const std::string& title);

// Whether the runs hold more than one batch size (a --batch_sizes sweep).
bool HasBatchSweep(const std::vector<CompareRun>& runs);

// A gnuplot script that draws throughput (samples/sec) against the batch
// size per worker (log2 axis) into `png_path`: one line per mode, #PS and
// number of workers, with error bars (one standard deviation) where it has
// repeats. For a --batch_sizes sweep (HasBatchSweep).
std::string GnuplotBatchScript(const std::vector<CompareRun>& runs,
                               const std::string& png_path,
                               const std::string& title);

// How `--steps` is spent as workers are added. kWeak: every worker runs
// `--steps` steps (the work grows with the workers, as in throughput
// studies). kStrong: the job's work is fixed at `--steps` steps of one
// worker, split across the workers (each runs ceil(steps / W)), as a fixed
// number of epochs is; runtime then falls as workers are added.
enum class Scaling { kWeak, kStrong };
// "weak" or "strong"; INVALID_ARGUMENT naming --scaling otherwise.
absl::StatusOr<Scaling> ParseScaling(const std::string& text);
// Steps per worker for `steps` (> 0) with `workers` workers.
int StepsPerWorker(int steps, int workers, Scaling scaling);

// The layouts of the published reports a preset reproduces, besides the
// scaling table every compare prints.
enum class ReportLayout {
  kNone,
  // ResNets on MNIST and bigMNIST, a fixed number of epochs:
  // | #Nodes | #GPUs | Epoch | Batchsize | Steps | Runtime | Speedup |
  kEpochRuntime,
  // DLPerf (OneFlow's benchmark reports), the median of repeats:
  // | num_nodes | gpu_num_per_node | batch_size_per_device | throughput |
  // speedup |
  kDlperf,
  // AlexNet, ResNet-18, VGG-16 on tiny-ImageNet, CPU and GPU nodes:
  // | #Nodes | Batch size | Images/sec | CV | Speedup |, per model and
  // backend, with the batch-size sweep.
  kNodesImages,
  // The seeds' BERT table (issue 41): per series, workers 1..N with the
  // batch per device, samples/sec, samples/sec per device, the CV of the
  // repeats (7 a row), the speedup and, for a PS series, its throughput
  // over allreduce's at the same workers:
  // | #GPUs | Batch size per GPU | Samples/sec | Samples/sec per GPU | CV |
  // Speedup | vs allreduce |
  kPerDevice,
};

// `pstrain compare --preset=NAME`: one command per published table. A
// preset is a set of flag values (applied where the command line gives the
// flag no value, so any of them can be overridden) and the layout its
// report prints in.
struct ComparePreset {
  std::string name;
  // The report, its columns and how it is scaled to one machine.
  std::string description;
  ReportLayout layout = ReportLayout::kNone;
  struct Flag {
    std::string name;
    std::string value;
    // Not applied when this flag is on the command line (e.g. a preset's
    // --batch_sizes when --batch_size is given); empty: always.
    std::string unless;
  };
  std::vector<Flag> flags;
};
const std::vector<ComparePreset>& ComparePresets();
// INVALID_ARGUMENT naming --preset and the presets there are.
absl::StatusOr<const ComparePreset*> FindComparePreset(const std::string& name);

// The runs in `layout` (kNone: ""): one Markdown table per series (mode and
// #PS, and for kNodesImages the model), each after a bold title line, rows
// in the order of `runs`. Device columns say "GPUs" where the runs
// computed on CUDA and "CPU workers" otherwise. Nodes: with one host per
// task (num_nodes > 1) every worker is a node; on one machine, 1 node for
// kEpochRuntime and kDlperf, and for kNodesImages the workers (one worker
// per node, as that report ran; its caption says so). Epoch: samples
// trained (steps x workers x batch) over the training set. Runtime: "12.3
// s", "m:ss" or "h:mm:ss". Speedup and
// throughput as in FormatScalingTable (the median run's, "-" without a
// 1-worker run); CV in percent with "-" for one run.
std::string FormatReportTable(const std::vector<CompareRun>& runs,
                              ReportLayout layout);

// What the report of `pstrain compare` says besides its runs.
struct CompareReportOptions {
  std::string out_dir;       // an existing folder
  std::string command_line;  // the report's "Command:" line
  std::string preset_line;   // "Preset NAME: DESCRIPTION.\n\n", or empty
  ReportLayout layout = ReportLayout::kNone;  // the published table first
  double link_mbit =
      0;               // bandwidth bounds of the communication table (0: none)
  bool netns = false;  // the runs had one network namespace per task
  // Synthetic compute's milliseconds per step and backward share, for the
  // title.
  double compute_ms = 0;
  double backward_fraction = 0;
  // The runs' --wire_dtype ("fp32" or empty: not in the title).
  std::string wire_dtype;
  bool plot = true;  // draw the PNGs with gnuplot (else the scripts only)
};

// Prints the report of `runs` (non-empty; its title from the first run:
// model and dataset, or synthetic compute): the published table of
// options.layout, the scaling and the communication tables; writes
// results.md, results.csv, results.json and throughput.gp (and
// batch_size.gp with a batch sweep) into options.out_dir, with options.plot
// their PNGs by gnuplot, and prints what it wrote. An error naming the
// file that could not be written or the gnuplot script that failed.
absl::Status WriteCompareReport(const CompareReportOptions& options,
                                const std::vector<CompareRun>& runs);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_COMPARE_H_
