#include "coordinator/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "catalog/catalog.h"
#include "catalog/job_config.h"
#include "common/partition.h"
#include "common/rpc_options.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

// Keeps the first error the text-format parser reports.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    // The parser counts from 0.
    error_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

// One line whatever the spec held: control characters escaped (\n, \x01),
// and at most 300 characters (a 5000-character model name is cut).
std::string OneLine(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (out.size() >= 300) {
      out += "...";
      break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += absl::StrFormat("\\x%02x", u);
    }
  }
  return out;
}

absl::Status Bad(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", OneLine(message)));
}

// The shortest text that reads back as `value` ("0.99999999", not StrCat's
// "1").
std::string Number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);  // 3600000, not 3.6e+06
  }
  for (int precision = 6; precision < 17; ++precision) {
    const std::string text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}
std::string Number(int64_t value) { return absl::StrCat(value); }
std::string Number(uint64_t value) { return absl::StrCat(value); }
std::string Number(int value) { return absl::StrCat(value); }

// "field: value; expected lo to hi[ unit]" unless lo <= value <= hi (NaN is
// outside every range).
template <typename T, typename Lo, typename Hi>
absl::Status CheckRange(absl::string_view field, T value, Lo lo_bound,
                        Hi hi_bound, absl::string_view unit = "") {
  const T lo = static_cast<T>(lo_bound);
  const T hi = static_cast<T>(hi_bound);
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Bad(field,
             absl::StrCat(Number(value), "; expected ", Number(lo), " to ",
                          Number(hi), unit.empty() ? "" : " ", unit));
}

// As CheckRange, and a multiple of 4 (whole fp32 values).
absl::Status CheckBytes(absl::string_view field, int64_t value, int64_t lo,
                        int64_t hi) {
  if (value >= lo && value <= hi && value % 4 == 0) return absl::OkStatus();
  return Bad(field, absl::StrCat(value, "; expected a multiple of 4 from ", lo,
                                 " to ", hi, " bytes"));
}

// SGD's momentum and the lr schedule (optim/optimizer.h) of the parsed
// optimizer and schedule, with torch.optim.SGD's refusals.
absl::Status CheckOptimizer(const JobConfig& config) {
  const OptimizerSpec& o = config.spec.optimizer();
  const bool sgd = config.optimizer == OPTIMIZER_SGD;
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return Bad(
        "optimizer.momentum",
        absl::StrCat(Number(o.momentum()), "; expected 0 <= momentum < 1"));
  }
  RETURN_IF_ERROR(CheckRange("optimizer.dampening", o.dampening(), 0.0, 1.0));
  if (!sgd && (o.momentum() != 0 || o.dampening() != 0 || o.nesterov())) {
    return Bad("optimizer.name",
               absl::StrCat(o.name(),
                            " with momentum, dampening or nesterov; "
                            "expected sgd (they are SGD's)"));
  }
  if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0)) {
    return Bad("optimizer.nesterov",
               absl::StrCat("true with momentum ", Number(o.momentum()),
                            " and dampening ", Number(o.dampening()),
                            "; expected momentum > 0 and dampening 0"));
  }
  RETURN_IF_ERROR(CheckRange("optimizer.warmup_steps", o.warmup_steps(), 0,
                             kMaxSteps, "(0: none)"));
  RETURN_IF_ERROR(CheckRange("optimizer.warmup_start_factor",
                             o.warmup_start_factor(), 0.0, 1.0));
  RETURN_IF_ERROR(CheckRange("optimizer.lr_gamma", o.lr_gamma(), 0.0, 1.0));
  RETURN_IF_ERROR(CheckRange("optimizer.lr_min", o.lr_min(), 0.0, o.lr()));
  RETURN_IF_ERROR(CheckRange("optimizer.lr_step_size", o.lr_step_size(),
                             config.lr_schedule == LR_SCHEDULE_STEP ? 1 : 0,
                             kMaxSteps));
  RETURN_IF_ERROR(
      CheckRange("optimizer.lr_total_steps", o.lr_total_steps(), 0, kMaxSteps));
  // A schedule's own knobs, set for another schedule, would be ignored.
  if (config.lr_schedule != LR_SCHEDULE_COSINE &&
      (o.lr_min() != 0 || o.lr_total_steps() != 0)) {
    return Bad(
        o.lr_min() != 0 ? "optimizer.lr_min" : "optimizer.lr_total_steps",
        absl::StrCat(o.lr_min() != 0 ? Number(o.lr_min())
                                     : absl::StrCat(o.lr_total_steps()),
                     " with lr_schedule ", Spelling(config.lr_schedule),
                     "; expected 0 (only cosine decays to lr_min over "
                     "lr_total_steps)"));
  }
  // lr_gamma and Adam's constants have defaults a spec always holds after
  // ApplyJobDefaults: a value other than the default, where it would be
  // ignored, is a mistake to name (the default itself changes nothing).
  if (config.lr_schedule != LR_SCHEDULE_STEP &&
      o.lr_gamma() != kDefaultLrGamma) {
    return Bad("optimizer.lr_gamma",
               absl::StrCat(Number(o.lr_gamma()), " with lr_schedule ",
                            Spelling(config.lr_schedule),
                            "; expected it unset (only step multiplies the "
                            "lr by lr_gamma)"));
  }
  if (sgd) {
    for (const auto& [field, value, unset] :
         {std::tuple<const char*, double, double>{"optimizer.beta1", o.beta1(),
                                                  kDefaultBeta1},
          {"optimizer.beta2", o.beta2(), kDefaultBeta2},
          {"optimizer.epsilon", o.epsilon(), kDefaultEpsilon}}) {
      if (value != unset) {
        return Bad(field, absl::StrCat(Number(value),
                                       " with optimizer sgd; expected it "
                                       "unset (it is Adam's)"));
      }
    }
  }
  if (config.lr_schedule != LR_SCHEDULE_STEP && o.lr_step_size() != 0) {
    return Bad("optimizer.lr_step_size",
               absl::StrCat(o.lr_step_size(), " with lr_schedule ",
                            Spelling(config.lr_schedule),
                            "; expected 0 (only step multiplies the lr by "
                            "lr_gamma every lr_step_size steps)"));
  }
  // 0: the job's total steps, which worker 0 counts from its dataset
  // (trainer.cc WithLrHorizon) and checks against warmup_steps there.
  if (config.lr_schedule == LR_SCHEDULE_COSINE && o.lr_total_steps() > 0 &&
      o.lr_total_steps() <= o.warmup_steps()) {
    return Bad("optimizer.lr_total_steps",
               absl::StrCat(o.lr_total_steps(),
                            " with a cosine schedule; expected more than "
                            "warmup_steps (",
                            o.warmup_steps(), "), or 0 for the job's steps"));
  }
  return absl::OkStatus();
}

absl::Status CheckPath(absl::string_view field, const std::string& path) {
  if (path.size() <= kMaxJobPathLength) return absl::OkStatus();
  return Bad(field,
             absl::StrCat("a path of ", path.size(),
                          " characters; expected at most ", kMaxJobPathLength));
}

absl::Status CheckHosts(
    const google::protobuf::RepeatedPtrField<HostPort>& hosts,
    const char* field, int count) {
  if (!hosts.empty() && hosts.size() != count) {
    return Bad(field, absl::StrCat(hosts.size(), " entries; expected ", count,
                                   " (one per task) or none"));
  }
  for (int i = 0; i < hosts.size(); ++i) {
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (hosts[i].host().empty()) return Bad(name, "host is empty");
    if (hosts[i].host().size() > kMaxHostLength) {
      return Bad(
          name, absl::StrCat("a host of ", hosts[i].host().size(),
                             " characters; expected at most ", kMaxHostLength));
    }
    if (hosts[i].port() < 0 || hosts[i].port() > 65535) {
      return Bad(name,
                 absl::StrCat("port ", hosts[i].port(), "; expected 0..65535"));
    }
  }
  return absl::OkStatus();
}

// Parts of ValidateJobSpec, in its order. Each returns the first bad field.

// The model and dataset names, and every text field's UTF-8.
absl::Status CheckNames(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckUtf8Fields(spec));
  if (!IsKnownModel(spec.model())) {
    return Bad("model", absl::StrCat("\"", spec.model(),
                                     "\" is not a known model; expected one "
                                     "of: ",
                                     KnownModels()));
  }
  if (!IsKnownDataset(spec.dataset())) {
    return Bad("dataset", absl::StrCat("\"", spec.dataset(),
                                       "\" is not a known dataset; expected "
                                       "one of: ",
                                       KnownDatasets()));
  }
  return absl::OkStatus();
}

// What mode allreduce and its collective need (the choices themselves are
// parsed by ParseJobChoices).
absl::Status CheckAllreduce(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  const bool allreduce = config.mode == MODE_ALLREDUCE;
  if (allreduce && spec.num_ps() != 0) {
    return Bad("num_ps", absl::StrCat(spec.num_ps(),
                                      "; expected 0 for mode allreduce (it "
                                      "has no parameter servers)"));
  }
  if (allreduce && spec.channels_per_shard() != 0) {
    return Bad("channels_per_shard",
               absl::StrCat(spec.channels_per_shard(),
                            "; expected 0 for mode allreduce (it has no "
                            "parameter servers to connect to)"));
  }
  if (allreduce && spec.priority_pulls()) {
    return Bad("priority_pulls",
               "true; expected false for mode allreduce (it has no pulls "
               "to order)");
  }
  if (allreduce && config.collective == COLLECTIVE_NONE) {
    return Bad("collective", "\"\"; expected gloo or nccl");
  }
  if (config.collective == COLLECTIVE_NCCL && config.backend != BACKEND_CUDA) {
    return Bad("collective",
               absl::StrCat("nccl with backend ", Spelling(config.backend),
                            "; expected backend cuda (NCCL runs between "
                            "GPUs)"));
  }
  return absl::OkStatus();
}

// Every count and size, before anything is allocated from it.
absl::Status CheckSizes(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (config.has_ps()) {
    RETURN_IF_ERROR(CheckRange("num_ps", spec.num_ps(), 1, kMaxNumPs));
    // 0: the default (ApplyJobDefaults).
    if (spec.channels_per_shard() != 0) {
      RETURN_IF_ERROR(
          CheckRange("channels_per_shard", spec.channels_per_shard(), 1,
                     kMaxChannelsPerShard, "connections per shard"));
    }
  }
  RETURN_IF_ERROR(
      CheckRange("num_workers", spec.num_workers(), 1, kMaxNumWorkers));
  RETURN_IF_ERROR(
      CheckRange("batch_size", spec.batch_size(), 1, kMaxBatchSize));
  RETURN_IF_ERROR(CheckRange("epochs", spec.epochs(), 1, kMaxEpochs));
  RETURN_IF_ERROR(CheckRange("seed", spec.seed(), uint64_t{1},
                             std::numeric_limits<uint64_t>::max()));
  RETURN_IF_ERROR(
      CheckRange("log_every_steps", spec.log_every_steps(), 1, kMaxSteps));
  RETURN_IF_ERROR(CheckRange("max_steps_per_epoch", spec.max_steps_per_epoch(),
                             0, kMaxSteps, "(0: whole epochs)"));
  // image_folder: 0 keeps the images' own size; max_dataset_memory_bytes 0
  // is half of each worker's MemAvailable.
  RETURN_IF_ERROR(CheckRange("image_size", spec.image_size(),
                             spec.dataset() == "image_folder" ? 0 : 1,
                             kMaxImageSize));
  RETURN_IF_ERROR(CheckRange("max_dataset_memory_bytes",
                             spec.max_dataset_memory_bytes(), 0,
                             std::numeric_limits<int64_t>::max(), "bytes"));
  RETURN_IF_ERROR(
      CheckRange("num_classes", spec.num_classes(), 1, kMaxNumClasses));
  RETURN_IF_ERROR(CheckRange("synthetic_samples", spec.synthetic_samples(), 1,
                             kMaxSyntheticSamples));
  RETURN_IF_ERROR(CheckBytes("partition_bytes", spec.partition_bytes(), 4,
                             kMaxPartitionBytes));
  return CheckRange("bucket_bytes", spec.bucket_bytes(), 4, kMaxBucketBytes,
                    "bytes");
}

// The paths' lengths, and the trace's folder.
absl::Status CheckPaths(const JobSpec& spec) {
  for (const auto& [field, path] : {std::pair<const char*, const std::string*>{
                                        "data_dir", &spec.data_dir()},
                                    {"init_from", &spec.init_from()},
                                    {"checkpoint_dir", &spec.checkpoint_dir()},
                                    {"metrics_dir", &spec.metrics_dir()}}) {
    RETURN_IF_ERROR(CheckPath(field, *path));
  }
  if (spec.trace() && spec.metrics_dir().empty()) {
    return Bad("trace",
               "true without a metrics_dir; expected a metrics_dir to write "
               "each task's trace into");
  }
  return absl::OkStatus();
}

// Synthetic compute's sizes, and what it has no model for.
absl::Status CheckCompute(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (config.compute != COMPUTE_SYNTHETIC) {
    if (spec.synthetic_layers()) {
      return Bad("synthetic_layers",
                 "true with compute model; expected compute synthetic (a "
                 "model job's layers take their own time)");
    }
    return absl::OkStatus();
  }
  // Shaped like `model`, the step exchanges the model's tensors.
  if (!spec.synthetic_layers()) {
    RETURN_IF_ERROR(
        CheckBytes("model_bytes", spec.model_bytes(), 4, kMaxModelBytes));
  }
  RETURN_IF_ERROR(
      CheckRange("compute_ms", spec.compute_ms(), 0.0, kMaxComputeMs, "ms"));
  RETURN_IF_ERROR(CheckRange("backward_fraction", spec.backward_fraction(), 0.0,
                             1.0,
                             "(the share of compute_ms that is "
                             "backward)"));
  if (spec.max_steps_per_epoch() < 1) {
    return Bad("max_steps_per_epoch",
               absl::StrCat(spec.max_steps_per_epoch(),
                            "; expected >= 1 with compute synthetic (it "
                            "has no dataset to make epochs of)"));
  }
  if (!spec.init_from().empty() || !spec.checkpoint_dir().empty()) {
    return Bad(spec.init_from().empty() ? "checkpoint_dir" : "init_from",
               "compute synthetic has no model to load or save");
  }
  return absl::OkStatus();
}

// Checkpoints, restarts, registration and the straggler aid.
absl::Status CheckRecovery(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  RETURN_IF_ERROR(CheckRange("checkpoint_every_steps",
                             spec.checkpoint_every_steps(), 0, kMaxSteps,
                             "(0: none)"));
  RETURN_IF_ERROR(CheckRange("keep_checkpoints", spec.keep_checkpoints(), 1,
                             kMaxKeepCheckpoints));
  RETURN_IF_ERROR(CheckRange("max_nonfinite_steps", spec.max_nonfinite_steps(),
                             0, kMaxNonfiniteSteps));
  RETURN_IF_ERROR(
      CheckRange("max_restarts", spec.max_restarts(), 0, kMaxRestarts));
  RETURN_IF_ERROR(CheckRange("checkpoint_every_secs",
                             spec.checkpoint_every_secs(), 0.0,
                             kMaxCheckpointEverySecs, "seconds"));
  if (spec.max_restarts() > 0 && config.mode == MODE_ALLREDUCE &&
      spec.checkpoint_dir().empty()) {
    return Bad("max_restarts",
               absl::StrCat(spec.max_restarts(),
                            "; an allreduce job restarts every worker from "
                            "the newest checkpoint and needs checkpoint_dir: "
                            "expected 0 without it"));
  }
  RETURN_IF_ERROR(CheckRange("registration_timeout_s",
                             spec.registration_timeout_s(), 1,
                             kMaxRegistrationTimeoutS, "seconds"));
  return ParseStraggler(spec.straggler(), spec.num_workers()).status();
}

// Sequence models and token datasets (issue 41): each takes only the
// other, with seq_len and dropout in range.
absl::Status CheckSequenceInputs(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  RETURN_IF_ERROR(CheckRange("seq_len", spec.seq_len(), 0, kMaxSeqLen,
                             "tokens (0: the token file's, or 128)"));
  if (spec.has_dropout()) {
    RETURN_IF_ERROR(CheckRange("dropout", spec.dropout(), 0.0, kMaxDropout,
                               "(a probability below 1)"));
  }
  if (config.compute == COMPUTE_SYNTHETIC) return absl::OkStatus();
  const bool sequence = IsSequenceModel(spec.model());
  if (sequence != IsTokenDataset(spec.dataset())) {
    return Bad("dataset",
               absl::StrCat(spec.dataset(), " with model ", spec.model(),
                            sequence ? "; expected tokens or synthetic_tokens "
                                       "(the model takes token sequences)"
                                     : "; expected an image dataset (the "
                                       "model takes images, not tokens)"));
  }
  if (spec.seq_len() == 1) {
    return Bad("seq_len", "1; expected 0 or 2 to 512 ([CLS] and a token)");
  }
  return absl::OkStatus();
}

// Augmentation and streaming: the input pipeline of a streamed
// image_folder.
absl::Status CheckInputs(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (config.augment != AUGMENT_NONE && !spec.stream_images()) {
    return Bad("augment",
               absl::StrCat(spec.augment(),
                            " without stream_images; expected none "
                            "(augmentation runs in the input pipeline of "
                            "a streamed image_folder)"));
  }
  if (spec.stream_images() && spec.dataset() != "image_folder") {
    return Bad("stream_images",
               absl::StrCat("true with dataset ", spec.dataset(),
                            "; expected false (streaming is for "
                            "image_folder: IDX and record files are "
                            "memory-mapped already)"));
  }
  return CheckSequenceInputs(config);
}

// Elastic jobs (issue 40): max_workers and min_workers, their ranges and
// what is not built yet.
absl::Status CheckElastic(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (spec.max_workers() != 0) {
    RETURN_IF_ERROR(CheckRange("max_workers", spec.max_workers(),
                               spec.num_workers(), kMaxNumWorkers,
                               "(0: not elastic)"));
  }
  if (spec.min_workers() != 0) {
    RETURN_IF_ERROR(CheckRange("min_workers", spec.min_workers(), 1,
                               spec.num_workers(), "(0: never shrink)"));
  }
  if (spec.max_workers() == 0 && spec.min_workers() == 0) {
    if (spec.standby_workers()) {
      return Bad("standby_workers",
                 "true without max_workers; expected false (standbys are "
                 "the worker tasks past num_workers, up to max_workers)");
    }
    if (spec.linear_lr_scaling()) {
      return Bad("linear_lr_scaling",
                 "true without max_workers or min_workers; expected false "
                 "(the workers never change, so the lr has nothing to "
                 "follow)");
    }
    return absl::OkStatus();
  }
  if (spec.standby_workers() && spec.max_workers() <= spec.num_workers()) {
    return Bad("standby_workers",
               absl::StrCat("true with max_workers ", spec.max_workers(),
                            " and num_workers ", spec.num_workers(),
                            "; expected max_workers > num_workers (the "
                            "standbys are the worker tasks past num_workers)"));
  }
  return absl::OkStatus();
}

// Elastic shards (issue 40): max_ps, its range and where moving the state
// to another number of shards is refused. Sync: the state moves at a step
// boundary where every shard holds one decided version of every chunk
// (with staleness, worker 0 waits there until every shard has decided its
// last step; with backup workers, shard 0 holds a cut's admissions until
// every shard has decided the steps before it); async: as it is, each
// chunk at its own version. Top-k residuals stay with their workers
// (GradientExchange::ChangeShards).
absl::Status CheckElasticShards(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (spec.max_ps() == 0) return absl::OkStatus();
  const int value = spec.max_ps();
  if (config.mode == MODE_ALLREDUCE) {
    return Bad("max_ps", absl::StrCat(value,
                                      " with mode allreduce; expected 0 "
                                      "(allreduce has no shards)"));
  }
  RETURN_IF_ERROR(CheckRange("max_ps", value, spec.num_ps(), kMaxElasticPs,
                             "(num_ps to 64; 0: the shards fixed)"));
  return absl::OkStatus();
}

// Row-sparse embeddings (issue 41): what lazy updates of a table's rows
// need.
absl::Status CheckSparseEmbeddings(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  if (!spec.sparse_embeddings()) return absl::OkStatus();
  auto refuse = [](absl::string_view why) {
    return Bad("sparse_embeddings", absl::StrCat("true ", why));
  };
  // Top-k compresses the other parameters; a table pushes its step's rows
  // whole (no residual) and the shards update them lazily. Not where the
  // workers keep the optimizer's state, whose shards apply plain SGD.
  if (spec.momentum_correction()) {
    return refuse(
        "with momentum_correction; expected false (it moves the optimizer's "
        "state to the workers, each of its own gradient, and the shards "
        "apply plain SGD: a table's lazy update, torch.optim.SparseAdam's, "
        "is of the average gradient, on the shards)");
  }
  if (spec.compression_freeze_adam_variance()) {
    return refuse(
        "with compression_freeze_adam_variance; expected false (1-bit "
        "Adam's frozen variance is of dense Adam; torch.optim.SparseAdam, "
        "a table's update, has none)");
  }
  // SGD with momentum or weight decay updates every row of a table, as the
  // dense update of the densified gradient (server/row_sparse.h); Adam's
  // rows are SparseAdam's, lazy, which has no weight decay.
  if (config.optimizer != OPTIMIZER_SGD &&
      spec.optimizer().weight_decay() != 0) {
    return refuse(absl::StrCat(
        "with optimizer adam and weight_decay ",
        Number(spec.optimizer().weight_decay()),
        "; expected 0 (a table's update is torch.optim.SparseAdam's, which "
        "has no weight decay; SGD takes it)"));
  }
  if (!HasUntiedEmbedding(spec.model())) {
    return refuse(absl::StrCat(
        "with model ", spec.model(),
        "; expected a model with an untied embedding table (bert_tiny_untied, "
        "bert_base_untied: bert_tiny and bert_base tie theirs to the MLM "
        "head, whose gradient is dense)"));
  }
  return absl::OkStatus();
}

// Staleness, backup workers and gradient clipping: their ranges, the modes
// they are for and the combinations refused.
absl::Status CheckModeCombinations(const JobConfig& config) {
  const JobSpec& spec = config.spec;
  const absl::string_view mode = Spelling(config.mode);
  RETURN_IF_ERROR(
      CheckRange("staleness", spec.staleness(), 0, kMaxStaleness, "steps"));
  RETURN_IF_ERROR(CheckRange("clip_grad_norm", spec.clip_grad_norm(), 0.0,
                             kMaxClipGradNorm, "(0: none)"));
  if (spec.clip_grad_norm() > 0 && config.mode == MODE_ASYNC) {
    return Bad("clip_grad_norm",
               absl::StrCat(Number(spec.clip_grad_norm()),
                            " with mode async; expected 0 (async applies "
                            "each push alone: there is no step whose "
                            "gradients have one norm)"));
  }
  RETURN_IF_ERROR(CheckRange("backup_workers", spec.backup_workers(), 0,
                             std::max(0, spec.num_workers() - 1),
                             "(num_workers - 1)"));
  if (spec.backup_workers() > 0) {
    if (config.mode != MODE_SYNC) {
      return Bad("backup_workers",
                 absl::StrCat(spec.backup_workers(), " with mode ", mode,
                              "; expected 0 (backup workers are for mode "
                              "sync)"));
    }
  }
  if (spec.staleness() > 0 && config.mode != MODE_SYNC) {
    return Bad("staleness",
               absl::StrCat(spec.staleness(), " with mode ", mode,
                            "; expected 0 (a staleness bound is for mode "
                            "sync; async has none)"));
  }
  RETURN_IF_ERROR(CheckElastic(config));
  RETURN_IF_ERROR(CheckElasticShards(config));
  // Staleness and backup workers compose with checkpoints, resume,
  // restarts and clipping (server/step_policy.h): with staleness worker 0
  // names the cut's step before it pushes it, with backup workers shard 0
  // picks it (ParameterShard::HoldCheckpointStep); each shard copies every
  // chunk when it reaches that version (BeginDeferredSnapshot).
  return absl::OkStatus();
}

// The optimizer's values. It runs in fp32: each value is checked as the
// update will see it.
absl::Status CheckOptimizerValues(const JobConfig& config) {
  const OptimizerSpec& o = config.spec.optimizer();
  RETURN_IF_ERROR(CheckRange("optimizer.lr", o.lr(), kMinLr, kMaxLr));
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"optimizer.beta1", o.beta1()},
        {"optimizer.beta2", o.beta2()}}) {
    // 1 - beta divides the bias correction: a beta that rounds to 1.0f
    // would divide by zero.
    if (!(value >= 0 && value < 1) || static_cast<float>(value) >= 1.0f) {
      return Bad(field, absl::StrCat(Number(value),
                                     "; expected 0 <= beta < 1, and below 1 "
                                     "in fp32 (at most 0.99999994)"));
    }
  }
  RETURN_IF_ERROR(
      CheckRange("optimizer.epsilon", o.epsilon(), kMinEpsilon, kMaxEpsilon));
  RETURN_IF_ERROR(CheckRange("optimizer.weight_decay", o.weight_decay(), 0.0,
                             kMaxWeightDecay));
  return CheckOptimizer(config);
}

// The host lists, and every task's own address.
absl::Status CheckAddresses(const JobSpec& spec) {
  // An elastic-shard job has max_ps PS tasks.
  RETURN_IF_ERROR(CheckHosts(spec.ps_hosts(), "ps_hosts",
                             std::max(spec.num_ps(), spec.max_ps())));
  // An elastic job has max_workers worker tasks.
  RETURN_IF_ERROR(CheckHosts(
      spec.worker_hosts(), "worker_hosts",
      spec.max_workers() > 0 ? spec.max_workers() : spec.num_workers()));
  // Every task needs its own address: the same host:port twice, in either
  // list, would make the second task fail to bind.
  std::map<std::pair<std::string, int>, std::string> seen;
  for (const auto& [field, hosts] :
       {std::pair<const char*,
                  const google::protobuf::RepeatedPtrField<HostPort>*>{
            "ps_hosts", &spec.ps_hosts()},
        {"worker_hosts", &spec.worker_hosts()}}) {
    for (int i = 0; i < hosts->size(); ++i) {
      const HostPort& h = (*hosts)[i];
      if (h.port() == 0) continue;
      const std::string name = absl::StrCat(field, "[", i, "]");
      auto [it, inserted] =
          seen.emplace(std::make_pair(h.host(), h.port()), name);
      if (!inserted) {
        return Bad(name,
                   absl::StrCat(h.host(), ":", h.port(),
                                " is already the address of ", it->second));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> ResolveJobSpec(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckNames(spec));
  ASSIGN_OR_RETURN(JobConfig config, ParseJobChoices(spec));
  RETURN_IF_ERROR(CheckAllreduce(config));
  RETURN_IF_ERROR(CheckSizes(config));
  RETURN_IF_ERROR(CheckPaths(spec));
  RETURN_IF_ERROR(CheckCompute(config));
  RETURN_IF_ERROR(CheckRecovery(config));
  RETURN_IF_ERROR(CheckModeCombinations(config));
  RETURN_IF_ERROR(CheckInputs(config));
  RETURN_IF_ERROR(CheckOptimizerValues(config));
  RETURN_IF_ERROR(CheckSparseEmbeddings(config));
  RETURN_IF_ERROR(CheckAddresses(spec));
  return config;
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  return ResolveJobSpec(spec).status();
}

void ApplyJobDefaults(JobSpec* spec) {
  if (spec->model().empty()) spec->set_model("lenet5");
  if (spec->dataset().empty()) spec->set_dataset("fashion_mnist");
  if (spec->data_dir().empty()) {
    spec->set_data_dir("/usr/share/datasets/fashion-mnist");
  }
  if (spec->backend().empty()) spec->set_backend("cpu");
  if (spec->mode().empty()) spec->set_mode("sync");
  if (spec->seed() == 0) spec->set_seed(1);
  if (spec->partition_bytes() == 0) {
    spec->set_partition_bytes(spec->priority_pulls()
                                  ? PartitionPlan::kPriorityPartitionBytes
                                  : PartitionPlan::kDefaultPartitionBytes);
  }
  if (spec->log_every_steps() == 0) spec->set_log_every_steps(200);
  // image_folder's 0 keeps the images' own size.
  if (spec->image_size() == 0 && spec->dataset() != "image_folder") {
    spec->set_image_size(224);
  }
  // synthetic_tokens: a vocabulary, BERT-base's WordPiece size.
  if (spec->num_classes() == 0) {
    spec->set_num_classes(spec->dataset() == "synthetic_tokens" ? 30522 : 1000);
  }
  if (spec->synthetic_samples() == 0) spec->set_synthetic_samples(12800);
  if (spec->bucket_bytes() == 0) spec->set_bucket_bytes(25 << 20);
  if (spec->compute().empty()) spec->set_compute("model");
  if (spec->keep_checkpoints() == 0) spec->set_keep_checkpoints(3);
  if (spec->registration_timeout_s() == 0) {
    spec->set_registration_timeout_s(600);
  }
  if (!spec->has_max_nonfinite_steps()) spec->set_max_nonfinite_steps(10);
  // An unknown mode or schedule gets no default here: ValidateJobSpec
  // names it.
  const absl::StatusOr<Mode> mode = ParseMode(spec->mode());
  if (spec->collective().empty() && mode.ok() && *mode == MODE_ALLREDUCE) {
    spec->set_collective("gloo");
  }
  OptimizerSpec* o = spec->mutable_optimizer();
  if (!o->has_lr()) o->set_lr(1e-3);
  if (!o->has_beta1()) o->set_beta1(kDefaultBeta1);
  if (!o->has_beta2()) o->set_beta2(kDefaultBeta2);
  if (!o->has_epsilon()) o->set_epsilon(kDefaultEpsilon);
  if (!o->has_weight_decay()) o->set_weight_decay(0.0);
  if (o->name().empty()) o->set_name("adam");
  if (!o->has_momentum()) o->set_momentum(0.0);
  if (!o->has_dampening()) o->set_dampening(0.0);
  if (o->lr_schedule().empty()) o->set_lr_schedule("constant");
  if (!o->has_warmup_start_factor()) o->set_warmup_start_factor(0.0);
  if (!o->has_lr_gamma()) o->set_lr_gamma(kDefaultLrGamma);
  // A cosine schedule's lr_total_steps stays 0: worker 0 counts the job's
  // steps (epochs x min(max_steps_per_epoch, the dataset's steps)), as
  // `pstrain run`'s workers do.
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const std::string& source) {
  JobSpec spec;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", errors.error()));
  }
  ApplyJobDefaults(&spec);
  absl::Status s = ValidateJobSpec(spec);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return spec;
}

OptimizerOptions OptimizerOptionsOf(const JobConfig& config) {
  const OptimizerSpec& optimizer = config.spec.optimizer();
  OptimizerOptions o = AdamOptionsOf(optimizer);
  o.kind = config.optimizer == OPTIMIZER_SGD ? OptimizerKind::kSgd
                                             : OptimizerKind::kAdam;
  o.momentum = static_cast<float>(optimizer.momentum());
  o.dampening = static_cast<float>(optimizer.dampening());
  o.nesterov = optimizer.nesterov();
  if (config.compression.momentum_correction()) {
    // DGC: the workers apply the momentum, or Adam's moments
    // (worker/topk_compression.h); the shards plain SGD to the average of
    // what they push (AdamW's decoupled decay is then SGD's coupled term:
    // the same w (1 - lr wd) - lr d).
    o.kind = OptimizerKind::kSgd;
    o.momentum = 0;
    o.dampening = 0;
    o.nesterov = false;
  }
  if (config.spec.compression_freeze_adam_variance()) {
    // Adam's updates: in async mode a shard applies every worker's push
    // alone, so each worker's dense steps are num_workers updates.
    o.freeze_variance_after =
        config.spec.compression_dense_steps() *
        (config.mode == MODE_ASYNC ? config.spec.num_workers() : 1);
  }
  LrSchedule& s = o.schedule;
  s.decay = config.lr_schedule == LR_SCHEDULE_STEP     ? LrDecay::kStep
            : config.lr_schedule == LR_SCHEDULE_COSINE ? LrDecay::kCosine
                                                       : LrDecay::kConstant;
  s.warmup_steps = optimizer.warmup_steps();
  s.warmup_start_factor = optimizer.warmup_start_factor();
  s.step_size = std::max<int64_t>(1, optimizer.lr_step_size());
  s.gamma = optimizer.lr_gamma();
  // 0 with cosine: the job's steps, set by the worker (and given to the
  // shards at Init: ParameterShard::SetLrHorizon).
  s.total_steps = optimizer.lr_total_steps();
  s.min_lr = optimizer.lr_min();
  return o;
}

absl::StatusOr<Straggler> ParseStraggler(absl::string_view text,
                                         int num_workers) {
  Straggler straggler;
  if (text.empty()) return straggler;
  const size_t colon = text.find(':');
  int worker = -1;
  int64_t delay_ms = -1;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(text.substr(0, colon), &worker) ||
      !absl::SimpleAtoi(text.substr(colon + 1), &delay_ms) || worker < 0 ||
      worker >= num_workers || delay_ms < 0 ||
      delay_ms > kMaxStragglerDelayMs) {
    return Bad("straggler",
               absl::StrCat("\"", text,
                            "\"; expected WORKER:DELAY_MS with "
                            "WORKER 0 to ",
                            std::max(0, num_workers - 1), " and DELAY_MS 0 to ",
                            kMaxStragglerDelayMs));
  }
  straggler.worker = worker;
  straggler.delay_ms = delay_ms;
  return straggler;
}

AdamOptions AdamOptionsOf(const OptimizerSpec& optimizer) {
  AdamOptions adam;
  adam.lr = static_cast<float>(optimizer.lr());
  adam.beta1 = static_cast<float>(optimizer.beta1());
  adam.beta2 = static_cast<float>(optimizer.beta2());
  adam.epsilon = static_cast<float>(optimizer.epsilon());
  adam.weight_decay = static_cast<float>(optimizer.weight_decay());
  return adam;
}

}  // namespace pstrain
