#include "coordinator/job_spec.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc_options.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

constexpr char kGood[] = R"pb(
  model: "resnet18"
  dataset: "fashion_mnist"
  num_ps: 2
  num_workers: 2
  batch_size: 64
  epochs: 1
  optimizer { weight_decay: 0.01 }
  ps_hosts { host: "10.0.0.2" port: 7000 }
  ps_hosts { host: "10.0.0.3" port: 7000 }
  worker_hosts { host: "10.0.0.4" port: 7001 }
  worker_hosts { host: "10.0.0.4" port: 7002 }
)pb";

TEST(JobSpecTest, ParsesAndFillsDefaults) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kGood, "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "resnet18");
  EXPECT_EQ(spec->mode(), "sync");
  EXPECT_EQ(spec->backend(), "cpu");
  EXPECT_EQ(spec->seed(), 1u);
  EXPECT_EQ(spec->partition_bytes(), 4 << 20);
  EXPECT_EQ(spec->channels_per_shard(), 0);  // automatic
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-3);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 0.01);
  EXPECT_EQ(spec->worker_hosts(1).port(), 7002);
  EXPECT_EQ(spec->collective(), "");  // a PS job has none
  // Submitted jobs may wait in a scheduler's queue.
  EXPECT_EQ(spec->registration_timeout_s(), 600);
  absl::StatusOr<JobSpec> allreduce = ParseJobSpec(
      "num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\"",
      "job.pbtxt");
  ASSERT_TRUE(allreduce.ok()) << allreduce.status();
  EXPECT_EQ(allreduce->collective(), "gloo");
  absl::StatusOr<JobSpec> nccl = ParseJobSpec(
      "num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
      "collective: \"nccl\" backend: \"cuda\"",
      "job.pbtxt");
  EXPECT_TRUE(nccl.ok()) << nccl.status();
}

// A submitted cosine schedule leaves its horizon to worker 0's count, as
// `pstrain run` does: a default of epochs x max_steps_per_epoch overshot a
// dataset with fewer steps per epoch, so the lr never reached lr_min.
TEST(JobSpecTest, ACosineHorizonIsLeftToTheWorkersCount) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 2 "
      "max_steps_per_epoch: 100000 optimizer { lr_schedule: \"cosine\" }",
      "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().lr_total_steps(), 0);
}

// Priority pulls take P3's small slices unless a size is given.
TEST(JobSpecTest, PriorityPullsDefaultToSmallPartitions) {
  const std::string base = "num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1 ";
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(base + "priority_pulls: true", "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition_bytes(), 256 << 10);
  spec = ParseJobSpec(base + "priority_pulls: true partition_bytes: 8388608",
                      "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition_bytes(), 8 << 20);
  spec = ParseJobSpec(base + "priority_pulls: false", "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition_bytes(), 4 << 20);
}

TEST(JobSpecTest, AdamOptionsComeFromTheOptimizer) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kGood, "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const AdamOptions adam = AdamOptionsOf(spec->optimizer());
  EXPECT_FLOAT_EQ(adam.lr, 1e-3f);
  EXPECT_FLOAT_EQ(adam.beta1, 0.9f);
  EXPECT_FLOAT_EQ(adam.beta2, 0.999f);
  EXPECT_FLOAT_EQ(adam.epsilon, 1e-8f);
  EXPECT_FLOAT_EQ(adam.weight_decay, 0.01f);
}

// DGC's momentum correction moves the momentum onto the workers: the
// shards' SGD has none (issue 39); the frozen Adam variance stops at the
// dense steps.
TEST(JobSpecTest, CompressionOptionsShapeTheShardsOptimizer) {
  const std::string base =
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 "
      "compression: \"topk:0.01\" ";
  absl::StatusOr<JobSpec> sgd =
      ParseJobSpec(base +
                       "momentum_correction: true optimizer { name: \"sgd\" "
                       "momentum: 0.9 nesterov: true lr: 0.05 }",
                   "job.pbtxt");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  absl::StatusOr<JobConfig> config = ResolveJobSpec(*sgd);
  ASSERT_TRUE(config.ok()) << config.status();
  OptimizerOptions o = OptimizerOptionsOf(*config);
  EXPECT_EQ(o.kind, OptimizerKind::kSgd);
  EXPECT_EQ(o.momentum, 0.0f);
  EXPECT_FALSE(o.nesterov);
  EXPECT_FLOAT_EQ(o.lr, 0.05f);
  EXPECT_FLOAT_EQ(config->compression.momentum, 0.9);

  absl::StatusOr<JobSpec> adam =
      ParseJobSpec(base +
                       "compression_dense_steps: 94 "
                       "compression_freeze_adam_variance: true",
                   "job.pbtxt");
  ASSERT_TRUE(adam.ok()) << adam.status();
  config = ResolveJobSpec(*adam);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(OptimizerOptionsOf(*config).freeze_variance_after, 94);
  EXPECT_EQ(config->compression.dense_steps, 94);
  EXPECT_EQ(config->compression.RatioAt(93), 1.0);
  EXPECT_EQ(config->compression.RatioAt(94), 0.01);
}

// Each bad spec is refused with the field named.
TEST(JobSpecTest, BadSpecsNameTheField) {
  const std::string counts =
      "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1 ";
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {counts + "modle: \"lenet5\"",
       "job.pbtxt:1:55: Message type \"pstrain.JobSpec\" has no field named "
       "\"modle\"."},
      {counts + "model: \"resnet9000\"",
       "job.pbtxt: model: \"resnet9000\" is not a known model; expected one "
       "of: alexnet, bert_base, bert_base_untied, bert_tiny, "
       "bert_tiny_untied, lenet5, mlp, resnet101, resnet18, resnet34, "
       "resnet50, vgg16"},
      {counts + "dataset: \"imagenet\"",
       "job.pbtxt: dataset: \"imagenet\" is not a known dataset; expected one "
       "of: cifar10, fashion_mnist, image_folder, mnist, records, synthetic, "
       "synthetic_tokens, tokens"},
      {counts + "model: \"bert_tiny\"",
       "job.pbtxt: dataset: fashion_mnist with model bert_tiny; expected "
       "tokens or synthetic_tokens (the model takes token sequences)"},
      {counts + "model: \"lenet5\" dataset: \"tokens\"",
       "job.pbtxt: dataset: tokens with model lenet5; expected an image "
       "dataset (the model takes images, not tokens)"},
      {counts + "model: \"bert_tiny\" dataset: \"tokens\" seq_len: 1",
       "job.pbtxt: seq_len: 1; expected 0 or 2 to 512 ([CLS] and a token)"},
      {"num_ps: 1 num_workers: 0 batch_size: 8 epochs: 1",
       "job.pbtxt: num_workers: 0; expected 1 to 4096"},
      {"num_ps: 1 num_workers: 1 batch_size: 8",
       "job.pbtxt: epochs: 0; expected 1 to 1000000"},
      {counts + "mode: \"semi\"",
       "job.pbtxt: mode: \"semi\"; expected sync, async or allreduce"},
      {counts + "mode: \"allreduce\"",
       "job.pbtxt: num_ps: 1; expected 0 for mode allreduce (it has no "
       "parameter servers)"},
      {"num_ps: 0 num_workers: 1 batch_size: 8 epochs: 1",
       "job.pbtxt: num_ps: 0; expected 1 to 1024"},
      {"num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "collective: \"mpi\"",
       "job.pbtxt: collective: \"mpi\"; expected gloo or nccl"},
      {"num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "collective: \"nccl\"",
       "job.pbtxt: collective: nccl with backend cpu; expected backend cuda "
       "(NCCL runs between GPUs)"},
      {counts + "collective: \"gloo\"",
       "job.pbtxt: collective: \"gloo\" with mode sync; expected none (only "
       "allreduce has one)"},
      {counts + "backend: \"tpu\"",
       "job.pbtxt: backend: \"tpu\"; expected cpu or cuda"},
      {counts + "registration_timeout_s: -5",
       "job.pbtxt: registration_timeout_s: -5; expected 1 to 604800 seconds"},
      {counts + "partition_bytes: 6",
       "job.pbtxt: partition_bytes: 6; expected a multiple of 4 from 4 to "
       "134217728 bytes"},
      {counts + "optimizer { lr: 0 }",
       "job.pbtxt: optimizer.lr: 0; expected 1e-30 to 10"},
      // A schedule's knobs with another schedule would be ignored.
      {counts + "optimizer { lr_min: 0.0001 }",
       "job.pbtxt: optimizer.lr_min: 0.0001 with lr_schedule constant; "
       "expected 0 (only cosine decays to lr_min over lr_total_steps)"},
      {counts + "optimizer { lr_schedule: \"step\" lr_step_size: 5 "
                "lr_total_steps: 100 }",
       "job.pbtxt: optimizer.lr_total_steps: 100 with lr_schedule step; "
       "expected 0 (only cosine decays to lr_min over lr_total_steps)"},
      {counts + "optimizer { lr_schedule: \"cosine\" lr_step_size: 5 }",
       "job.pbtxt: optimizer.lr_step_size: 5 with lr_schedule cosine; "
       "expected 0 (only step multiplies the lr by lr_gamma every "
       "lr_step_size steps)"},
      // So would a value other than the default of lr_gamma or Adam's
      // constants.
      {counts + "optimizer { lr_gamma: 0.5 }",
       "job.pbtxt: optimizer.lr_gamma: 0.5 with lr_schedule constant; "
       "expected it unset (only step multiplies the lr by lr_gamma)"},
      {counts + "optimizer { name: \"sgd\" beta2: 0.99 }",
       "job.pbtxt: optimizer.beta2: 0.99 with optimizer sgd; expected it "
       "unset (it is Adam's)"},
      {counts + "optimizer { name: \"sgd\" epsilon: 0.001 }",
       "job.pbtxt: optimizer.epsilon: 0.001 with optimizer sgd; expected it "
       "unset (it is Adam's)"},
      {counts + "optimizer { beta1: 1 }",
       "job.pbtxt: optimizer.beta1: 1; expected 0 <= beta < 1, and below 1 "
       "in fp32 (at most 0.99999994)"},
      {counts + "ps_hosts { host: \"a\" port: 1 } ps_hosts { host: \"b\" }",
       "job.pbtxt: ps_hosts: 2 entries; expected 1 (one per task) or none"},
      {counts + "worker_hosts { host: \"a\" port: 70000 }",
       "job.pbtxt: worker_hosts[0]: port 70000; expected 0..65535"},
      {counts + "worker_hosts { port: 7 }",
       "job.pbtxt: worker_hosts[0]: host is empty"},
      {counts + "ps_hosts { host: \"h\" port: 7000 } "
                "worker_hosts { host: \"h\" port: 7000 }",
       "job.pbtxt: worker_hosts[0]: h:7000 is already the address of "
       "ps_hosts[0]"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.text, "job.pbtxt");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_EQ(spec.status().message(), c.error) << c.text;
  }
}

// Every range of job_spec.h at its edges: the bound itself is accepted,
// one step beyond it is refused with the field, the value and the range.
TEST(JobSpecTest, RangesAcceptTheirBoundsAndRefuseOneBeyond) {
  const std::string base = "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1 ";
  const std::string synthetic_no_model_bytes =
      "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1 compute: "
      "\"synthetic\" max_steps_per_epoch: 5 ";
  const std::string synthetic = synthetic_no_model_bytes + "model_bytes: 400 ";
  const struct {
    std::string ok;   // just inside
    std::string bad;  // just outside
    std::string error;
  } cases[] = {
      {"num_ps: 1024 num_workers: 1 batch_size: 8 epochs: 1",
       "num_ps: 1025 num_workers: 1 batch_size: 8 epochs: 1",
       "num_ps: 1025; expected 1 to 1024"},
      {"num_ps: 1 num_workers: 4096 batch_size: 8 epochs: 1",
       "num_ps: 1 num_workers: 4097 batch_size: 8 epochs: 1",
       "num_workers: 4097; expected 1 to 4096"},
      {"num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1",
       "num_ps: 1 num_workers: 2147483647 batch_size: 8 epochs: 1",
       "num_workers: 2147483647; expected 1 to 4096"},
      {"num_ps: 1 num_workers: 1 batch_size: 65536 epochs: 1",
       "num_ps: 1 num_workers: 1 batch_size: 65537 epochs: 1",
       "batch_size: 65537; expected 1 to 65536"},
      {"num_ps: 1 num_workers: 1 batch_size: 1 epochs: 1",
       "num_ps: 1 num_workers: 1 batch_size: -1 epochs: 1",
       "batch_size: -1; expected 1 to 65536"},
      {"num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1000000",
       "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1000001",
       "epochs: 1000001; expected 1 to 1000000"},
      {base + "log_every_steps: 1000000000", base + "log_every_steps: -1",
       "log_every_steps: -1; expected 1 to 1000000000"},
      {base + "max_steps_per_epoch: 1000000000",
       base + "max_steps_per_epoch: 1000000001",
       "max_steps_per_epoch: 1000000001; expected 0 to 1000000000 (0: whole "
       "epochs)"},
      {base + "image_size: 1024", base + "image_size: 1025",
       "image_size: 1025; expected 1 to 1024"},
      {base + "num_classes: 100000", base + "num_classes: 100001",
       "num_classes: 100001; expected 1 to 100000"},
      {base + "synthetic_samples: 100000000",
       base + "synthetic_samples: 100000001",
       "synthetic_samples: 100000001; expected 1 to 100000000"},
      {base + "model: \"bert_tiny\" dataset: \"synthetic_tokens\" seq_len: 512",
       base + "model: \"bert_tiny\" dataset: \"synthetic_tokens\" seq_len: 513",
       "seq_len: 513; expected 0 to 512 tokens (0: the token file's, or 128)"},
      {base + "model: \"bert_tiny\" dataset: \"tokens\" dropout: 0.99",
       base + "model: \"bert_tiny\" dataset: \"tokens\" dropout: -0.1",
       "dropout: -0.1; expected 0 to 0.99 (a probability below 1)"},
      {base + "partition_bytes: 134217728", base + "partition_bytes: 134217732",
       "partition_bytes: 134217732; expected a multiple of 4 from 4 to "
       "134217728 bytes"},
      {base + "partition_bytes: 4", base + "partition_bytes: -4",
       "partition_bytes: -4; expected a multiple of 4 from 4 to 134217728 "
       "bytes"},
      {base + "bucket_bytes: 1073741824", base + "bucket_bytes: 1073741825",
       "bucket_bytes: 1073741825; expected 4 to 1073741824 bytes"},
      {synthetic_no_model_bytes + "model_bytes: 17179869184",
       synthetic_no_model_bytes + "model_bytes: 17179869188",
       "model_bytes: 17179869188; expected a multiple of 4 from 4 to "
       "17179869184 bytes"},
      // Shaped like a model, the synthetic step needs no model_bytes; a
      // model job's layers are its own.
      {synthetic_no_model_bytes + "synthetic_layers: true model: \"resnet18\"",
       base + "synthetic_layers: true model: \"resnet18\"",
       "synthetic_layers: true with compute model; expected compute "
       "synthetic (a model job's layers take their own time)"},
      {synthetic + "compute_ms: 3600000", synthetic + "compute_ms: 3600000.5",
       "compute_ms: 3600000.5; expected 0 to 3600000 ms"},
      {synthetic + "compute_ms: 0", synthetic + "compute_ms: nan",
       "compute_ms: nan; expected 0 to 3600000 ms"},
      {synthetic + "backward_fraction: 1",
       synthetic + "backward_fraction: 1.01",
       "backward_fraction: 1.01; expected 0 to 1 (the share of compute_ms "
       "that is backward)"},
      {base + "checkpoint_every_steps: 1000000000",
       base + "checkpoint_every_steps: -1",
       "checkpoint_every_steps: -1; expected 0 to 1000000000 (0: none)"},
      {base + "checkpoint_every_secs: 10000000",
       base + "checkpoint_every_secs: inf",
       "checkpoint_every_secs: inf; expected 0 to 10000000 seconds"},
      {base + "keep_checkpoints: 1000", base + "keep_checkpoints: 1001",
       "keep_checkpoints: 1001; expected 1 to 1000"},
      {base + "keep_checkpoints: 1", base + "keep_checkpoints: -1",
       "keep_checkpoints: -1; expected 1 to 1000"},
      {base + "max_restarts: 1000", base + "max_restarts: 1001",
       "max_restarts: 1001; expected 0 to 1000"},
      {base + "channels_per_shard: 16", base + "channels_per_shard: 17",
       "channels_per_shard: 17; expected 1 to 16 connections per shard"},
      {base + "channels_per_shard: 1", base + "channels_per_shard: -1",
       "channels_per_shard: -1; expected 1 to 16 connections per shard"},
      {"num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\"",
       "num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "channels_per_shard: 2",
       "channels_per_shard: 2; expected 0 for mode allreduce (it has no "
       "parameter servers to connect to)"},
      {"num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "max_restarts: 3 checkpoint_dir: \"/tmp/ck\"",
       "num_workers: 2 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "max_restarts: 3",
       "max_restarts: 3; an allreduce job restarts every worker from the "
       "newest checkpoint and needs checkpoint_dir: expected 0 without it"},
      {base + "max_nonfinite_steps: 1000000",
       base + "max_nonfinite_steps: 1000001",
       "max_nonfinite_steps: 1000001; expected 0 to 1000000"},
      {base + "max_nonfinite_steps: 0", base + "max_nonfinite_steps: -1",
       "max_nonfinite_steps: -1; expected 0 to 1000000"},
      {base + "straggler: \"0:600000\"", base + "straggler: \"1:100\"",
       "straggler: \"1:100\"; expected WORKER:DELAY_MS with WORKER 0 to 0 "
       "and DELAY_MS 0 to 600000"},
      {base + "straggler: \"0:0\"", base + "straggler: \"0:600001\"",
       "straggler: \"0:600001\"; expected WORKER:DELAY_MS with WORKER 0 to "
       "0 and DELAY_MS 0 to 600000"},
      {base + "straggler: \"0:5\"", base + "straggler: \"0-5\"",
       "straggler: \"0-5\"; expected WORKER:DELAY_MS with WORKER 0 to 0 "
       "and DELAY_MS 0 to 600000"},
      {"num_workers: 1 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "clip_grad_norm: 1000000",
       "num_workers: 1 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "clip_grad_norm: 1000001",
       "clip_grad_norm: 1000001; expected 0 to 1000000 (0: none)"},
      {"num_workers: 1 batch_size: 8 epochs: 1 mode: \"allreduce\" "
       "clip_grad_norm: 1",
       base + "mode: \"async\" clip_grad_norm: 1",
       "clip_grad_norm: 1 with mode async; expected 0 (async applies each "
       "push alone: there is no step whose gradients have one norm)"},
      {base + "staleness: 1000", base + "staleness: 1001",
       "staleness: 1001; expected 0 to 1000 steps"},
      {base + "staleness: 0", base + "staleness: -1",
       "staleness: -1; expected 0 to 1000 steps"},
      {base + "mode: \"sync\" staleness: 2",
       base + "mode: \"async\" staleness: 2",
       "staleness: 2 with mode async; expected 0 (a staleness bound is for "
       "mode sync; async has none)"},
      {"num_ps: 1 num_workers: 3 batch_size: 8 epochs: 1 backup_workers: 2",
       "num_ps: 1 num_workers: 3 batch_size: 8 epochs: 1 backup_workers: 3",
       "backup_workers: 3; expected 0 to 2 (num_workers - 1)"},
      {"num_ps: 1 num_workers: 3 batch_size: 8 epochs: 1 backup_workers: 1",
       "num_ps: 1 num_workers: 3 batch_size: 8 epochs: 1 backup_workers: 1 "
       "mode: \"async\"",
       "backup_workers: 1 with mode async; expected 0 (backup workers are "
       "for mode sync)"},
      {base + "dataset: \"image_folder\" data_dir: \"/d\" stream_images: true",
       base + "stream_images: true",
       "stream_images: true with dataset fashion_mnist; expected false "
       "(streaming is for image_folder: IDX and record files are "
       "memory-mapped already)"},
      {base + "dataset: \"image_folder\" data_dir: \"/d\" stream_images: true "
              "augment: \"random_resized_crop\"",
       base + "dataset: \"image_folder\" data_dir: \"/d\" stream_images: true "
              "augment: \"rotate\"",
       "augment: \"rotate\"; expected none, random_resized_crop or "
       "pad_crop"},
      {base + "dataset: \"image_folder\" data_dir: \"/d\" stream_images: true "
              "augment: \"pad_crop\"",
       base + "dataset: \"image_folder\" data_dir: \"/d\" augment: "
              "\"pad_crop\"",
       "augment: pad_crop without stream_images; expected none "
       "(augmentation runs in the input pipeline of a streamed "
       "image_folder)"},
      {base + "registration_timeout_s: 604800",
       base + "registration_timeout_s: 604801",
       "registration_timeout_s: 604801; expected 1 to 604800 seconds"},
      {base + "optimizer { lr: 10 }", base + "optimizer { lr: 10.000001 }",
       "optimizer.lr: 10.000001; expected 1e-30 to 10"},
      {base + "optimizer { lr: 1e-30 }", base + "optimizer { lr: -0.001 }",
       "optimizer.lr: -0.001; expected 1e-30 to 10"},
      {base + "optimizer { lr: 0.1 }", base + "optimizer { lr: inf }",
       "optimizer.lr: inf; expected 1e-30 to 10"},
      {base + "optimizer { lr: 0.1 }", base + "optimizer { lr: nan }",
       "optimizer.lr: nan; expected 1e-30 to 10"},
      {base + "optimizer { epsilon: 1 }", base + "optimizer { epsilon: inf }",
       "optimizer.epsilon: inf; expected 1e-30 to 1"},
      {base + "optimizer { epsilon: 1e-30 }",
       base + "optimizer { epsilon: 1e-31 }",
       "optimizer.epsilon: 1e-31; expected 1e-30 to 1"},
      {base + "optimizer { weight_decay: 1 }",
       base + "optimizer { weight_decay: 1.5 }",
       "optimizer.weight_decay: 1.5; expected 0 to 1"},
      {base + "optimizer { weight_decay: 0 }",
       base + "optimizer { weight_decay: -inf }",
       "optimizer.weight_decay: -inf; expected 0 to 1"},
      {base + "optimizer { beta1: 0 }", base + "optimizer { beta1: -0.1 }",
       "optimizer.beta1: -0.1; expected 0 <= beta < 1, and below 1 in fp32 "
       "(at most 0.99999994)"},
      // 0.99999994 is the largest float below 1; 0.99999999 rounds to 1.0f,
      // where 1 - beta2 would divide by zero.
      {base + "optimizer { beta2: 0.99999994 }",
       base + "optimizer { beta2: 0.99999999 }",
       "optimizer.beta2: 0.99999999; expected 0 <= beta < 1, and below 1 in "
       "fp32 (at most 0.99999994)"},
      {base + "data_dir: \"" + std::string(4096, 'd') + "\"",
       base + "data_dir: \"" + std::string(4097, 'd') + "\"",
       "data_dir: a path of 4097 characters; expected at most 4096"},
      {base + "ps_hosts { host: \"" + std::string(255, 'h') + "\" }",
       base + "ps_hosts { host: \"" + std::string(256, 'h') + "\" }",
       "ps_hosts[0]: a host of 256 characters; expected at most 255"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> ok = ParseJobSpec(c.ok, "job.pbtxt");
    EXPECT_TRUE(ok.ok()) << c.ok.substr(0, 200) << ": " << ok.status();
    absl::StatusOr<JobSpec> bad = ParseJobSpec(c.bad, "job.pbtxt");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << c.bad.substr(0, 200);
    EXPECT_EQ(bad.status().message(), "job.pbtxt: " + c.error)
        << c.bad.substr(0, 200);
  }
}

// In a spec, 0 means "unset": the documented default, which is in range.
// Built by hand (as `pstrain run` does) and not defaulted, 0 is checked as 0.
TEST(JobSpecTest, StalenessAndBackupsComposeWithCheckpointsRestartsAndClip) {
  // Issue 36: with staleness the shards take a deferred cut at the step
  // worker 0 names, with backup workers at the step shard 0 picks; both
  // clip by the norm of the step's average (the admitted workers' one).
  for (const char* policy : {"staleness: 2", "backup_workers: 1",
                             "backup_workers: 1 staleness: 2"}) {
    for (const char* extra :
         {"checkpoint_every_steps: 50", "checkpoint_every_secs: 60",
          "checkpoint_every_steps: 50 resume: true",
          "checkpoint_every_steps: 50 max_restarts: 3", "clip_grad_norm: 1",
          "checkpoint_every_steps: 50 max_restarts: 3 clip_grad_norm: 1"}) {
      absl::StatusOr<JobSpec> spec = ParseJobSpec(
          absl::StrCat("num_ps: 2 num_workers: 3 batch_size: 8 epochs: 1 "
                       "mode: \"sync\" checkpoint_dir: \"/tmp/ck\" ",
                       policy, " ", extra),
          "job.pbtxt");
      EXPECT_TRUE(spec.ok()) << policy << " " << extra << ": " << spec.status();
    }
  }
}

TEST(JobSpecTest, ZeroIsTheDefaultInASpecButAnErrorWhenSetExplicitly) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1 partition_bytes: 0 "
      "log_every_steps: 0 keep_checkpoints: 0 seed: 0",
      "job.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition_bytes(), 4 << 20);
  EXPECT_EQ(spec->log_every_steps(), 200);
  EXPECT_EQ(spec->keep_checkpoints(), 3);
  EXPECT_EQ(spec->seed(), 1u);
  for (const auto& [field, error] :
       {std::pair<std::string, std::string>{
            "partition_bytes",
            "partition_bytes: 0; expected a multiple of 4 from 4 to "
            "134217728 bytes"},
        {"log_every_steps", "log_every_steps: 0; expected 1 to 1000000000"},
        {"keep_checkpoints", "keep_checkpoints: 0; expected 1 to 1000"},
        {"seed", "seed: 0; expected 1 to 18446744073709551615"}}) {
    JobSpec zero = *spec;
    const google::protobuf::FieldDescriptor* f =
        zero.GetDescriptor()->FindFieldByName(field);
    ASSERT_NE(f, nullptr) << field;
    zero.GetReflection()->ClearField(&zero, f);
    const absl::Status s = ValidateJobSpec(zero);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(s.message(), error);
  }
}

TEST(JobSpecTest, SameHostDifferentPortsAndUnsetPortsAreFine) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 "
      "ps_hosts { host: \"h\" } "
      "worker_hosts { host: \"h\" } worker_hosts { host: \"h\" port: 9 }",
      "job.pbtxt");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

// Issue 40: max_workers and min_workers, their ranges and the modes that
// are not elastic yet.
TEST(JobSpecTest, ElasticRangesAndRefusals) {
  const std::string base = "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 ";
  for (const std::string& good :
       {base + "max_workers: 2", base + "max_workers: 4096",
        base + "min_workers: 1", base + "min_workers: 2 max_workers: 4",
        base + "max_workers: 4 backup_workers: 1",
        // Worker 0 waits for every shard to decide its last step, then
        // reopens them (GradientExchange::ChangeMembership).
        base + "max_workers: 4 min_workers: 1 staleness: 2",
        // Shard 0 holds a cut's admissions until every shard has decided
        // the steps before it (PsClient::HoldAndSettle).
        base + "max_workers: 4 staleness: 2 backup_workers: 1",
        // Top-k residuals stay with their workers across a membership
        // change (GradientExchange::ChangeMembership).
        base + "max_workers: 4 compression: \"topk:0.1\" checkpoint_dir: "
               "\"/tmp/c\"",
        base + "max_workers: 3 worker_hosts { host: \"a\" } "
               "worker_hosts { host: \"b\" } worker_hosts { host: \"c\" }",
        base + "max_workers: 4 min_workers: 1 mode: \"async\"",
        // The collective's world changes in place
        // (GradientExchange::ChangeWorld).
        std::string("num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: "
                    "\"allreduce\" max_workers: 4 min_workers: 1 "
                    "linear_lr_scaling: true")}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(good, "job.pbtxt");
    EXPECT_TRUE(spec.ok()) << good << ": " << spec.status();
  }
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {base + "max_workers: 1",
       "max_workers: 1; expected 2 to 4096 (0: not elastic)"},
      {base + "max_workers: 4097",
       "max_workers: 4097; expected 2 to 4096 (0: not elastic)"},
      {base + "min_workers: 3",
       "min_workers: 3; expected 1 to 2 (0: never shrink)"},
      {base + "min_workers: -1",
       "min_workers: -1; expected 1 to 2 (0: never shrink)"},
      {base + "max_workers: 3 worker_hosts { host: \"a\" } "
              "worker_hosts { host: \"b\" }",
       "worker_hosts: 2 entries; expected 3 (one per task) or none"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.text, "job.pbtxt");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_EQ(spec.status().message(), "job.pbtxt: " + c.error) << c.text;
  }
}

// Issue 40: the linear scaling rule follows elastic workers only.
TEST(JobSpecTest, LinearLrScalingNeedsElasticWorkers) {
  const std::string base = "num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1 ";
  for (const std::string& good :
       {base + "linear_lr_scaling: true max_workers: 4",
        base + "linear_lr_scaling: true min_workers: 1",
        base + "linear_lr_scaling: false"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(good, "job.pbtxt");
    EXPECT_TRUE(spec.ok()) << good << ": " << spec.status();
  }
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(base + "linear_lr_scaling: true max_ps: 3", "job.pbtxt");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            "job.pbtxt: linear_lr_scaling: true without max_workers or "
            "min_workers; expected false (the workers never change, so the "
            "lr has nothing to follow)");
}

// Issue 40, elastic shards: max_ps, its range and what it refuses (not
// allreduce, which has no shards).
TEST(JobSpecTest, ElasticShardRangesAndRefusals) {
  const std::string base = "num_ps: 2 num_workers: 2 batch_size: 8 epochs: 1 ";
  for (const std::string& good :
       {base + "max_ps: 2", base + "max_ps: 64",
        base + "max_ps: 3 max_workers: 4 min_workers: 1",
        base + "max_ps: 4 backup_workers: 1",
        base + "max_ps: 4 staleness: 2 max_workers: 3",
        base + "max_ps: 4 staleness: 2 backup_workers: 1 max_workers: 3",
        base + "max_ps: 3 compression: \"topk:0.1\"",
        base + "max_ps: 3 compression: \"topk:0.1\" checkpoint_dir: "
               "\"/tmp/c\" max_workers: 3",
        base + "max_ps: 3 ps_hosts { host: \"a\" } ps_hosts { host: \"b\" } "
               "ps_hosts { host: \"c\" }",
        base + "max_ps: 4 max_workers: 3 mode: \"async\""}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(good, "job.pbtxt");
    EXPECT_TRUE(spec.ok()) << good << ": " << spec.status();
  }
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {base + "max_ps: 1",
       "max_ps: 1; expected 2 to 64 (num_ps to 64; 0: the shards fixed)"},
      {base + "max_ps: 65",
       "max_ps: 65; expected 2 to 64 (num_ps to 64; 0: the shards fixed)"},
      {base + "max_ps: -1",
       "max_ps: -1; expected 2 to 64 (num_ps to 64; 0: the shards fixed)"},
      {"num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: "
       "\"allreduce\" max_ps: 2",
       "max_ps: 2 with mode allreduce; expected 0 (allreduce has no "
       "shards)"},
      {base + "max_ps: 3 ps_hosts { host: \"a\" } ps_hosts { host: \"b\" }",
       "ps_hosts: 2 entries; expected 3 (one per task) or none"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.text, "job.pbtxt");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_EQ(spec.status().message(), "job.pbtxt: " + c.error) << c.text;
  }
}

// Issue 41: sparse_embeddings and what it refuses; only the models with an
// untied embedding table (bert_*_untied) take it.
TEST(JobSpecTest, SparseEmbeddingsRefusals) {
  const std::string base =
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 sparse_embeddings: "
      "true ";
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {base + "compression: \"topk:0.01\" momentum_correction: true",
       "sparse_embeddings: true with momentum_correction; expected false (it "
       "moves the optimizer's state to the workers, each of its own "
       "gradient, and the shards apply plain SGD: a table's lazy update, "
       "torch.optim.SparseAdam's, is of the average gradient, on the "
       "shards)"},
      {base + "compression: \"topk:0.01\" compression_dense_steps: 5 "
              "compression_freeze_adam_variance: true",
       "sparse_embeddings: true with compression_freeze_adam_variance; "
       "expected false (1-bit Adam's frozen variance is of dense Adam; "
       "torch.optim.SparseAdam, a table's update, has none)"},
      {base + "optimizer { weight_decay: 0.01 }",
       "sparse_embeddings: true with optimizer adam and weight_decay 0.01; "
       "expected 0 (a table's update is torch.optim.SparseAdam's, which has "
       "no weight decay; SGD takes it)"},
      {base + "model: \"bert_tiny\" dataset: \"synthetic_tokens\"",
       "sparse_embeddings: true with model bert_tiny; expected a model with "
       "an untied embedding table (bert_tiny_untied, bert_base_untied: "
       "bert_tiny and bert_base tie theirs to the MLM head, whose gradient "
       "is dense)"},
      {base + "model: \"lenet5\"",
       "sparse_embeddings: true with model lenet5; expected a model with an "
       "untied embedding table (bert_tiny_untied, bert_base_untied: "
       "bert_tiny and bert_base tie theirs to the MLM head, whose gradient "
       "is dense)"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.text, "job.pbtxt");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_EQ(spec.status().message(), "job.pbtxt: " + c.error) << c.text;
  }
  absl::StatusOr<JobSpec> off = ParseJobSpec(
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 "
      "sparse_embeddings: false",
      "job.pbtxt");
  EXPECT_TRUE(off.ok()) << off.status();
  // The untied BERTs, in sync (also with staleness, backup workers and
  // clipping), async, with SGD (also with momentum and weight decay:
  // PyTorch's dense SGD on a sparse gradient), bf16 wires, checkpoints and
  // top-k.
  for (const std::string extra :
       {"", "mode: \"async\"", "staleness: 2", "backup_workers: 1",
        "clip_grad_norm: 1", "optimizer { name: \"sgd\" }",
        "optimizer { name: \"sgd\" momentum: 0.9 nesterov: true "
        "weight_decay: 0.01 }",
        "compression: \"topk:0.01\" checkpoint_dir: \"/tmp/c\" "
        "checkpoint_every_steps: 5",
        "wire_dtype: \"bf16\" checkpoint_dir: \"/tmp/c\" "
        "checkpoint_every_steps: 5"}) {
    for (const char* model : {"bert_tiny_untied", "bert_base_untied"}) {
      absl::StatusOr<JobSpec> on =
          ParseJobSpec(base + "dataset: \"synthetic_tokens\" model: \"" +
                           model + "\" " + extra,
                       "job.pbtxt");
      EXPECT_TRUE(on.ok()) << model << " " << extra << ": " << on.status();
    }
  }
  // Allreduce gathers the tables' rows (worker/gradient_exchange.h
  // AllreduceRows), also with top-k.
  for (const std::string extra : {"", "compression: \"topk:0.01\""}) {
    absl::StatusOr<JobSpec> allreduce = ParseJobSpec(
        "num_ps: 0 num_workers: 2 batch_size: 8 epochs: 1 mode: "
        "\"allreduce\" sparse_embeddings: true dataset: \"synthetic_tokens\" "
        "model: \"bert_tiny_untied\" " +
            extra,
        "job.pbtxt");
    EXPECT_TRUE(allreduce.ok()) << extra << ": " << allreduce.status();
  }
}

}  // namespace
}  // namespace pstrain
