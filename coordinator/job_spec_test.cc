#include "coordinator/job_spec.h"

#include <string>

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
       "of: alexnet, lenet5, mlp, resnet101, resnet18, resnet34, resnet50, "
       "vgg16"},
      {counts + "dataset: \"imagenet\"",
       "job.pbtxt: dataset: \"imagenet\" is not a known dataset; expected one "
       "of: cifar10, fashion_mnist, image_folder, mnist, synthetic"},
      {"num_ps: 1 num_workers: 0 batch_size: 8 epochs: 1",
       "job.pbtxt: num_workers: 0; expected >= 1"},
      {"num_ps: 1 num_workers: 1 batch_size: 8",
       "job.pbtxt: epochs: 0; expected >= 1"},
      {counts + "mode: \"semi\"",
       "job.pbtxt: mode: \"semi\"; expected sync, async or allreduce"},
      {counts + "mode: \"allreduce\"",
       "job.pbtxt: num_ps: 1; expected 0 for mode allreduce (it has no "
       "parameter servers)"},
      {"num_ps: 0 num_workers: 1 batch_size: 8 epochs: 1",
       "job.pbtxt: num_ps: 0; expected >= 1"},
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
       "job.pbtxt: registration_timeout_s: -5; expected 1 to 604800 seconds "
       "(0: 600)"},
      {counts + "partition_bytes: 6",
       "job.pbtxt: partition_bytes: 6; expected a positive multiple of 4"},
      {counts + "optimizer { lr: 0 }",
       "job.pbtxt: optimizer.lr: 0; expected > 0"},
      {counts + "optimizer { beta1: 1 }",
       "job.pbtxt: optimizer.beta1: 1; expected 0 <= beta < 1"},
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

TEST(JobSpecTest, SameHostDifferentPortsAndUnsetPortsAreFine) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "num_ps: 1 num_workers: 2 batch_size: 8 epochs: 1 "
      "ps_hosts { host: \"h\" } "
      "worker_hosts { host: \"h\" } worker_hosts { host: \"h\" port: 9 }",
      "job.pbtxt");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

}  // namespace
}  // namespace pstrain
