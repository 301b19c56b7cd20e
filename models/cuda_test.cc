// The CUDA backend against the CPU backend (itself checked against PyTorch
// in layers_test and model_test): every layer case, forward and backward,
// and whole zoo models, on the same inputs and weights. Tagged "gpu"; each
// test skips, saying why, where no GPU is visible or the build has no CUDA
// (bazel test --config=cuda //models:cuda_test on a GPU machine runs them).
//
// Tolerances: cuDNN and cuBLAS may use TF32 (10-bit mantissa) for fp32
// convolutions and GEMMs, so single layers agree to ~1e-3 relative and deep
// models to ~1e-2 of the gradient mass.
#include <cmath>
#include <memory>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_harness.h"
#include "models/model.h"

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

std::vector<float> Formula(int64_t n, double a, double b) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(std::sin(a * i + b));
  return v;
}

TEST_F(CudaTest, EveryLayerMatchesTheCpuBackend) {
  for (const LayerCase& c : LayerCases()) {
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
    const std::vector<float> dout = Formula(cpu_out.size(), 0.53, 0.0);
    const auto cpu_din = cpu.Backward(cpu_ptrs, dout);
    const auto gpu_din = gpu.Backward(gpu_ptrs, dout);
    for (size_t i = 0; i < cpu_din.size(); ++i) {
      ExpectClose(gpu_din[i], cpu_din[i], 2e-3, "din");
    }
    for (size_t p = 0; p < cpu.params().size(); ++p) {
      ExpectClose(Values(gpu.params()[p].grad), Values(cpu.params()[p].grad),
                  2e-3, "grad " + cpu.params()[p].name);
    }
    for (size_t b = 0; b < cpu.buffers().size(); ++b) {
      ExpectClose(Values(gpu.buffers()[b].value),
                  Values(cpu.buffers()[b].value), 2e-3, "buffer");
    }
  }
}

TEST_F(CudaTest, DropoutKeepsAboutOneMinusPAndScales) {
  Harness gpu(cuda_.get(), LayerSpec::Dropout(0.3f), 3);
  ExpectInvertedDropout(gpu);
}

TEST_F(CudaTest, WholeModelsMatchTheCpuBackend) {
  struct Case {
    const char* name;
    Shape chw;
  };
  for (const Case& c :
       {Case{"lenet5", {1, 28, 28}}, Case{"resnet18", {1, 28, 28}},
        Case{"resnet50", {3, 32, 32}}, Case{"vgg16", {3, 32, 32}}}) {
    SCOPED_TRACE(c.name);
    ModelOptions options;
    options.seed = 5;
    auto cpu = Model::Create(c.name, c.chw, 10, options, cpu_.get());
    auto gpu = Model::Create(c.name, c.chw, 10, options, cuda_.get());
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    Tensor x({4, c.chw[0], c.chw[1], c.chw[2]});
    x.data = Formula(x.size(), 0.37, 0.1);
    const std::vector<int32_t> labels = {1, 3, 5, 7};
    // Eval-mode logits (no dropout), then a training step's gradients
    // (models with dropout draw different masks on each backend: only the
    // loss of eval mode is compared for them).
    const Tensor cpu_logits = **(*cpu)->Forward(x);
    const Tensor gpu_logits = **(*gpu)->Forward(x);
    ExpectClose(gpu_logits.data, cpu_logits.data, 1e-2, "eval logits");
    if (std::string(c.name) == "vgg16") continue;
    auto cpu_loss = (*cpu)->ForwardBackward(x, labels);
    auto gpu_loss = (*gpu)->ForwardBackward(x, labels);
    ASSERT_TRUE(cpu_loss.ok() && gpu_loss.ok());
    EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-2 * std::max(1.0f, *cpu_loss));
    // The host staging holds the gradients after ForwardBackward.
    for (size_t p = 0; p < (*cpu)->params().size(); ++p) {
      const auto& g = (*gpu)->HostGradients()[p];
      const auto& r = (*cpu)->HostGradients()[p];
      double diff = 0, mass = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        diff += std::fabs(double{g[i]} - r[i]);
        mass += std::fabs(r[i]);
      }
      EXPECT_LE(diff, 2e-2 * mass + 1e-6) << (*cpu)->params()[p]->name;
    }
  }
}

}  // namespace
}  // namespace pstrain
