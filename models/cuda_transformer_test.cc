// The CUDA backend's transformer layers and masked-language-model loss
// (issue 41) against the CPU backend's, which transformer_test and
// bert_test hold to PyTorch 1.13 fixtures: every layer's forward, input
// gradient and parameter gradients, with and without dropout (both
// backends draw models/dropout_mask.h's masks), sequences longer than a
// warp, repeated gathered rows; the ignoring cross-entropy; bad token ids,
// positions and all-padding samples; and bert_tiny as a whole model,
// gradients and a few training steps. TF32 off: the comparison is of the
// code, not of TF32's rounding. Tagged "gpu"; each test skips, saying why,
// where no GPU is visible or the build has no CUDA.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_harness.h"
#include "models/model.h"
#include "models/precision_checks.h"
#include "optim/adam.h"

namespace pstrain {
namespace {

class CudaTransformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status available = Backend::CudaAvailable(0);
    if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.message();
    absl::StatusOr<std::unique_ptr<Backend>> cuda = Backend::Create("cuda", 0);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = *std::move(cuda);
    ASSERT_TRUE(cuda_->SetPrecision(PRECISION_FP32).ok());
    cpu_ = NewCpuBackend();
  }
  std::unique_ptr<Backend> cpu_, cuda_;
};

// |gpu - cpu| <= rel * max(|cpu|, 1e-3) elementwise; returns the largest
// difference relative to that scale.
double ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                   double rel, const std::string& what) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  if (gpu.size() != cpu.size()) return INFINITY;
  double scale = 1e-3, worst = 0;
  for (float v : cpu) scale = std::max(scale, double{std::fabs(v)});
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double diff = std::fabs(double{gpu[i]} - cpu[i]);
    // Written so that a NaN fails.
    EXPECT_TRUE(diff <= rel * scale)
        << what << "[" << i << "]: " << gpu[i] << " vs " << cpu[i];
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// A layer case: the spec, the first input's shape and values, and the
// second input (mask or positions) when the layer takes two.
struct TransformerCase {
  std::string name;
  LayerSpec spec;
  Shape shape;
  std::vector<float> x;
  Shape second_shape;
  std::vector<float> second;
};

std::vector<TransformerCase> Cases() {
  std::vector<TransformerCase> cases = {
      {"layernorm", LayerSpec::LayerNorm(8), {2, 3, 8}, {}, {}, {}},
      {"layernorm_wide", LayerSpec::LayerNorm(100), {3, 5, 100}, {}, {}, {}},
      {"gelu", LayerSpec::Gelu(), {2, 3, 8}, {}, {}, {}},
      {"embedding",
       LayerSpec::Embedding(11, 7, 6),
       {2, 5},
       TokenIds(10, 11),
       {},
       {}},
      {"embedding_repeats",
       LayerSpec::Embedding(5, 40, 33),
       {3, 40},
       TokenIds(120, 5),
       {},
       {}},
      {"mha",
       LayerSpec::MultiheadAttention(8, 2, 0.0f),
       {2, 5, 8},
       {},
       {2, 5},
       PaddingMask(2, 5)},
      {"mha_heads4",
       LayerSpec::MultiheadAttention(12, 4, 0.0f),
       {3, 4, 12},
       {},
       {3, 4},
       PaddingMask(3, 4)},
      {"mha_long_dropout",
       LayerSpec::MultiheadAttention(16, 2, 0.2f),
       {3, 40, 16},
       {},
       {3, 40},
       PaddingMask(3, 40)},
      {"encoder",
       LayerSpec::TransformerEncoderLayer(8, 2, 16, 0.0f),
       {2, 5, 8},
       {},
       {2, 5},
       PaddingMask(2, 5)},
      {"encoder_dropout",
       LayerSpec::TransformerEncoderLayer(16, 4, 24, 0.25f),
       {2, 36, 16},
       {},
       {2, 36},
       PaddingMask(2, 36)},
      {"gatherrows",
       LayerSpec::GatherRows(6),
       {2, 5, 6},
       {},
       {5},
       {0, 7, 3, 7, 9}},
  };
  for (TransformerCase& c : cases) {
    if (c.x.empty()) c.x = Formula(NumElements(c.shape), 0.37, 0.1);
  }
  return cases;
}

// Forward (training), input gradient and parameter gradients of every case
// on both backends, twice (the second call draws the next dropout masks and
// reuses the layers' scratch), within 1e-4 of each comparison's largest
// CPU magnitude.
TEST_F(CudaTransformerTest, EveryLayerMatchesTheCpuBackend) {
  constexpr double kRel = 1e-4;
  for (const TransformerCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    Harness cpu(cpu_.get(), c.spec, 7);
    Harness gpu(cuda_.get(), c.spec, 7);
    DeviceTensor cx = cpu.Make(c.shape, c.x), gx = gpu.Make(c.shape, c.x);
    std::vector<DeviceTensor*> cin = {&cx}, gin = {&gx};
    DeviceTensor c2, g2;
    if (!c.second.empty()) {
      c2 = cpu.Make(c.second_shape, c.second);
      g2 = gpu.Make(c.second_shape, c.second);
      cin.push_back(&c2);
      gin.push_back(&g2);
    }
    double worst = 0;
    for (int call = 1; call <= 2; ++call) {
      SCOPED_TRACE("call " + std::to_string(call));
      const std::vector<float> cout = cpu.Forward(cin);
      const std::vector<float> gout = gpu.Forward(gin);
      worst = std::max(worst, ExpectClose(gout, cout, kRel, "out"));
      const std::vector<float> dout = Formula(cout.size(), 0.53, 0.2 * call);
      const auto cdin = cpu.Backward(cin, dout);
      const auto gdin = gpu.Backward(gin, dout);
      for (size_t i = 0; i < cdin.size(); ++i) {
        worst = std::max(worst, ExpectClose(gdin[i], cdin[i], kRel,
                                            "din " + std::to_string(i)));
      }
      for (size_t p = 0; p < cpu.params().size(); ++p) {
        worst = std::max(worst, ExpectClose(Values(gpu.params()[p].grad),
                                            Values(cpu.params()[p].grad), kRel,
                                            "grad " + cpu.params()[p].name));
      }
    }
    std::printf("%s: largest GPU-CPU difference / largest CPU value: %.3g\n",
                c.name.c_str(), worst);
  }
}

// Eval mode drops nothing: the encoder with dropout 0.25 equals itself
// with dropout 0 there.
TEST_F(CudaTransformerTest, DropoutIsOffInEval) {
  const std::vector<float> x = Formula(2 * 6 * 8, 0.31, 0.4);
  const std::vector<float> mask = PaddingMask(2, 6);
  std::vector<float> outs[2];
  for (int with_dropout = 0; with_dropout < 2; ++with_dropout) {
    Harness h(cuda_.get(),
              LayerSpec::TransformerEncoderLayer(8, 2, 16,
                                                 with_dropout ? 0.25f : 0.0f),
              3);
    DeviceTensor tx = h.Make({2, 6, 8}, x), tm = h.Make({2, 6}, mask);
    outs[with_dropout] = h.Forward({&tx, &tm}, /*training=*/false);
  }
  EXPECT_EQ(outs[1], outs[0]);
}

// The masked-language-model loss on the device against the host's
// (HostSoftmaxCrossEntropyIgnoring): loss and dlogits; every row ignored
// gives 0 and zero gradients; a label outside [0, K) is INVALID_ARGUMENT.
TEST_F(CudaTransformerTest, IgnoringCrossEntropyMatchesTheHost) {
  constexpr int64_t kRows = 7, kVocab = 300;
  const std::vector<float> values = Formula(kRows * kVocab, 0.77, 0.3);
  Harness h(cuda_.get(), LayerSpec::Gelu());
  DeviceTensor logits = h.Make({kRows, kVocab}, values);
  DeviceTensor dlogits =
      h.Make({kRows, kVocab}, std::vector<float>(kRows * kVocab, 5.0f));
  for (const std::vector<int32_t>& labels :
       {std::vector<int32_t>{3, kIgnoreLabel, 299, 0, kIgnoreLabel, 17, 150},
        std::vector<int32_t>(kRows, kIgnoreLabel)}) {
    std::vector<float> expected(kRows * kVocab);
    absl::StatusOr<float> host = HostSoftmaxCrossEntropyIgnoring(
        values.data(), kRows, kVocab, labels, kIgnoreLabel, expected.data());
    ASSERT_TRUE(host.ok()) << host.status();
    absl::StatusOr<float> device = cuda_->SoftmaxCrossEntropyIgnoring(
        logits, labels, kIgnoreLabel, &dlogits);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_NEAR(*device, *host, 1e-5 * std::max(1.0f, *host));
    ExpectClose(Values(dlogits), expected, 1e-5, "dlogits");
  }
  absl::StatusOr<float> bad = cuda_->SoftmaxCrossEntropyIgnoring(
      logits, std::vector<int32_t>{0, 1, 2, 300, 4, 5, 6}, kIgnoreLabel,
      &dlogits);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "label 300 of row 3 is outside [0, 300) and not the ignore index "
            "-100");
}

// What the CPU backend refuses, the CUDA backend refuses with the same
// message: a token id outside the vocabulary or not an integer, a position
// outside the rows, a sample whose every key is padding.
TEST_F(CudaTransformerTest, BadIdsPositionsAndMasksAreInvalid) {
  struct Bad {
    LayerSpec spec;
    Shape shape;
    std::vector<float> x;
    Shape second_shape;
    std::vector<float> second;
  };
  const std::vector<Bad> cases = {
      {LayerSpec::Embedding(5, 4, 3), {1, 3}, {0, 5, 1}, {}, {}},
      {LayerSpec::Embedding(5, 4, 3), {1, 3}, {0, 1.5f, 1}, {}, {}},
      {LayerSpec::GatherRows(2), {1, 3, 2}, Formula(6, 0.1, 0.2), {2}, {0, 3}},
      {LayerSpec::MultiheadAttention(4, 2, 0.0f),
       {2, 3, 4},
       Formula(24, 0.1, 0.2),
       {2, 3},
       {0, 0, 1, 1, 1, 1}},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(LayerName(b.spec));
    std::string messages[2];
    Backend* backends[2] = {cpu_.get(), cuda_.get()};
    for (int i = 0; i < 2; ++i) {
      Harness h(backends[i], b.spec, 1);
      DeviceTensor x = h.Make(b.shape, b.x);
      DeviceTensor second;
      std::vector<const DeviceTensor*> in = {&x};
      std::vector<Shape> shapes = {b.shape};
      if (!b.second.empty()) {
        second = h.Make(b.second_shape, b.second);
        in.push_back(&second);
        shapes.push_back(b.second_shape);
      }
      DeviceTensor out(backends[i]);
      ASSERT_TRUE(out.Resize(*OutputShape(b.spec, shapes)).ok());
      absl::StatusOr<std::unique_ptr<Layer>> layer = backends[i]->CreateLayer(
          b.spec,
          [&] {
            std::vector<Param*> p;
            for (Param& param : h.params()) p.push_back(&param);
            return p;
          }(),
          {}, 1);
      ASSERT_TRUE(layer.ok()) << layer.status();
      absl::Status s = (*layer)->Forward(in, &out, true);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      messages[i] = std::string(s.message());
    }
    EXPECT_EQ(messages[1], messages[0]);
  }
}

// bf16 and fp16 (cuda_transformer.h) against the CPU backend's fp32: the
// attention's and the encoder block's projections round, within
// precision_checks.h's bounds, and bert_tiny's loss and gradients stay
// close. bf16 is skipped on a GPU before compute capability 8.0, which
// refuses it.
TEST_F(CudaTransformerTest, SixteenBitProjectionsStayCloseToFp32) {
  struct Case {
    PrecisionKind precision;
    double unit_roundoff;
  };
  for (const Case& c : {Case{PRECISION_BF16, kBf16UnitRoundoff},
                        Case{PRECISION_FP16, kFp16UnitRoundoff}}) {
    absl::StatusOr<std::unique_ptr<Backend>> sixteen =
        Backend::Create("cuda", 0);
    ASSERT_TRUE(sixteen.ok()) << sixteen.status();
    if (absl::Status s = (*sixteen)->SetPrecision(c.precision); !s.ok()) {
      std::printf("skipped: %s\n", std::string(s.message()).c_str());
      continue;
    }
    SCOPED_TRACE((*sixteen)->name());
    ExpectProjectionsRound(sixteen->get(), cpu_.get(), c.unit_roundoff);
    ExpectBertTinyCloseTo(sixteen->get(), cpu_.get());
  }
}

// bert_tiny (dropout 0) from the same weights on both backends: the loss
// and every gradient within 1e-3 of its L1 mass, then five Adam steps on
// the GPU lower the loss.
TEST_F(CudaTransformerTest, BertTinyMatchesTheCpuBackendAndTrains) {
  constexpr int64_t kBatch = 4, kSeq = 32, kVocab = 97;
  ModelOptions options;
  options.transformer_dropout = 0.0f;
  options.seed = 5;
  auto cpu = Model::Create("bert_tiny", {kSeq}, kVocab, options, cpu_.get());
  auto gpu = Model::Create("bert_tiny", {kSeq}, kVocab, options, cuda_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<float> id_values = TokenIds(kBatch * kSeq, kVocab);
  const std::vector<float> mask_values = PaddingMask(kBatch, kSeq);
  const Tensor ids = MakeTensor({kBatch, kSeq}, id_values);
  const Tensor mask = MakeTensor({kBatch, kSeq}, mask_values);
  const std::vector<int32_t> labels = MlmLabels(id_values, mask_values);
  absl::StatusOr<float> cpu_loss = (*cpu)->ForwardBackward(ids, mask, labels);
  absl::StatusOr<float> gpu_loss = (*gpu)->ForwardBackward(ids, mask, labels);
  ASSERT_TRUE(cpu_loss.ok()) << cpu_loss.status();
  ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
  EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-4 * std::max(1.0f, *cpu_loss));
  double worst = 0;
  std::string worst_name;
  for (size_t p = 0; p < (*cpu)->params().size(); ++p) {
    const absl::Span<const float> g = (*gpu)->HostGradients()[p];
    const absl::Span<const float> r = (*cpu)->HostGradients()[p];
    double diff = 0, mass = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      diff += std::fabs(double{g[i]} - r[i]);
      mass += std::fabs(r[i]);
    }
    const std::string name = (*cpu)->params()[p]->name;
    EXPECT_LE(diff, 1e-3 * mass + 1e-7) << name;
    if (diff / (mass + 1e-30) > worst) {
      worst = diff / (mass + 1e-30);
      worst_name = name;
    }
  }
  std::printf(
      "bert_tiny: loss cpu %.6f gpu %.6f; worst gradient L1 "
      "difference / L1 mass %.3g (%s)\n",
      *cpu_loss, *gpu_loss, worst, worst_name.c_str());
  Model& m = **gpu;
  std::vector<std::vector<float>> adam_m, adam_v;
  for (const auto& w : m.HostWeights()) {
    adam_m.emplace_back(w.size());
    adam_v.emplace_back(w.size());
  }
  AdamOptions adam;
  adam.lr = 1e-3f;
  const float first = *gpu_loss;
  float last = first;
  for (int step = 1; step <= 5; ++step) {
    if (step > 1) {
      absl::StatusOr<float> loss = m.ForwardBackward(ids, mask, labels);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(std::isfinite(*loss)) << "step " << step;
      last = *loss;
    }
    for (size_t i = 0; i < m.params().size(); ++i) {
      AdamUpdate(adam, step, m.HostWeights()[i].data(),
                 m.HostGradients()[i].data(), adam_m[i].data(),
                 adam_v[i].data(), m.HostWeights()[i].size());
    }
    ASSERT_TRUE(m.LoadHostWeights().ok());
  }
  EXPECT_LT(last, first) << "loss " << first << " -> " << last;
}

}  // namespace
}  // namespace pstrain
