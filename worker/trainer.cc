#include "worker/trainer.h"

#include <omp.h>

#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "models/model.h"
#include "worker/gradient_exchange.h"

namespace pstrain {
namespace {

void Emit(const TrainerOptions& options, const std::string& line) {
  if (options.log_line) {
    options.log_line(line);
    return;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

struct Evaluation {
  double accuracy = 0;
  double loss = 0;
};

absl::StatusOr<Evaluation> Evaluate(Model& model, const LabeledImages& test,
                                    int eval_batch) {
  Evaluation eval;
  int64_t correct = 0;
  double loss_sum = 0;
  std::vector<int64_t> indices(test.count);
  for (int64_t i = 0; i < test.count; ++i) indices[i] = i;
  Tensor images;
  std::vector<int32_t> labels;
  for (int64_t begin = 0; begin < test.count; begin += eval_batch) {
    const int64_t n = std::min<int64_t>(eval_batch, test.count - begin);
    GatherBatch(test, indices, begin, n, &images, &labels);
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

}  // namespace

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
  const bool chief = options.worker_id == 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   Backend::Create(options.backend, options.gpu));
  ModelOptions model_options;
  model_options.seed = options.seed;
  model_options.dropout_seed = options.seed * 7919 + options.worker_id;
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      Model::Create(options.model, dataset.train.chw, dataset.num_classes,
                    model_options, backend.get()));
  const int num_buffers = static_cast<int>(model->buffers().size());
  std::unique_ptr<GradientExchange> exchange;
  std::string placement;
  if (allreduce) {
    exchange = CreateAllreduceExchange(options.collective, options.adam,
                                       options.bucket_bytes, num_buffers);
    placement = absl::StrFormat(
        "ring allreduce over %d workers, buckets of "
        "%d bytes",
        options.num_workers, options.bucket_bytes);
  } else {
    ASSIGN_OR_RETURN(
        PartitionPlan plan,
        PartitionPlan::Create(
            model->PsTensorNumElements(), options.partition_bytes,
            static_cast<int>(options.ps_addresses.size()), num_buffers));
    placement = absl::StrFormat("%d chunks on %d shards", plan.chunks().size(),
                                plan.num_shards());
    PsClientOptions client_options;
    client_options.addresses = options.ps_addresses;
    client_options.job_id = options.job_id;
    client_options.worker_id = options.worker_id;
    client_options.rpc_timeout = options.rpc_timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                     PsClient::Create(client_options, plan));
    exchange = CreatePsExchange(std::move(client), options.mode == "sync",
                                chief, options.init_timeout);
  }

  const std::vector<absl::Span<float>>& weights = model->HostWeights();
  const std::vector<absl::Span<const float>>& gradients =
      model->HostGradients();
  RETURN_IF_ERROR(exchange->Start(weights));
  RETURN_IF_ERROR(model->LoadHostWeights());

  const ShardedSampler sampler(dataset.train.count, options.worker_id,
                               options.num_workers, options.seed);
  int64_t steps_per_epoch = sampler.samples_per_worker() / options.batch_size;
  if (options.max_steps_per_epoch > 0) {
    steps_per_epoch = std::min(steps_per_epoch, options.max_steps_per_epoch);
  }
  if (steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", options.batch_size, " is larger than this worker's ",
        sampler.samples_per_worker(), " training samples"));
  }

  TrainerOutput output;
  RunResult& result = output.result;
  result.set_num_ps(allreduce ? 0
                              : static_cast<int>(options.ps_addresses.size()));
  result.set_num_workers(options.num_workers);
  result.set_mode(options.mode);
  result.set_model(options.model);
  result.set_dataset(dataset.name);
  result.set_batch_size(options.batch_size);
  result.set_epochs(options.epochs);
  result.set_num_parameters(model->NumParameters());
  if (chief && options.verbose) {
    Emit(options,
         absl::StrFormat(
             "model %s on %s: %d parameters, %d buffers, %.2f MFLOPs forward "
             "per sample; %s; %d steps per epoch per worker",
             options.model, backend->name(), model->NumParameters(),
             model->buffers().size(), 2.0 * model->ForwardMacsPerSample() / 1e6,
             placement, steps_per_epoch));
  }

  int64_t samples_at_start = 0;
  if (chief) {
    ASSIGN_OR_RETURN(samples_at_start, exchange->SamplesSoFar());
  }
  int64_t window_samples = samples_at_start;
  absl::Time window_start = absl::Now();
  int64_t step = 0;
  double train_seconds = 0;
  BatchPrefetcher::Batch batch;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    const std::vector<int64_t> indices = sampler.EpochIndices(epoch);
    const absl::Time epoch_start = absl::Now();
    double loss_sum = 0;
    // The next batches are gathered (and augmented) on a background thread.
    BatchPrefetcher prefetcher(
        dataset.train, indices, options.batch_size, steps_per_epoch,
        dataset.augment,
        options.seed * 104729 + epoch * 131 + options.worker_id);
    for (int64_t i = 0; i < steps_per_epoch; ++i) {
      if (!prefetcher.Next(&batch)) {
        return absl::InternalError("prefetcher ended before the epoch");
      }
      ASSIGN_OR_RETURN(float loss,
                       model->ForwardBackward(batch.images, batch.labels));
      loss_sum += loss;
      RETURN_IF_ERROR(exchange->Step(gradients, options.batch_size, weights));
      RETURN_IF_ERROR(model->LoadHostWeights());
      ++step;
      if (options.on_progress) {
        const double seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
        options.on_progress(
            step, options.batch_size * (i + 1) / std::max(seconds, 1e-9));
      }
      if (chief && options.log_every_steps > 0 &&
          step % options.log_every_steps == 0) {
        ASSIGN_OR_RETURN(const int64_t samples, exchange->SamplesSoFar());
        const absl::Time now = absl::Now();
        const double seconds = absl::ToDoubleSeconds(now - window_start);
        if (options.verbose) {
          Emit(options, absl::StrFormat("Step%d: %.2f data/sec", step,
                                        (samples - window_samples) / seconds));
        }
        window_samples = samples;
        window_start = now;
      }
    }
    const double epoch_seconds =
        absl::ToDoubleSeconds(absl::Now() - epoch_start);
    train_seconds += epoch_seconds;
    if (chief && options.evaluate) {
      // No stream may sit idle through the evaluation (see CloseStreams).
      RETURN_IF_ERROR(exchange->BeforePause());
      const absl::Time test_start = absl::Now();
      // The other workers wait at the next step's barrier (or have
      // finished): evaluate with every core.
      const int train_threads = omp_get_max_threads();
      omp_set_num_threads(omp_get_num_procs());
      absl::StatusOr<Evaluation> evaluated =
          Evaluate(*model, dataset.test, options.eval_batch_size);
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
      if (options.verbose) {
        Emit(options, absl::StrFormat(
                          "Epoch %d in %.2f sec, test time %.2f sec, test "
                          "accuracy: %.4f",
                          epoch, epoch_seconds, test_seconds, eval.accuracy));
      }
      // Evaluation time is not training time: restart the throughput window.
      ASSIGN_OR_RETURN(window_samples, exchange->SamplesSoFar());
      window_start = absl::Now();
    }
  }
  result.set_steps(step);
  result.set_runtime_seconds(train_seconds);
  if (chief) {
    ASSIGN_OR_RETURN(const int64_t samples, exchange->SamplesSoFar());
    // Samples of every worker. In sync and allreduce modes this is
    // num_workers * batch_size * steps exactly.
    result.set_throughput_samples_per_sec((samples - samples_at_start) /
                                          std::max(train_seconds, 1e-9));
  }
  for (absl::Span<float> w : weights) {
    output.final_weights.emplace_back(w.begin(), w.end());
  }
  RETURN_IF_ERROR(exchange->Finish());
  return output;
}

}  // namespace pstrain
