#include "worker/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "models/model.h"
#include "models/model_file.h"
#include "worker/checkpoint.h"
#include "worker/gradient_exchange.h"
#include "worker/input_pipeline.h"
#include "worker/metrics.h"
#include "worker/run_report.h"

namespace pstrain {
namespace {

// The test aid PSTRAIN_INJECT_NONFINITE="W:all" or "W:S1,S2,...": worker
// W's gradient of parameter 0 gets a NaN at every step or at steps S1,
// S2, ... (global steps). Unset or empty: nothing.
struct NonFiniteInjection {
  int worker = -1;
  bool every_step = false;
  std::vector<int64_t> steps;
  bool At(int worker_id, int64_t step) const {
    if (worker != worker_id) return false;
    return every_step ||
           std::find(steps.begin(), steps.end(), step) != steps.end();
  }
};

absl::StatusOr<NonFiniteInjection> ParseNonFiniteInjection() {
  NonFiniteInjection injection;
  const char* text = std::getenv("PSTRAIN_INJECT_NONFINITE");
  if (text == nullptr || *text == '\0') return injection;
  const auto bad = [text] {
    return absl::InvalidArgumentError(absl::StrCat(
        "PSTRAIN_INJECT_NONFINITE=\"", text,
        "\"; expected WORKER:all or WORKER:STEP[,STEP...] (a test aid)"));
  };
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &injection.worker) ||
      injection.worker < 0) {
    return bad();
  }
  if (parts[1] == "all") {
    injection.every_step = true;
    return injection;
  }
  for (absl::string_view step : absl::StrSplit(parts[1], ',')) {
    int64_t s;
    if (!absl::SimpleAtoi(step, &s) || s < 0) return bad();
    injection.steps.push_back(s);
  }
  return injection;
}

void Emit(const TrainerOptions& options, const std::string& line) {
  if (options.log_line) {
    options.log_line(line);
    return;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// What a worker computes each step: the real model (forward and backward
// on its batches), or a stand-in for a GPU that sleeps compute_ms and
// offers model-sized gradients (emulated-link runs, see trainer.h).
class Workload {
 public:
  virtual ~Workload() = default;
  // PS tensors: parameters, then num_buffers() BatchNorm buffers.
  virtual const std::vector<absl::Span<float>>& weights() = 0;
  virtual const std::vector<absl::Span<const float>>& gradients() = 0;
  virtual int num_buffers() const = 0;
  virtual std::vector<int64_t> TensorNumElements() const = 0;
  // PS tensors' names and shapes, for checkpoints.
  virtual std::vector<std::string> TensorNames() const = 0;
  virtual std::vector<std::vector<int64_t>> TensorShapes() const = 0;
  // Skips the next `n` batches of the epoch (a resumed run's position).
  virtual void SkipBatches(int64_t n) = 0;
  // Copies weights() into whatever computes with them.
  virtual absl::Status LoadWeights() = 0;
  virtual int64_t steps_per_epoch() const = 0;
  virtual void BeginEpoch(int epoch) = 0;
  // One step's compute; the training loss (0 for the stand-in). Calls
  // `on_ready` for every PS tensor as its gradient becomes final.
  virtual absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) = 0;
  // The last Step()'s forward and backward times, where measured.
  virtual StepPhases LastPhases() const { return {}; }
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
};

// A streamed split's pipeline: `threads` (at least 1) decoding, two
// batches per thread and two more prefetched, augmented as `augment`
// (checked by ModelWorkload::Create: StreamAugmentOptions).
InputPipelineOptions StreamInputOptions(const Dataset& dataset,
                                        int64_t batch_size, int threads,
                                        bool idle_priority,
                                        const std::string& augment = "") {
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
    ASSIGN_OR_RETURN(w->backend_,
                     Backend::Create(options.backend, options.gpu));
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
                  options_.augment.empty() || options_.augment == "none"
                      ? ""
                      : absl::StrCat(", augmented by ", options_.augment)));
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

absl::StatusOr<AugmentOptions> StreamAugmentOptions(
    const Dataset& dataset, const std::string& augment) {
  AugmentOptions options;
  if (augment.empty() || augment == "none") {
    options.crop = AugmentOptions::Crop::kResize;
    options.hflip = false;
  } else if (augment == "random_resized_crop") {
    options.crop = AugmentOptions::Crop::kRandomResizedCrop;
    options.hflip = true;
  } else if (augment == "pad_crop") {
    options.crop = AugmentOptions::Crop::kPadCrop;
    options.pad = 4;
    options.hflip = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("augment: \"", augment,
                     "\"; expected none, random_resized_crop or pad_crop"));
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

absl::StatusOr<TrainerOutput> RunWorker(const TrainerOptions& options,
                                        const Dataset& dataset) {
  const bool allreduce = options.mode == "allreduce";
  if (options.mode != "sync" && options.mode != "async" && !allreduce) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mode \"", options.mode, "\"; expected sync, async or allreduce"));
  }
  if (allreduce && options.collective == nullptr) {
    return absl::InvalidArgumentError(
        "mode allreduce needs the workers' collective");
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", options.batch_size, "; expected a positive number"));
  }
  const bool synthetic = options.compute == "synthetic";
  if (!synthetic && options.compute != "model") {
    return absl::InvalidArgumentError(absl::StrCat(
        "compute \"", options.compute, "\"; expected model or synthetic"));
  }
  const bool chief = options.worker_id == 0;
  std::unique_ptr<Workload> workload;
  if (synthetic) {
    ASSIGN_OR_RETURN(workload, SyntheticWorkload::Create(options));
  } else {
    ASSIGN_OR_RETURN(workload, ModelWorkload::Create(options, dataset));
  }
  const int num_buffers = workload->num_buffers();
  std::unique_ptr<GradientExchange> exchange;
  std::string placement;
  if (allreduce) {
    exchange = CreateAllreduceExchange(options.collective, options.adam,
                                       options.bucket_bytes, num_buffers,
                                       options.clip_grad_norm);
    placement = absl::StrFormat(
        "ring allreduce over %d workers, buckets of "
        "%d bytes",
        options.num_workers, options.bucket_bytes);
  } else {
    ASSIGN_OR_RETURN(
        PartitionPlan plan,
        PartitionPlan::Create(
            workload->TensorNumElements(), options.partition_bytes,
            static_cast<int>(options.ps_addresses.size()), num_buffers));
    placement = absl::StrFormat("%d chunks on %d shards", plan.chunks().size(),
                                plan.num_shards());
    PsClientOptions client_options;
    client_options.addresses = options.ps_addresses;
    client_options.job_id = options.job_id;
    client_options.worker_id = options.worker_id;
    client_options.rpc_timeout = options.rpc_timeout;
    client_options.credentials = options.ps_credentials;
    client_options.backup_workers =
        options.mode == "sync" && options.backup_workers > 0;
    client_options.clip_by_global_norm =
        options.mode == "sync" && options.clip_grad_norm > 0;
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                     PsClient::Create(client_options, plan));
    exchange = CreatePsExchange(std::move(client), options.mode == "sync",
                                chief, options.init_timeout, options.staleness,
                                client_options.backup_workers);
  }

  if (!options.init_from.empty()) {
    RETURN_IF_ERROR(workload->LoadModel(options.init_from));
  }
  const std::vector<absl::Span<float>>& weights = workload->weights();
  const std::vector<absl::Span<const float>>& gradients = workload->gradients();
  const int64_t steps_per_epoch = workload->steps_per_epoch();
  const int num_shards = static_cast<int>(options.ps_addresses.size());
  const bool checkpointing =
      options.checkpoint_every_steps > 0 || options.checkpoint_every_secs > 0;
  if ((options.resume || checkpointing) && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "checkpoints and resume need a checkpoint folder");
  }
  // Recovery (see TrainerOptions::max_restarts): what worker 0 restores the
  // shards to before the first checkpoint, the job's initial weights (the
  // same on a restarted worker 0: from `seed` or `init_from`).
  const bool recovers = options.max_restarts > 0 && !allreduce;
  ModelState initial_state;
  if (recovers && chief) {
    for (absl::Span<float> w : weights) {
      initial_state.weights.emplace_back(w.begin(), w.end());
    }
    initial_state.m.resize(weights.size());
    initial_state.v.resize(weights.size());
    initial_state.versions.resize(weights.size());
  }
  // Resume: the newest checkpoint's data position (every worker) and state
  // (worker 0, for the shards; allreduce: every worker, which holds it all).
  // The state is stored per parameter, so a checkpoint of any mode loads.
  int64_t start_step = 0;
  ModelState resume_state;
  if (options.resume) {
    ASSIGN_OR_RETURN(CheckpointManifest manifest,
                     ReadLatestCheckpoint(options.checkpoint_dir));
    const DataPosition& p = manifest.position;
    if (p.batch_size != options.batch_size ||
        p.num_workers != options.num_workers ||
        p.steps_per_epoch != steps_per_epoch || p.seed != options.seed) {
      return absl::InvalidArgumentError(absl::StrCat(
          manifest.dir, ": saved with batch size ", p.batch_size, ", ",
          p.num_workers, " workers, ", p.steps_per_epoch,
          " steps per epoch and seed ", p.seed, "; this job has ",
          options.batch_size, ", ", options.num_workers, ", ", steps_per_epoch,
          " and ", options.seed, ": its data position cannot be restored"));
    }
    // Adam's m and v mean nothing to SGD, and SGD's buffer nothing to Adam.
    if (manifest.job.adam.kind != options.adam.kind) {
      return absl::InvalidArgumentError(
          absl::StrCat(manifest.dir, ": saved with optimizer ",
                       OptimizerName(manifest.job.adam.kind), "; this job has ",
                       OptimizerName(options.adam.kind),
                       ": its optimizer state cannot be restored"));
    }
    start_step = p.epoch * steps_per_epoch + p.step_in_epoch;
    if (chief || allreduce) {
      ASSIGN_OR_RETURN(
          resume_state,
          LoadCheckpointState(manifest, workload->TensorNames(),
                              workload->TensorShapes(), num_buffers));
      for (size_t t = 0; t < weights.size(); ++t) {
        std::copy(resume_state.weights[t].begin(),
                  resume_state.weights[t].end(), weights[t].begin());
      }
      if (options.verbose) {
        Emit(options, absl::StrCat("Resuming from ", manifest.dir, " (step ",
                                   manifest.step, ", epoch ", p.epoch, ")"));
      }
    }
  }
  // Worker 0's state to restore the shards to: the newest checkpoint's, or
  // the initial one before the first.
  std::string restore_source;
  auto restore_state = [&]() -> absl::StatusOr<ModelState> {
    if (!options.checkpoint_dir.empty()) {
      absl::StatusOr<CheckpointManifest> manifest =
          ReadLatestCheckpoint(options.checkpoint_dir);
      if (manifest.ok()) {
        restore_source = manifest->dir;
        return LoadCheckpointState(*manifest, workload->TensorNames(),
                                   workload->TensorShapes(), num_buffers);
      }
      if (!absl::IsNotFound(manifest.status())) return manifest.status();
    }
    restore_source = "the initial weights (no checkpoint yet)";
    return initial_state;
  };
  // Worker 0, after a reconnect: what the shards went on from.
  auto say_how_restored = [&](int64_t version) {
    if (exchange->RecoveredInPlace()) {
      Emit(options,
           absl::StrCat("Reopened the shards at their own state, version ",
                        version, " (no rollback)"));
      return;
    }
    const std::string why = exchange->ReopenRefusal();
    // Async: the checkpoint's step is worker 0's, its version every
    // worker's pushes (the job goes on from version / num_workers).
    const std::string at =
        options.mode == "sync"
            ? ""
            : absl::StrCat("; version ", version, ", step ",
                           version / options.num_workers, " of each worker");
    Emit(options, absl::StrCat("Restored the shards to ", restore_source,
                               why.empty() ? "" : " (", why,
                               why.empty() ? "" : ")", at));
  };
  // The data position of a version pulled after a restore.
  auto step_of_version = [&](int64_t version) {
    return options.mode == "sync" ? version : version / options.num_workers;
  };
  std::unique_ptr<CheckpointWriter> checkpoints;
  // Reconnects after a failure (Recover) or as a restarted task (Rejoin):
  // attempts of at most 5 s each, with fresh addresses and a growing pause
  // between them, until init_timeout has passed; the smallest version
  // pulled.
  auto reconnect = [&](const ModelState* restore,
                       bool rejoin) -> absl::StatusOr<int64_t> {
    const absl::Time deadline = absl::Now() + options.init_timeout;
    absl::Duration pause = absl::Milliseconds(100);
    while (true) {
      std::vector<std::string> addresses;
      if (options.ps_addresses_fn) {
        ASSIGN_OR_RETURN(addresses, options.ps_addresses_fn());
      }
      const absl::Duration attempt = std::max(
          absl::Seconds(1), std::min(absl::Seconds(5), deadline - absl::Now()));
      absl::StatusOr<int64_t> version =
          rejoin ? exchange->Rejoin(weights, addresses, restore, attempt)
                 : exchange->Recover(addresses, restore, attempt);
      if (version.ok()) return version;
      const absl::Status& s = version.status();
      const bool again = absl::IsUnavailable(s) || absl::IsAborted(s) ||
                         absl::IsCancelled(s) || absl::IsDeadlineExceeded(s);
      if (!again || absl::Now() + pause > deadline) {
        return absl::Status(
            s.code(), absl::StrCat("reconnecting to the shards for ",
                                   absl::FormatDuration(options.init_timeout),
                                   ": ", s.message()));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Seconds(2));
    }
  };
  // After `cause` (a failed step), the step to go on from, or the error
  // that ends the run: not a failure a task's death explains, recovery
  // off, or too many recoveries.
  int recoveries = 0;
  const int max_recoveries = 2 * options.max_restarts + 2;
  auto recover = [&](absl::Status cause) -> absl::StatusOr<int64_t> {
    while (true) {
      const bool recoverable = absl::IsUnavailable(cause) ||
                               absl::IsAborted(cause) ||
                               absl::IsCancelled(cause);
      if (!recovers || !recoverable) return cause;
      if (recoveries >= max_recoveries) {
        return absl::Status(cause.code(),
                            absl::StrCat("gave up after ", recoveries,
                                         " recoveries: ", cause.message()));
      }
      ++recoveries;
      const absl::Time began = absl::Now();
      Emit(options,
           absl::StrCat("worker ", options.worker_id, ": step failed (",
                        cause.ToString(), "); recovering (", recoveries,
                        " of at most ", max_recoveries, ")"));
      if (checkpoints != nullptr) {
        // The checkpoint in flight may have lost a shard: it never becomes
        // `latest` then.
        if (absl::Status s = checkpoints->Wait(); !s.ok()) {
          Emit(options, absl::StrCat("checkpoint abandoned: ", s.ToString()));
        }
      }
      ModelState state;
      if (chief) {
        ASSIGN_OR_RETURN(state, restore_state());
      }
      absl::StatusOr<int64_t> version =
          reconnect(chief ? &state : nullptr, /*rejoin=*/false);
      if (!version.ok()) {
        cause = version.status();
        continue;
      }
      if (chief) say_how_restored(*version);
      RETURN_IF_ERROR(workload->LoadWeights());
      const int64_t step = step_of_version(*version);
      Emit(options,
           absl::StrFormat("worker %d: recovered in %.2f s; going on from "
                           "step %d (version %d)",
                           options.worker_id,
                           absl::ToDoubleSeconds(absl::Now() - began), step,
                           *version));
      return step;
    }
  };
  if (options.rejoin && !allreduce) {
    // A restarted task: the shards run already.
    ModelState state;
    if (chief) {
      ASSIGN_OR_RETURN(state, restore_state());
    }
    absl::StatusOr<int64_t> version =
        reconnect(chief ? &state : nullptr, /*rejoin=*/true);
    if (!version.ok()) return version.status();
    if (chief) say_how_restored(*version);
    start_step = step_of_version(*version);
    Emit(options, absl::StrCat("worker ", options.worker_id,
                               " rejoined the job at step ", start_step));
  } else {
    RETURN_IF_ERROR(exchange->Start(
        weights,
        (chief || allreduce) && options.resume ? &resume_state : nullptr));
  }
  RETURN_IF_ERROR(workload->LoadWeights());
  absl::Time last_checkpoint = absl::Now();
  int64_t checkpoints_before = 0;
  if (chief && checkpointing) {
    CheckpointJobInfo job;
    job.mode = options.mode;
    job.model = synthetic ? "synthetic" : options.model;
    job.dataset = synthetic ? "none" : dataset.name;
    // Allreduce: one file of the whole state (every worker holds it).
    job.num_shards = allreduce ? 1 : num_shards;
    job.partition_bytes = options.partition_bytes;
    job.adam = options.adam;
    job.tensor_names = workload->TensorNames();
    job.tensor_shapes = workload->TensorShapes();
    job.num_buffers = num_buffers;
    Workload* w = workload.get();
    checkpoints = std::make_unique<CheckpointWriter>(
        options.checkpoint_dir, options.keep_checkpoints, std::move(job),
        exchange.get(),
        [w](const std::vector<absl::Span<float>>& weights,
            const std::string& path, int64_t step,
            const safetensors::WriteOptions& write_options) {
          return w->SaveWeights(weights, path, step, write_options);
        });
    // Bounded staleness: worker 0's weights lag the cut (CheckpointWriter).
    checkpoints->set_model_from_shards(!allreduce && options.staleness > 0);
    // A restarted worker 0 goes on counting the job's checkpoints.
    if (options.rejoin) {
      absl::StatusOr<CheckpointManifest> newest =
          ReadLatestCheckpoint(options.checkpoint_dir);
      if (newest.ok()) checkpoints_before = newest->checkpoint_count;
    }
    checkpoints->ContinueCount(checkpoints_before);
  }
  const bool evaluate = options.evaluate && workload->can_evaluate();

  TrainerOutput output;
  RunResult& result = output.result;
  result.set_num_ps(allreduce ? 0
                              : static_cast<int>(options.ps_addresses.size()));
  result.set_num_workers(options.num_workers);
  result.set_mode(options.mode);
  result.set_model(synthetic ? "synthetic" : options.model);
  result.set_dataset(synthetic ? "none" : dataset.name);
  result.set_batch_size(options.batch_size);
  result.set_epochs(options.epochs);
  result.set_num_parameters(workload->num_parameters());
  result.set_compute(options.compute);
  result.set_train_samples(synthetic ? 0 : dataset.train.count);
  result.set_backend(options.backend);
  result.set_model_bytes([&] {
    int64_t elements = 0;
    for (int64_t n : workload->TensorNumElements()) elements += n;
    return elements * 4;
  }());
  if (chief && options.verbose) {
    Emit(options,
         absl::StrFormat("%s; %s; %d steps per epoch per worker",
                         workload->Describe(), placement, steps_per_epoch));
  }

  ASSIGN_OR_RETURN(const NonFiniteInjection injection,
                   ParseNonFiniteInjection());
  int64_t step = start_step;
  const GradientsReadyFn on_ready = [&](absl::Span<const int> tensors,
                                        std::shared_ptr<CopyFence> fence) {
    if (injection.At(options.worker_id, step) &&
        std::find(tensors.begin(), tensors.end(), 0) != tensors.end()) {
      // Parameter 0 (the first layer's, the last gradient backward makes,
      // so later layers' chunks have gone out already) gets a NaN.
      if (fence != nullptr) fence->Wait().IgnoreError();
      const_cast<float*>(gradients[0].data())[0] = std::nanf("");
    }
    exchange->GradientsReady(gradients, options.batch_size, tensors,
                             std::move(fence));
  };
  // Steps skipped for non-finite values (issue 22), in a row.
  int consecutive_skips = 0;
  const std::vector<std::string> tensor_names = workload->TensorNames();
  auto describe = [&](const SkippedStepInfo& skip) {
    const NonFiniteValue& v = skip.nonfinite;
    const std::string where =
        v.param_id < 0 ? "the loss"
        : v.param_id < static_cast<int>(tensor_names.size())
            ? absl::StrCat("element ", v.element, " of the gradient of ",
                           tensor_names[v.param_id])
            : absl::StrCat("element ", v.element, " of parameter ", v.param_id);
    const std::string who = skip.worker_id < 0
                                ? std::string("a worker's")
                                : absl::StrCat("worker ", skip.worker_id, "'s");
    return absl::StrCat("step ", skip.step, ": ", who, " ", where, " is ",
                        v.value);
  };
  // Worker 0's figures across recoveries (worker/run_report.h). Sync
  // without backup workers and allreduce: every worker trains every step,
  // counted here (the shards' count lags by the other workers' last pulls,
  // which may still be on their way when worker 0 has ended); otherwise
  // shard 0's count.
  RunReport::Options report_options;
  report_options.count_on_worker =
      allreduce || (options.mode == "sync" && options.backup_workers == 0);
  report_options.samples_per_step =
      int64_t{options.num_workers} * options.batch_size;
  report_options.checkpoints_before = checkpoints_before;
  auto shard_samples = [&]() -> absl::StatusOr<int64_t> {
    if (!chief || report_options.count_on_worker) return 0;
    return exchange->SamplesSoFar();
  };
  ASSIGN_OR_RETURN(const int64_t samples_at_start, shard_samples());
  RunReport report(report_options, absl::Now(), samples_at_start);
  // Metrics rows (worker/metrics.h): this worker's files, worker 0's lines.
  const int64_t total_steps = int64_t{options.epochs} * steps_per_epoch;
  StepMetrics step_metrics(options.batch_size, options.adam.lr);
  std::unique_ptr<MetricsWriter> metrics;
  if (!options.metrics_dir.empty()) {
    ASSIGN_OR_RETURN(metrics, MetricsWriter::Create(
                                  options.metrics_dir, options.worker_id,
                                  /*append=*/options.resume || options.rejoin));
  }
  // Backup workers: steps this worker ended late (dropped by the shards),
  // and the steps its last step jumped over.
  int64_t late_steps = 0;
  int64_t jumped = 0;
  absl::Duration compute_time;
  absl::Duration exchange_time;
  int64_t timed_steps = 0;
  for (int epoch = static_cast<int>(start_step / steps_per_epoch);
       epoch < options.epochs; ++epoch) {
    absl::Time epoch_start = absl::Now();
    double loss_sum = 0;
    workload->BeginEpoch(epoch);
    const int64_t first = step - int64_t{epoch} * steps_per_epoch;
    workload->SkipBatches(first);
    // One step of the epoch; an error may be recovered from (below).
    auto train_step = [&](int64_t i) -> absl::Status {
      trace::Scope traced_step("step", "step", {{"step", step}});
      const absl::Time step_start = absl::Now();
      if (options.worker_id == options.straggler_worker) {
        // The straggler test aid: slower by a known time per step.
        absl::SleepFor(absl::Milliseconds(options.straggler_delay_ms));
      }
      ASSIGN_OR_RETURN(float loss, workload->Step(on_ready));
      const absl::Time computed = absl::Now();
      if (!std::isfinite(loss)) {
        NonFiniteValue value;
        value.value = NonFiniteText(loss);
        exchange->MarkStepNonFinite(value);
      }
      RETURN_IF_ERROR(exchange->Step(gradients, options.batch_size));
      RETURN_IF_ERROR(workload->LoadWeights());
      const absl::Time exchanged = absl::Now();
      trace::Complete("exchange", "step", absl::ToUnixMicros(computed),
                      absl::ToUnixMicros(exchanged), {{"step", step}});
      StepPhases phases = workload->LastPhases();
      const ExchangeStepTimes exchange_times = exchange->LastStepTimes();
      phases.push = exchange_times.push;
      phases.barrier_wait = exchange_times.barrier_wait;
      phases.pull = exchange_times.pull;
      phases.allreduce = exchange_times.allreduce;
      phases.bytes_pushed = exchange_times.bytes_pushed;
      phases.bytes_pulled = exchange_times.bytes_pulled;
      std::optional<SkippedStepInfo> skipped = exchange->SkippedStep();
      if (skipped.has_value()) {
        // Async: the shards' version is no step of this worker's; name
        // the worker's own.
        const bool async = options.mode == "async";
        if (async) skipped->step = step;
        ++consecutive_skips;
        if (skipped->worker_id == options.worker_id) {
          Emit(options,
               absl::StrCat(
                   "worker ", options.worker_id, ": ", describe(*skipped),
                   async       ? "; its pushes from there on are dropped ("
                   : allreduce ? "; the step is skipped on every worker ("
                               : "; the step is skipped on every shard (",
                   consecutive_skips, " in a row; at most ",
                   options.max_nonfinite_steps, ")"));
        }
        if (consecutive_skips > options.max_nonfinite_steps) {
          return absl::FailedPreconditionError(
              absl::StrCat(consecutive_skips,
                           " consecutive steps skipped for non-finite values "
                           "(--max_nonfinite_steps=",
                           options.max_nonfinite_steps,
                           "); the last: ", describe(*skipped)));
        }
      } else {
        consecutive_skips = 0;
        loss_sum += loss;
      }
      step_metrics.AddStep(synthetic || skipped.has_value()
                               ? std::nullopt
                               : std::optional<double>(loss),
                           computed - step_start, exchanged - computed, phases);
      // The first step (connections, first allocations) is warm-up.
      if (step > 0 || steps_per_epoch * options.epochs == 1) {
        compute_time += computed - step_start;
        exchange_time += exchanged - computed;
        ++timed_steps;
      }
      // Backup workers: a worker the shards left behind goes on from
      // their version.
      const int64_t next = exchange->NextStep(step);
      jumped = next - step - 1;
      if (exchange->LastStepLate()) ++late_steps;
      step = next;
      const bool checkpoint_due =
          (options.checkpoint_every_steps > 0 &&
           step % options.checkpoint_every_steps == 0) ||
          (options.checkpoint_every_secs > 0 &&
           absl::Now() - last_checkpoint >=
               absl::Seconds(options.checkpoint_every_secs));
      if (checkpoints != nullptr && checkpoint_due &&
          step < int64_t{options.epochs} * steps_per_epoch) {
        last_checkpoint = absl::Now();
        DataPosition position;
        position.epoch = step / steps_per_epoch;
        position.step_in_epoch = step % steps_per_epoch;
        position.steps_per_epoch = steps_per_epoch;
        position.seed = options.seed;
        position.batch_size = options.batch_size;
        position.num_workers = options.num_workers;
        RETURN_IF_ERROR(checkpoints->Begin(step, position, weights));
      }
      report.StepTrained();
      if (options.on_progress) {
        const double seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
        options.on_progress(
            step, options.batch_size * (i + 1) / std::max(seconds, 1e-9));
      }
      const bool log_step =
          options.log_every_steps > 0 && step % options.log_every_steps == 0;
      if (log_step || (metrics != nullptr && step == total_steps)) {
        MetricsRow row = step_metrics.TakeInterval(step, epoch);
        // The scheduled lr of the interval's last update, as StepMetrics
        // keeps a float's decimal.
        row.lr = std::stod(absl::StrFormat(
            "%.7g", static_cast<float>(ScheduledLr(options.adam, step - 1))));
        if (chief && log_step) {
          ASSIGN_OR_RETURN(const int64_t samples, shard_samples());
          row.job_samples_per_sec =
              report.TakeWindowSamplesPerSec(absl::Now(), samples);
          if (options.verbose) {
            Emit(options, absl::StrFormat("Step%d: %.2f data/sec", step,
                                          *row.job_samples_per_sec) +
                              FormatStepDetails(row, total_steps));
          }
        }
        if (metrics != nullptr) RETURN_IF_ERROR(metrics->Write(row));
      }
      return absl::OkStatus();
    };
    bool rolled_back = false;
    for (int64_t i = first; i < steps_per_epoch; ++i) {
      if (absl::Status s = train_step(i); !s.ok()) {
        ASSIGN_OR_RETURN(step, recover(s));
        ASSIGN_OR_RETURN(const int64_t samples, shard_samples());
        report.Recovered(absl::Now(), samples);
        rolled_back = true;
        break;
      }
      if (jumped > 0) {
        // The batches of the steps taken without this worker; past the
        // epoch's end the next epoch skips the rest.
        const int64_t in_epoch = std::min(jumped, steps_per_epoch - 1 - i);
        workload->SkipBatches(in_epoch);
        i += in_epoch;
        jumped = 0;
      }
    }
    if (rolled_back) {
      epoch = static_cast<int>(step / steps_per_epoch) - 1;  // then ++epoch
      continue;
    }
    // The training time since the last epoch's end: recoveries and redone
    // steps included, so that the epochs add up to the Runtime.
    const double epoch_seconds = report.TakeEpochSeconds(absl::Now());
    absl::Status evaluated_epoch = [&]() -> absl::Status {
      if (!(chief && evaluate)) return absl::OkStatus();
      report.Pause(absl::Now());
      // No stream may sit idle through the evaluation (see CloseStreams).
      RETURN_IF_ERROR(exchange->BeforePause());
      const absl::Time test_start = absl::Now();
      // The other workers wait at the next step's barrier (or have
      // finished): evaluate with every core.
      const int train_threads = omp_get_max_threads();
      omp_set_num_threads(omp_get_num_procs());
      absl::StatusOr<Evaluation> evaluated = workload->Evaluate();
      omp_set_num_threads(train_threads);
      ASSIGN_OR_RETURN(Evaluation eval, std::move(evaluated));
      const double test_seconds =
          absl::ToDoubleSeconds(absl::Now() - test_start);
      EpochResult* e = result.add_epoch_results();
      e->set_epoch(epoch);
      e->set_train_seconds(epoch_seconds);
      e->set_test_seconds(test_seconds);
      e->set_test_accuracy(eval.accuracy);
      e->set_test_loss(eval.loss);
      e->set_train_loss(loss_sum / steps_per_epoch);
      result.set_test_accuracy(eval.accuracy);
      if (options.on_epoch) options.on_epoch(result);
      if (metrics != nullptr) {
        RETURN_IF_ERROR(metrics->Write(
            step_metrics.EvaluationRow(step, epoch, eval.loss, eval.accuracy)));
      }
      if (options.verbose) {
        Emit(options, absl::StrFormat(
                          "Epoch %d in %.2f sec, test time %.2f sec, test "
                          "accuracy: %.4f",
                          epoch, epoch_seconds, test_seconds, eval.accuracy));
      }
      // Evaluation time is not training time: restart the throughput window.
      ASSIGN_OR_RETURN(const int64_t samples, shard_samples());
      report.Resume(absl::Now(), samples);
      return absl::OkStatus();
    }();
    if (!evaluated_epoch.ok()) {
      report.Resume(absl::Now(), 0);  // a recovery is training time
      ASSIGN_OR_RETURN(step, recover(evaluated_epoch));
      ASSIGN_OR_RETURN(const int64_t samples, shard_samples());
      report.Recovered(absl::Now(), samples);
      epoch = static_cast<int>(step / steps_per_epoch) - 1;  // then ++epoch
    }
  }
  const double train_seconds = report.training_seconds(absl::Now());
  if (checkpoints != nullptr) {
    RETURN_IF_ERROR(checkpoints->Wait());
    if (options.verbose && checkpoints->completed() > 0) {
      Emit(options,
           absl::StrCat(
               "Wrote ", report.checkpoints(checkpoints->completed()),
               " checkpoints; the newest: ", checkpoints->latest_path()));
    }
  }
  if (late_steps > 0 && options.verbose) {
    Emit(options,
         absl::StrCat("worker ", options.worker_id, ": ", late_steps,
                      " steps ended late (their gradients dropped: ",
                      options.num_workers - options.backup_workers, " of ",
                      options.num_workers, " workers per step)"));
  }
  result.set_steps(step);
  result.set_runtime_seconds(train_seconds);
  if (timed_steps > 0) {
    result.set_compute_seconds_per_step(absl::ToDoubleSeconds(compute_time) /
                                        timed_steps);
    result.set_exchange_seconds_per_step(absl::ToDoubleSeconds(exchange_time) /
                                         timed_steps);
  }
  if (chief) {
    // Samples of every worker, redone steps included (RunReport).
    ASSIGN_OR_RETURN(const int64_t samples, shard_samples());
    result.set_throughput_samples_per_sec(report.samples(samples) /
                                          std::max(train_seconds, 1e-9));
  }
  for (absl::Span<float> w : weights) {
    output.final_weights.emplace_back(w.begin(), w.end());
  }
  if (chief && !options.model_out.empty()) {
    RETURN_IF_ERROR(workload->SaveModel(options.model_out, step));
    if (options.verbose) {
      Emit(options, absl::StrCat("Saved the trained model (", step,
                                 " steps) to ", options.model_out));
    }
  }
  RETURN_IF_ERROR(exchange->Finish());
  return output;
}

}  // namespace pstrain
