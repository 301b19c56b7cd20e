// pstrain: the command-line interface.
//
//   pstrain run [flags]   Runs a whole job on this machine: --num_ps shard
//                         processes and --num_workers worker processes on
//                         127.0.0.1 (ports chosen by the OS), their output
//                         streamed with a role prefix, then a one-row table
//                         of results (and JSON with --results_json).
//                         With --ps_netns/--worker_netns each task runs in
//                         its own network namespace instead.
//   pstrain compare [flags]
//                         Runs `run` once per configuration: each of
//                         --modes (ps_sync, ps_async, allreduce) at each of
//                         --workers, and each --num_ps for the PS modes;
//                         prints every run's lines and table, then the
//                         scaling and communication tables (cli/compare.h)
//                         and writes them, as CSV, JSON and a gnuplot PNG,
//                         into --out_dir. Every configuration is checked
//                         before the first run starts.
//
// Exit codes: 0 success; 2 bad flags or input (nothing started); 1 a process
// of the job failed (the others are stopped); 128+signal when interrupted.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "catalog/catalog.h"
#include "catalog/job_config.h"
#include "cli/certs_command.h"
#include "cli/command_help.h"
#include "cli/compare.h"
#include "cli/eval_command.h"
#include "cli/job_commands.h"
#include "cli/launch_lines.h"
#include "cli/local_job.h"
#include "cli/node_agent.h"
#include "cli/pstrain_flags.h"
#include "common/flags_util.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "common/tls_flags.h"
#include "common/wire_dtype.h"
#include "coordinator/job_spec.h"
#include "worker/data_flags.h"
#include "worker/dataset.h"
#include "worker/trainer.h"

ABSL_DECLARE_FLAG(bool, insecure);
ABSL_DECLARE_FLAG(bool, insecure_allow_remote);

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain";
volatile sig_atomic_t g_signal = 0;
// This program's command line, for the report of `compare`.
std::string g_command_line;
void OnSignal(int signal) { g_signal = signal; }

int Fail(int code, const std::string& message) {
  PrintError(kProgram, message);
  return code;
}

// An installed pstrain (pstrain install): PREFIX/bin/<name> beside it;
// else bazel-bin/cli/pstrain -> bazel-bin/<package>/<name>.
std::string SiblingBinary(const std::string& package, const std::string& name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, n);
  dir = dir.substr(0, dir.rfind('/'));  // .../cli, or PREFIX/bin
  const std::string beside = absl::StrCat(dir, "/", name);
  if (access(beside.c_str(), X_OK) == 0) return beside;
  dir = dir.substr(0, dir.rfind('/'));  // ...
  return absl::StrCat(dir, "/", package, "/", name);
}

}  // namespace

std::string PsBinary() {
  const std::string flag = absl::GetFlag(FLAGS_ps_binary);
  return flag.empty() ? SiblingBinary("server", "pstrain_ps") : flag;
}

std::string WorkerBinary() {
  const std::string flag = absl::GetFlag(FLAGS_worker_binary);
  return flag.empty() ? SiblingBinary("worker", "pstrain_worker") : flag;
}

std::string CoordinatorBinary() {
  return SiblingBinary("coordinator", "pstrain_coordinator");
}

std::string SelfBinary() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return n > 0 ? std::string(self, n) : std::string("pstrain");
}

namespace {

// The placement --ps_netns, --worker_netns and --coordinator_host give.
absl::StatusOr<Placement> PlacementFromFlags() {
  return ParsePlacement(absl::GetFlag(FLAGS_ps_netns),
                        absl::GetFlag(FLAGS_worker_netns),
                        absl::GetFlag(FLAGS_coordinator_host));
}

// The flags that `config`'s spec (built from them) would ignore, given on
// the command line anyway: an error naming the first, so that nobody
// believes a flag took effect that did not. `command` is "run" or
// "compare".
absl::Status CheckIgnoredFlags(const JobConfig& config,
                               const std::string& command, bool any_ps_mode,
                               bool any_allreduce) {
  const JobSpec& spec = config.spec;
  auto ignored = [&](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " would be ignored: ", why,
                     "; see pstrain help ", command));
  };
  const std::string modes =
      command == "run" ? absl::StrCat("--mode=", Spelling(config.mode))
                       : absl::StrCat("--modes=", absl::GetFlag(FLAGS_modes));
  if (!any_allreduce && FlagSpecified("bucket_bytes")) {
    return ignored(
        "bucket_bytes",
        absl::StrCat("only allreduce has gradient buckets, not ", modes));
  }
  if (!any_ps_mode) {
    // Checkpoints, --resume and restarts are for every mode.
    for (const char* flag :
         {"num_ps", "channels_per_shard", "delta_pulls", "priority_pulls"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, absl::StrCat("it is for the parameter-server "
                                          "modes (sync, async), not ",
                                          modes));
      }
    }
    if (command == "compare" && FlagSpecified("sparse_embeddings")) {
      return ignored("sparse_embeddings",
                     absl::StrCat("compare's allreduce rows stay dense (the "
                                  "seeds' tables set the row-sparse PS "
                                  "against them), and ",
                                  modes, " has no PS mode"));
    }
    if (FlagSpecified("partition_bytes") && !config.compression.enabled() &&
        !spec.sparse_embeddings()) {
      return ignored("partition_bytes",
                     absl::StrCat("allreduce partitions only the top-k "
                                  "selection of a --compression and a "
                                  "table's rows (--sparse_embeddings), and ",
                                  modes, " has neither"));
    }
  }
  // The lr schedule's and the optimizer's knobs that another schedule or
  // optimizer would ignore are the spec's checks (ValidateJobSpec).
  if (!IsSequenceModel(spec.model()) && FlagSpecified("dropout")) {
    return ignored("dropout", absl::StrCat("it is for the bert_* models, not ",
                                           spec.model()));
  }
  const bool synthetic = config.compute == COMPUTE_SYNTHETIC;
  for (const char* flag : {"compute_ms", "model_bytes", "backward_fraction"}) {
    if (!synthetic && FlagSpecified(flag)) {
      return ignored(flag, "it is for --compute=synthetic");
    }
  }
  if (synthetic && FlagSpecified("model") && FlagSpecified("model_bytes")) {
    return ignored(
        "model_bytes",
        absl::StrCat("--compute=synthetic --model=", absl::GetFlag(FLAGS_model),
                     " exchanges that model's tensors"));
  }
  if (synthetic) {
    for (const char* flag : {"dataset", "data_dir", "image_size", "num_classes",
                             "synthetic_samples", "seq_len"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, "--compute=synthetic reads no dataset");
      }
    }
  } else {
    RETURN_IF_ERROR(CheckIgnoredDataFlags(spec.dataset(), command));
  }
  RETURN_IF_ERROR(CheckIgnoredBackendFlags(config.backend, command));
  if (command == "compare" && absl::GetFlag(FLAGS_steps) > 0) {
    for (const char* flag : {"epochs", "max_steps_per_epoch"}) {
      if (FlagSpecified(flag)) {
        return ignored(flag, "--steps sets one epoch of that many steps");
      }
    }
  }
  return absl::OkStatus();
}

// The job spec the flags describe (mode, PS count and workers given; an
// allreduce over Gloo).
JobSpec SpecFromFlags(Mode mode, int num_ps, int num_workers) {
  JobSpec spec;
  spec.set_model(absl::GetFlag(FLAGS_model));
  spec.set_dataset(absl::GetFlag(FLAGS_dataset));
  spec.set_data_dir(absl::GetFlag(FLAGS_data_dir));
  // --image_size=0 (its default): image_folder keeps the images' own size;
  // synthetic images are 224 pixels square.
  const int image_size = absl::GetFlag(FLAGS_image_size);
  spec.set_image_size(
      image_size == 0 && spec.dataset() != "image_folder" ? 224 : image_size);
  spec.set_stream_images(absl::GetFlag(FLAGS_stream_images));
  spec.set_max_dataset_memory_bytes(
      absl::GetFlag(FLAGS_max_dataset_memory).bytes);
  spec.set_augment(std::string(Spelling(absl::GetFlag(FLAGS_augment))));
  spec.set_num_classes(NumClassesFromFlags());
  spec.set_seq_len(absl::GetFlag(FLAGS_seq_len));
  spec.set_dropout(absl::GetFlag(FLAGS_dropout));
  spec.set_synthetic_samples(absl::GetFlag(FLAGS_synthetic_samples));
  spec.set_backend(std::string(Spelling(absl::GetFlag(FLAGS_backend))));
  spec.set_precision(std::string(Spelling(absl::GetFlag(FLAGS_precision))));
  spec.set_mode(std::string(Spelling(mode)));
  spec.set_num_ps(mode == MODE_ALLREDUCE ? 0 : num_ps);
  spec.set_num_workers(num_workers);
  spec.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  spec.set_epochs(absl::GetFlag(FLAGS_epochs));
  spec.set_seed(absl::GetFlag(FLAGS_seed));
  const pstrain::PartitionBytesFlag partition =
      absl::GetFlag(FLAGS_partition_bytes);
  spec.set_partition_bytes(partition.bytes);
  spec.set_partition_bytes_auto(partition.automatic);
  if (!FlagSpecified("partition_bytes") &&
      absl::GetFlag(FLAGS_priority_pulls)) {
    // P3's small slices (PartitionPlan::kPriorityPartitionBytes); also
    // compare's allreduce rows, whose top-k selects from the same chunks.
    spec.set_partition_bytes(PartitionPlan::kPriorityPartitionBytes);
  }
  // Every mode: allreduce averages the gradients in the 16-bit type.
  spec.set_wire_dtype(absl::GetFlag(FLAGS_wire_dtype));
  if (mode != MODE_ALLREDUCE) {
    spec.set_channels_per_shard(absl::GetFlag(FLAGS_channels_per_shard));
    spec.set_priority_pulls(absl::GetFlag(FLAGS_priority_pulls));
    spec.set_dense_pulls(!absl::GetFlag(FLAGS_delta_pulls));
  }
  {
    // Every mode: allreduce sums top-k pairs in a sparse allgather, and
    // gathers a table's rows.
    spec.set_sparse_embeddings(absl::GetFlag(FLAGS_sparse_embeddings));
    spec.set_compression(absl::GetFlag(FLAGS_compression));
    spec.set_no_error_feedback(!absl::GetFlag(FLAGS_error_feedback));
    spec.set_compression_warmup_steps(
        absl::GetFlag(FLAGS_compression_warmup_steps));
    spec.set_compression_warmup_start(
        absl::GetFlag(FLAGS_compression_warmup_start));
    spec.set_momentum_correction(absl::GetFlag(FLAGS_momentum_correction));
    spec.set_compression_dense_steps(
        absl::GetFlag(FLAGS_compression_dense_steps));
    spec.set_compression_freeze_adam_variance(
        absl::GetFlag(FLAGS_compression_freeze_adam_variance));
  }
  spec.set_log_every_steps(absl::GetFlag(FLAGS_log_every_steps));
  spec.set_max_steps_per_epoch(absl::GetFlag(FLAGS_max_steps_per_epoch));
  spec.set_bucket_bytes(absl::GetFlag(FLAGS_bucket_bytes));
  spec.set_compute(std::string(Spelling(absl::GetFlag(FLAGS_compute))));
  spec.set_compute_ms(absl::GetFlag(FLAGS_compute_ms));
  spec.set_model_bytes(absl::GetFlag(FLAGS_model_bytes));
  spec.set_backward_fraction(absl::GetFlag(FLAGS_backward_fraction));
  // --model given with synthetic compute: the step takes its shape.
  spec.set_synthetic_layers(absl::GetFlag(FLAGS_compute) == COMPUTE_SYNTHETIC &&
                            FlagSpecified("model"));
  spec.set_registration_timeout_s(absl::GetFlag(FLAGS_registration_timeout_s));
  // Absolute, so that every task finds them whatever its folder.
  auto absolute = [](const std::string& path) -> std::string {
    return path.empty()
               ? path
               : std::filesystem::absolute(path).lexically_normal().string();
  };
  spec.set_init_from(absolute(absl::GetFlag(FLAGS_init_from)));
  spec.set_metrics_dir(absolute(absl::GetFlag(FLAGS_metrics_dir)));
  spec.set_trace(absl::GetFlag(FLAGS_trace));
  spec.set_checkpoint_dir(absolute(absl::GetFlag(FLAGS_checkpoint_dir)));
  spec.set_checkpoint_every_steps(absl::GetFlag(FLAGS_checkpoint_every_steps));
  spec.set_checkpoint_every_secs(absl::GetFlag(FLAGS_checkpoint_every_secs));
  spec.set_keep_checkpoints(absl::GetFlag(FLAGS_keep_checkpoints));
  spec.set_max_nonfinite_steps(absl::GetFlag(FLAGS_max_nonfinite_steps));
  spec.set_straggler(absl::GetFlag(FLAGS_straggler));
  spec.set_staleness(absl::GetFlag(FLAGS_staleness));
  spec.set_backup_workers(absl::GetFlag(FLAGS_backup_workers));
  spec.set_max_workers(absl::GetFlag(FLAGS_max_workers));
  spec.set_min_workers(absl::GetFlag(FLAGS_min_workers));
  spec.set_max_ps(absl::GetFlag(FLAGS_max_ps));
  spec.set_linear_lr_scaling(absl::GetFlag(FLAGS_linear_lr_scaling));
  spec.set_standby_workers(absl::GetFlag(FLAGS_standby_workers));
  spec.set_clip_grad_norm(absl::GetFlag(FLAGS_clip_grad_norm));
  spec.set_resume(absl::GetFlag(FLAGS_resume));
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  spec.set_max_restarts(max_restarts >= 0                ? max_restarts
                        : !spec.checkpoint_dir().empty() ? 3
                                                         : 0);
  OptimizerSpec* optimizer = spec.mutable_optimizer();
  optimizer->set_lr(absl::GetFlag(FLAGS_lr));
  optimizer->set_beta1(absl::GetFlag(FLAGS_beta1));
  optimizer->set_beta2(absl::GetFlag(FLAGS_beta2));
  optimizer->set_epsilon(absl::GetFlag(FLAGS_epsilon));
  optimizer->set_name(std::string(Spelling(absl::GetFlag(FLAGS_optimizer))));
  optimizer->set_momentum(absl::GetFlag(FLAGS_momentum));
  optimizer->set_dampening(absl::GetFlag(FLAGS_dampening));
  optimizer->set_nesterov(absl::GetFlag(FLAGS_nesterov));
  optimizer->set_lr_schedule(
      std::string(Spelling(absl::GetFlag(FLAGS_lr_schedule))));
  optimizer->set_warmup_steps(absl::GetFlag(FLAGS_warmup_steps));
  optimizer->set_lr_step_size(absl::GetFlag(FLAGS_lr_step_size));
  optimizer->set_lr_gamma(absl::GetFlag(FLAGS_lr_gamma));
  optimizer->set_lr_min(absl::GetFlag(FLAGS_lr_min));
  optimizer->set_lr_total_steps(absl::GetFlag(FLAGS_lr_total_steps));
  optimizer->set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  // Not ApplyJobDefaults: every field above comes from a flag with its own
  // default, and a flag given as 0 is checked as 0, not made a default.
  if (mode == MODE_ALLREDUCE) {
    spec.set_collective(std::string(Spelling(COLLECTIVE_GLOO)));
  }
  return spec;
}

// The task binaries a job starts.
absl::Status CheckBinaries() {
  for (const std::string& binary : {PsBinary(), WorkerBinary()}) {
    if (access(binary.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(binary,
                       ": not an executable; build it with "
                       "bazel build //server:pstrain_ps "
                       "//worker:pstrain_worker"));
    }
  }
  return absl::OkStatus();
}

// Runs `config`'s spec (checked) to its end on this machine (RunLocalJob)
// with the binaries and TLS of the flags; CANCELLED after SIGINT/SIGTERM.
absl::StatusOr<RunResult> RunJob(const JobConfig& config,
                                 const Placement& placement) {
  LocalJobOptions options;
  options.ps_binary = PsBinary();
  options.worker_binary = WorkerBinary();
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.insecure_allow_remote = absl::GetFlag(FLAGS_insecure_allow_remote);
  options.heartbeat_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.stop_signal = &g_signal;
  options.control_file = absl::GetFlag(FLAGS_control_file);
  return RunLocalJob(config, placement, options);
}

int ExitCodeOf(const absl::Status& status) {
  if (absl::IsCancelled(status)) return 128 + g_signal;
  return 1;
}

// The dataset the flags name, listed once without its pixels to check batch
// sizes and shapes (an image folder's headers only: this process never
// decodes a dataset, and an in-memory image folder too large for its
// workers is refused here, before any process starts); null with synthetic
// compute (it has none).
absl::StatusOr<std::unique_ptr<Dataset>> CheckDataFromFlags() {
  if (absl::GetFlag(FLAGS_compute) == COMPUTE_SYNTHETIC) {
    return std::unique_ptr<Dataset>();
  }
  if (absl::Status s = CheckBackendFlags(); !s.ok()) return s;
  ASSIGN_OR_RETURN(Dataset dataset, ListDatasetFromFlags());
  return std::make_unique<Dataset>(std::move(dataset));
}

// --max_restarts: -1 (a default that depends on --checkpoint_dir) or a
// count, which ValidateJobSpec checks.
absl::Status CheckMaxRestartsFlag() {
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts >= -1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--max_restarts=", max_restarts, ": expected 0 to ",
                   kMaxRestarts, ", or -1 (3 with --checkpoint_dir, else 0)"));
}

int Run() {
  const Mode mode = absl::GetFlag(FLAGS_mode);
  // Every check before any process starts.
  if (absl::Status s = CheckMaxRestartsFlag(); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<std::vector<int>> num_ps =
      ParsePositiveList("num_ps", absl::GetFlag(FLAGS_num_ps));
  if (!num_ps.ok()) return Fail(2, std::string(num_ps.status().message()));
  if (num_ps->size() != 1) {
    return Fail(2, absl::StrCat("--num_ps=", absl::GetFlag(FLAGS_num_ps),
                                ": expected one number (lists are for "
                                "pstrain compare)"));
  }
  const JobSpec spec =
      SpecFromFlags(mode, (*num_ps)[0], absl::GetFlag(FLAGS_num_workers));
  if (absl::Status s = CheckFlagRange("heartbeat_timeout_s",
                                      absl::GetFlag(FLAGS_heartbeat_timeout_s),
                                      1, kMaxHeartbeatTimeoutS, "seconds");
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  // The spec's ranges (the same ValidateJobSpec as a submitted spec's), then
  // the flags the job would ignore.
  absl::StatusOr<JobConfig> config = CheckSpec(spec, nullptr);
  if (!config.ok()) return Fail(2, std::string(config.status().message()));
  if (absl::Status s = CheckIgnoredFlags(*config, "run", mode != MODE_ALLREDUCE,
                                         mode == MODE_ALLREDUCE);
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<Placement> placement = PlacementFromFlags();
  if (!placement.ok()) {
    return Fail(2, std::string(placement.status().message()));
  }
  // An elastic job needs room for max_workers and max_ps, and a control
  // file for them.
  if (absl::Status s =
          CheckRoom(*placement, std::max(spec.num_ps(), spec.max_ps()),
                    std::max(spec.num_workers(), spec.max_workers()),
                    spec.max_workers() > 0 ? "--max_workers" : "--num_workers");
      !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  if (!absl::GetFlag(FLAGS_control_file).empty() && spec.max_workers() == 0 &&
      spec.max_ps() == 0) {
    return Fail(2,
                "--control_file: needs --max_workers or --max_ps (an elastic "
                "job)");
  }
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = CheckDataFromFlags();
  if (!dataset.ok()) return Fail(2, std::string(dataset.status().message()));
  config = CheckSpec(spec, dataset->get());
  if (!config.ok()) return Fail(2, std::string(config.status().message()));
  if (absl::Status s = CheckBinaries(); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  // What the job writes, before it trains: a result that cannot be written
  // would lose the run.
  for (absl::Status s :
       {CheckOutputFile("results_json", absl::GetFlag(FLAGS_results_json)),
        CheckOutputFolder("metrics_dir", absl::GetFlag(FLAGS_metrics_dir)),
        CheckOutputFolder("checkpoint_dir",
                          absl::GetFlag(FLAGS_checkpoint_dir))}) {
    if (!s.ok()) return Fail(2, std::string(s.message()));
  }
  if (absl::Status s = CheckModelFiles(spec, dataset->get()); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  absl::StatusOr<RunResult> result = RunJob(*config, *placement);
  if (!result.ok()) {
    return Fail(ExitCodeOf(result.status()),
                std::string(result.status().message()));
  }
  std::printf("\n%s", FormatResultTable(*result).c_str());
  std::fflush(stdout);
  const std::string results_json = absl::GetFlag(FLAGS_results_json);
  if (!results_json.empty()) {
    absl::Status status =
        WriteFileAtomically(results_json, ResultJson(*result));
    if (!status.ok()) return Fail(1, status.ToString());
  }
  return 0;
}

// Sets the preset's flag values that the command line leaves unset.
absl::Status ApplyPreset(const ComparePreset& preset) {
  for (const ComparePreset::Flag& flag : preset.flags) {
    if (FlagSpecified(flag.name)) continue;
    if (!flag.unless.empty() && FlagSpecified(flag.unless)) continue;
    absl::CommandLineFlag* target = absl::FindCommandLineFlag(flag.name);
    std::string error;
    if (target == nullptr || !target->ParseFrom(flag.value, &error)) {
      return absl::InternalError(absl::StrCat("--preset=", preset.name,
                                              ": cannot set --", flag.name, "=",
                                              flag.value, ": ", error));
    }
  }
  return absl::OkStatus();
}

// The lists of `pstrain compare` and what its modes ask for.
struct CompareLists {
  Scaling scaling = Scaling::kWeak;
  std::vector<int> workers;
  std::vector<int> num_ps;
  std::vector<int> batch_sizes;
  std::vector<CompareMode> modes;  // ps_sync, ps_async, allreduce, ...
  // --compression's entries (none, topk:R), each a row of every PS mode.
  std::vector<std::string> compressions;
  // --wire_dtype's entries (fp32, bf16, fp16), each a row of every mode.
  std::vector<std::string> wire_dtypes;
  bool any_ps_mode = false;
  bool any_allreduce = false;
};

// --scaling, --workers, --num_ps, --batch_sizes (else --batch_size) and
// --modes; INVALID_ARGUMENT naming the first bad one.
absl::StatusOr<CompareLists> ParseCompareLists() {
  CompareLists lists;
  ASSIGN_OR_RETURN(lists.scaling, ParseScaling(absl::GetFlag(FLAGS_scaling)));
  ASSIGN_OR_RETURN(lists.workers,
                   ParsePositiveList("workers", absl::GetFlag(FLAGS_workers)));
  ASSIGN_OR_RETURN(lists.num_ps,
                   ParsePositiveList("num_ps", absl::GetFlag(FLAGS_num_ps)));
  lists.batch_sizes = {absl::GetFlag(FLAGS_batch_size)};
  if (!absl::GetFlag(FLAGS_batch_sizes).empty()) {
    if (FlagSpecified("batch_size")) {
      return absl::InvalidArgumentError(
          "--batch_size would be ignored: --batch_sizes gives the batch "
          "sizes; see pstrain help compare");
    }
    ASSIGN_OR_RETURN(
        lists.batch_sizes,
        ParsePositiveList("batch_sizes", absl::GetFlag(FLAGS_batch_sizes)));
  }
  for (absl::string_view label :
       absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    ASSIGN_OR_RETURN(CompareMode mode, ParseCompareMode(std::string(label)));
    (mode.mode == MODE_ALLREDUCE ? lists.any_allreduce : lists.any_ps_mode) =
        true;
    lists.modes.push_back(std::move(mode));
  }
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_compression), ',')) {
    if (std::find(lists.compressions.begin(), lists.compressions.end(), c) !=
            lists.compressions.end() ||
        lists.compressions.size() >= 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--compression: \"", absl::CHexEscape(c.substr(0, 40)),
          "\" repeated, or more than 8 entries; expected distinct entries "
          "such as none,topk:0.01"));
    }
    lists.compressions.emplace_back(c);
  }
  for (absl::string_view w :
       absl::StrSplit(absl::GetFlag(FLAGS_wire_dtype), ',')) {
    ASSIGN_OR_RETURN(const DType dtype, ParseWireDtype(w, "--wire_dtype"));
    const std::string spelling = WireDtypeSpelling(dtype);
    if (std::find(lists.wire_dtypes.begin(), lists.wire_dtypes.end(),
                  spelling) != lists.wire_dtypes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--wire_dtype: ", spelling,
                       " repeated; expected distinct entries such as "
                       "fp32,bf16"));
    }
    lists.wire_dtypes.push_back(spelling);
  }
  return lists;
}

// What every configuration shares (model, data, compute, optimizer: one
// spec's fields and the flags it would ignore), then --out_dir, --steps,
// --scaling, --repeats and --link_mbit; INVALID_ARGUMENT naming the first
// bad one.
absl::Status CheckCompareFlags(const CompareLists& lists) {
  JobSpec shared = SpecFromFlags(lists.any_ps_mode ? MODE_SYNC : MODE_ALLREDUCE,
                                 lists.num_ps[0], lists.workers[0]);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps > 0) {
    shared.set_epochs(1);
    shared.set_max_steps_per_epoch(steps);
  }
  // Each --compression and --wire_dtype entry is checked with its
  // configuration; the shared check takes a compression where the list
  // has one, so that the flags for compressed rows are checked with it.
  const auto compressed =
      std::find_if(lists.compressions.begin(), lists.compressions.end(),
                   [](const std::string& c) { return c != "none"; });
  shared.set_compression(compressed != lists.compressions.end()
                             ? *compressed
                             : lists.compressions[0]);
  shared.set_wire_dtype(lists.wire_dtypes[0]);
  ASSIGN_OR_RETURN(const JobConfig config, CheckSpec(shared, nullptr));
  RETURN_IF_ERROR(CheckIgnoredFlags(config, "compare", lists.any_ps_mode,
                                    lists.any_allreduce));
  if (absl::GetFlag(FLAGS_out_dir).empty()) {
    return absl::InvalidArgumentError(
        "--out_dir: expected a directory for the table, CSV, JSON and plot");
  }
  RETURN_IF_ERROR(CheckOutputFolder("out_dir", absl::GetFlag(FLAGS_out_dir)));
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps=", steps, ": expected >= 1, or 0 for whole --epochs"));
  }
  if (steps == 0 && FlagSpecified("scaling")) {
    return absl::InvalidArgumentError(
        "--scaling would be ignored: it says how --steps is spent, and whole "
        "--epochs (--steps=0) are split across the workers already; see "
        "pstrain help compare");
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1 || repeats > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--repeats=", repeats, ": expected 1..100"));
  }
  const double link_mbit = absl::GetFlag(FLAGS_link_mbit);
  if (!(link_mbit >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link_mbit=", link_mbit, ": expected >= 0"));
  }
  return absl::OkStatus();
}

// One configuration of `pstrain compare` and the job it runs.
struct CompareConfig {
  CompareRun run;
  JobConfig config;
};

// One configuration per mode, batch size, PS count (PS modes) and worker
// count, nested in that order, each checked against `placement` and
// `dataset` (null with synthetic compute); INVALID_ARGUMENT naming the
// configuration.
// One series of rows: a mode with one compression and one wire.
// Its label names both past the mode ("ps_sync+topk:0.01",
// "allreduce+bf16"; compare.h CompareRun::mode).
struct CompareSeries {
  const CompareMode* mode;
  std::string compression;
  std::string wire;
  std::string label;
};

// A PS row without compression beside compressed ones (--compression=
// none,topk:R): the flags that only mean something with a compression
// (error feedback, warm-up, dense steps, momentum correction, delta
// pulls) are the compressed rows'; this row runs as a plain job.
void ClearCompressionFlags(JobSpec* spec) {
  spec->set_no_error_feedback(false);
  spec->set_dense_pulls(false);
  spec->set_compression_warmup_steps(0);
  spec->set_compression_warmup_start(0);
  spec->set_momentum_correction(false);
  spec->set_compression_dense_steps(0);
  spec->set_compression_freeze_adam_variance(false);
}

std::vector<CompareSeries> SeriesOf(const CompareLists& lists) {
  std::vector<CompareSeries> series;
  for (const CompareMode& mode : lists.modes) {
    const bool allreduce = mode.mode == MODE_ALLREDUCE;
    // Beside PS modes allreduce keeps its dense row: the seeds' tables set
    // compressed PS rows against the dense allreduce. Alone it takes the
    // list as given.
    std::vector<std::string> compressions = lists.compressions;
    if (allreduce && lists.any_ps_mode &&
        std::find(compressions.begin(), compressions.end(), "none") ==
            compressions.end()) {
      compressions.insert(compressions.begin(), "none");
    }
    for (const std::string& compression : compressions) {
      for (const std::string& wire : lists.wire_dtypes) {
        series.push_back(
            {&mode, compression, wire,
             absl::StrCat(mode.label,
                          compression == "none" || compression.empty()
                              ? ""
                              : absl::StrCat("+", compression),
                          wire == "fp32" ? "" : absl::StrCat("+", wire))});
      }
    }
  }
  return series;
}

absl::StatusOr<std::vector<CompareConfig>> CompareConfigs(
    const CompareLists& lists, const Placement& placement,
    const Dataset* dataset) {
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<CompareConfig> configs;
  for (const CompareSeries& s : SeriesOf(lists)) {
    const bool allreduce = s.mode->mode == MODE_ALLREDUCE;
    for (int b : lists.batch_sizes) {
      for (int k : allreduce ? std::vector<int>{0} : lists.num_ps) {
        for (int w : lists.workers) {
          CompareConfig c;
          c.run.mode = s.label;
          c.run.num_ps = k;
          c.run.num_workers = w;
          c.run.batch_size = b;
          c.run.num_nodes = placement.netns() ? k + w : 1;
          RETURN_IF_ERROR(CheckRoom(placement, k, w, "--workers"));
          JobSpec spec = SpecFromFlags(s.mode->mode, k, w);
          spec.set_batch_size(b);
          spec.set_wire_dtype(s.wire);
          if (allreduce) {
            spec.set_collective(std::string(Spelling(s.mode->collective)));
            // The seeds' tables set the row-sparse PS against the dense
            // allreduce (`pstrain run --mode=allreduce --sparse_embeddings`
            // gathers rows).
            spec.set_sparse_embeddings(false);
          }
          spec.set_compression(s.compression);
          if (s.compression == "none") ClearCompressionFlags(&spec);
          if (steps > 0) {
            spec.set_epochs(1);
            spec.set_max_steps_per_epoch(
                StepsPerWorker(steps, w, lists.scaling));
          }
          absl::StatusOr<JobConfig> config = CheckSpec(spec, dataset);
          if (!config.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(s.label, " with ", w, " workers, batch ", b, ": ",
                             config.status().message()));
          }
          c.config = *std::move(config);
          configs.push_back(std::move(c));
        }
      }
    }
  }
  return configs;
}

// Runs each configuration `repeats` times, printing every run's lines and
// table; each configuration's run with its median run's result (and every
// repeat's throughput when repeats > 1). The first failure, named by its
// configuration (CANCELLED after a signal).
absl::StatusOr<std::vector<CompareRun>> RunConfigs(
    const std::vector<CompareConfig>& configs, const Placement& placement,
    int repeats) {
  std::vector<CompareRun> done;
  for (size_t i = 0; i < configs.size(); ++i) {
    CompareRun run = configs[i].run;
    std::vector<RunResult> results;
    for (int rep = 0; rep < repeats; ++rep) {
      std::printf(
          "\n=== run %zu/%zu: %s, %d PS, %d workers, batch %d%s ===\n", i + 1,
          configs.size(), run.mode.c_str(), run.num_ps, run.num_workers,
          run.batch_size,
          repeats > 1
              ? absl::StrFormat(", repeat %d/%d", rep + 1, repeats).c_str()
              : "");
      std::fflush(stdout);
      absl::StatusOr<RunResult> result = RunJob(configs[i].config, placement);
      if (!result.ok()) {
        return absl::Status(
            result.status().code(),
            absl::StrCat(run.mode, " with ", run.num_workers,
                         " workers: ", result.status().message()));
      }
      std::printf("%s", FormatResultTable(*result).c_str());
      std::fflush(stdout);
      run.throughputs.push_back(result->throughput_samples_per_sec());
      results.push_back(*std::move(result));
    }
    run.result = results[MedianIndex(run.throughputs)];
    if (repeats == 1) run.throughputs.clear();
    done.push_back(std::move(run));
  }
  return done;
}

int Compare() {
  // Every check before any process starts.
  CompareReportOptions report;
  if (!absl::GetFlag(FLAGS_preset).empty()) {
    absl::StatusOr<const ComparePreset*> preset =
        FindComparePreset(absl::GetFlag(FLAGS_preset));
    if (!preset.ok()) return Fail(2, std::string(preset.status().message()));
    if (absl::Status s = ApplyPreset(**preset); !s.ok()) {
      return Fail(1, std::string(s.message()));
    }
    report.layout = (*preset)->layout;
    report.preset_line = absl::StrCat("Preset ", (*preset)->name, ": ",
                                      (*preset)->description, ".\n\n");
  }
  absl::StatusOr<CompareLists> lists = ParseCompareLists();
  if (!lists.ok()) return Fail(2, std::string(lists.status().message()));
  if (absl::Status s = CheckCompareFlags(*lists); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<Placement> placement = PlacementFromFlags();
  if (!placement.ok()) {
    return Fail(2, std::string(placement.status().message()));
  }
  report.plot = absl::GetFlag(FLAGS_plot);
  if (report.plot && std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return Fail(2,
                "gnuplot: not found; the plot needs it (apt-get install "
                "gnuplot-nox), or pass --noplot");
  }
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = CheckDataFromFlags();
  if (!dataset.ok()) return Fail(2, std::string(dataset.status().message()));
  if (absl::Status s = CheckBinaries(); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  absl::StatusOr<std::vector<CompareConfig>> configs =
      CompareConfigs(*lists, *placement, dataset->get());
  if (!configs.ok()) return Fail(2, std::string(configs.status().message()));
  report.out_dir = absl::GetFlag(FLAGS_out_dir);
  std::error_code error;
  std::filesystem::create_directories(report.out_dir, error);
  if (error) {
    return Fail(2, absl::StrCat("--out_dir=", report.out_dir,
                                ": cannot create: ", error.message()));
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  absl::StatusOr<std::vector<CompareRun>> done =
      RunConfigs(*configs, *placement, absl::GetFlag(FLAGS_repeats));
  if (!done.ok()) {
    return Fail(ExitCodeOf(done.status()),
                std::string(done.status().message()));
  }
  report.command_line = g_command_line;
  report.link_mbit = absl::GetFlag(FLAGS_link_mbit);
  // One wire for every row goes in the title; several, in the rows' modes.
  if (lists->wire_dtypes.size() == 1) report.wire_dtype = lists->wire_dtypes[0];
  report.netns = placement->netns();
  report.compute_ms = absl::GetFlag(FLAGS_compute_ms);
  report.backward_fraction = absl::GetFlag(FLAGS_backward_fraction);
  if (absl::Status s = WriteCompareReport(report, *done); !s.ok()) {
    return Fail(1, std::string(s.message()));
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pstrain run [--flags]: train a data-parallel job on this machine "
      "(parameter-server shards and workers as local processes).\n"
      "pstrain eval --checkpoint=FILE_OR_DIR [--dataset=... --data_dir=... "
      "--backend=...]: test loss and accuracy of a saved model.\n"
      "pstrain submit JOB.pbtxt | status [ID] | logs ID | cancel ID | wait ID "
      "| scale ID [--num_workers=N] [--num_ps=M] [--coordinator=HOST:PORT]: "
      "jobs on a "
      "pstrain_coordinator.\n"
      "pstrain compare [--workers=1,2,4 --modes=ps_sync,ps_async,allreduce "
      "--num_ps=2 --steps=N --out_dir=DIR]: run each configuration and "
      "write the scaling tables, CSV, JSON and a throughput plot.\n"
      "pstrain launch-lines JOB.pbtxt --launcher=slurm|mpirun|ssh "
      "[--coordinator=HOST:PORT] [--job=ID] [--bin_dir=DIR] [--sbatch]: a "
      "script that starts its tasks and waits for them.\n"
      "pstrain install --prefix=DIR: copy the binaries to DIR/bin.\n"
      "pstrain certs --out=DIR [--num_ps=N --num_workers=M --job=ID "
      "--hosts=H,...]: a CA and mutual-TLS certificates for a cluster.\n"
      "pstrain node --coordinator=HOST:PORT --job=ID: start this node's "
      "tasks of a job and wait for them.");
  pstrain::g_command_line = absl::StrJoin(argv, argv + argc, " ");
  // Unknown flags and bad values: exit 2 here. --help is answered below, by
  // command.
  // Where an unknown flag's error points: the help of the command named
  // (the first argument that is not a flag), else the list of commands.
  std::string hint = "pstrain help";
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    if (pstrain::FindCommand(argv[i]) != nullptr) {
      hint = absl::StrCat("pstrain help ", argv[i]);
    }
    break;
  }
  const std::vector<std::string> positional = pstrain::ParseFlagsOrExit(
      argc, argv, "pstrain", hint, /*handle_help=*/false);
  const std::string command = positional.empty() ? "" : positional[0];
  const std::vector<std::string> args(
      positional.empty() ? positional.end() : positional.begin() + 1,
      positional.end());
  if (command.empty() && pstrain::HelpRequested()) {
    pstrain::PrintUsageAndExit();
  }
  if (command == "help") {
    if (args.size() > 1) {
      pstrain::PrintError("pstrain", "usage: pstrain help [COMMAND]");
      return 2;
    }
    const pstrain::CommandInfo* topic =
        args.empty() ? nullptr : pstrain::FindCommand(args[0]);
    if (!args.empty() && topic == nullptr) {
      pstrain::PrintError("pstrain", absl::StrCat("unknown command \"", args[0],
                                                  "\"; see pstrain help"));
      return 2;
    }
    std::printf("%s", topic == nullptr ? pstrain::CommandsOverview().c_str()
                                       : pstrain::CommandHelp(*topic).c_str());
    return 0;
  }
  const pstrain::CommandInfo* info = pstrain::FindCommand(command);
  if (info == nullptr) {
    pstrain::PrintError(
        "pstrain",
        command.empty()
            ? "expected a command (run, compare, eval, submit, status, logs, "
              "cancel, scale, wait, launch-lines, install, certs, node, help); "
              "see pstrain help"
            : absl::StrCat("unknown command \"", command,
                           "\"; see pstrain help"));
    return 2;
  }
  if (pstrain::HelpRequested()) {
    std::printf("%s", pstrain::CommandHelp(*info).c_str());
    return 0;
  }
  if (absl::Status s = pstrain::CheckFlagsOf(*info); !s.ok()) {
    pstrain::PrintError("pstrain", s.message());
    return 2;
  }
  if ((command == "run" || command == "compare" || command == "eval") &&
      !args.empty()) {
    pstrain::PrintError(
        "pstrain", absl::StrCat("pstrain ", command, ": unexpected argument \"",
                                args[0], "\"; see pstrain help ", command));
    return 2;
  }
  if (command == "run" && args.empty()) return pstrain::Run();
  if (command == "compare" && args.empty()) return pstrain::Compare();
  if (command == "eval" && args.empty()) {
    return pstrain::EvalCommand(absl::GetFlag(FLAGS_checkpoint),
                                pstrain::FlagSpecified("batch_size")
                                    ? absl::GetFlag(FLAGS_batch_size)
                                    : 100);
  }
  if (command == "certs") return pstrain::CertsCommand(args);
  // The coordinator's clients (cli/job_commands.h): ExitAfterCommand.
  using pstrain::ExitAfterCommand;
  if (command == "submit") ExitAfterCommand(pstrain::SubmitCommand(args));
  if (command == "status") ExitAfterCommand(pstrain::StatusCommand(args));
  if (command == "cancel") ExitAfterCommand(pstrain::CancelCommand(args));
  if (command == "scale") {
    pstrain::ScaleFlags flags;
    flags.num_workers = absl::GetFlag(FLAGS_num_workers);
    flags.num_workers_given = pstrain::FlagSpecified("num_workers");
    flags.num_ps = absl::GetFlag(FLAGS_num_ps);
    flags.num_ps_given = pstrain::FlagSpecified("num_ps");
    ExitAfterCommand(pstrain::ScaleCommand(args, flags));
  }
  if (command == "wait") ExitAfterCommand(pstrain::WaitCommand(args));
  if (command == "logs") ExitAfterCommand(pstrain::LogsCommand(args));
  if (command == "trace") ExitAfterCommand(pstrain::TraceCommand(args));
  if (command == "launch-lines") {
    return pstrain::LaunchLinesCommand(args, absl::GetFlag(FLAGS_ps_binary),
                                       absl::GetFlag(FLAGS_worker_binary));
  }
  if (command == "node") {
    return pstrain::NodeCommand(args, pstrain::PsBinary(),
                                pstrain::WorkerBinary());
  }
  if (command == "install") {
    auto named_by = [](const std::string& value, const char* flag) {
      return value.empty() ? std::string() : std::string(flag);
    };
    return pstrain::InstallCommand(
        args, {{pstrain::SelfBinary(), "pstrain", ""},
               {pstrain::PsBinary(), "pstrain_ps",
                named_by(absl::GetFlag(FLAGS_ps_binary), "ps_binary")},
               {pstrain::WorkerBinary(), "pstrain_worker",
                named_by(absl::GetFlag(FLAGS_worker_binary), "worker_binary")},
               {pstrain::CoordinatorBinary(), "pstrain_coordinator", ""}});
  }
  return 2;  // Commands() lists no other command.
}
