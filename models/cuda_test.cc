// The CUDA backend against the CPU backend (itself checked against PyTorch
// in layers_test and model_test): every layer case, forward and backward,
// and whole zoo models, on the same inputs and weights. Tagged "gpu"; each
// test skips, saying why, where no GPU is visible or the build has no CUDA
// (bazel test --config=cuda //models:cuda_test on a GPU machine runs them).
//
// Tolerances: cuDNN and cuBLAS may use TF32 (10-bit mantissa) for fp32
// convolutions and GEMMs, so single layers agree to ~1e-3 relative. Whole
// models run with TF32 off and are held to 1e-2 of each gradient's mass, or
// to a multiple of the CPU backend's own spread where the model's backward
// amplifies rounding more than that (WholeModelsMatchTheCpuBackend).
//
// With PSTRAIN_LAYER_ERRORS=FILE set, EveryLayerMatchesTheCpuBackend also
// writes a Markdown table of each layer case's largest absolute and relative
// (to the largest CPU magnitude) differences there (scripts/gpu_check.sh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/types/span.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_harness.h"
#include "models/model.h"
#include "optim/adam.h"

namespace pstrain {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status available = Backend::CudaAvailable(0);
    if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.message();
    absl::StatusOr<std::unique_ptr<Backend>> cuda = Backend::Create("cuda", 0);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = *std::move(cuda);
    cpu_ = NewCpuBackend();
  }
  std::unique_ptr<Backend> cpu_, cuda_;
};

// The largest |gpu - cpu| of a comparison, absolute and relative to the
// largest |cpu| (at least 1e-3), over everything a layer case compares.
struct MaxError {
  double abs = 0, rel = 0;
  void Add(const std::vector<float>& gpu, const std::vector<float>& cpu) {
    double scale = 1e-3, diff = 0;
    for (float v : cpu) scale = std::max(scale, double{std::fabs(v)});
    for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
      diff = std::max(diff, std::fabs(double{gpu[i]} - cpu[i]));
    }
    abs = std::max(abs, diff);
    rel = std::max(rel, diff / scale);
  }
};

void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                 double rel, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0;
  for (float v : cpu) scale = std::max(scale, double{std::fabs(v)});
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], rel * std::max(scale, 1e-3))
        << what << "[" << i << "]";
  }
}

// Mixed precision (issue 38): under bf16 and fp16 the CUDA backend's
// convolutions and linear layers equal the CPU backend's fp32 layers run on
// the input, weights and output gradient rounded to the 16-bit type (their
// products are exact in fp32, and both accumulate in fp32), except that
// cuDNN writes the convolutions' output and gradients in the 16-bit type:
// within one rounding of it (2^-8 relative for bf16, 2^-11 for fp16) of the
// largest magnitude, with fp32's accumulation-order slack. Two parts differ:
// - bias gradients are fp32 sums of the fp32 output gradient (the layers
//   reduce dout before rounding it), so they are compared with a CPU
//   backward of the unrounded dout;
// - cuDNN's 16-bit filter gradient (the legacy API writes dW in the input
//   type) may round partial sums of a split reduction to the 16-bit type:
//   the H200 run of 2026-11-27 showed bf16 dW of conv1x1_stride2 off by
//   0.0087 of the largest magnitude (2.2 bf16 roundings), so dW gets
//   `weight_rel`, four roundings.
TEST_F(CudaTest, SixteenBitLayersAreFp32OnRoundedValues) {
  struct Precision {
    PrecisionKind kind;
    DType wire;
    double rel;
    double weight_rel;
  };
  for (const Precision& p :
       {Precision{PRECISION_BF16, DTYPE_BFLOAT16, 6e-3, 1.6e-2},
        Precision{PRECISION_FP16, DTYPE_FLOAT16, 1.5e-3, 2e-3}}) {
    SCOPED_TRACE(static_cast<int>(p.kind));
    absl::Status set = cuda_->SetPrecision(p.kind);
    if (absl::IsFailedPrecondition(set)) {
      std::printf("skipping: %s\n", std::string(set.message()).c_str());
      continue;
    }
    ASSERT_TRUE(set.ok()) << set;
    auto rounded = [&](std::vector<float> v) {
      for (float& f : v) {
        f = p.wire == DTYPE_BFLOAT16 ? Bfloat16ToFloat(FloatToBfloat16(f))
                                     : Float16ToFloat(FloatToFloat16(f));
      }
      return v;
    };
    for (const LayerCase& c : LayerCases()) {
      if (c.spec.type != LayerType::kConv2d &&
          c.spec.type != LayerType::kLinear) {
        continue;
      }
      SCOPED_TRACE(c.name);
      Harness cpu(cpu_.get(), c.spec, 7);
      Harness gpu(cuda_.get(), c.spec, 7);
      Param& w = cpu.params()[0];
      cpu.SetValues(&w.value, rounded(Values(w.value)));
      const std::vector<float> x = Formula(NumElements(c.shape), 0.37, 0.1);
      DeviceTensor cpu_in = cpu.Make(c.shape, rounded(x));
      DeviceTensor gpu_in = gpu.Make(c.shape, x);
      ExpectClose(gpu.Forward({&gpu_in}), cpu.Forward({&cpu_in}), p.rel, "out");
      const std::vector<float> dout =
          Formula(NumElements(cpu.out_shape()), 0.53, 0.0);
      const auto cpu_din = cpu.Backward({&cpu_in}, rounded(dout));
      const auto gpu_din = gpu.Backward({&gpu_in}, dout);
      ExpectClose(gpu_din[0], cpu_din[0], p.rel, "din");
      // The same CPU layer's backward of the fp32 dout, for the bias.
      Harness cpu32(cpu_.get(), c.spec, 7);
      cpu32.SetValues(&cpu32.params()[0].value, rounded(Values(w.value)));
      DeviceTensor cpu32_in = cpu32.Make(c.shape, rounded(x));
      cpu32.Forward({&cpu32_in});
      cpu32.Backward({&cpu32_in}, dout);
      for (size_t i = 0; i < cpu.params().size(); ++i) {
        const bool bias = cpu.params()[i].name == "bias";
        ExpectClose(Values(gpu.params()[i].grad),
                    Values((bias ? cpu32 : cpu).params()[i].grad),
                    i == 0 ? p.weight_rel : p.rel,
                    "grad " + cpu.params()[i].name);
      }
    }
  }
}

TEST_F(CudaTest, EveryLayerMatchesTheCpuBackend) {
  const char* report_path = std::getenv("PSTRAIN_LAYER_ERRORS");
  FILE* report =
      report_path != nullptr ? std::fopen(report_path, "w") : nullptr;
  if (report != nullptr) {
    std::fprintf(report,
                 "| layer case | forward max abs | forward max rel | backward "
                 "max abs | backward max rel |\n|---|---:|---:|---:|---:|\n");
  }
  std::vector<LayerCase> cases = LayerCases();
  for (const LayerCase& c : FusedLayerCases()) cases.push_back(c);
  for (const LayerCase& c : cases) {
    MaxError forward, backward;
    SCOPED_TRACE(c.name);
    Harness cpu(cpu_.get(), c.spec, 7);
    Harness gpu(cuda_.get(), c.spec, 7);
    const int64_t n = NumElements(c.shape);
    std::vector<DeviceTensor> cpu_in, gpu_in;
    for (int i = 0; i < c.num_inputs; ++i) {
      const std::vector<float> x = Formula(n, 0.37 + 0.1 * i, 0.1);
      cpu_in.push_back(cpu.Make(c.shape, x));
      gpu_in.push_back(gpu.Make(c.shape, x));
    }
    std::vector<DeviceTensor*> cpu_ptrs, gpu_ptrs;
    for (auto& t : cpu_in) cpu_ptrs.push_back(&t);
    for (auto& t : gpu_in) gpu_ptrs.push_back(&t);
    const std::vector<float> cpu_out = cpu.Forward(cpu_ptrs);
    const std::vector<float> gpu_out = gpu.Forward(gpu_ptrs);
    ExpectClose(gpu_out, cpu_out, 2e-3, "out");
    forward.Add(gpu_out, cpu_out);
    const std::vector<float> dout = Formula(cpu_out.size(), 0.53, 0.0);
    const auto cpu_din = cpu.Backward(cpu_ptrs, dout);
    const auto gpu_din = gpu.Backward(gpu_ptrs, dout);
    for (size_t i = 0; i < cpu_din.size(); ++i) {
      ExpectClose(gpu_din[i], cpu_din[i], 2e-3, "din");
      backward.Add(gpu_din[i], cpu_din[i]);
    }
    for (size_t p = 0; p < cpu.params().size(); ++p) {
      const std::vector<float> g = Values(gpu.params()[p].grad);
      const std::vector<float> r = Values(cpu.params()[p].grad);
      ExpectClose(g, r, 2e-3, "grad " + cpu.params()[p].name);
      backward.Add(g, r);
    }
    for (size_t b = 0; b < cpu.buffers().size(); ++b) {
      const std::vector<float> g = Values(gpu.buffers()[b].value);
      const std::vector<float> r = Values(cpu.buffers()[b].value);
      ExpectClose(g, r, 2e-3, "buffer");
      forward.Add(g, r);
    }
    if (report != nullptr) {
      std::fprintf(report, "| %s | %.3g | %.3g | %.3g | %.3g |\n",
                   c.name.c_str(), forward.abs, forward.rel, backward.abs,
                   backward.rel);
    }
  }
  if (report != nullptr) std::fclose(report);
}

// The contract the memory plan relies on (layer_spec.h BackwardReadsOf).
TEST_F(CudaTest, EveryLayerCaseReadsOnlyWhatItsContractSays) {
  for (const LayerCase& c : LayerCases()) {
    ExpectBackwardReadsOnlyWhatItSays(cuda_.get(), c, 1e-5f);
  }
  for (const LayerCase& c : FusedLayerCases()) {
    ExpectBackwardReadsOnlyWhatItSays(cuda_.get(), c, 1e-5f);
  }
}

TEST_F(CudaTest, DropoutKeepsAboutOneMinusPAndScales) {
  Harness gpu(cuda_.get(), LayerSpec::Dropout(0.3f), 3);
  ExpectInvertedDropout(gpu);
}

// Both backends draw models/dropout_mask.h's masks: the same, call after
// call, for the same layer seed.
TEST_F(CudaTest, DropoutDrawsTheCpuBackendsMasks) {
  Harness gpu(cuda_.get(), LayerSpec::Dropout(0.1f), 5);
  Harness cpu(cpu_.get(), LayerSpec::Dropout(0.1f), 5);
  const std::vector<float> ones(3 * 70001, 1.0f);
  DeviceTensor xg = gpu.Make({3, 70001}, ones);
  DeviceTensor xc = cpu.Make({3, 70001}, ones);
  for (int call = 1; call <= 2; ++call) {
    EXPECT_EQ(gpu.Forward({&xg}), cpu.Forward({&xc})) << "call " << call;
  }
}

// L1 norms of one parameter's gradient and of its difference from another
// run's.
struct GradientGap {
  double diff = 0, mass = 0;
  double relative() const { return diff / (mass + 1e-30); }
};

GradientGap GapOf(absl::Span<const float> other, absl::Span<const float> ref) {
  GradientGap gap;
  for (size_t i = 0; i < ref.size(); ++i) {
    gap.diff += std::fabs(double{other[i]} - ref[i]);
    gap.mass += std::fabs(ref[i]);
  }
  return gap;
}

// The largest GapOf(...).relative() over the params of two runs of the same
// model after each one's ForwardBackward, and that param's name.
struct WorstGap {
  double relative = 0;
  std::string name;
};

WorstGap WorstGapOf(Model& other, Model& ref) {
  WorstGap worst;
  for (size_t p = 0; p < ref.params().size(); ++p) {
    const double relative =
        GapOf(other.HostGradients()[p], ref.HostGradients()[p]).relative();
    if (relative > worst.relative) worst = {relative, ref.params()[p]->name};
  }
  return worst;
}

// Whole models, TF32 off (fp32 on FMA units on both sides: the comparison
// is of the code, not of TF32's rounding), on inputs large enough that
// every BatchNorm normalizes over at least 32 values per channel: with 4
// (batch 4 at a 1x1 map) the backward divides by a standard deviation of 4
// nearly equal numbers and amplifies rounding differences past any
// tolerance (seen on the first H100 run, TF32 on: 30-100% of the gradient
// mass on ResNet-18/50, differing from run to run).
//
// Even so, a BatchNorm ResNet at initialisation is chaotic: its gradients
// grow backward through the blocks (Yang et al. 2019, "A mean field theory
// of batch normalization": BatchNorm itself causes gradient explosion at
// init; conv1.weight's gradient here has an L1 mass of 1e4 on a loss of
// 2.4), and the same amplification turns fp32 rounding into percent-level
// gradient differences. Measured on the CPU backend alone (2026-11-26), as
// the worst param's L1 difference over its L1 mass (OMP_NUM_THREADS 1 / 2
// for the perturbed inputs):
//
//             1 vs 2 threads   every input +1 ulp   one input +1 ulp
//   lenet5    4.3e-8           4.8e-7 / 4.8e-7      3.6e-8 / 3.6e-8
//   resnet18  3.0e-3           2.5e-3 / 4.6e-3      5.9e-3 / 2.7e-3
//   resnet50  4.6e-2           3.3e-2 / 4.2e-2      1.6e-2 / 9.7e-3
//
// ResNet-50's 1-vs-2-thread gap (4.6e-2 at layer1.0.bn2.bias, conv1.weight
// 3.9e-2) is the H200's CUDA-vs-CPU gap (4.65e-2 at layer1.0.bn2.bias,
// conv1.weight 3.4e-2); the thread gap grows from fc.weight (7e-5) through
// layer4 to ~3% in every layer before it, as chaos does: no fixed bound
// separates such noise from a bug. So the test measures the spread where it
// runs, the CPU backend against itself on every input one ulp larger (a change
// to every value, as a different backend makes; one input's ulp gives a
// smaller and more variable spread), and holds every param's
// CUDA-vs-CPU gap to max(1e-2, kSpreads * that spread's worst param).
// kSpreads = 4: the thread gap and the H200's gap are 1.1-1.4x the ulp
// spreads measured (3.3e-2, 4.2e-2), and a single chaotic draw of the
// spread may come out low, so 4 leaves a margin of ~3x. Where the spread is
// below 2.5e-3 (LeNet-5; ResNet-18 on one thread) the bound stays 1e-2;
// for ResNet-50 it is ~0.13 (the H200 run of this test: spread 3.1e-2,
// tolerance 0.125, gap 4.4e-2), which a wrong layer (an O(1) error in its
// gradients and in those of every layer before it) still exceeds. The
// precise check of each layer, at ~1e-6 on the H200, is
// EveryLayerMatchesTheCpuBackend.
TEST_F(CudaTest, WholeModelsMatchTheCpuBackend) {
  constexpr double kSpreads = 4;
  struct Case {
    const char* name;
    Shape chw;
  };
  ASSERT_TRUE(cuda_->SetPrecision(PRECISION_FP32).ok());
  for (const Case& c :
       {Case{"lenet5", {1, 28, 28}}, Case{"resnet18", {1, 64, 64}},
        Case{"resnet50", {3, 64, 64}}, Case{"vgg16", {3, 32, 32}}}) {
    SCOPED_TRACE(c.name);
    ModelOptions options;
    options.seed = 5;
    auto cpu = Model::Create(c.name, c.chw, 10, options, cpu_.get());
    auto gpu = Model::Create(c.name, c.chw, 10, options, cuda_.get());
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    Tensor x({8, c.chw[0], c.chw[1], c.chw[2]});
    x.data = Formula(x.size(), 0.37, 0.1);
    const std::vector<int32_t> labels = {1, 3, 5, 7, 0, 2, 4, 6};
    // Eval-mode logits (no dropout), then a training step's gradients
    // (models with dropout draw different masks on each backend: only the
    // loss of eval mode is compared for them).
    const Tensor cpu_logits = **(*cpu)->Forward(x);
    const Tensor gpu_logits = **(*gpu)->Forward(x);
    ExpectClose(gpu_logits.data, cpu_logits.data, 1e-3, "eval logits");
    if (std::string(c.name) == "vgg16") continue;
    auto cpu_loss = (*cpu)->ForwardBackward(x, labels);
    auto gpu_loss = (*gpu)->ForwardBackward(x, labels);
    ASSERT_TRUE(cpu_loss.ok() && gpu_loss.ok());
    EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-3 * std::max(1.0f, *cpu_loss));
    // The spread: the CPU backend on every input one ulp larger.
    auto nudged = Model::Create(c.name, c.chw, 10, options, cpu_.get());
    ASSERT_TRUE(nudged.ok());
    Tensor x_nudged = x;
    for (float& v : x_nudged.data) v = std::nextafter(v, 2.0f);
    ASSERT_TRUE((*nudged)->ForwardBackward(x_nudged, labels).ok());
    const WorstGap spread = WorstGapOf(**nudged, **cpu);
    const double tolerance = std::max(1e-2, kSpreads * spread.relative);
    // The host staging holds the gradients after ForwardBackward. The
    // worst parameter's L1 difference over its L1 mass goes to the log.
    for (size_t p = 0; p < (*cpu)->params().size(); ++p) {
      const GradientGap gap =
          GapOf((*gpu)->HostGradients()[p], (*cpu)->HostGradients()[p]);
      EXPECT_LE(gap.diff, tolerance * gap.mass + 1e-6)
          << (*cpu)->params()[p]->name << " (tolerance " << tolerance << ")";
    }
    const WorstGap worst = WorstGapOf(**gpu, **cpu);
    std::printf(
        "%s: worst gradient L1 difference / L1 mass: %.3g (%s); CPU spread "
        "(inputs +1 ulp): %.3g (%s); tolerance %.3g\n",
        c.name, worst.relative, worst.name.c_str(), spread.relative,
        spread.name.c_str(), tolerance);
  }
}

// The memory plan on cuDNN (in-place ReLU forward and backward, fused
// add + ReLU, outputs and gradients in shared slots) against every tensor in
// its own memory on the same GPU, TF32 off, over two steps on the same
// weights (the second reuses the slots): the same losses, and gradients up
// to the algorithms cudnnFind picks for each model (1e-2 of the gradient
// mass, as WholeModelsMatchTheCpuBackend). ResNet-18, whose gradients agree
// with the CPU backend's to 0.6% at this size; ResNet-50's backward at
// initialisation amplifies rounding past that (the first H200 run: 4.6%,
// as the CPU backend's own 1-vs-2-thread spread; see above), and an Adam
// step between would turn near-zero gradient noise into full-size updates.
TEST_F(CudaTest, MemoryPlanMatchesUnplannedTensors) {
  ASSERT_TRUE(cuda_->SetPrecision(PRECISION_FP32).ok());
  const Shape chw = {1, 64, 64};
  std::unique_ptr<Model> models[2];
  for (int planned = 0; planned < 2; ++planned) {
    ModelOptions options;
    options.seed = 5;
    options.memory_plan = planned == 1;
    options.fuse_add_relu = planned == 1;
    auto m = Model::Create("resnet18", chw, 10, options, cuda_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    models[planned] = *std::move(m);
  }
  Tensor x({8, chw[0], chw[1], chw[2]});
  x.data = Formula(x.size(), 0.37, 0.1);
  const std::vector<int32_t> labels = {1, 3, 5, 7, 0, 2, 4, 6};
  for (int step = 0; step < 2; ++step) {
    float loss[2];
    for (int planned = 0; planned < 2; ++planned) {
      absl::StatusOr<float> l = models[planned]->ForwardBackward(x, labels);
      ASSERT_TRUE(l.ok()) << l.status();
      loss[planned] = *l;
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-3 * std::max(1.0f, loss[0]));
    double worst = 0;
    for (size_t p = 0; p < models[0]->params().size(); ++p) {
      const auto& a = models[0]->HostGradients()[p];
      const auto& b = models[1]->HostGradients()[p];
      double diff = 0, mass = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        diff += std::fabs(double{a[i]} - b[i]);
        mass += std::fabs(a[i]);
      }
      worst = std::max(worst, diff / (mass + 1e-30));
      EXPECT_LE(diff, 1e-2 * mass + 1e-6)
          << "step " << step << " " << models[0]->params()[p]->name;
    }
    std::printf(
        "memory plan, step %d: worst gradient L1 difference / L1 "
        "mass: %.3g\n",
        step, worst);
  }
  std::printf("resnet18 64x64 batch 8: activation memory %lld -> %lld bytes\n",
              static_cast<long long>(models[0]->ActivationBytes()),
              static_cast<long long>(models[1]->ActivationBytes()));
  EXPECT_LT(models[1]->ActivationBytes(),
            models[0]->ActivationBytes() * 6 / 10);
}

// The CUDA Adam kernel rounds every operation as the host's AdamUpdate
// does: the same weights and state bit for bit, Adam and AdamW, over steps
// whose bias corrections differ.
TEST_F(CudaTest, AdamKernelMatchesTheHostUpdateBitForBit) {
  const int64_t n = 100003;  // Not a multiple of the block size.
  for (const float weight_decay : {0.0f, 0.01f}) {
    SCOPED_TRACE(weight_decay);
    AdamOptions options;
    options.lr = 3e-3f;
    options.weight_decay = weight_decay;
    std::vector<float> w = Formula(n, 0.31, 0.5), m(n, 0.0f), v(n, 0.0f);
    DeviceTensor dw(cuda_.get()), dg(cuda_.get()), dm(cuda_.get()),
        dv(cuda_.get());
    for (DeviceTensor* t : {&dw, &dg, &dm, &dv})
      ASSERT_TRUE(t->Resize({n}).ok());
    ASSERT_TRUE(cuda_->CopyToDevice(w.data(), n, dw.data()).ok());
    ASSERT_TRUE(cuda_->CopyToDevice(m.data(), n, dm.data()).ok());
    ASSERT_TRUE(cuda_->CopyToDevice(v.data(), n, dv.data()).ok());
    for (int step = 1; step <= 4; ++step) {
      const std::vector<float> g = Formula(n, 0.17 * step, 0.02);
      ASSERT_TRUE(cuda_->CopyToDevice(g.data(), n, dg.data()).ok());
      ASSERT_TRUE(cuda_->Synchronize().ok());
      AdamUpdate(options, step, w.data(), g.data(), m.data(), v.data(), n);
      ASSERT_TRUE(cuda_
                      ->AdamUpdate(options, step, dw.data(), dg.data(),
                                   dm.data(), dv.data(), n)
                      .ok());
    }
    std::vector<float> gw(n), gm(n), gv(n);
    ASSERT_TRUE(cuda_->CopyToHost(dw.data(), n, gw.data()).ok());
    ASSERT_TRUE(cuda_->CopyToHost(dm.data(), n, gm.data()).ok());
    ASSERT_TRUE(cuda_->CopyToHost(dv.data(), n, gv.data()).ok());
    ASSERT_TRUE(cuda_->Synchronize().ok());
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += gw[i] != w[i] || gm[i] != m[i] || gv[i] != v[i];
    }
    EXPECT_EQ(differ, 0) << "elements whose w, m or v differ";
  }
}

// A few training steps of every zoo model on the GPU, each as a PS worker
// takes them (forward and backward, Adam on the host, weights loaded back):
// the loss stays finite and falls on a fixed batch (the training loss; for
// the models with dropout, whose training loss is noisy, the eval-mode loss).
TEST_F(CudaTest, EveryZooModelTrainsAFewSteps) {
  for (const std::string name :
       {"mlp", "lenet5", "alexnet", "vgg16", "resnet18", "resnet34", "resnet50",
        "resnet101"}) {
    SCOPED_TRACE(name);
    const Shape chw =
        name == "mlp" || name == "lenet5" ? Shape{1, 28, 28} : Shape{3, 32, 32};
    auto model = Model::Create(name, chw, 10, ModelOptions(), cuda_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    Model& m = **model;
    Tensor x({8, chw[0], chw[1], chw[2]});
    x.data = Formula(x.size(), 0.29, 0.3);
    const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<std::vector<float>> adam_m, adam_v;
    for (const auto& w : m.HostWeights()) {
      adam_m.emplace_back(w.size());
      adam_v.emplace_back(w.size());
    }
    AdamOptions adam;
    adam.lr = 1e-3f;
    const bool dropout = name == "alexnet" || name == "vgg16";
    auto eval_loss = [&]() -> float {
      absl::StatusOr<const Tensor*> logits = m.Forward(x);
      if (!logits.ok()) return NAN;
      absl::StatusOr<float> loss = HostSoftmaxCrossEntropy(
          (*logits)->data.data(), 8, 10, labels, nullptr);
      return loss.ok() ? *loss : NAN;
    };
    float first = dropout ? eval_loss() : NAN, last = NAN;
    for (int step = 1; step <= 5; ++step) {
      absl::StatusOr<float> loss = m.ForwardBackward(x, labels);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(std::isfinite(*loss)) << "step " << step;
      if (step == 1 && !dropout) first = *loss;
      last = *loss;
      for (size_t i = 0; i < m.params().size(); ++i) {
        AdamUpdate(adam, step, m.HostWeights()[i].data(),
                   m.HostGradients()[i].data(), adam_m[i].data(),
                   adam_v[i].data(), m.HostWeights()[i].size());
      }
      ASSERT_TRUE(m.LoadHostWeights().ok());
    }
    if (dropout) last = eval_loss();
    ASSERT_TRUE(std::isfinite(first) && std::isfinite(last));
    EXPECT_LT(last, first) << "loss " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace pstrain
