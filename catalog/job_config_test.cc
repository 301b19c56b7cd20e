#include "catalog/job_config.h"

#include <cmath>
#include <string>

#include "absl/flags/marshalling.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(JobConfigTest, EverySpellingParsesAndPrintsBack) {
  for (absl::string_view s : {"sync", "async", "allreduce"}) {
    EXPECT_EQ(Spelling(ParseMode(s).value()), s);
  }
  for (absl::string_view s : {"cpu", "cuda"}) {
    EXPECT_EQ(Spelling(ParseBackend(s).value()), s);
  }
  for (absl::string_view s : {"gloo", "nccl"}) {
    EXPECT_EQ(Spelling(ParseCollective(s).value()), s);
  }
  for (absl::string_view s : {"model", "synthetic"}) {
    EXPECT_EQ(Spelling(ParseCompute(s).value()), s);
  }
  for (absl::string_view s : {"none", "random_resized_crop", "pad_crop"}) {
    EXPECT_EQ(Spelling(ParseAugment(s).value()), s);
  }
  for (absl::string_view s : {"adam", "sgd"}) {
    EXPECT_EQ(Spelling(ParseOptimizer(s).value()), s);
  }
  for (absl::string_view s : {"constant", "step", "cosine"}) {
    EXPECT_EQ(Spelling(ParseLrSchedule(s).value()), s);
  }
}

TEST(JobConfigTest, ValuesAndAliases) {
  EXPECT_EQ(ParseMode("allreduce").value(), MODE_ALLREDUCE);
  EXPECT_EQ(ParseBackend("cuda").value(), BACKEND_CUDA);
  EXPECT_EQ(ParseCollective("").value(), COLLECTIVE_NONE);
  EXPECT_EQ(Spelling(COLLECTIVE_NONE), "");
  EXPECT_EQ(ParseAugment("").value(), AUGMENT_NONE);
  EXPECT_EQ(ParseOptimizer("adamw").value(), OPTIMIZER_ADAM);
  EXPECT_EQ(ParseLrSchedule("cosine").value(), LR_SCHEDULE_COSINE);
  EXPECT_EQ(Spelling(MODE_UNSPECIFIED), "");
  EXPECT_EQ(Spelling(static_cast<Mode>(77)), "");
}

TEST(JobConfigTest, ErrorsNameTheFieldAndTheSpellings) {
  EXPECT_EQ(ParseMode("semi").status().message(),
            "mode: \"semi\"; expected sync, async or allreduce");
  EXPECT_EQ(ParseMode("Sync", "--mode").status().message(),
            "--mode: \"Sync\"; expected sync, async or allreduce");
  EXPECT_EQ(ParseBackend("").status().message(),
            "backend: \"\"; expected cpu or cuda");
  EXPECT_EQ(ParseCollective("mpi").status().message(),
            "collective: \"mpi\"; expected gloo or nccl");
  EXPECT_EQ(ParseCompute("gpu").status().message(),
            "compute: \"gpu\"; expected model or synthetic");
  EXPECT_EQ(ParseAugment("rotate").status().message(),
            "augment: \"rotate\"; expected none, random_resized_crop or "
            "pad_crop");
  EXPECT_EQ(ParseOptimizer("lamb").status().message(),
            "optimizer.name: \"lamb\"; expected adam, adamw or sgd");
  EXPECT_EQ(ParseLrSchedule("linear").status().message(),
            "optimizer.lr_schedule: \"linear\"; expected constant, step or "
            "cosine");
  EXPECT_TRUE(absl::IsInvalidArgument(ParseMode("x").status()));
  // One line, bounded.
  EXPECT_EQ(ParseMode("a\nb\"").status().message(),
            "mode: \"a\\nb\\\"\"; expected sync, async or allreduce");
  const std::string message(
      ParseMode(std::string(5000, 'x')).status().message());
  EXPECT_LT(message.size(), 400u);
  EXPECT_NE(message.find("xxx...\""), std::string::npos);
}

TEST(JobConfigTest, ParseJobChoices) {
  JobSpec spec;
  spec.set_backend("cuda");
  spec.set_mode("allreduce");
  spec.set_collective("nccl");
  spec.set_compute("synthetic");
  spec.set_augment("pad_crop");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr_schedule("step");
  spec.set_num_workers(3);
  absl::StatusOr<JobConfig> config = ParseJobChoices(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->backend, BACKEND_CUDA);
  EXPECT_EQ(config->mode, MODE_ALLREDUCE);
  EXPECT_FALSE(config->has_ps());
  EXPECT_EQ(config->collective, COLLECTIVE_NCCL);
  EXPECT_EQ(config->compute, COMPUTE_SYNTHETIC);
  EXPECT_EQ(config->augment, AUGMENT_PAD_CROP);
  EXPECT_EQ(config->optimizer, OPTIMIZER_SGD);
  EXPECT_EQ(config->lr_schedule, LR_SCHEDULE_STEP);
  EXPECT_EQ(config->spec.num_workers(), 3);

  EXPECT_EQ(ModeOf(spec), MODE_ALLREDUCE);
  spec.set_mode("sync");
  EXPECT_EQ(ModeOf(spec), MODE_SYNC);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "collective: \"nccl\" with mode sync; expected none (only "
            "allreduce has one)");
  spec.clear_collective();
  spec.mutable_optimizer()->set_lr_schedule("");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "optimizer.lr_schedule: \"\"; expected constant, step or cosine");
}

// Top-k compression (issue 39): parsed into CompressionOptions; refused
// with allreduce and where its options would shape nothing.
TEST(JobConfigTest, CompressionParsesAndIsRefusedWhereItCannotApply) {
  JobSpec spec;
  spec.set_backend("cpu");
  spec.set_mode("sync");
  spec.set_compute("model");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_lr_schedule("constant");
  spec.set_compression("topk:0.01");
  spec.set_compression_warmup_steps(100);
  absl::StatusOr<JobConfig> config = ParseJobChoices(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_DOUBLE_EQ(config->compression.topk_ratio, 0.01);
  EXPECT_TRUE(config->compression.error_feedback);
  EXPECT_EQ(config->compression.warmup_steps, 100);
  EXPECT_DOUBLE_EQ(config->compression.warmup_start, 1);  // dense
  spec.set_compression_warmup_start(0.25);
  EXPECT_DOUBLE_EQ(ParseJobChoices(spec)->compression.warmup_start, 0.25);
  spec.set_compression_warmup_start(0.005);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "compression_warmup_start: 0.005; expected 0 (dense) or a "
            "fraction in [0.01, 1] (from topk:R's R to dense; Deep Gradient "
            "Compression's is 0.25)");
  spec.set_compression_warmup_start(1.5);
  EXPECT_FALSE(ParseJobChoices(spec).ok());
  spec.set_compression_warmup_start(std::nan(""));
  EXPECT_FALSE(ParseJobChoices(spec).ok());
  spec.set_compression_warmup_steps(0);
  spec.set_compression_warmup_start(0.5);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "compression_warmup_start: 0.5 without compression_warmup_steps; "
            "expected 0 (it is where the warm-up's fraction starts)");
  spec.set_compression_warmup_start(0);
  spec.set_compression_warmup_steps(100);
  spec.set_no_error_feedback(true);
  EXPECT_FALSE(ParseJobChoices(spec)->compression.error_feedback);

  spec.set_compression("topk:2");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "compression: \"topk:2\"; expected none or topk:R with 0 < R <= 1 "
            "(the fraction of each chunk pushed, e.g. topk:0.01)");
  spec.set_compression(std::string(5000, 'x'));
  EXPECT_LT(ParseJobChoices(spec).status().message().size(), 200u);
  spec.set_compression("none");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "compression_warmup_steps: 100; expected 0, or a positive step "
            "count with a compression");
  spec.set_compression_warmup_steps(0);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "no_error_feedback: true without a compression; expected a "
            "compression such as topk:0.01 (error feedback keeps what top-k "
            "did not send)");
  spec.set_no_error_feedback(false);
  spec.set_dense_pulls(true);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "dense_pulls: true without a compression; expected a compression "
            "such as topk:0.01 (only sparse pushes make the deltas that pulls "
            "would otherwise send; every other job's pulls are whole)");
  spec.set_compression("topk:0.1");
  EXPECT_TRUE(ParseJobChoices(spec).ok());
  // Allreduce takes top-k (a sparse allgather); it pulls nothing.
  spec.set_mode("allreduce");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "dense_pulls: true with mode allreduce; expected false (an "
            "allreduce job pulls nothing: every worker sums the others' top-k "
            "pairs itself)");
  spec.set_dense_pulls(false);
  absl::StatusOr<JobConfig> allreduce = ParseJobChoices(spec);
  ASSERT_TRUE(allreduce.ok()) << allreduce.status();
  EXPECT_DOUBLE_EQ(allreduce->compression.topk_ratio, 0.1);
}

// DGC's momentum correction (issue 39): takes the optimizer's momentum,
// dampening and Nesterov; refused without a compression with error
// feedback and without SGD momentum, and the shards then apply SGD
// without momentum.
TEST(JobConfigTest, MomentumCorrectionNeedsTopKWithFeedbackAndMomentum) {
  JobSpec spec;
  spec.set_backend("cpu");
  spec.set_mode("sync");
  spec.set_compute("model");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_optimizer()->set_nesterov(true);
  spec.mutable_optimizer()->set_lr_schedule("constant");
  spec.set_compression("topk:0.01");
  spec.set_momentum_correction(true);
  absl::StatusOr<JobConfig> config = ParseJobChoices(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->compression.momentum_correction());
  EXPECT_DOUBLE_EQ(config->compression.momentum, 0.9);
  EXPECT_TRUE(config->compression.nesterov);

  spec.set_no_error_feedback(true);
  const std::string no_feedback =
      "momentum_correction: true without a compression with error "
      "feedback; expected a compression such as topk:0.01 (the velocity "
      "accumulates into the residual)";
  EXPECT_EQ(ParseJobChoices(spec).status().message(), no_feedback);
  spec.set_no_error_feedback(false);
  spec.set_compression("none");
  EXPECT_EQ(ParseJobChoices(spec).status().message(), no_feedback);
  spec.set_compression("topk:0.01");
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_nesterov(false);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "momentum_correction: true with optimizer sgd without momentum; "
            "expected momentum > 0, or adam (the workers keep the optimizer's "
            "momentum, or Adam's moments, before the selection)");
  // Adam: its moments go to the workers, with the job's betas and epsilon.
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_beta1(0.8);
  spec.mutable_optimizer()->set_beta2(0.99);
  spec.mutable_optimizer()->set_epsilon(1e-6);
  config = ParseJobChoices(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->compression.adam);
  EXPECT_EQ(config->compression.moments(), 2);
  EXPECT_DOUBLE_EQ(config->compression.beta1, 0.8);
  EXPECT_DOUBLE_EQ(config->compression.beta2, 0.99);
  EXPECT_DOUBLE_EQ(config->compression.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(config->compression.momentum, 0);
  // 1-bit Adam's frozen shard variance has no shard variance to freeze.
  spec.set_compression_dense_steps(10);
  spec.set_compression_freeze_adam_variance(true);
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "momentum_correction: true with compression_freeze_adam_variance; "
            "expected one of them (with momentum correction Adam's moments "
            "are on the workers and the shards apply plain SGD: there is no "
            "shard variance to freeze)");
  spec.set_compression_freeze_adam_variance(false);
  spec.set_compression_dense_steps(0);
  spec.set_momentum_correction(false);
  EXPECT_FALSE(ParseJobChoices(spec)->compression.momentum_correction());
}

// Mixed precision (issue 38): "" is the backend's default; tf32 is a
// format of NVIDIA tensor cores and refused on the CPU backend.
TEST(JobConfigTest, PrecisionDefaultsPerBackendAndTf32NeedsCuda) {
  for (absl::string_view s : {"fp32", "tf32", "bf16", "fp16"}) {
    EXPECT_EQ(Spelling(ParsePrecision(s).value()), s);
  }
  EXPECT_EQ(ParsePrecision("").value(), PRECISION_UNSPECIFIED);
  EXPECT_EQ(ParsePrecision("half").status().message(),
            "precision: \"half\"; expected fp32, tf32, bf16 or fp16");
  JobSpec spec;
  spec.set_backend("cpu");
  spec.set_mode("sync");
  spec.set_compute("model");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_lr_schedule("constant");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_FP32);
  spec.set_backend("cuda");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_TF32);
  spec.set_precision("fp32");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_FP32);
  spec.set_precision("tf32");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_TF32);
  spec.set_precision("bf16");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_BF16);
  spec.set_backend("cpu");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_BF16);
  spec.set_precision("fp16");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "precision: \"fp16\" with backend cpu; expected fp32 or bf16 "
            "(oneDNN 2.6 has no fp16 convolution or inner product on CPUs; "
            "bf16 has fp32's range and needs no loss scaling)");
  spec.set_backend("cuda");
  EXPECT_EQ(ParseJobChoices(spec)->precision, PRECISION_FP16);
  spec.set_backend("cpu");
  spec.set_precision("tf32");
  EXPECT_EQ(ParseJobChoices(spec).status().message(),
            "precision: \"tf32\" with backend cpu; expected fp32 or bf16 "
            "(TF32 is a format of NVIDIA tensor cores; CPUs have no TF32 "
            "arithmetic)");
  EXPECT_EQ(CheckPrecisionOnBackend(PRECISION_TF32, BACKEND_CPU, "--precision")
                .message()
                .substr(0, 34),
            "--precision: \"tf32\" with backend c");
  PrecisionKind precision = PRECISION_FP32;
  std::string error;
  EXPECT_TRUE(absl::ParseFlag("bf16", &precision, &error));
  EXPECT_EQ(precision, PRECISION_BF16);
  EXPECT_TRUE(absl::ParseFlag("", &precision, &error));
  EXPECT_EQ(precision, PRECISION_UNSPECIFIED);
  EXPECT_FALSE(absl::ParseFlag("BF16", &precision, &error));
  EXPECT_EQ(error,
            "expected fp32, tf32, bf16 or fp16 (empty: the backend's default)");
  EXPECT_EQ(absl::UnparseFlag(PRECISION_FP16), "fp16");
}

TEST(JobConfigTest, FlagsTakeTheSpellings) {
  Mode mode = MODE_UNSPECIFIED;
  std::string error;
  EXPECT_TRUE(absl::ParseFlag("async", &mode, &error));
  EXPECT_EQ(mode, MODE_ASYNC);
  EXPECT_FALSE(absl::ParseFlag("MODE_ASYNC", &mode, &error));
  EXPECT_EQ(error, "expected sync, async or allreduce");
  EXPECT_EQ(absl::UnparseFlag(MODE_ALLREDUCE), "allreduce");
  BackendKind backend = BACKEND_UNSPECIFIED;
  EXPECT_TRUE(absl::ParseFlag("cuda", &backend, &error));
  EXPECT_EQ(absl::UnparseFlag(backend), "cuda");
  AugmentKind augment = AUGMENT_PAD_CROP;
  EXPECT_TRUE(absl::ParseFlag("none", &augment, &error));
  EXPECT_EQ(augment, AUGMENT_NONE);
  OptimizerAlgorithm optimizer = OPTIMIZER_UNSPECIFIED;
  EXPECT_TRUE(absl::ParseFlag("adamw", &optimizer, &error));
  EXPECT_EQ(absl::UnparseFlag(optimizer), "adam");
}

}  // namespace
}  // namespace pstrain
