// Job specs (proto/job.proto): parsing the protobuf text format users
// submit, filling the defaults, and refusing bad specs with the field named.
//
// Defaults (as `pstrain run`): model "lenet5", dataset "fashion_mnist",
// data_dir "/usr/share/datasets/fashion-mnist", backend "cpu", mode "sync",
// seed 1, partition_bytes 4 MiB (256 KiB with priority_pulls),
// log_every_steps 200, image_size 224, num_classes 1000, synthetic_samples
// 12800, bucket_bytes 25 MiB, the optimizer's defaults (proto/job.proto);
// and, unlike `pstrain run` (60), registration_timeout_s 600, since a
// submitted job's tasks may wait in a scheduler's queue.
// num_ps (except in mode allreduce, where it is 0), num_workers, batch_size
// and epochs have no default: they must be set, and >= 1. They are the
// job's size, which the launcher must start as many tasks for, and proto3
// cannot tell a field left out from one set to 0.
//
// Ranges (ValidateJobSpec), the one validation of a job: `pstrain run` and
// `compare` build a spec from their flags and check it here, the
// coordinator checks every submitted spec here (INVALID_ARGUMENT; it keeps
// serving), and `pstrain submit` and the spec files read here too. Counts
// and sizes are bounded so that nothing is allocated from an untrusted
// number. In a spec file or a SubmitJob request, 0 (unset) in a field with a
// default above means that default; a flag given as 0 is checked as 0.
//
//   field                    range                          unset (0)
//   num_ps                   1 to 1024 (0 in allreduce)     required
//   num_workers              1 to 4096                      required
//   batch_size               1 to 65536                     required
//   epochs                   1 to 1000000                   required
//   seed                     1 to 2^64-1                    1
//   log_every_steps          1 to 1e9                       200
//   max_steps_per_epoch      0 to 1e9 (0: whole epochs)     0
//   image_size               1 to 1024                      224
//   num_classes              1 to 100000                    1000 (30522
//                                                          synthetic_tokens)
//   synthetic_samples        1 to 1e8                       12800
//   seq_len (token datasets) 0, 2 to 512 (0: the token      0
//                            file's; synthetic_tokens 128)
//   dropout (bert_*)         0 <= dropout < 1               0.1
//   partition_bytes          4 to 128 MiB, a multiple of 4  4 MiB (256 KiB
//                                                          with priority_
//                                                          pulls)
//   partition_bytes_auto     true or false (PS modes; true: false
//                            chosen by measurement, then
//                            partition_bytes is unused)
//   bucket_bytes             4 to 1 GiB                     25 MiB
//   model_bytes (synthetic)  4 to 16 GiB, a multiple of 4   required
//   compute_ms (synthetic)   0 to 3600000                   0
//   backward_fraction        0 to 1                         0
//   checkpoint_every_steps   0 to 1e9 (0: none)             0
//   checkpoint_every_secs    0 to 1e7 (0: by steps only)    0
//   keep_checkpoints         1 to 1000                      3
//   max_restarts             0 to 1000 (allreduce: 0        0
//                            without checkpoint_dir)
//   max_nonfinite_steps      0 to 1000000                   10
//   registration_timeout_s   1 to 604800                    600
//   straggler (test aid)     "WORKER:DELAY_MS", WORKER 0 to  none
//                            num_workers-1, DELAY_MS 0 to 600000
//   clip_grad_norm           0 to 1e6; 0 in async (no step  0 (none)
//                            gathers every worker's
//                            gradient to take a norm of)
//   staleness                0 to 1000; 0 unless mode sync  0 (sync)
//   backup_workers           0 to num_workers-1; 0 unless   0 (none)
//                            mode sync
//   max_workers (elastic)    num_workers to 4096            0 (not elastic)
//   min_workers (elastic)    1 to num_workers               0 (never shrink)
//   linear_lr_scaling        only with max_workers or       false
//                            min_workers
//   standby_workers          only with max_workers >        false
//                            num_workers
//   max_ps (elastic shards)  num_ps to 64; 0 in allreduce   0 (shards fixed)
//   wire_dtype               fp32, bf16, fp16               fp32
//   compression              none or topk:R, 0 < R <= 1     none
//   no_error_feedback        only with a compression        false
//   compression_warmup_steps >= 0; 0 without a compression  0
//   compression_warmup_start 0, or R to 1 with              0 (1: dense)
//                            compression_warmup_steps
//   momentum_correction      only with a compression with   false
//                            error feedback, with sgd
//                            momentum > 0 or adam, and not
//                            with compression_freeze_adam_
//                            variance
//   compression_dense_steps  >= 0; 0 without a compression  0
//   compression_freeze_adam_ only adam with                 false
//     variance               compression_dense_steps > 0
//   dense_pulls              only with a compression        false
//   priority_pulls           false in allreduce (no pulls)  false
//   sparse_embeddings        false with momentum_           false
//                            correction, compression_
//                            freeze_adam_variance or adam's
//                            weight decay, and for a model
//                            without an untied table (only
//                            bert_*_untied have one)
//   optimizer.lr             1e-30 to 10                    0.001
//   optimizer.beta1, beta2   0 <= beta < 1, also in fp32    0.9, 0.999
//                            (1 - beta > 0 after rounding:
//                            0.99999999 rounds to 1.0f)
//   optimizer.epsilon        1e-30 to 1                     1e-8
//   optimizer.weight_decay   0 to 1                         0
//   optimizer.name           adam, adamw (the same), sgd    adam
//   optimizer.momentum       0 <= momentum < 1 (sgd only)   0
//   optimizer.dampening      0 to 1 (sgd only)              0
//   optimizer.nesterov       sgd, momentum > 0, dampening 0 false
//   optimizer.lr_schedule    constant, step, cosine         constant
//   optimizer.warmup_steps   0 to 1e9                       0
//   optimizer.warmup_start_factor  0 to 1                   0
//   optimizer.lr_step_size   1 to 1e9 for step              0
//   optimizer.lr_gamma       0 to 1                         0.1
//   optimizer.lr_min         0 to lr                        0
//   optimizer.lr_total_steps 0, or above warmup_steps for   epochs x
//                            cosine (0: the job's steps, max_steps_per_epoch,
//                            counted by worker 0)           else 0
//   data_dir, init_from,     at most 4096 characters
//   checkpoint_dir, metrics_dir
//   trace                    needs metrics_dir              false
//   ps_hosts, worker_hosts   none or one per task (an elastic
//                            job: max_workers workers, max_ps
//                            shards); host 1 to 255
//                            characters, port 0 to 65535
// Doubles outside a range include NaN and the infinities. An error is one
// line naming the field, the value and the range:
// "num_workers: 2147483647; expected 1 to 4096".
//
// Thread-safety: pure functions.
#ifndef PSTRAIN_COORDINATOR_JOB_SPEC_H_
#define PSTRAIN_COORDINATOR_JOB_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "catalog/job_config.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "proto/job.pb.h"

namespace pstrain {

// The bounds of the table above.
inline constexpr int kMaxNumPs = 1024;
inline constexpr int kMaxNumWorkers = 4096;
// The most shards an elastic-shard job may have (max_ps).
inline constexpr int kMaxElasticPs = 64;
inline constexpr int kMaxBatchSize = 65536;
inline constexpr int kMaxEpochs = 1000000;
inline constexpr int64_t kMaxSteps = 1000000000;
inline constexpr int kMaxImageSize = 1024;
inline constexpr int kMaxNumClasses = 100000;
inline constexpr int64_t kMaxSyntheticSamples = 100000000;
// The defaults ApplyJobDefaults fills in for optimizer fields that another
// schedule or optimizer ignores (ValidateJobSpec refuses any other value
// there), and `pstrain run`'s flags' defaults.
inline constexpr double kDefaultLrGamma = 0.1;
inline constexpr double kDefaultBeta1 = 0.9;
inline constexpr double kDefaultBeta2 = 0.999;
inline constexpr double kDefaultEpsilon = 1e-8;
inline constexpr int kMaxSeqLen = 512;  // The models' position table.
inline constexpr double kMaxDropout = 0.99;
inline constexpr int64_t kMaxPartitionBytes = int64_t{128} << 20;
inline constexpr int64_t kMaxBucketBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxModelBytes = int64_t{16} << 30;
inline constexpr double kMaxComputeMs = 3600000;
inline constexpr double kMaxCheckpointEverySecs = 1e7;
inline constexpr int kMaxKeepCheckpoints = 1000;
inline constexpr int kMaxRestarts = 1000;
inline constexpr int kMaxNonfiniteSteps = 1000000;
inline constexpr int kMaxRegistrationTimeoutS = 7 * 24 * 3600;
inline constexpr double kMinLr = 1e-30;
inline constexpr double kMaxLr = 10;
inline constexpr double kMinEpsilon = 1e-30;
inline constexpr double kMaxEpsilon = 1;
inline constexpr double kMaxWeightDecay = 1;
inline constexpr size_t kMaxJobPathLength = 4096;
inline constexpr size_t kMaxHostLength = 255;
// --heartbeat_timeout_s of `pstrain run` and pstrain_coordinator: 1 to
// 86400 seconds.
inline constexpr int kMaxHeartbeatTimeoutS = 24 * 3600;
inline constexpr int64_t kMaxStragglerDelayMs = 600000;
inline constexpr int kMaxStaleness = 1000;
inline constexpr double kMaxClipGradNorm = 1e6;

// The straggler test knob (JobSpec.straggler, issue 25): worker `worker`
// sleeps `delay_ms` milliseconds at the start of each step.
struct Straggler {
  int worker = -1;  // -1: no straggler
  int64_t delay_ms = 0;
};
// Parses JobSpec.straggler: "" gives no straggler; otherwise
// "WORKER:DELAY_MS" with 0 <= WORKER < num_workers and 0 <= DELAY_MS <=
// kMaxStragglerDelayMs, else INVALID_ARGUMENT "straggler: \"x\"; expected
// ...". Pure.
absl::StatusOr<Straggler> ParseStraggler(absl::string_view text,
                                         int num_workers);

// Parses `text` (protobuf text format) read from `source` (a file name, for
// messages), fills the defaults and validates. INVALID_ARGUMENT with a
// one-line message: "job.pbtxt:3:1: Message type \"pstrain.JobSpec\" has no
// field named \"modle\"." for a syntax error or unknown field, or the
// ValidateJobSpec message prefixed with `source`.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const std::string& source);

// Fills the unset fields listed above.
void ApplyJobDefaults(JobSpec* spec);

// The job's typed config (catalog/job_config.h): `spec` validated, its
// choices parsed once. INVALID_ARGUMENT naming the first bad field, its
// value and what was expected: a text field that is not UTF-8
// (CheckUtf8Fields: the spec's text fields are bytes on the wire, so a
// server parses such a spec and answers this, not gRPC's INTERNAL), an
// unknown model, dataset, backend, mode, collective, compute, augment,
// optimizer name or lr schedule (ParseJobChoices); a value outside the
// ranges above; a host list whose length is neither 0 nor the task count;
// an empty host; the same host:port (port > 0) listed twice; fields that
// contradict each other (max_restarts or a collective with the wrong mode,
// nccl without cuda, init_from or checkpoint_dir with synthetic compute,
// staleness, backup workers and clipping outside their modes and
// combinations). Reads `spec` after ApplyJobDefaults: a 0 here is checked
// as 0. The coordinator, the PS and the workers each resolve the spec they
// read once and then read the config's enums.
absl::StatusOr<JobConfig> ResolveJobSpec(const JobSpec& spec);

// ResolveJobSpec's verdict alone.
absl::Status ValidateJobSpec(const JobSpec& spec);

// The Adam hyperparameters of `optimizer` (doubles in the spec, fp32 in the
// update), for the shards and for allreduce workers alike.
AdamOptions AdamOptionsOf(const OptimizerSpec& optimizer);
// The whole optimizer of a resolved job: kind, Adam's and SGD's
// hyperparameters, the lr schedule. With momentum_correction the momentum
// (or Adam's moments) is the workers' (worker/topk_compression.h): kind
// SGD with momentum, dampening and nesterov 0 here, so the shards apply
// plain SGD; with compression_freeze_adam_variance Adam's variance stops
// after compression_dense_steps updates (AdamOptions::freeze_variance_after;
// async: x num_workers, a shard's updates being every worker's pushes).
OptimizerOptions OptimizerOptionsOf(const JobConfig& config);

}  // namespace pstrain

#endif  // PSTRAIN_COORDINATOR_JOB_SPEC_H_
