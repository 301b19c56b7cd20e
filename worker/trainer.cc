#include "worker/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "models/backend_factory.h"
#include "models/model.h"
#include "models/model_file.h"
#include "worker/checkpoint.h"
#include "worker/checkpoint_schedule.h"
#include "worker/data_position.h"
#include "worker/gradient_exchange.h"
#include "worker/input_pipeline.h"
#include "worker/metrics.h"
#include "worker/partition_tuner.h"
#include "worker/recovery.h"
#include "worker/reporter.h"
#include "worker/step_loop.h"

namespace pstrain {
namespace {

// What a worker computes each step: the real model (forward and backward
// on its batches), or a stand-in for a GPU that sleeps compute_ms and
// offers model-sized gradients (emulated-link runs, see trainer.h).
class Workload : public StepCompute {
 public:
  // PS tensors: parameters, then num_buffers() BatchNorm buffers.
  virtual const std::vector<absl::Span<float>>& weights() = 0;
  virtual int num_buffers() const = 0;
  virtual std::vector<int64_t> TensorNumElements() const = 0;
  // PS tensors' names and shapes, for checkpoints.
  virtual std::vector<std::string> TensorNames() const = 0;
  virtual std::vector<std::vector<int64_t>> TensorShapes() const = 0;
  virtual int64_t steps_per_epoch() const = 0;
  virtual bool can_evaluate() const = 0;
  virtual absl::StatusOr<Evaluation> Evaluate() = 0;
  virtual int64_t num_parameters() const = 0;
  // "model lenet5 on cpu: ..." for worker 0's first line.
  virtual std::string Describe() const = 0;
  // The model's weights from / to a model file (models/model_file.h); the
  // saved file records `steps`.
  virtual absl::Status LoadModel(const std::string& path) = 0;
  virtual absl::Status SaveModel(const std::string& path, int64_t steps) = 0;
  // As SaveModel, with `weights` (PS tensors) in place of the model's own;
  // the file's size and crc32.
  virtual absl::StatusOr<safetensors::WriteResult> SaveWeights(
      const std::vector<absl::Span<float>>& weights, const std::string& path,
      int64_t steps, const safetensors::WriteOptions& write_options) = 0;
  // Whether Step()'s forward can ask a WeightsGate per tensor (a model on
  // a host-memory backend), and the gate it asks from then on.
  virtual bool can_gate_weights() const { return false; }
  virtual void SetWeightsGate(WeightsGate* gate) {}
};

// A streamed split's pipeline: `threads` (at least 1) decoding, two
// batches per thread and two more prefetched, augmented as `augment`
// (checked by ModelWorkload::Create: StreamAugmentOptions).
InputPipelineOptions StreamInputOptions(const Dataset& dataset,
                                        int64_t batch_size, int threads,
                                        bool idle_priority,
                                        AugmentKind augment = AUGMENT_NONE) {
  InputPipelineOptions input;
  input.batch_size = batch_size;
  input.threads = std::max(1, threads);
  input.prefetch_batches = 2 * input.threads + 2;
  absl::StatusOr<AugmentOptions> options =
      StreamAugmentOptions(dataset, augment);
  input.augment = options.ok() ? *options : AugmentOptions();
  input.idle_priority = idle_priority;
  return input;
}

class ModelWorkload : public Workload {
 public:
  static absl::StatusOr<std::unique_ptr<Workload>> Create(
      const TrainerOptions& options, const Dataset& dataset) {
    for (const LabeledImages* split : {&dataset.train, &dataset.test}) {
      if (split->count > kMaxSamples) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a dataset split of ", split->count, " samples; at most ",
            kMaxSamples, " (sample indices are 32-bit)"));
      }
    }
    if (dataset.train.files != nullptr) {
      RETURN_IF_ERROR(StreamAugmentOptions(dataset, options.augment).status());
    }
    auto w = absl::WrapUnique(new ModelWorkload(options, dataset));
    ASSIGN_OR_RETURN(w->backend_, CreateBackend(options.backend, options.gpu));
    ModelOptions model_options;
    model_options.seed = options.seed;
    model_options.dropout_seed = options.seed * 7919 + options.worker_id;
    ASSIGN_OR_RETURN(
        w->model_,
        Model::Create(options.model, dataset.train.chw, dataset.num_classes,
                      model_options, w->backend_.get()));
    w->steps_per_epoch_ = w->sampler_.samples_per_worker() / options.batch_size;
    if (options.max_steps_per_epoch > 0) {
      w->steps_per_epoch_ =
          std::min(w->steps_per_epoch_, options.max_steps_per_epoch);
    }
    if (w->steps_per_epoch_ <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch size ", options.batch_size, " is larger than this worker's ",
          w->sampler_.samples_per_worker(), " training samples"));
    }
    return std::unique_ptr<Workload>(std::move(w));
  }

  const std::vector<absl::Span<float>>& weights() override {
    return model_->HostWeights();
  }
  const std::vector<absl::Span<const float>>& gradients() override {
    return model_->HostGradients();
  }
  int num_buffers() const override {
    return static_cast<int>(model_->buffers().size());
  }
  std::vector<int64_t> TensorNumElements() const override {
    return model_->PsTensorNumElements();
  }
  std::vector<std::string> TensorNames() const override {
    return model_->PsTensorNames();
  }
  std::vector<std::vector<int64_t>> TensorShapes() const override {
    return model_->PsTensorShapes();
  }
  void SkipBatches(int64_t n) override {
    if (pipeline_ != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        absl::StatusOr<bool> more = pipeline_->Next(&stream_batch_);
        if (!more.ok() || !*more) return;  // Step() reports it
      }
      return;
    }
    for (int64_t i = 0; i < n && prefetcher_->Next(&batch_); ++i) {
    }
  }
  absl::Status LoadWeights() override { return model_->LoadHostWeights(); }
  bool can_gate_weights() const override { return backend_->host_memory(); }
  void SetWeightsGate(WeightsGate* gate) override {
    model_->set_weights_gate(gate);
  }
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }
  void BeginEpoch(int epoch) override {
    prefetcher_.reset();
    pipeline_.reset();
    indices_ = sampler_.EpochIndices(epoch);
    if (dataset_.train.files != nullptr) {
      // Streamed: the files of the next batches are decoded on the input
      // threads while this one trains.
      InputPipelineOptions input = StreamInputOptions(
          dataset_, options_.batch_size, options_.input_threads,
          options_.input_idle_priority, options_.augment);
      input.seed = options_.seed * 104729 + epoch * 131 + options_.worker_id;
      absl::StatusOr<std::unique_ptr<InputPipeline>> pipeline =
          InputPipeline::Create(*dataset_.train.files, indices_,
                                steps_per_epoch_, input);
      if (pipeline.ok()) {
        pipeline_ = *std::move(pipeline);
      } else {
        pipeline_error_ = pipeline.status();
      }
      return;
    }
    // The next batches are gathered (and augmented) on a background thread.
    prefetcher_ = std::make_unique<BatchPrefetcher>(
        dataset_.train, indices_, options_.batch_size, steps_per_epoch_,
        dataset_.augment,
        options_.seed * 104729 + epoch * 131 + options_.worker_id);
  }
  absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) override {
    if (dataset_.train.files != nullptr) {
      if (pipeline_ == nullptr) return pipeline_error_;
      ASSIGN_OR_RETURN(const bool more, pipeline_->Next(&stream_batch_));
      if (!more) {
        return absl::InternalError("input pipeline ended before the epoch");
      }
      return model_->ForwardBackward(stream_batch_.images, stream_batch_.labels,
                                     on_ready);
    }
    if (!prefetcher_->Next(&batch_)) {
      return absl::InternalError("prefetcher ended before the epoch");
    }
    return model_->ForwardBackward(batch_.images, batch_.labels, on_ready);
  }
  StepPhases LastPhases() const override {
    StepPhases phases;
    phases.forward = model_->last_forward_time();
    phases.backward = model_->last_backward_time();
    return phases;
  }
  bool can_evaluate() const override { return true; }
  absl::StatusOr<Evaluation> Evaluate() override {
    const int eval_batch =
        options_.eval_batch_size > 0
            ? options_.eval_batch_size
            : std::max(1, std::min(500, 2 * options_.batch_size));
    return EvaluateModel(*model_, dataset_, eval_batch, options_.input_threads);
  }
  int64_t num_parameters() const override { return model_->NumParameters(); }
  absl::Status LoadModel(const std::string& path) override {
    return LoadModelFile(path, model_.get());
  }
  absl::Status SaveModel(const std::string& path, int64_t steps) override {
    return SaveWeights(model_->HostWeights(), path, steps, {}).status();
  }
  absl::StatusOr<safetensors::WriteResult> SaveWeights(
      const std::vector<absl::Span<float>>& weights, const std::string& path,
      int64_t steps, const safetensors::WriteOptions& write_options) override {
    ModelFileInfo info;
    info.model = options_.model;
    info.input_chw = dataset_.train.chw;
    info.num_classes = dataset_.num_classes;
    info.steps = steps;
    info.dataset = dataset_.name;
    return SaveModelFile(*model_, weights, info, path, write_options);
  }
  std::string Describe() const override {
    return absl::StrFormat(
        "model %s on %s: %d parameters, %d buffers, %.2f MFLOPs forward per "
        "sample%s",
        options_.model, backend_->name(), model_->NumParameters(),
        model_->buffers().size(), 2.0 * model_->ForwardMacsPerSample() / 1e6,
        dataset_.train.files == nullptr
            ? ""
            : absl::StrFormat(
                  "; streaming %d image files, decoded on %d input threads%s",
                  dataset_.train.count, std::max(1, options_.input_threads),
                  options_.augment == AUGMENT_NONE
                      ? ""
                      : absl::StrCat(", augmented by ",
                                     Spelling(options_.augment))));
  }

 private:
  ModelWorkload(const TrainerOptions& options, const Dataset& dataset)
      : options_(options),
        dataset_(dataset),
        sampler_(dataset.train.count, options.worker_id, options.num_workers,
                 options.seed) {}

  const TrainerOptions& options_;
  const Dataset& dataset_;
  const ShardedSampler sampler_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  int64_t steps_per_epoch_ = 0;
  SampleOrder indices_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;
  BatchPrefetcher::Batch batch_;
  // Streamed datasets instead of the prefetcher.
  std::unique_ptr<InputPipeline> pipeline_;
  absl::Status pipeline_error_;
  InputPipeline::Batch stream_batch_;
};

class SyntheticWorkload : public Workload {
 public:
  static absl::StatusOr<std::unique_ptr<Workload>> Create(
      const TrainerOptions& options) {
    if (options.model_bytes < 4 || options.model_bytes % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic compute: model_bytes ", options.model_bytes,
                       "; expected a positive multiple of 4"));
    }
    if (!(options.compute_ms >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic compute: compute_ms ", options.compute_ms,
                       "; expected >= 0"));
    }
    if (!(options.backward_fraction >= 0 && options.backward_fraction <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic compute: backward_fraction ",
                       options.backward_fraction, "; expected 0 to 1"));
    }
    if (options.max_steps_per_epoch <= 0) {
      return absl::InvalidArgumentError(
          "synthetic compute has no dataset: set the steps per epoch "
          "(max_steps_per_epoch > 0)");
    }
    auto w = absl::WrapUnique(new SyntheticWorkload(options));
    int64_t left = options.model_bytes / 4;
    while (left > 0) {
      const int64_t n = std::min(left, kTensorElements);
      w->sizes_.push_back(n);
      left -= n;
    }
    // Weights as a model's initialisation: the same on every worker (the
    // exchange broadcasts worker 0's anyway). Gradients: small fixed
    // values, different per worker, so that sums and Adam do real work.
    uint64_t state = options.seed * 0x9E3779B97F4A7C15ull + options.worker_id;
    for (int64_t n : w->sizes_) {
      w->weight_storage_.emplace_back(n, 0.01f);
      std::vector<float>& g = w->gradient_storage_.emplace_back(n);
      for (float& x : g) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = static_cast<float>(static_cast<int32_t>(state >> 40)) * 1e-9f;
      }
    }
    for (size_t t = 0; t < w->sizes_.size(); ++t) {
      w->all_tensors_.push_back(static_cast<int>(w->sizes_.size() - 1 - t));
      w->weights_.emplace_back(w->weight_storage_[t]);
      w->gradients_.emplace_back(w->gradient_storage_[t]);
    }
    return std::unique_ptr<Workload>(std::move(w));
  }

  const std::vector<absl::Span<float>>& weights() override { return weights_; }
  const std::vector<absl::Span<const float>>& gradients() override {
    return gradients_;
  }
  int num_buffers() const override { return 0; }
  std::vector<int64_t> TensorNumElements() const override { return sizes_; }
  std::vector<std::string> TensorNames() const override {
    std::vector<std::string> names;
    for (size_t t = 0; t < sizes_.size(); ++t) {
      names.push_back(absl::StrCat("synthetic.", t));
    }
    return names;
  }
  std::vector<std::vector<int64_t>> TensorShapes() const override {
    std::vector<std::vector<int64_t>> shapes;
    for (int64_t n : sizes_) shapes.push_back({n});
    return shapes;
  }
  void SkipBatches(int64_t) override {}
  absl::Status LoadWeights() override { return absl::OkStatus(); }
  int64_t steps_per_epoch() const override {
    return options_.max_steps_per_epoch;
  }
  void BeginEpoch(int) override {}
  // Forward: sleep. Backward (the last backward_fraction of the step):
  // each tensor, last first, is announced once its share of the backward
  // time (by size) has passed, measured from the step's start so that
  // announcing does not add to the step. Without a backward fraction, every
  // gradient at once when the sleep ends.
  absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) override {
    const absl::Time start = absl::Now();
    const absl::Duration step = absl::Milliseconds(options_.compute_ms);
    const absl::Duration backward = step * options_.backward_fraction;
    if (backward > absl::ZeroDuration()) {
      const double total = static_cast<double>(options_.model_bytes / 4);
      double done = 0;
      for (int t : all_tensors_) {
        done += static_cast<double>(sizes_[t]);
        absl::SleepFor(start + (step - backward) + backward * (done / total) -
                       absl::Now());
        on_ready(absl::MakeConstSpan(&t, 1), nullptr);
      }
    }
    absl::SleepFor(start + step - absl::Now());
    if (backward <= absl::ZeroDuration()) on_ready(all_tensors_, nullptr);
    return 0.0f;
  }
  bool can_evaluate() const override { return false; }
  absl::Status LoadModel(const std::string&) override {
    return absl::InvalidArgumentError(
        "compute synthetic has no model to load weights into");
  }
  absl::Status SaveModel(const std::string&, int64_t) override {
    return absl::InvalidArgumentError("compute synthetic has no model to save");
  }
  absl::StatusOr<safetensors::WriteResult> SaveWeights(
      const std::vector<absl::Span<float>>&, const std::string&, int64_t,
      const safetensors::WriteOptions&) override {
    return absl::InvalidArgumentError("compute synthetic has no model to save");
  }
  absl::StatusOr<Evaluation> Evaluate() override {
    return absl::FailedPreconditionError("synthetic compute has no test set");
  }
  int64_t num_parameters() const override { return options_.model_bytes / 4; }
  std::string Describe() const override {
    return absl::StrFormat(
        "synthetic compute: %.1f ms per step (the last %.0f%% a backward "
        "pass), %d bytes of gradients in %d tensors",
        options_.compute_ms, options_.backward_fraction * 100,
        options_.model_bytes, sizes_.size());
  }

 private:
  // Tensors of at most 1 MiB (ResNet-50's 161 average 0.63 MB).
  static constexpr int64_t kTensorElements = 1 << 18;

  explicit SyntheticWorkload(const TrainerOptions& options)
      : options_(options) {}

  const TrainerOptions& options_;
  std::vector<int64_t> sizes_;
  std::vector<int> all_tensors_;  // Last first, as backward.
  std::vector<std::vector<float>> weight_storage_;
  std::vector<std::vector<float>> gradient_storage_;
  std::vector<absl::Span<float>> weights_;
  std::vector<absl::Span<const float>> gradients_;
};

}  // namespace

absl::StatusOr<AugmentOptions> StreamAugmentOptions(const Dataset& dataset,
                                                    AugmentKind augment) {
  AugmentOptions options;
  switch (augment) {
    case AUGMENT_NONE:
      options.crop = AugmentOptions::Crop::kResize;
      options.hflip = false;
      break;
    case AUGMENT_RANDOM_RESIZED_CROP:
      options.crop = AugmentOptions::Crop::kRandomResizedCrop;
      options.hflip = true;
      break;
    case AUGMENT_PAD_CROP:
      options.crop = AugmentOptions::Crop::kPadCrop;
      options.pad = 4;
      options.hflip = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("augment ", static_cast<int>(augment),
                       " (not an AugmentKind); expected none, "
                       "random_resized_crop or pad_crop"));
  }
  options.out_size = static_cast<int>(dataset.train.chw[1]);
  options.channels = static_cast<int>(dataset.train.chw[0]);
  for (double m : dataset.channel_mean) {
    options.mean.push_back(static_cast<float>(m));
  }
  for (double s : dataset.channel_stddev) {
    options.stddev.push_back(static_cast<float>(s));
  }
  return options;
}

absl::StatusOr<Evaluation> EvaluateModel(Model& model, const Dataset& dataset,
                                         int eval_batch, int input_threads) {
  const LabeledImages& test = dataset.test;
  Evaluation eval;
  int64_t correct = 0;
  double loss_sum = 0;
  std::vector<SampleIndex> indices(test.count);
  for (int64_t i = 0; i < test.count; ++i) indices[i] = i;
  Tensor images;
  std::vector<int32_t> labels;
  // A streamed split: whole batches from one pipeline, the rest from a
  // second one of the remainder's size.
  std::unique_ptr<InputPipeline> full, rest;
  if (test.files != nullptr) {
    InputPipelineOptions input =
        StreamInputOptions(dataset, eval_batch, input_threads,
                           /*idle_priority=*/false);
    if (test.count / eval_batch > 0) {
      ASSIGN_OR_RETURN(full,
                       InputPipeline::Create(*test.files, indices,
                                             test.count / eval_batch, input));
    }
    if (test.count % eval_batch > 0) {
      input.batch_size = test.count % eval_batch;
      std::vector<SampleIndex> tail(indices.end() - input.batch_size,
                                    indices.end());
      ASSIGN_OR_RETURN(rest,
                       InputPipeline::Create(*test.files, tail, 1, input));
    }
  }
  const SampleOrder in_order(std::move(indices));
  InputPipeline::Batch streamed;
  for (int64_t begin = 0; begin < test.count; begin += eval_batch) {
    const int64_t n = std::min<int64_t>(eval_batch, test.count - begin);
    if (test.files != nullptr) {
      InputPipeline* from = n == eval_batch ? full.get() : rest.get();
      ASSIGN_OR_RETURN(const bool more, from->Next(&streamed));
      if (!more) return absl::InternalError("input pipeline ended early");
      images = std::move(streamed.images);
      labels = std::move(streamed.labels);
    } else {
      GatherBatch(test, in_order, begin, n, &images, &labels);
    }
    ASSIGN_OR_RETURN(const Tensor* logits, model.Forward(images));
    const int64_t k = logits->shape[1];
    ASSIGN_OR_RETURN(float loss, HostSoftmaxCrossEntropy(logits->data.data(), n,
                                                         k, labels, nullptr));
    loss_sum += double{loss} * n;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = &logits->data[i * k];
      const int64_t best = std::max_element(row, row + k) - row;
      if (best == labels[i]) ++correct;
    }
  }
  eval.accuracy =
      static_cast<double>(correct) / std::max<int64_t>(test.count, 1);
  eval.loss = loss_sum / std::max<int64_t>(test.count, 1);
  return eval;
}

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
  if (kind.allreduce && options.collective == nullptr) {
    return absl::InvalidArgumentError(
        "mode allreduce needs the workers' collective");
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
  client_options.clip_by_global_norm = kind.sync && options.clip_grad_norm > 0;
  client_options.wire_dtype = options.wire_dtype;
  client_options.channels_per_shard = options.channels_per_shard;
  client_options.priority_pulls = options.priority_pulls;
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

// The top-k compressor of the job's parameters (not its buffers: those
// are values, pushed dense), or null without compression.
std::unique_ptr<TopKCompressor> CompressorOf(const TrainerOptions& options,
                                             const Workload& workload) {
  if (!options.compression.enabled()) return nullptr;
  std::vector<int64_t> sizes = workload.TensorNumElements();
  sizes.resize(sizes.size() - workload.num_buffers());
  // Residuals back to the furthest checkpoint a worker can hear of late
  // (worker/topk_compression.h).
  return std::make_unique<TopKCompressor>(options.compression, std::move(sizes),
                                          options.staleness + 3);
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
                            workload.num_buffers()));
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Create(PsClientOptionsOf(options, kind), plan));
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
        CompressorOf(options, workload);
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

// The mode's exchange, and where its tensors go ("12 chunks on 2 shards").
absl::StatusOr<std::unique_ptr<GradientExchange>> CreateExchange(
    const TrainerOptions& options, const RunKind& kind,
    const Workload& workload, const PartitionSetting& partition,
    std::string* placement) {
  if (kind.allreduce) {
    *placement =
        absl::StrFormat("ring allreduce over %d workers, buckets of %d bytes",
                        options.num_workers, options.bucket_bytes);
    return CreateAllreduceExchange(options.collective, options.adam,
                                   options.bucket_bytes, workload.num_buffers(),
                                   options.clip_grad_norm);
  }
  ASSIGN_OR_RETURN(PartitionPlan plan,
                   PartitionPlan::Create(
                       workload.TensorNumElements(), partition.partition_bytes,
                       static_cast<int>(options.ps_addresses.size()),
                       workload.num_buffers()));
  *placement = absl::StrFormat("%d chunks on %d shards", plan.chunks().size(),
                               plan.num_shards());
  PsClientOptions client_options = PsClientOptionsOf(options, kind);
  PsCompression compression;
  if (options.compression.enabled()) {
    compression.names = workload.TensorNames();
    compression.names.resize(compression.names.size() - workload.num_buffers());
    compression.compressor = CompressorOf(options, workload);
    client_options.compressor = compression.compressor.get();
    if (!options.checkpoint_dir.empty()) {
      compression.step_dir = [dir = options.checkpoint_dir](int64_t step) {
        return CheckpointStepDir(dir, step);
      };
    }
    compression.worker_id = options.worker_id;
    compression.num_workers = options.num_workers;
  }
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
  recovery.init_timeout = options.init_timeout;
  recovery.ps_addresses_fn = options.ps_addresses_fn;
  recovery.checkpoint_dir = options.checkpoint_dir;
  recovery.tensor_names = workload->TensorNames();
  recovery.tensor_shapes = workload->TensorShapes();
  recovery.num_buffers = workload->num_buffers();
  ModelState initial;
  if (recovery.max_restarts > 0 && options.worker_id == 0) {
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

// Resume: the newest checkpoint's data position (every worker: the step to
// start at) and state (worker 0, for the shards; allreduce: every worker,
// which holds it all), put into the weights. The state is stored per
// parameter, so a checkpoint of any mode loads.
absl::StatusOr<int64_t> ReadResume(const TrainerOptions& options,
                                   const RunKind& kind,
                                   const DataPositions& positions,
                                   Workload& workload, ModelState* state,
                                   std::string* dir, const LineFn& say) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadLatestCheckpoint(options.checkpoint_dir));
  *dir = manifest.dir;
  ASSIGN_OR_RETURN(const int64_t step,
                   positions.StepOf(manifest.position, manifest.dir));
  // Adam's m and v mean nothing to SGD, and SGD's buffer nothing to Adam.
  if (manifest.job.adam.kind != options.adam.kind) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest.dir, ": saved with optimizer ",
                     OptimizerName(manifest.job.adam.kind), "; this job has ",
                     OptimizerName(options.adam.kind),
                     ": its optimizer state cannot be restored"));
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
      say(absl::StrCat("Resuming from ", manifest.dir, " (step ", manifest.step,
                       ", epoch ", manifest.position.epoch, ")"));
    }
  }
  return step;
}

// Every worker's weights from the shards (or worker 0's, allreduce), in
// the model: a fresh or resumed start, or a restarted task's rejoin. The
// step to start at.
absl::StatusOr<int64_t> StartExchange(const TrainerOptions& options,
                                      const RunKind& kind,
                                      const DataPositions& positions,
                                      Workload& workload,
                                      GradientExchange& exchange,
                                      Recovery& recovery, const LineFn& say) {
  int64_t step = 0;
  ModelState resume_state;
  std::string resume_dir;
  if (options.resume) {
    ASSIGN_OR_RETURN(step, ReadResume(options, kind, positions, workload,
                                      &resume_state, &resume_dir, say));
  }
  if (options.rejoin && !kind.allreduce) {
    // A restarted task: the shards run already.
    ASSIGN_OR_RETURN(step, recovery.Rejoin(workload.weights()));
  } else {
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

// Worker 0's checkpoint writer (worker/checkpoint.h), and the checkpoints
// the job made durable before it (a restarted worker 0 goes on counting).
std::unique_ptr<CheckpointWriter> CreateCheckpointWriter(
    const TrainerOptions& options, const RunKind& kind, const Dataset& dataset,
    Workload* workload, GradientExchange* exchange, int64_t partition_bytes,
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
  writer->set_model_from_shards(
      !kind.allreduce && (options.staleness > 0 || options.backup_workers > 0));
  *checkpoints_before = 0;
  if (options.rejoin) {
    absl::StatusOr<CheckpointManifest> newest =
        ReadLatestCheckpoint(options.checkpoint_dir);
    if (newest.ok()) *checkpoints_before = newest->checkpoint_count;
  }
  writer->ContinueCount(*checkpoints_before);
  return writer;
}

// What the run is, in its result.
void DescribeRun(const TrainerOptions& options, const RunKind& kind,
                 const Dataset& dataset, const Workload& workload,
                 RunResult* result) {
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
  loop.tensor_names = workload.TensorNames();
  loop.inject_nonfinite = std::move(injection);
  return loop;
}

// Worker 0's evaluation after an epoch (StepLoop::EndEpochFn).
absl::Status EvaluateEpoch(Workload& workload, GradientExchange& exchange,
                           Reporter& reporter,
                           Reporter::EpochEvaluation epoch) {
  reporter.PauseTraining();
  // No stream may sit idle through the evaluation (see CloseStreams).
  RETURN_IF_ERROR(exchange.BeforePause());
  const absl::Time test_start = absl::Now();
  // The other workers wait at the next step's barrier (or have finished):
  // evaluate with every core.
  const int train_threads = omp_get_max_threads();
  omp_set_num_threads(omp_get_num_procs());
  absl::StatusOr<Evaluation> evaluated = workload.Evaluate();
  omp_set_num_threads(train_threads);
  ASSIGN_OR_RETURN(const Evaluation eval, std::move(evaluated));
  epoch.test_seconds = absl::ToDoubleSeconds(absl::Now() - test_start);
  epoch.test_loss = eval.loss;
  epoch.test_accuracy = eval.accuracy;
  RETURN_IF_ERROR(reporter.Evaluated(epoch));
  return reporter.ResumeTraining();
}

}  // namespace

absl::StatusOr<TrainerOutput> RunWorker(const TrainerOptions& options,
                                        const Dataset& dataset) {
  ASSIGN_OR_RETURN(const RunKind kind, KindOf(options));
  const bool chief = options.worker_id == 0;
  const LineFn say = ConsoleLines(options.log_line);
  std::unique_ptr<Workload> workload;
  if (kind.synthetic) {
    ASSIGN_OR_RETURN(workload, SyntheticWorkload::Create(options));
  } else {
    ASSIGN_OR_RETURN(workload, ModelWorkload::Create(options, dataset));
  }
  if (!options.init_from.empty()) {
    RETURN_IF_ERROR(workload->LoadModel(options.init_from));
  }
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
  const DataPositions positions(workload->steps_per_epoch(), options.epochs,
                                options.seed, options.batch_size,
                                options.num_workers);
  const bool checkpointing =
      options.checkpoint_every_steps > 0 || options.checkpoint_every_secs > 0;
  if ((options.resume || checkpointing) && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "checkpoints and resume need a checkpoint folder");
  }
  const std::unique_ptr<Recovery> recovery =
      CreateRecovery(options, kind, workload.get(), exchange.get(), say);
  ASSIGN_OR_RETURN(const int64_t start_step,
                   StartExchange(options, kind, positions, *workload, *exchange,
                                 *recovery, say));
  // Worker 0's checkpoints, due by CheckpointSchedule (time counted from
  // now).
  std::unique_ptr<CheckpointWriter> checkpoints;
  std::optional<CheckpointSchedule> schedule;
  int64_t checkpoints_before = 0;
  if (chief && checkpointing) {
    checkpoints = CreateCheckpointWriter(
        options, kind, dataset, workload.get(), exchange.get(),
        partition.partition_bytes, &checkpoints_before);
    recovery->set_checkpoint_writer(checkpoints.get());
    schedule.emplace(
        CheckpointSchedule::Options{options.checkpoint_every_steps,
                                    options.checkpoint_every_secs},
        positions,
        [&](int64_t step, const DataPosition& position) {
          RETURN_IF_ERROR(exchange->AwaitWeights());
          return checkpoints->Begin(step, position, workload->weights());
        },
        absl::Now());
  }
  TrainerOutput output;
  DescribeRun(options, kind, dataset, *workload, &output.result);
  if (!kind.allreduce) {
    output.result.set_partition_bytes(partition.partition_bytes);
  }
  if (partition.choice.has_value()) {
    for (const PartitionTrial& trial : partition.choice->trials) {
      PartitionTrialResult* row = output.result.add_partition_trials();
      row->set_partition_bytes(trial.partition_bytes);
      row->set_ms_per_step(trial.ms_per_step);
    }
  }
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
  if (chief && options.evaluate && workload->can_evaluate()) {
    parts.end_epoch = [&](int epoch, int64_t step, double train_seconds,
                          double train_loss) {
      Reporter::EpochEvaluation evaluation;
      evaluation.epoch = epoch;
      evaluation.step = step;
      evaluation.train_seconds = train_seconds;
      evaluation.train_loss = train_loss;
      return EvaluateEpoch(*workload, *exchange, *reporter, evaluation);
    };
  }
  StepLoop loop(
      StepLoopOptionsOf(options, kind, *workload, std::move(injection)),
      positions, std::move(parts));
  RETURN_IF_ERROR(loop.Run(start_step));
  RETURN_IF_ERROR(exchange->AwaitWeights());
  const int64_t steps = loop.step();
  const double train_seconds = reporter->TrainingSeconds();
  if (checkpoints != nullptr) {
    RETURN_IF_ERROR(checkpoints->Wait());
    reporter->CheckpointsWritten(checkpoints->completed(),
                                 checkpoints->latest_path());
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
