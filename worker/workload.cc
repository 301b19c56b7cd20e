#include "worker/workload.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
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
#include "catalog/catalog.h"
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
#include "worker/token_dataset.h"

namespace pstrain {
namespace {

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

// The fixed masking of every evaluation (the same masks each epoch, and in
// every run of a test split, whatever the job's seed).
constexpr uint64_t kEvalMaskSeed = 0x7E57;

// MLM loss (mean over the masked tokens) and masked-token accuracy of
// `model` over `dataset`'s token test split, in batches of `eval_batch`.
absl::StatusOr<Evaluation> EvaluateMlm(Model& model, const Dataset& dataset,
                                       int eval_batch) {
  const TokenSplit& test = dataset.tokens->test;
  ASSIGN_OR_RETURN(const MlmMasker masker,
                   MlmMasker::Create(dataset.tokens->vocab_size, {}));
  std::vector<SampleIndex> indices(test.count);
  for (int64_t i = 0; i < test.count; ++i) indices[i] = i;
  const SampleOrder in_order(std::move(indices));
  double loss_sum = 0;
  int64_t masked = 0, correct = 0;
  PredictedTokens predicted;
  for (int64_t begin = 0; begin < test.count; begin += eval_batch) {
    const int64_t n = std::min<int64_t>(eval_batch, test.count - begin);
    const MlmBatch batch =
        TokenBatch(test, in_order, begin, n, masker, kEvalMaskSeed, 0);
    // The head runs at the masked tokens only (Model::ForwardAt).
    FindPredictedTokens(batch.labels, &predicted);
    if (predicted.positions.empty()) continue;
    ASSIGN_OR_RETURN(
        const Tensor* logits,
        model.ForwardAt(batch.ids, batch.padding_mask, predicted.positions));
    const int64_t vocab = logits->shape[1];
    for (size_t p = 0; p < predicted.labels.size(); ++p) {
      const int32_t label = predicted.labels[p];
      const float* row = &logits->data[p * vocab];
      const float top = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t k = 0; k < vocab; ++k) sum += std::exp(double{row[k]} - top);
      loss_sum += std::log(sum) + top - row[label];
      correct += row[label] == top;
      ++masked;
    }
  }
  Evaluation eval;
  eval.loss = loss_sum / std::max<int64_t>(masked, 1);
  eval.accuracy = static_cast<double>(correct) / std::max<int64_t>(masked, 1);
  return eval;
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
    RETURN_IF_ERROR(CheckModelTakesDataset(options.model, dataset));
    auto w = absl::WrapUnique(new ModelWorkload(options, dataset));
    if (dataset.tokens != nullptr) {
      ASSIGN_OR_RETURN(w->masker_,
                       MlmMasker::Create(dataset.tokens->vocab_size, {}));
    }
    ASSIGN_OR_RETURN(w->backend_, CreateBackend(options.backend, options.gpu));
    RETURN_IF_ERROR(w->backend_->SetPrecision(options.precision));
    ModelOptions model_options;
    model_options.seed = options.seed;
    model_options.dropout_seed = options.seed * 7919 + options.worker_id;
    model_options.transformer_dropout = options.transformer_dropout;
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
  std::vector<int64_t> TensorRowElements() const override {
    return model_->PsTensorRowElements();
  }
  bool BatchRows(int64_t ahead,
                 std::vector<std::vector<uint32_t>>* rows) override {
    if (dataset_.tokens == nullptr || ahead < 0 ||
        next_batch_ + ahead >= slice_steps_) {
      return false;
    }
    // The ids the batch's embedding reads (every position's, padding's
    // too): the rows of the tables' gradient (torch.nn.Embedding's sparse
    // gradient has the same indices).
    const MlmBatch batch =
        TokenBatch(dataset_.tokens->train, indices_,
                   (next_batch_ + ahead) * options_.batch_size,
                   options_.batch_size, *masker_, options_.seed, epoch_);
    std::vector<uint32_t> ids(batch.ids.data.begin(), batch.ids.data.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const std::vector<int64_t> row_elements = model_->PsTensorRowElements();
    rows->assign(row_elements.size(), {});
    bool any = false;
    for (size_t p = 0; p < row_elements.size(); ++p) {
      if (row_elements[p] == 0) continue;
      (*rows)[p] = ids;
      any = true;
    }
    return any;
  }
  std::vector<std::vector<int64_t>> TensorShapes() const override {
    return model_->PsTensorShapes();
  }
  void SkipBatches(int64_t n) override {
    taken_ += n;
    if (dataset_.tokens != nullptr) {
      next_batch_ += n;  // A token batch is a function of its position.
      return;
    }
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
  void SetLossScale(float scale) override { model_->set_loss_scale(scale); }
  bool can_gate_weights() const override { return true; }
  void SetWeightsGate(WeightsGate* gate) override {
    model_->set_weights_gate(gate);
  }
  int64_t samples_per_epoch() const override { return dataset_.train.count; }
  void BeginEpoch(const EpochSlice& slice) override {
    prefetcher_.reset();
    pipeline_.reset();
    const int epoch = slice.epoch;
    slice_steps_ = slice.steps;
    taken_ = 0;
    indices_ =
        sampler_.EpochSlice(epoch, slice.offset, slice.rank, slice.members,
                            slice.steps * options_.batch_size);
    epoch_ = epoch;
    next_batch_ = 0;
    if (dataset_.tokens != nullptr) return;  // Masked as each step begins.
    if (dataset_.train.files != nullptr) {
      // Streamed: the files of the next batches are decoded on the input
      // threads while this one trains.
      InputPipelineOptions input = StreamInputOptions(
          dataset_, options_.batch_size, options_.input_threads,
          options_.input_idle_priority, options_.augment);
      input.seed = options_.seed * 104729 + epoch * 131 + options_.worker_id;
      absl::StatusOr<std::unique_ptr<InputPipeline>> pipeline =
          InputPipeline::Create(*dataset_.train.files, indices_, slice_steps_,
                                input);
      if (pipeline.ok()) {
        pipeline_ = *std::move(pipeline);
      } else {
        pipeline_error_ = pipeline.status();
      }
      return;
    }
    // The next batches are gathered (and augmented) on a background thread.
    prefetcher_ = std::make_unique<BatchPrefetcher>(
        dataset_.train, indices_, options_.batch_size, slice_steps_,
        dataset_.augment,
        options_.seed * 104729 + epoch * 131 + options_.worker_id);
  }
  std::vector<uint32_t> LastBatchSamples() const override {
    std::vector<SampleIndex> samples;
    const int64_t b = options_.batch_size;
    for (int64_t k = (taken_ - 1) * b; taken_ > 0 && k < taken_ * b; ++k) {
      if (k < indices_.size()) samples.push_back(indices_[k]);
    }
    return samples;
  }
  absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) override {
    ++taken_;
    if (dataset_.tokens != nullptr) {
      if (next_batch_ >= slice_steps_) {
        return absl::InternalError("token batches ended before the epoch");
      }
      token_batch_ = TokenBatch(
          dataset_.tokens->train, indices_, next_batch_ * options_.batch_size,
          options_.batch_size, *masker_, options_.seed, epoch_);
      ++next_batch_;
      return model_->ForwardBackward(token_batch_.ids,
                                     token_batch_.padding_mask,
                                     token_batch_.labels, on_ready);
    }
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
  bool can_evaluate() const override { return TestSamples(dataset_) > 0; }
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
    // The pixels the weights were trained on were standardised with these.
    info.input_mean = dataset_.channel_mean;
    info.input_stddev = dataset_.channel_stddev;
    return SaveModelFile(*model_, weights, info, path, write_options);
  }
  std::string Describe() const override {
    return absl::StrFormat(
        "model %s on %s: %d parameters, %d buffers, %.2f MFLOPs forward per "
        "sample%s",
        options_.model, backend_->name(), model_->NumParameters(),
        model_->buffers().size(), 2.0 * model_->ForwardMacsPerSample() / 1e6,
        dataset_.tokens != nullptr
            ? absl::StrFormat("; %d sequences of %d tokens, vocabulary %d",
                              dataset_.train.count, dataset_.tokens->seq_len,
                              dataset_.tokens->vocab_size)
        : dataset_.train.files == nullptr
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
  // The batches of the epoch's slice BeginEpoch() began.
  int64_t slice_steps_ = 0;
  // Batches of the slice taken (trained or skipped).
  int64_t taken_ = 0;
  SampleOrder indices_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;
  BatchPrefetcher::Batch batch_;
  // Streamed datasets instead of the prefetcher.
  std::unique_ptr<InputPipeline> pipeline_;
  absl::Status pipeline_error_;
  InputPipeline::Batch stream_batch_;
  // Token datasets: the epoch, the next batch's index in it, BERT's
  // masking and the batch of the step.
  int epoch_ = 0;
  int64_t next_batch_ = 0;
  std::optional<MlmMasker> masker_;
  MlmBatch token_batch_;
};

class SyntheticWorkload : public Workload {
 public:
  static absl::StatusOr<std::unique_ptr<Workload>> Create(
      const TrainerOptions& options) {
    if (!options.synthetic_layers &&
        (options.model_bytes < 4 || options.model_bytes % 4 != 0)) {
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
    std::vector<int64_t> weights;  // of each tensor's time
    if (options.synthetic_layers) {
      RETURN_IF_ERROR(w->ShapeLike(options.model, &weights));
    } else {
      int64_t left = options.model_bytes / 4;
      while (left > 0) {
        const int64_t n = std::min(left, kTensorElements);
        w->sizes_.push_back(n);
        left -= n;
      }
      weights = w->sizes_;
    }
    double total = 0;
    for (int64_t x : weights) total += static_cast<double>(x);
    for (int64_t x : weights) {
      w->shares_.push_back(static_cast<double>(x) / total);
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
    if (!names_.empty()) return names_;
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
  int64_t samples_per_epoch() const override { return 0; }
  void BeginEpoch(const EpochSlice&) override {}
  // Priority pulls (PsExchange's early forward): the forward below waits
  // for each tensor's weights before its share.
  bool can_gate_weights() const override { return true; }
  void SetWeightsGate(WeightsGate* gate) override { gate_ = gate; }

  // Forward (the first 1 - backward_fraction of the step): a sleep; with a
  // weights gate (priority pulls), tensor by tensor, first first, each
  // share (shares_) once its weights are in, as a model's layers ask
  // (Model::ForwardBackward), then a wait for the whole pull. Backward
  // (the rest): each tensor, last first, is announced once its share of
  // the backward time (shares_) has passed, measured from the backward's
  // start so that announcing does not add to the step. Without a backward
  // fraction, every gradient at once when the sleep ends. A gate's error
  // (the pull's) ends the step.
  absl::StatusOr<float> Step(const GradientsReadyFn& on_ready) override {
    const absl::Duration step = absl::Milliseconds(options_.compute_ms);
    const absl::Duration backward = step * options_.backward_fraction;
    const absl::Duration forward = step - backward;

    absl::Time at = absl::Now();  // where the forward has got to
    if (gate_ != nullptr) {
      for (size_t t = 0; t < sizes_.size(); ++t) {
        RETURN_IF_ERROR(gate_->AwaitTensor(static_cast<int>(t)));
        at = std::max(at, absl::Now()) + forward * shares_[t];
        absl::SleepFor(at - absl::Now());
      }
      RETURN_IF_ERROR(gate_->AwaitAll());
      at = std::max(at, absl::Now());
    } else {
      at += forward;
    }
    if (backward > absl::ZeroDuration()) {
      double done = 0;
      for (int t : all_tensors_) {
        done += shares_[t];
        absl::SleepFor(at + backward * done - absl::Now());
        on_ready(absl::MakeConstSpan(&t, 1), nullptr);
      }
    }
    absl::SleepFor(at + backward - absl::Now());
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
  int64_t num_parameters() const override {
    int64_t n = 0;
    for (int64_t s : sizes_) n += s;
    return n;
  }
  std::string Describe() const override {
    return absl::StrFormat(
        "synthetic compute: %.1f ms per step (the last %.0f%% a backward "
        "pass), %d bytes of gradients in %d tensors%s",
        options_.compute_ms, options_.backward_fraction * 100,
        4 * num_parameters(), sizes_.size(),
        options_.synthetic_layers
            ? absl::StrCat(" shaped like ", options_.model,
                           "'s (time by multiply-accumulates)")
            : "");
  }

 private:
  // Tensors of at most 1 MiB (ResNet-50's 161 average 0.63 MB).
  static constexpr int64_t kTensorElements = 1 << 18;

  explicit SyntheticWorkload(const TrainerOptions& options)
      : options_(options) {}

  // sizes_ and names_ become `model`'s PS tensors (built on the CPU backend
  // on Fashion-MNIST's input, a bert_* model on 128 tokens of BERT's
  // vocabulary; JobSpec.synthetic_layers), `time_weights` each one's
  // forward multiply-accumulates. INVALID_ARGUMENT for an unknown model or
  // one that counts none.
  absl::Status ShapeLike(const std::string& model,
                         std::vector<int64_t>* time_weights) {
    std::unique_ptr<Backend> cpu = NewCpuBackend();
    const bool sequence = IsSequenceModel(model);
    absl::StatusOr<std::unique_ptr<Model>> built =
        Model::Create(model, sequence ? Shape{kSequence} : Shape{1, 28, 28},
                      sequence ? kVocabulary : 10, ModelOptions(), cpu.get());
    if (!built.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic compute shaped like model ", model, ": ",
                       built.status().message()));
    }
    sizes_ = (*built)->PsTensorNumElements();
    names_ = (*built)->PsTensorNames();
    *time_weights = (*built)->ForwardMacsPerPsTensor();
    int64_t macs = 0;
    for (int64_t m : *time_weights) macs += m;
    if (macs <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic compute shaped like model ", model,
                       ": it counts no multiply-accumulates to share the "
                       "step's time by"));
    }
    return absl::OkStatus();
  }

  static constexpr int64_t kSequence = 128;
  static constexpr int kVocabulary = 30522;

  const TrainerOptions& options_;
  WeightsGate* gate_ = nullptr;  // not owned; null: no priority pulls
  std::vector<int64_t> sizes_;
  std::vector<std::string> names_;  // a model's (synthetic_layers)
  // Each tensor's share of the forward and of the backward time (sum 1):
  // by size, or by its layer's multiply-accumulates (synthetic_layers).
  std::vector<double> shares_;
  std::vector<int> all_tensors_;  // Last first, as backward.
  std::vector<std::vector<float>> weight_storage_;
  std::vector<std::vector<float>> gradient_storage_;
  std::vector<absl::Span<float>> weights_;
  std::vector<absl::Span<const float>> gradients_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Workload>> CreateModelWorkload(
    const TrainerOptions& options, const Dataset& dataset) {
  return ModelWorkload::Create(options, dataset);
}

absl::StatusOr<std::unique_ptr<Workload>> CreateSyntheticWorkload(
    const TrainerOptions& options) {
  return SyntheticWorkload::Create(options);
}

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

int64_t TestSamples(const Dataset& dataset) {
  return dataset.tokens != nullptr ? dataset.tokens->test.count
                                   : dataset.test.count;
}

absl::StatusOr<Evaluation> EvaluateModel(Model& model, const Dataset& dataset,
                                         int eval_batch, int input_threads) {
  if (TestSamples(dataset) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dataset.name, " has no test split to evaluate on"));
  }
  if (dataset.tokens != nullptr) {
    RETURN_IF_ERROR(CheckModelTakesDataset(model.name(), dataset));
    return EvaluateMlm(model, dataset, eval_batch);
  }
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

}  // namespace pstrain
