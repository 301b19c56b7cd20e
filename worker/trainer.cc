#include "worker/trainer.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "models/backend_factory.h"
#include "models/model.h"
#include "models/model_file.h"
#include "worker/checkpoint.h"
#include "worker/checkpoint_schedule.h"
#include "worker/data_position.h"
#include "worker/elastic.h"
#include "worker/gradient_exchange.h"
#include "worker/input_pipeline.h"
#include "worker/metrics.h"
#include "worker/partition_tuner.h"
#include "worker/recovery.h"
#include "worker/reporter.h"
#include "worker/step_loop.h"
#include "worker/workload.h"

namespace pstrain {
namespace {

// The run's kind, from TrainerOptions' mode and compute, and its options
// checked.
struct RunKind {
  bool sync = false;
  bool async = false;
  bool allreduce = false;
  bool synthetic = false;
};

absl::StatusOr<RunKind> KindOf(const TrainerOptions& options) {
  RunKind kind;
  kind.sync = options.mode == MODE_SYNC;
  kind.async = options.mode == MODE_ASYNC;
  kind.allreduce = options.mode == MODE_ALLREDUCE;
  if (!kind.sync && !kind.async && !kind.allreduce) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode ", static_cast<int>(options.mode),
                     " (not a Mode); expected sync, async or allreduce"));
  }
  if (kind.allreduce && options.collective == nullptr &&
      !(options.elastic && options.connect_collective)) {
    return absl::InvalidArgumentError(
        "mode allreduce needs the workers' collective (an elastic job: a "
        "way to connect one)");
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", options.batch_size, "; expected a positive number"));
  }
  kind.synthetic = options.compute == COMPUTE_SYNTHETIC;
  if (!kind.synthetic && options.compute != COMPUTE_MODEL) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute ", static_cast<int>(options.compute),
                     " (not a ComputeKind); expected model or synthetic"));
  }
  return kind;
}

// The client options of the job's PS exchange (compression aside).
PsClientOptions PsClientOptionsOf(const TrainerOptions& options,
                                  const RunKind& kind) {
  PsClientOptions client_options;
  client_options.addresses = options.ps_addresses;
  client_options.job_id = options.job_id;
  client_options.worker_id = options.worker_id;
  client_options.rpc_timeout = options.rpc_timeout;
  client_options.credentials = options.ps_credentials;
  client_options.backup_workers = kind.sync && options.backup_workers > 0;
  client_options.lr_total_steps = options.adam.schedule.total_steps;
  client_options.clip_by_global_norm = kind.sync && options.clip_grad_norm > 0;
  client_options.wire_dtype = options.wire_dtype;
  client_options.channels_per_shard = options.channels_per_shard;
  client_options.priority_pulls = options.priority_pulls;
  // Only sparse pushes make sparse updates (a top-k push under SGD).
  client_options.delta_pulls =
      kind.sync && options.compression.enabled() && !options.dense_pulls;
  const char* hold = std::getenv("PSTRAIN_HOLD_STEP_END");
  if (hold != nullptr && options.worker_id == 1 &&
      !absl::SimpleAtoi(hold, &client_options.hold_step_end)) {
    client_options.hold_step_end = -1;
  }
  // PSTRAIN_HOLD_ONCE=FILE: only the worker 1 process that creates FILE
  // (on its first call here) holds, so a restarted worker 1 trains on.
  if (client_options.hold_step_end < 0) return client_options;
  static const bool holder = [] {
    const char* once = std::getenv("PSTRAIN_HOLD_ONCE");
    if (once == nullptr) return true;
    const int fd = open(once, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    return fd >= 0;
  }();
  if (!holder) client_options.hold_step_end = -1;
  return client_options;
}

// The partition the job trains with, and the shards' generation if they
// hold the job's initial state already (the tuning's last restore).
struct PartitionSetting {
  int64_t partition_bytes = 0;
  std::optional<int64_t> ready_generation;
  // Worker 0's tuning, if it ran.
  std::optional<PartitionChoice> choice;
};

// The plan's row-sparse tables (issue 41): the workload's where the job
// asks for them in a PS mode, else none (every tensor dense).
std::vector<int64_t> RowElementsOf(const TrainerOptions& options,
                                   const RunKind& kind,
                                   const Workload& workload) {
  if (!options.sparse_embeddings) return {};
  return workload.TensorRowElements();
}

// The top-k compressor of the job's parameters (not its buffers: those
// are values, pushed dense), or null without compression. A model's
// one-dimensional parameters go whole (WholeTensors); synthetic compute's
// flat tensors stand for weights and are all compressed. A row-sparse
// table pushes its step's rows whole, never a top-k of them: no residual.
std::unique_ptr<TopKCompressor> CompressorOf(const TrainerOptions& options,
                                             const RunKind& kind,
                                             const Workload& workload) {
  if (!options.compression.enabled()) return nullptr;
  std::vector<int64_t> sizes = workload.TensorNumElements();
  sizes.resize(sizes.size() - workload.num_buffers());
  const std::vector<int64_t> rows = RowElementsOf(options, kind, workload);
  for (size_t t = 0; t < sizes.size() && t < rows.size(); ++t) {
    if (rows[t] > 0) sizes[t] = 0;
  }
  std::vector<bool> whole;
  if (!kind.synthetic) {
    std::vector<std::vector<int64_t>> shapes = workload.TensorShapes();
    shapes.resize(sizes.size());
    whole = WholeTensors(shapes);
  }
  // Residuals back to the furthest checkpoint a worker can hear of late
  // (worker/topk_compression.h).
  return std::make_unique<TopKCompressor>(options.compression, std::move(sizes),
                                          options.staleness + 3,
                                          std::move(whole));
}

// INVALID_ARGUMENT where the job asks for row-sparse tables in a PS mode
// and the model has none.
absl::Status CheckRowTables(const TrainerOptions& options, const RunKind& kind,
                            const Workload& workload) {
  const std::vector<int64_t> rows = RowElementsOf(options, kind, workload);
  if (!options.sparse_embeddings ||
      std::any_of(rows.begin(), rows.end(), [](int64_t d) { return d > 0; })) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("sparse_embeddings: model ", options.model,
                   " has no untied embedding table; expected a model with one "
                   "(bert_tiny_untied, bert_base_untied)"));
}

// --partition_bytes=auto (worker/partition_tuner.h): a fresh job tunes; a
// resumed one takes its checkpoint's size; a rejoining task its newest
// checkpoint's, else the shards' layout.
absl::StatusOr<PartitionSetting> ChoosePartition(const TrainerOptions& options,
                                                 const RunKind& kind,
                                                 Workload& workload,
                                                 const LineFn& say) {
  PartitionSetting setting;
  setting.partition_bytes = options.partition_bytes;
  if (!options.partition_bytes_auto || kind.allreduce) return setting;
  const bool chief = options.worker_id == 0;
  if (options.resume || options.rejoin) {
    absl::StatusOr<CheckpointManifest> manifest =
        ReadLatestCheckpoint(options.checkpoint_dir);
    if (manifest.ok() || options.resume) {
      RETURN_IF_ERROR(manifest.status());
      setting.partition_bytes = manifest->job.partition_bytes;
      return setting;
    }
  }
  const std::vector<int64_t> candidates =
      PartitionCandidates(workload.TensorNumElements());
  ASSIGN_OR_RETURN(
      PartitionPlan plan,
      PartitionPlan::Create(workload.TensorNumElements(), candidates[0],
                            static_cast<int>(options.ps_addresses.size()),
                            workload.num_buffers(),
                            RowElementsOf(options, kind, workload)));
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Create(PsClientOptionsOf(options, kind), plan));
  // fp16 (sync): the tuning's last restore, the job's initial state, gives
  // the shards a fresh job's loss scaler (GradScaler's defaults), which
  // they keep from then on (PsClient::set_loss_scaler).
  LossScaler fresh;
  if (options.precision == PRECISION_FP16 && kind.sync) {
    client->set_loss_scaler(&fresh);
  }
  if (options.rejoin) {
    // No checkpoint yet: the size the shards hold.
    RETURN_IF_ERROR(client->WaitReady(options.init_timeout, 0,
                                      /*wait_for_connection=*/false,
                                      &setting.partition_bytes));
    return setting;
  }
  if (candidates.size() == 1) {
    setting.partition_bytes = candidates[0];
    setting.choice = PartitionChoice{candidates[0], 0, {}};
  } else {
    PartitionTunerOptions tuning;
    tuning.candidates = candidates;
    tuning.sync = kind.sync;
    tuning.staleness = options.staleness;
    tuning.init_timeout = options.init_timeout;
    std::vector<absl::Span<const float>> initial;
    if (chief) {
      for (absl::Span<float> w : workload.weights()) initial.push_back(w);
    }
    const std::unique_ptr<TopKCompressor> trial_compressor =
        CompressorOf(options, kind, workload);
    ASSIGN_OR_RETURN(
        PartitionChoice choice,
        TunePartition(tuning, *client, initial, chief, trial_compressor.get()));
    setting.partition_bytes = choice.partition_bytes;
    setting.ready_generation = choice.generation;
    setting.choice = std::move(choice);
  }
  if (chief && options.verbose) say(DescribePartitionChoice(*setting.choice));
  return setting;
}

// The job's top-k compression (none without one) and its residual files.
ExchangeCompression CompressionOf(const TrainerOptions& options,
                                  const RunKind& kind,
                                  const Workload& workload) {
  ExchangeCompression compression;
  if (!options.compression.enabled()) return compression;
  compression.names = workload.TensorNames();
  compression.names.resize(compression.names.size() - workload.num_buffers());
  // The residual file's names: the parameters', then each moment's.
  std::vector<std::string> moments;
  if (options.compression.adam) {
    moments = {"adam_m.", "adam_v."};
  } else if (options.compression.momentum_correction()) {
    moments = {"velocity."};
  }
  const size_t n = compression.names.size();
  for (const std::string& prefix : moments) {
    for (size_t t = 0; t < n; ++t) {
      compression.names.push_back(prefix + compression.names[t]);
    }
  }
  compression.compressor = CompressorOf(options, kind, workload);
  if (!options.checkpoint_dir.empty()) {
    compression.step_dir = [dir = options.checkpoint_dir](int64_t step) {
      return CheckpointStepDir(dir, step);
    };
  }
  compression.worker_id = options.worker_id;
  compression.num_workers = options.num_workers;
  if (options.partition_bytes > 0) {
    compression.partition_bytes = options.partition_bytes;
  }
  compression.residual_wait = options.init_timeout;
  return compression;
}

// The mode's exchange, and where its tensors go ("12 chunks on 2 shards").
absl::StatusOr<std::unique_ptr<GradientExchange>> CreateExchange(
    const TrainerOptions& options, const RunKind& kind,
    const Workload& workload, const PartitionSetting& partition,
    std::string* placement) {
  if (kind.allreduce) {
    *placement = absl::StrFormat(
        "ring allreduce over %d workers, buckets of %d bytes%s%s",
        options.num_workers, options.bucket_bytes,
        options.wire_dtype == DTYPE_FLOAT32
            ? ""
            : absl::StrCat(", gradients in ",
                           WireDtypeSpelling(options.wire_dtype)),
        options.compression.enabled()
            ? absl::StrCat(", ", CompressionSpelling(options.compression),
                           " pairs in a sparse allgather")
            : "");
    std::optional<ElasticWorld> elastic;
    if (options.elastic) {
      ElasticWorld world;
      world.connect = options.connect_collective;
      world.worker_id = options.worker_id;
      world.start = options.start_membership;
      world.await_start = options.await_membership;
      world.announce = options.announce_world;
      world.linear_lr_scaling = options.linear_lr_scaling;
      world.initial_workers = options.num_workers;
      world.timeout = options.init_timeout;
      elastic = std::move(world);
    }
    AllreduceRows rows;
    rows.row_elements = RowElementsOf(options, kind, workload);
    if (options.partition_bytes > 0) {
      rows.partition_bytes = options.partition_bytes;
    }
    return CreateAllreduceExchange(
        options.collective, options.adam, options.bucket_bytes,
        workload.num_buffers(), options.clip_grad_norm, options.wire_dtype,
        std::move(elastic), CompressionOf(options, kind, workload),
        std::move(rows));
  }
  ASSIGN_OR_RETURN(
      PartitionPlan plan,
      PartitionPlan::Create(
          workload.TensorNumElements(), partition.partition_bytes,
          static_cast<int>(options.ps_addresses.size()), workload.num_buffers(),
          RowElementsOf(options, kind, workload)));
  *placement = absl::StrFormat("%d chunks on %d shards", plan.chunks().size(),
                               plan.num_shards());
  PsClientOptions client_options = PsClientOptionsOf(options, kind);
  ExchangeCompression compression = CompressionOf(options, kind, workload);
  client_options.compressor = compression.compressor.get();
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Create(client_options, plan));
  return CreatePsExchange(std::move(client), kind.sync, options.worker_id == 0,
                          options.init_timeout, options.staleness,
                          client_options.backup_workers, std::move(compression),
                          partition.ready_generation);
}

// Recovery (worker/recovery.h; PS modes). Worker 0 restores the shards to
// the job's initial weights before the first checkpoint (the same on a
// restarted worker 0: from `seed` or `init_from`), copied now.
std::unique_ptr<Recovery> CreateRecovery(const TrainerOptions& options,
                                         const RunKind& kind,
                                         Workload* workload,
                                         GradientExchange* exchange,
                                         const LineFn& say) {
  RecoveryOptions recovery;
  recovery.worker_id = options.worker_id;
  recovery.num_workers = options.num_workers;
  recovery.sync = kind.sync;
  recovery.max_restarts = kind.allreduce ? 0 : options.max_restarts;
  recovery.elastic = options.elastic && !kind.allreduce;
  recovery.init_timeout = options.init_timeout;
  recovery.ps_addresses_fn = options.ps_addresses_fn;
  recovery.checkpoint_dir = options.checkpoint_dir;
  recovery.tensor_names = workload->TensorNames();
  recovery.tensor_shapes = workload->TensorShapes();
  recovery.num_buffers = workload->num_buffers();
  ModelState initial;
  if ((recovery.max_restarts > 0 || recovery.elastic) &&
      options.worker_id == 0) {
    const std::vector<absl::Span<float>>& weights = workload->weights();
    for (absl::Span<float> w : weights) {
      initial.weights.emplace_back(w.begin(), w.end());
    }
    initial.m.resize(weights.size());
    initial.v.resize(weights.size());
    initial.versions.resize(weights.size());
  }
  return std::make_unique<Recovery>(
      std::move(recovery), exchange, std::move(initial),
      [workload] { return workload->LoadWeights(); }, say);
}

// Which batch each step trains, from step 0 with the job's workers.
DataPositions PositionsOf(const TrainerOptions& options,
                          const Workload& workload) {
  return DataPositions(
      workload.samples_per_epoch(), options.max_steps_per_epoch, options.epochs,
      options.seed, options.batch_size, options.num_workers, options.worker_id);
}

// An elastic job's membership (worker/elastic.h) as the options say.
ElasticOptions ElasticOptionsOf(const TrainerOptions& options,
                                const RunKind& kind, const LineFn& say) {
  ElasticOptions elastic;
  elastic.worker_id = options.worker_id;
  elastic.async = kind.async;
  elastic.allreduce = kind.allreduce;
  elastic.newest = options.newest_membership;
  elastic.announced_world = options.announced_world;
  elastic.num_ps = static_cast<int>(options.ps_addresses.size());
  elastic.applied = options.membership_applied;
  elastic.say = say;
  elastic.timeout = options.init_timeout;
  if (options.min_workers > 0) elastic.verdict_wait = absl::Seconds(5);
  return elastic;
}

// An elastic job's membership into `elastic` (which must stay where it
// is: the exchange's restore membership reads it), and the data position
// its exchange sends: allreduce, with rank 0's state (a joining worker's,
// or every survivor's after a death); PS, worker 0's with a restore.
void CreateElastic(const TrainerOptions& options, const RunKind& kind,
                   const LineFn& say, DataPositions& positions,
                   GradientExchange& exchange, Recovery& recovery,
                   std::optional<ElasticMembership>& elastic) {
  elastic.emplace(ElasticOptionsOf(options, kind, say), &positions, &exchange);
  if (kind.allreduce) {
    exchange.set_restore_membership(
        [&elastic](int64_t step) { return elastic->AtVersion(step); });
  } else if (options.worker_id == 0) {
    exchange.set_restore_membership([&elastic, &recovery](int64_t v) {
      return elastic->AtVersion(recovery.StepOfVersion(v));
    });
  }
}

// Resume: the newest checkpoint's data position (every worker: the step to
// start at), loss scale (fp16: every worker, into `loss_scaler` when set)
// and state (worker 0, for the shards; allreduce: every worker, which
// holds it all), put into the weights. The state is stored per parameter,
// so a checkpoint of any mode loads.
absl::StatusOr<int64_t> ReadResume(const TrainerOptions& options,
                                   const RunKind& kind,
                                   DataPositions& positions, Workload& workload,
                                   LossScaler* loss_scaler, ModelState* state,
                                   std::string* dir, const LineFn& say) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadLatestCheckpoint(options.checkpoint_dir));
  *dir = manifest.dir;
  const int64_t step = manifest.step;
  RETURN_IF_ERROR(positions.Resume(step, manifest.position, manifest.dir));
  // Adam's m and v mean nothing to SGD, and SGD's buffer nothing to Adam.
  if (manifest.job.adam.kind != options.adam.kind) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest.dir, ": saved with optimizer ",
                     OptimizerName(manifest.job.adam.kind), "; this job has ",
                     OptimizerName(options.adam.kind),
                     ": its optimizer state cannot be restored"));
  }
  if (loss_scaler != nullptr && manifest.loss_scaler.has_value()) {
    loss_scaler->Restore(*manifest.loss_scaler);
  }
  if (options.worker_id == 0 || kind.allreduce) {
    ASSIGN_OR_RETURN(
        *state,
        LoadCheckpointState(manifest, workload.TensorNames(),
                            workload.TensorShapes(), workload.num_buffers()));
    const std::vector<absl::Span<float>>& weights = workload.weights();
    for (size_t t = 0; t < weights.size(); ++t) {
      std::copy(state->weights[t].begin(), state->weights[t].end(),
                weights[t].begin());
    }
    if (options.verbose) {
      std::string scale;
      if (loss_scaler != nullptr) {
        scale = absl::StrCat(manifest.loss_scaler.has_value()
                                 ? ", loss scale "
                                 : ", no loss scale saved: starting from ",
                             loss_scaler->scale());
      }
      say(absl::StrCat("Resuming from ", manifest.dir, " (step ", manifest.step,
                       ", epoch ", manifest.position.epoch, scale, ")"));
    }
  }
  return step;
}

// Every worker's weights from the shards (or worker 0's, allreduce), in
// the model: a fresh or resumed start, or a restarted task's rejoin. The
// step to start at.
absl::StatusOr<int64_t> StartExchange(
    const TrainerOptions& options, const RunKind& kind,
    DataPositions& positions, Workload& workload, GradientExchange& exchange,
    Recovery& recovery, LossScaler* loss_scaler, const LineFn& say) {
  int64_t step = 0;
  ModelState resume_state;
  std::string resume_dir;
  if (options.resume) {
    ASSIGN_OR_RETURN(step,
                     ReadResume(options, kind, positions, workload, loss_scaler,
                                &resume_state, &resume_dir, say));
  }
  // An elastic job's workers but 0 join the generation that has them (at
  // the start, the first one; later, the one that added them).
  const bool joins = options.elastic && options.worker_id != 0;
  if ((options.rejoin || joins) && !kind.allreduce) {
    // A restarted task: the shards run already.
    if (joins) exchange.set_joining(true);
    if (joins && options.prepared) options.prepared();
    if (options.await_membership) {
      RETURN_IF_ERROR(options.await_membership().status());
    }
    const int64_t own_start = step;
    ASSIGN_OR_RETURN(step, recovery.Rejoin(workload.weights()));
    // An async elastic job's first workers start where a fixed async
    // job's do (step 0, or the resume's step), however far worker 0 ran
    // without them (async waits for nobody; the shards' pushes would place
    // them ahead, skipping their first batches); one a Scale added goes on
    // from its membership's step (ElasticMembership::Started).
    if (kind.async && !options.rejoin) step = own_start;
  } else {
    // An elastic allreduce job's joining worker is prepared: the others
    // may switch to the world it joins in Start().
    if (joins && options.prepared) options.prepared();
    const bool resumes =
        (options.worker_id == 0 || kind.allreduce) && options.resume;
    RETURN_IF_ERROR(
        exchange.Start(workload.weights(), resumes ? &resume_state : nullptr));
    if (options.resume && options.compression.enabled() &&
        options.compression.error_feedback) {
      ASSIGN_OR_RETURN(const bool loaded,
                       exchange.RestoreResiduals(resume_dir, step));
      if (!loaded && options.verbose) {
        say(absl::StrCat("worker ", options.worker_id, ": ", resume_dir,
                         " holds no residual of this worker; its error "
                         "feedback starts from zero"));
      }
    }
  }
  RETURN_IF_ERROR(workload.LoadWeights());
  return step;
}

// Worker 0's checkpoint writer (worker/checkpoint.h), with fp16's
// `loss_scaler` (null: none) and given to `recovery` to wait for, and the
// checkpoints the job made durable before it (a restarted worker 0 goes on
// counting).
std::unique_ptr<CheckpointWriter> CreateCheckpointWriter(
    const TrainerOptions& options, const RunKind& kind, const Dataset& dataset,
    Workload* workload, GradientExchange* exchange, int64_t partition_bytes,
    const LossScaler* loss_scaler, Recovery* recovery,
    int64_t* checkpoints_before) {
  CheckpointJobInfo job;
  job.mode = options.mode;
  job.model = kind.synthetic ? "synthetic" : options.model;
  job.dataset = kind.synthetic ? "none" : dataset.name;
  // Allreduce: one file of the whole state (every worker holds it).
  job.num_shards =
      kind.allreduce ? 1 : static_cast<int>(options.ps_addresses.size());
  job.partition_bytes = partition_bytes;
  job.adam = options.adam;
  job.tensor_names = workload->TensorNames();
  job.tensor_shapes = workload->TensorShapes();
  job.num_buffers = workload->num_buffers();
  auto writer = std::make_unique<CheckpointWriter>(
      options.checkpoint_dir, options.keep_checkpoints, std::move(job),
      exchange,
      [workload](const std::vector<absl::Span<float>>& weights,
                 const std::string& path, int64_t step,
                 const safetensors::WriteOptions& write_options) {
        return workload->SaveWeights(weights, path, step, write_options);
      });
  // Bounded staleness and backup workers: worker 0's weights are not the
  // cut's (CheckpointWriter; with backups shard 0 picks the cut).
  // Row-sparse tables: worker 0 holds fresh rows only where it pulled
  // them (the next batch's).
  writer->set_model_from_shards(
      !kind.allreduce && (options.staleness > 0 || options.backup_workers > 0 ||
                          options.sparse_embeddings));
  *checkpoints_before = 0;
  if (options.rejoin) {
    absl::StatusOr<CheckpointManifest> newest =
        ReadLatestCheckpoint(options.checkpoint_dir);
    if (newest.ok()) *checkpoints_before = newest->checkpoint_count;
  }
  writer->ContinueCount(*checkpoints_before);
  writer->set_loss_scaler(loss_scaler);
  recovery->set_checkpoint_writer(writer.get());
  return writer;
}

// What the run is, in its result, with the partition it chose.
void DescribeRun(const TrainerOptions& options, const RunKind& kind,
                 const Dataset& dataset, const Workload& workload,
                 const PartitionSetting& partition, RunResult* result) {
  if (!kind.allreduce) result->set_partition_bytes(partition.partition_bytes);
  if (partition.choice.has_value()) {
    for (const PartitionTrial& trial : partition.choice->trials) {
      PartitionTrialResult* row = result->add_partition_trials();
      row->set_partition_bytes(trial.partition_bytes);
      row->set_ms_per_step(trial.ms_per_step);
    }
  }
  result->set_num_ps(
      kind.allreduce ? 0 : static_cast<int>(options.ps_addresses.size()));
  result->set_num_workers(options.num_workers);
  result->set_mode(std::string(Spelling(options.mode)));
  result->set_model(kind.synthetic ? "synthetic" : options.model);
  result->set_dataset(kind.synthetic ? "none" : dataset.name);
  result->set_batch_size(options.batch_size);
  result->set_epochs(options.epochs);
  result->set_num_parameters(workload.num_parameters());
  result->set_compute(std::string(Spelling(options.compute)));
  result->set_train_samples(kind.synthetic ? 0 : dataset.train.count);
  result->set_backend(std::string(Spelling(options.backend)));
  int64_t elements = 0;
  for (int64_t n : workload.TensorNumElements()) elements += n;
  result->set_model_bytes(elements * 4);
}

Reporter::Options ReporterOptionsOf(const TrainerOptions& options,
                                    const RunKind& kind,
                                    const DataPositions& positions,
                                    int64_t checkpoints_before,
                                    const LineFn& say) {
  Reporter::Options report;
  report.worker_id = options.worker_id;
  report.num_workers = options.num_workers;
  report.backup_workers = options.backup_workers;
  report.batch_size = options.batch_size;
  report.log_every_steps = options.log_every_steps;
  report.verbose = options.verbose;
  report.total_steps = positions.total_steps();
  report.adam = options.adam;
  // Sync without backup workers and allreduce: every worker trains every
  // step, counted on the worker (the shards' count lags by the other
  // workers' last pulls, which may still be on their way when worker 0 has
  // ended); otherwise shard 0's count.
  report.count_on_worker =
      kind.allreduce || (kind.sync && options.backup_workers == 0);
  report.checkpoints_before = checkpoints_before;
  report.metrics_dir = options.metrics_dir;
  report.append_metrics = options.resume || options.rejoin;
  report.say = say;
  report.on_progress = options.on_progress;
  report.on_epoch = options.on_epoch;
  return report;
}

StepLoop::Options StepLoopOptionsOf(const TrainerOptions& options,
                                    const RunKind& kind,
                                    const Workload& workload,
                                    NonFiniteInjection injection) {
  StepLoop::Options loop;
  loop.worker_id = options.worker_id;
  loop.batch_size = options.batch_size;
  loop.async = kind.async;
  loop.allreduce = kind.allreduce;
  loop.max_nonfinite_steps = options.max_nonfinite_steps;
  loop.report_loss = !kind.synthetic;
  loop.straggler_worker = options.straggler_worker;
  loop.straggler_delay_ms = options.straggler_delay_ms;
  if (const char* dir = std::getenv("PSTRAIN_RECORD_SAMPLES")) {
    loop.record_samples_dir = dir;
  }
  loop.tensor_names = workload.TensorNames();
  loop.inject_nonfinite = std::move(injection);
  const std::vector<int64_t> rows = RowElementsOf(options, kind, workload);
  loop.sparse_rows =
      std::any_of(rows.begin(), rows.end(), [](int64_t d) { return d > 0; });
  loop.backup_workers = options.backup_workers > 0;
  return loop;
}

// Worker 0's evaluation after an epoch (StepLoop::EndEpochFn).
// `others_wait`: the other workers wait for this one meanwhile (sync
// without backup workers: at the next step's barrier, or within staleness
// steps of it; allreduce: at the next collective).
absl::Status EvaluateEpoch(Workload& workload, GradientExchange& exchange,
                           Reporter& reporter, bool others_wait,
                           Reporter::EpochEvaluation epoch) {
  reporter.PauseTraining();
  // No stream may sit idle through the evaluation (see CloseStreams).
  RETURN_IF_ERROR(exchange.BeforePause());
  const absl::Time test_start = absl::Now();
  // The other workers wait (or have finished): evaluate with every core.
  // Async or backup workers: they go on training on theirs, so this worker
  // keeps its share; OpenMP threads beyond it would contend with theirs
  // (on a loaded 2-core machine an evaluation of 0.4 s took 11.7 s, and
  // the other two workers of a backup job trained the whole next epoch
  // without worker 0, which takes the checkpoints).
  const int train_threads = omp_get_max_threads();
  if (others_wait) omp_set_num_threads(omp_get_num_procs());
  absl::StatusOr<Evaluation> evaluated = workload.Evaluate();
  omp_set_num_threads(train_threads);
  ASSIGN_OR_RETURN(const Evaluation eval, std::move(evaluated));
  epoch.test_seconds = absl::ToDoubleSeconds(absl::Now() - test_start);
  epoch.test_loss = eval.loss;
  epoch.test_accuracy = eval.accuracy;
  RETURN_IF_ERROR(reporter.Evaluated(epoch));
  return reporter.ResumeTraining();
}

// Worker 0's evaluation after each epoch; null where it evaluates nothing
// (options.evaluate false, synthetic compute, or `dataset` without a test
// split, which it says).
StepLoop::EndEpochFn EndEpochFnOf(const TrainerOptions& options,
                                  const RunKind& kind, const Dataset& dataset,
                                  Workload& workload,
                                  GradientExchange& exchange,
                                  Reporter& reporter, const LineFn& say) {
  if (!options.evaluate) return nullptr;
  if (!workload.can_evaluate()) {
    if (options.verbose && workload.samples_per_epoch() > 0) {
      say(absl::StrCat(dataset.name,
                       " has no test split: epochs end without an evaluation "
                       "(no test accuracy)"));
    }
    return nullptr;
  }
  const bool others_wait = !kind.async && options.backup_workers == 0;
  return [&workload, &exchange, &reporter, others_wait](
             int epoch, int64_t step, double train_seconds, double train_loss) {
    Reporter::EpochEvaluation evaluation;
    evaluation.epoch = epoch;
    evaluation.step = step;
    evaluation.train_seconds = train_seconds;
    evaluation.train_loss = train_loss;
    return EvaluateEpoch(workload, exchange, reporter, others_wait, evaluation);
  };
}

// `options` with a cosine schedule's horizon where the job leaves it to
// the data (total_steps 0): the job's total steps, epochs x steps per
// epoch of this worker's count, which every worker reaches alike and
// worker 0 gives the shards at their Init (PsClientOptions
// ::lr_total_steps). An elastic job keeps its start's count.
absl::StatusOr<TrainerOptions> WithLrHorizon(const TrainerOptions& options,
                                             const DataPositions& positions) {
  TrainerOptions out = options;
  LrSchedule& s = out.adam.schedule;
  if (!s.needs_horizon()) return out;
  s.total_steps = positions.total_steps();
  if (s.total_steps <= s.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr_total_steps: the job's ", s.total_steps,
        " steps with a cosine schedule; expected more than warmup_steps (",
        s.warmup_steps, ")"));
  }
  return out;
}

}  // namespace

absl::StatusOr<TrainerOutput> RunWorker(const TrainerOptions& job_options,
                                        const Dataset& dataset) {
  ASSIGN_OR_RETURN(const RunKind kind, KindOf(job_options));
  std::unique_ptr<Workload> workload;
  if (kind.synthetic) {
    ASSIGN_OR_RETURN(workload, CreateSyntheticWorkload(job_options));
  } else {
    ASSIGN_OR_RETURN(workload, CreateModelWorkload(job_options, dataset));
  }
  DataPositions positions = PositionsOf(job_options, *workload);
  ASSIGN_OR_RETURN(const TrainerOptions options,
                   WithLrHorizon(job_options, positions));
  const bool chief = options.worker_id == 0;
  const LineFn say = ConsoleLines(options.log_line);
  if (!options.init_from.empty()) {
    RETURN_IF_ERROR(workload->LoadModel(options.init_from));
  }
  RETURN_IF_ERROR(CheckRowTables(options, kind, *workload));
  ASSIGN_OR_RETURN(const PartitionSetting partition,
                   ChoosePartition(options, kind, *workload, say));
  std::string placement;
  ASSIGN_OR_RETURN(
      std::unique_ptr<GradientExchange> exchange,
      CreateExchange(options, kind, *workload, partition, &placement));
  if (workload->can_gate_weights()) {
    // Priority pulls: the next forward starts while the pull goes on.
    if (WeightsGate* gate = exchange->StartEarlyForward()) {
      workload->SetWeightsGate(gate);
    }
  }
  const bool checkpointing =
      options.checkpoint_every_steps > 0 || options.checkpoint_every_secs > 0;
  if ((options.resume || checkpointing) && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "checkpoints and resume need a checkpoint folder");
  }
  const std::unique_ptr<Recovery> recovery =
      CreateRecovery(options, kind, workload.get(), exchange.get(), say);
  std::optional<ElasticMembership> elastic;
  if (options.elastic) {
    CreateElastic(options, kind, say, positions, *exchange, *recovery, elastic);
  }
  // fp16 precision: GradScaler's defaults, or the resumed checkpoint's.
  LossScaler loss_scaler;
  LossScaler* const scaler =
      options.precision == PRECISION_FP16 ? &loss_scaler : nullptr;
  exchange->set_loss_scaler(scaler);
  ASSIGN_OR_RETURN(int64_t start_step,
                   StartExchange(options, kind, positions, *workload, *exchange,
                                 *recovery, scaler, say));
  if (elastic.has_value()) {
    ASSIGN_OR_RETURN(const bool member, elastic->Started(&start_step));
    if (!member) return TrainerOutput{};
  }
  // Worker 0's checkpoints, due by CheckpointSchedule (time counted from
  // now).
  std::unique_ptr<CheckpointWriter> checkpoints;
  std::optional<CheckpointSchedule> schedule;
  int64_t checkpoints_before = 0;
  if (chief && checkpointing) {
    checkpoints = CreateCheckpointWriter(
        options, kind, dataset, workload.get(), exchange.get(),
        partition.partition_bytes, scaler, recovery.get(), &checkpoints_before);
    schedule.emplace(
        CheckpointSchedule::Options{options.checkpoint_every_steps,
                                    options.checkpoint_every_secs},
        positions,
        [&](int64_t step, const DataPosition& position) {
          RETURN_IF_ERROR(exchange->AwaitWeights());
          return checkpoints->Begin(
              step, positions.total_steps(), position, workload->weights(),
              [&positions](int64_t cut) { return positions.At(cut); });
        },
        absl::Now());
  }
  TrainerOutput output;
  DescribeRun(options, kind, dataset, *workload, partition, &output.result);
  if (chief && options.verbose) {
    say(absl::StrFormat("%s; %s; %d steps per epoch per worker",
                        workload->Describe(), placement,
                        positions.steps_per_epoch()));
  }
  ASSIGN_OR_RETURN(
      NonFiniteInjection injection,
      ParseNonFiniteInjection(std::getenv("PSTRAIN_INJECT_NONFINITE")));
  ASSIGN_OR_RETURN(const std::unique_ptr<Reporter> reporter,
                   Reporter::Create(ReporterOptionsOf(options, kind, positions,
                                                      checkpoints_before, say),
                                    exchange.get(), &output.result));
  StepLoop::Parts parts;
  parts.compute = workload.get();
  parts.exchange = exchange.get();
  parts.recovery = recovery.get();
  parts.checkpoints = schedule.has_value() ? &*schedule : nullptr;
  parts.reporter = reporter.get();
  if (elastic.has_value()) {
    if (checkpoints != nullptr) {
      elastic->set_wait_checkpoint(
          [&checkpoints] { return checkpoints->Wait(); });
      if (options.compression.enabled() && options.compression.error_feedback) {
        elastic->set_checkpoint_in_flight(
            [&checkpoints] { return checkpoints->InFlight(); });
      }
    }
    parts.elastic = &*elastic;
  }
  if (chief) {
    parts.end_epoch = EndEpochFnOf(options, kind, dataset, *workload, *exchange,
                                   *reporter, say);
  }
  parts.loss_scaler = scaler;
  StepLoop loop(
      StepLoopOptionsOf(options, kind, *workload, std::move(injection)),
      positions, std::move(parts));
  RETURN_IF_ERROR(loop.Run(start_step));
  if (loop.removed()) {
    // Left out of an elastic job's membership: nothing more to train or
    // report; the shards do not wait for this worker.
    return TrainerOutput{};
  }
  RETURN_IF_ERROR(exchange->AwaitWeights());
  const int64_t steps = loop.step();
  const double train_seconds = reporter->TrainingSeconds();
  if (checkpoints != nullptr) {
    RETURN_IF_ERROR(checkpoints->Wait());
    reporter->CheckpointsWritten(checkpoints->completed(),
                                 checkpoints->latest_path());
  }
  // An elastic job's table names the workers and shards it ended with.
  if (elastic.has_value()) {
    output.result.set_num_workers(positions.members());
    output.result.set_num_ps(elastic->num_ps());
  }
  RETURN_IF_ERROR(reporter->Finish(steps, train_seconds));
  for (absl::Span<float> w : workload->weights()) {
    output.final_weights.emplace_back(w.begin(), w.end());
  }
  if (chief && !options.model_out.empty()) {
    RETURN_IF_ERROR(workload->SaveModel(options.model_out, steps));
    if (options.verbose) {
      say(absl::StrCat("Saved the trained model (", steps, " steps) to ",
                       options.model_out));
    }
  }
  RETURN_IF_ERROR(exchange->Finish());
  return output;
}

}  // namespace pstrain
