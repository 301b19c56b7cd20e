// The worker's training loop: data-parallel SGD with the optimizer on the
// parameter server.
//
// Each step: forward and backward on this worker's batch (its shard of the
// data from ShardedSampler, gathered ahead by a BatchPrefetcher), push every
// gradient chunk (and the BatchNorm running statistics) to the shard that
// owns it, pull the new weights (sync: version v+1, after the barrier; async:
// the newest) into the model. Worker 0 initialises the shards with its model's
// initial weights; the others wait for them, so all start from one model.
// Worker 0 also prints the throughput lines ("Step200: 8123.45 data/sec",
// samples/sec summed over all workers, measured by shard 0's sample counter
// over the last --log_every_steps steps, then ", loss 0.4321, lr 0.001, step
// 200/936, ETA 0:45": worker 0's mean loss over those steps, the step out of
// the run's total and the time left at their rate; worker/metrics.h) and,
// after each epoch, evaluates on the full test set with the pulled weights
// ("Epoch 0 in 14.21 sec, test time 0.93 sec, test accuracy: 0.8702").
//
// Thread-compatible: RunWorker may run in several threads at once (tests run
// whole jobs in one process), each with its own options.
#ifndef PSTRAIN_WORKER_TRAINER_H_
#define PSTRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "catalog/job_config.h"
#include "common/membership.h"
#include "common/partition.h"
#include "grpcpp/security/credentials.h"
#include "models/model.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "proto/coordinator.pb.h"
#include "proto/ps.pb.h"
#include "proto/results.pb.h"
#include "worker/collective.h"
#include "worker/dataset.h"
#include "worker/input_pipeline.h"
#include "worker/topk_compression.h"

namespace pstrain {

struct TrainerOptions {
  std::string job_id = "local";
  int worker_id = 0;
  int num_workers = 1;
  // host:port of each PS shard, by shard index.
  std::vector<std::string> ps_addresses;
  // TLS to the shards as this worker (common/tls.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> ps_credentials;
  std::string model = "lenet5";
  // Sequence models: the dropout probability (JobSpec.dropout;
  // ModelOptions::transformer_dropout); 0 for deterministic steps.
  float transformer_dropout = 0.1f;
  // The backend (models/backend_factory.h) and the GPU index for cuda.
  BackendKind backend = BACKEND_CPU;
  int gpu = 0;
  // What the model's convolutions and linear layers compute in
  // (JobConfig::precision; Backend::SetPrecision); never UNSPECIFIED.
  PrecisionKind precision = PRECISION_FP32;
  // Batch size of the test-set evaluation; 0: twice batch_size, at most
  // 500. Evaluation keeps a forward pass's activations like training does,
  // so a fixed 500 took a ResNet-50 worker that trains at batch 16 past
  // 20 GB; twice the training batch stays near training's own memory.
  int eval_batch_size = 0;
  // Decoding threads of a streamed dataset's InputPipeline (on top of the
  // step's OpenMP threads; the worker takes them from its share of cores,
  // InputThreadsForCores).
  int input_threads = 1;
  // Streamed datasets: the input threads run under SCHED_IDLE
  // (InputPipelineOptions::idle_priority), beside a step that has every
  // core (a CPU worker).
  bool input_idle_priority = false;
  // Streamed datasets: training-batch augmentation (JobSpec.augment;
  // StreamAugmentOptions).
  AugmentKind augment = AUGMENT_NONE;
  // MODE_SYNC or MODE_ASYNC (must match the shards' mode), or
  // MODE_ALLREDUCE (no shards; see worker/gradient_exchange.h).
  Mode mode = MODE_SYNC;
  // allreduce: the workers' collective (not owned), the optimizer
  // (applied on every worker; server/optimizer.h) and the largest gradient
  // bucket, bytes. Every mode: its lr schedule gives the metrics' lr.
  Collective* collective = nullptr;
  // An elastic allreduce job (`elastic`; `collective` null): how the
  // exchange connects each world, and the coordinator's membership the
  // worker starts in (workers and epoch).
  CollectiveFactory connect_collective;
  WorkerMembership start_membership;
  OptimizerOptions adam;
  int64_t bucket_bytes = 25 << 20;
  // COMPUTE_MODEL: forward and backward of `model` on the dataset's
  // batches. COMPUTE_SYNTHETIC: a stand-in for a GPU (emulated-link runs):
  // each step sleeps `compute_ms` and offers `model_bytes` of fixed
  // gradients (fp32 tensors of at most 1 MiB); no dataset, no evaluation,
  // and max_steps_per_epoch (> 0) steps per epoch. The exchange is the real
  // one.
  ComputeKind compute = COMPUTE_MODEL;
  double compute_ms = 0;
  int64_t model_bytes = 0;
  // Synthetic: the last `backward_fraction` (0..1) of compute_ms announces
  // the gradients one tensor at a time, last first, each after its share
  // by size (a backward pass to overlap); 0: all at the end of the sleep.
  double backward_fraction = 0;
  // Synthetic: the tensors of `model` instead of model_bytes, their time
  // split by each layer's multiply-accumulates (JobSpec.synthetic_layers).
  bool synthetic_layers = false;
  // Per worker.
  int batch_size = 64;
  int epochs = 2;
  uint64_t seed = 1;
  int log_every_steps = 200;
  // If set, every worker writes its metrics into this folder
  // (worker/metrics.h: worker<j>.csv, worker<j>.jsonl, tb/worker<j>/), one
  // row every log_every_steps steps, one for the steps left at the end and
  // one per evaluation; empty: none.
  std::string metrics_dir;
  int64_t partition_bytes = PartitionPlan::kDefaultPartitionBytes;
  // PS modes, --partition_bytes=auto (worker/partition_tuner.h): before
  // the first step, worker 0 times a few exchange rounds at each candidate
  // size, keeps the fastest, prints "partition_bytes auto: ..." and
  // records it in the result; partition_bytes is then unused. A resumed
  // job takes its checkpoint's size, a rejoining task its checkpoint's or
  // else the shards' own.
  bool partition_bytes_auto = false;
  // How pushed gradients and pulled weights travel (the job's wire_dtype,
  // common/wire_dtype.h): DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16.
  // PS modes: the worker's model holds the pulled (rounded) weights;
  // allreduce: the gradients' average is taken in the 16-bit type
  // (CreateAllreduceExchange), the weights stay fp32.
  DType wire_dtype = DTYPE_FLOAT32;
  // PS modes: gRPC channels (TCP connections) to each shard, 1 to 16
  // (PsClientOptions; 0: common/rpc_options.h's default).
  int channels_per_shard = 0;
  // PS modes: priority pulls (PsClientOptions::priority_pulls); in sync
  // mode without staleness or backup workers the next step's forward also
  // starts on the first layers' weights while the last ones still arrive,
  // once the step is decided or (without clipping or top-k) every worker
  // said its step is finite (GradientExchange::StartEarlyForward). The
  // same weights bit for bit.
  bool priority_pulls = false;
  // Row-sparse embedding tables (JobSpec.sparse_embeddings; issue 41): PS
  // modes push the model's untied token table as the rows each step's
  // batch touches and pull the rows the next batch reads
  // (PsClient::SetStepRows), updated by the shards' lazy Adam
  // (optim/sparse_adam.h); allreduce allgathers the rows and applies the
  // same lazy update on every worker (worker/allreduce_exchange.h).
  bool sparse_embeddings = false;
  // PS modes: top-k compression of pushed gradients with (or without)
  // error feedback (the job's compression; worker/topk_compression.h).
  CompressionOptions compression;
  // PS sync mode with a compression: pulls send whole chunks always
  // (JobSpec.dense_pulls); otherwise delta pulls
  // (PsClientOptions::delta_pulls).
  bool dense_pulls = false;
  // 0: every full batch of the worker's shard; otherwise at most this many
  // steps per epoch (short test and benchmark runs).
  int64_t max_steps_per_epoch = 0;
  // A model file (models/model_file.h) every worker loads its initial
  // weights from instead of `seed`'s (worker 0's reach the shards, or the
  // other workers in allreduce mode); empty: `seed`'s.
  std::string init_from;
  // Worker 0 writes the final weights (after the last pull) there as a
  // model file; empty: nowhere.
  std::string model_out;
  // Checkpoints (worker/checkpoint.h; PS modes): worker 0 writes one into
  // `checkpoint_dir` every `checkpoint_every_steps` steps and/or once
  // `checkpoint_every_secs` seconds have passed since the last (at the end
  // of a step; 0: neither) and keeps the newest `keep_checkpoints`. With
  // `resume`, every worker continues from the newest checkpoint there: worker 0
  // gives the shards its weights, Adam state and versions; every worker starts
  // at its data position (the same batch size, workers and steps per epoch
  // required).
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_secs = 0;
  int keep_checkpoints = 3;
  // Non-finite gradients (PS modes): a step whose loss or gradients hold a
  // NaN or an infinity on any worker is skipped on every shard (its pushes
  // marked skipped, so no shard applies a partial update); after
  // `max_nonfinite_steps` consecutive skipped steps Train fails with
  // FAILED_PRECONDITION naming the worker, step and first parameter.
  int max_nonfinite_steps = 10;
  // A test and benchmark aid (JobSpec.straggler): worker
  // `straggler_worker` (-1: none) sleeps `straggler_delay_ms` at the start
  // of every step, before its compute.
  int straggler_worker = -1;
  int64_t straggler_delay_ms = 0;
  // Mode sync: bounded staleness (JobSpec.staleness; 0: plain sync). Each
  // step pulls weights of version >= step + 1 - staleness, not step + 1
  // (worker/gradient_exchange.h).
  int staleness = 0;
  // Mode sync: backup workers (JobSpec.backup_workers; 0: none). A step
  // this worker ends late is dropped by the shards, and the worker goes on
  // from the shards' version: its step jumps to it (the batches between
  // are skipped, so that a step's batch stays a function of the step).
  int backup_workers = 0;
  // An elastic job (JobSpec.max_workers > 0; worker/elastic.h): num_workers
  // is the first membership; `newest_membership` (worker 0) gives the
  // coordinator's newest (allreduce: every worker's), `membership_applied`
  // (worker 0) reports one applied. Every worker other than 0 joins the
  // shards' generation that has it (as a restarted task does); allreduce,
  // the world of its start membership.
  bool elastic = false;
  // JobSpec.min_workers: a dead worker whose budget is spent is removed
  // (worker 0 then waits for that verdict after a recovery).
  int min_workers = 0;
  // JobSpec.linear_lr_scaling (allreduce; the shards apply it otherwise).
  bool linear_lr_scaling = false;
  std::function<std::optional<Membership>()> newest_membership;
  std::function<void(const MembershipApplied&)> membership_applied;
  // Workers but 0 of an elastic job: called once the model and input
  // pipeline are built, before the worker waits to join
  // (TaskAgent::SetPrepared); null: nothing.
  std::function<void()> prepared;
  // A standby worker (JobSpec.standby_workers; not a member when it
  // started): called after `prepared`, it blocks until the coordinator's
  // newest membership has this worker and returns it; the worker then
  // joins that membership's generation (PS) or world (allreduce) as a
  // worker a Scale started does. Its error ends the run. Null: a member.
  std::function<absl::StatusOr<WorkerMembership>()> await_membership;
  // An elastic allreduce job's worker 0: ElasticWorld::announce; every
  // other worker: ElasticOptions::announced_world.
  std::function<absl::Status(int64_t from_epoch, const WorkerMembership&)>
      announce_world;
  std::function<absl::StatusOr<WorkerMembership>(int64_t from_epoch,
                                                 absl::Time deadline)>
      announced_world;
  // Gradient clipping by global norm (JobSpec.clip_grad_norm; 0: none):
  // mode allreduce, here (worker/gradient_exchange.h); mode sync, on the
  // shards, with the norm agreed through the workers (worker/ps_client.h).
  double clip_grad_norm = 0;
  bool resume = false;
  // Recovery (PS modes): up to `max_restarts` times (0: never; the first
  // error ends the run), a step that fails because a task died (a shard's
  // UNAVAILABLE, ABORTED or CANCELLED) is recovered instead: worker 0
  // restores every shard to the newest checkpoint in `checkpoint_dir` (the
  // job's initial weights before the first one), every worker pulls the
  // restored weights and goes back to their step's data position (sync:
  // the version; async: the smallest version over the workers), and the
  // run goes on. `ps_addresses_fn` gives the shards' addresses again (a
  // restarted shard listens elsewhere; null: unchanged); it may block until
  // every task is up, and should have a deadline.
  int max_restarts = 0;
  std::function<absl::StatusOr<std::vector<std::string>>()> ps_addresses_fn;
  // This process replaces a task that died: it joins the running job
  // (worker 0 restoring the shards as above) instead of initialising the
  // shards, and starts at the restored step.
  bool rejoin = false;
  // Whether worker 0 evaluates on the test set after each epoch.
  bool evaluate = true;
  // Print step and epoch lines (worker 0 only).
  bool verbose = true;
  // Where worker 0's step and epoch lines go, one line without its newline;
  // unset: stdout. Called on the training thread.
  std::function<void(const std::string&)> log_line;
  // Called on the training thread after every step with the steps done so
  // far and this worker's training samples/sec over the current epoch.
  std::function<void(int64_t steps, double samples_per_sec)> on_progress;
  // Worker 0: called on the training thread after each epoch's evaluation
  // with the results so far.
  std::function<void(const RunResult& so_far)> on_epoch;
  absl::Duration init_timeout = absl::Seconds(120);
  absl::Duration rpc_timeout = absl::Seconds(60);
};

struct TrainerOutput {
  // Filled on worker 0 (throughput, epochs, accuracy); steps on every worker.
  RunResult result;
  // The model's weights after the last pull, per PS tensor (parameters,
  // then BatchNorm buffers).
  std::vector<std::vector<float>> final_weights;
};

// Runs the whole job on this worker (`dataset` is unused with synthetic
// compute). The result also holds the mean wall time per step of the
// compute and of the gradient exchange, step 0 (warm-up) excluded. Errors: the
// first failing call's status (a shard's, the model's or the data's), naming
// what failed.
//
// RunWorker sets up the run (the workload, the exchange, a resume or
// rejoin) and drives its parts: the steps (worker/step_loop.h), recovery
// from a broken step (worker/recovery.h), worker 0's checkpoints
// (worker/checkpoint_schedule.h), which batch each step trains on
// (worker/data_position.h), and the reports (worker/reporter.h over
// worker/run_report.h).
absl::StatusOr<TrainerOutput> RunWorker(const TrainerOptions& options,
                                        const Dataset& dataset);

// Mean cross-entropy and accuracy of `model` (eval mode) over all of
// `dataset`'s test split, in batches of `batch_size`. A streamed split
// (LabeledImages.files) is decoded on `input_threads` threads as it is
// evaluated; a file that cannot be decoded is the error, naming it.
// FAILED_PRECONDITION for a dataset without a test split (an accuracy of
// no samples is no figure).
struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};
absl::StatusOr<Evaluation> EvaluateModel(Model& model, const Dataset& dataset,
                                         int batch_size, int input_threads = 1);
// The samples of `dataset`'s test split (sequences of a token dataset); 0
// where it has none.
int64_t TestSamples(const Dataset& dataset);

// How a streamed image_folder split becomes batches: with `augment`
// AUGMENT_NONE (evaluation, and training by default) kResize to the split's
// size, no flip, the dataset's channel statistics: the in-memory reader's
// pixels, so that streaming changes where the pixels are decoded, not what
// the model sees. AUGMENT_RANDOM_RESIZED_CROP: kRandomResizedCrop
// (torchvision's defaults) and a flip; AUGMENT_PAD_CROP: kPadCrop with 4
// pixels and a flip; the same size and statistics. INVALID_ARGUMENT for a
// number outside the enum.
absl::StatusOr<AugmentOptions> StreamAugmentOptions(
    const Dataset& dataset, AugmentKind augment = AUGMENT_NONE);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_H_
