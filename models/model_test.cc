// The model zoo: parameter counts against torchvision, whole-model forward
// and backward against PyTorch (testdata/models_fixture.txt from
// testdata/gen_layers_fixture.py; testdata/lenet5_fixture.txt from
// gen_lenet_fixture.py), and a finite-difference check of a whole model.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "catalog/catalog.h"
#include "gtest/gtest.h"
#include "models/staged_backend.h"
#include "optim/adam.h"

namespace pstrain {
namespace {

std::unique_ptr<Model> MustCreate(const std::string& name, const Shape& chw,
                                  int classes, Backend* backend) {
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(name, chw, classes, ModelOptions(), backend);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// torchvision 0.14's counts (the "Params" of its model tables), ImageNet
// input 3x224x224 and 1000 classes.
// catalog/catalog.h's list is the zoo's: Create builds every name in it.
TEST(ModelZoo, BuildsEveryCatalogModel) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (absl::string_view name : ModelNames()) {
    const bool sequence = absl::StartsWith(name, "bert_");
    std::unique_ptr<Model> model =
        MustCreate(std::string(name), sequence ? Shape{16} : Shape{3, 32, 32},
                   sequence ? 50 : 10, cpu.get());
    ASSERT_NE(model, nullptr) << name;
    EXPECT_GT(model->NumParameters(), 0) << name;
  }
}

TEST(ModelZoo, ParameterCountsMatchTorchvision) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const std::map<std::string, int64_t> torchvision = {
      {"resnet18", 11689512},  {"resnet34", 21797672}, {"resnet50", 25557032},
      {"resnet101", 44549160}, {"alexnet", 61100840},  {"vgg16", 138357544}};
  for (const auto& [name, count] : torchvision) {
    std::unique_ptr<Model> model =
        MustCreate(name, {3, 224, 224}, 1000, cpu.get());
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->NumParameters(), count) << name;
  }
}

// Model::ForwardMacsPerPsTensor: ResNet-18's count by tensor sums to the
// model's (each split rounds down by under one), convolutions' weights
// carry it, BatchNorm's parameters and the buffers none.
TEST(ModelZoo, ForwardMacsPerPsTensorSplitTheModelsCount) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("resnet18", {1, 28, 28}, 10, ModelOptions(), cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> macs = (*model)->ForwardMacsPerPsTensor();
  const std::vector<std::string> names = (*model)->PsTensorNames();
  ASSERT_EQ(macs.size(), names.size());
  int64_t sum = 0;
  for (size_t t = 0; t < macs.size(); ++t) {
    sum += macs[t];
    if (names[t].find("bn") != std::string::npos ||
        t >= (*model)->params().size()) {
      EXPECT_EQ(macs[t], 0) << names[t];
    }
    if (names[t] == "conv1.weight") {
      EXPECT_GT(macs[t], 0);
    }
  }
  const int64_t total = (*model)->ForwardMacsPerSample();
  EXPECT_LE(sum, total);
  EXPECT_GE(sum, total - static_cast<int64_t>(macs.size()));
}

TEST(ModelZoo, ForwardMacsOfResNet50MatchThePublishedFigure) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model =
      MustCreate("resnet50", {3, 224, 224}, 1000, cpu.get());
  ASSERT_NE(model, nullptr);
  // He et al. 2016, Table 1: 3.8e9 multiply-adds (excluding the fc and
  // counting the original stride placement); torchvision's v1.5: 4.09e9.
  EXPECT_NEAR(model->ForwardMacsPerSample() / 1e9, 4.09, 0.05);
  // 53 BatchNorm layers, two buffers each.
  EXPECT_EQ(model->buffers().size(), 106u);
}

TEST(ModelZoo, LeNet5HasTheClassicParameterCount) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->NumParameters(), 61706);
  EXPECT_EQ(model->params().size(), 10u);
  EXPECT_EQ(model->PsTensorNumElements()[4], 400 * 120);
}

TEST(ModelZoo, UnknownModelAndTooSmallInputAreNamed) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  auto model =
      Model::Create("resnet9000", {1, 28, 28}, 10, ModelOptions(), cpu.get());
  EXPECT_EQ(model.status().message(),
            "unknown model \"resnet9000\"; expected one of: alexnet, "
            "bert_base, bert_base_untied, bert_tiny, bert_tiny_untied, lenet5, "
            "mlp, resnet101, resnet18, resnet34, resnet50, vgg16");
  model = Model::Create("lenet5", {1, 8, 8}, 10, ModelOptions(), cpu.get());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(model.status().message(), "lenet5: layer"))
      << model.status();
}

TEST(ModelZoo, StemAdaptsToTheInputSize) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (const Shape& chw : std::vector<Shape>{
           {1, 28, 28}, {3, 32, 32}, {3, 64, 64}, {3, 224, 224}}) {
    if (chw[1] == 224) continue;  // ParameterCountsMatchTorchvision.
    for (const char* name : {"resnet18", "alexnet", "vgg16"}) {
      std::unique_ptr<Model> model = MustCreate(name, chw, 10, cpu.get());
      EXPECT_NE(model, nullptr) << name << " " << ShapeToString(chw);
    }
  }
}

// Weights by the formula of gen_layers_fixture.py.
void SetFormulaWeights(Model& model) {
  for (size_t k = 0; k < model.params().size(); ++k) {
    Param& p = *model.params()[k];
    const Shape& shape = p.value.shape();
    const int64_t n = p.value.size();
    double scale = 0.1, offset = 0;
    if (shape.size() >= 2) {
      scale = std::sqrt(3.0 / (static_cast<double>(n) / shape[0]));
    } else if (absl::EndsWith(p.name, ".weight")) {
      offset = 0.2;  // BatchNorm weight.
    }
    for (int64_t i = 0; i < n; ++i) {
      p.value.data()[i] =
          static_cast<float>(offset + scale * std::sin(0.7 * i + 1.3 * k));
    }
  }
}

Tensor FormulaInput(const Shape& chw) {
  Tensor x({2, chw[0], chw[1], chw[2]});
  for (int64_t i = 0; i < x.size(); ++i) {
    x.data[i] = static_cast<float>(std::sin(0.37 * i + 0.1));
  }
  return x;
}

TEST(ModelZoo, WholeModelsMatchPyTorch) {
  std::ifstream file("testdata/models_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/models_fixture.txt";
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model;
  Tensor x;
  std::string line;
  int models_checked = 0;
  std::string name;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "model") {
      int64_t c, h, w, k;
      in >> name >> c >> h >> w >> k;
      model = MustCreate(name, {c, h, w}, static_cast<int>(k), cpu.get());
      ASSERT_NE(model, nullptr);
      SetFormulaWeights(*model);
      x = FormulaInput({c, h, w});
      continue;
    }
    if (tag == "end") {
      ++models_checked;
      continue;
    }
    SCOPED_TRACE(name + " " + tag);
    int64_t n;
    in >> n;
    std::vector<double> expected(n);
    for (double& v : expected) in >> v;
    if (tag == "loss") {
      absl::StatusOr<float> loss = model->ForwardBackward(x, {3, 7});
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_NEAR(*loss, expected[0], 1e-4 * std::max(1.0, expected[0]));
    } else if (tag == "logits" || tag == "eval_logits") {
      // "logits" are of the training forward just run; recompute in
      // training mode would update the running statistics again, so compare
      // the eval logits only after the step, as the fixture does.
      if (tag == "logits") continue;
      absl::StatusOr<const Tensor*> logits = model->Forward(x, false);
      ASSERT_TRUE(logits.ok()) << logits.status();
      ASSERT_EQ((*logits)->size(), n);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR((*logits)->data[i], expected[i],
                    1e-3 + 1e-3 * std::fabs(expected[i]))
            << "logit " << i;
      }
    } else if (absl::StartsWith(tag, "grad:")) {
      const size_t k = std::stoul(tag.substr(5));
      ASSERT_LT(k, model->params().size());
      const DeviceTensor& g = model->params()[k]->grad;
      double sum = 0, sum_abs = 0;
      for (int64_t i = 0; i < g.size(); ++i) {
        sum += g.data()[i];
        sum_abs += std::fabs(g.data()[i]);
      }
      // 1%: ResNet-50's deep stack amplifies fp32 rounding (and the odd
      // ReLU that flips with it) to ~0.3% of the gradient mass; a wrong
      // connection or stride changes it by far more.
      EXPECT_NEAR(sum_abs, expected[1], 1e-2 * expected[1] + 1e-6)
          << model->params()[k]->name;
      EXPECT_NEAR(sum, expected[0], 1e-2 * expected[1] + 1e-6)
          << model->params()[k]->name;
    } else if (tag == "buffersum") {
      double sum = 0;
      for (const Buffer* b : model->buffers()) {
        for (int64_t i = 0; i < b->value.size(); ++i) sum += b->value.data()[i];
      }
      EXPECT_NEAR(sum, expected[0], 1e-4 * std::fabs(expected[0]));
    }
  }
  EXPECT_EQ(models_checked, 5);
}

// LeNet-5's composition (padding, pooling, flatten order) against PyTorch.
TEST(ModelZoo, LeNet5MatchesPyTorchForwardAndBackward) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> created =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(created, nullptr);
  Model& model = *created;
  // testdata/gen_lenet_fixture.py defines these formulas.
  for (size_t p = 0; p < model.params().size(); ++p) {
    DeviceTensor& w = model.params()[p]->value;
    for (int64_t i = 0; i < w.size(); ++i) {
      w.data()[i] = static_cast<float>(0.1 * std::sin(0.7 * i + 1.3 * p));
    }
  }
  Tensor x({2, 1, 28, 28});
  for (int64_t i = 0; i < x.size(); ++i) {
    x.data[i] = static_cast<float>(0.5 * std::cos(0.37 * i));
  }
  absl::StatusOr<float> loss = model.ForwardBackward(x, {3, 7});
  ASSERT_TRUE(loss.ok());
  std::ifstream file("testdata/lenet5_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/lenet5_fixture.txt";
  std::string line;
  int grads_checked = 0;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "loss") {
      double expected;
      in >> expected;
      EXPECT_NEAR(*loss, expected, 1e-5);
    } else if (tag == "logits") {
      const Tensor* logits = *model.Forward(x);
      for (int i = 0; i < 20; ++i) {
        double expected;
        in >> expected;
        EXPECT_NEAR(logits->data[i], expected, 1e-5) << "logit " << i;
      }
    } else if (tag == "grad") {
      size_t p;
      int64_t n;
      double sum, sum_abs;
      in >> p >> n >> sum >> sum_abs;
      ASSERT_LT(p, model.params().size());
      const DeviceTensor& g = model.params()[p]->grad;
      ASSERT_EQ(g.size(), n);
      double s = 0, sa = 0;
      for (int64_t i = 0; i < n; ++i) {
        s += g.data()[i];
        sa += std::fabs(g.data()[i]);
      }
      EXPECT_NEAR(s, sum, 1e-5 + 1e-4 * sum_abs) << "param " << p;
      EXPECT_NEAR(sa, sum_abs, 1e-4 * sum_abs) << "param " << p;
      for (int64_t i = 0; i < std::min<int64_t>(8, n); ++i) {
        double expected;
        in >> expected;
        EXPECT_NEAR(g.data()[i], expected, 1e-6 + 1e-4 * std::fabs(expected))
            << "param " << p << " element " << i;
      }
      ++grads_checked;
    }
  }
  EXPECT_EQ(grads_checked, 10);
}

TEST(ModelZoo, MlpGradientMatchesFiniteDifferences) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  ModelOptions options;
  options.seed = 3;
  auto created = Model::Create("mlp", {1, 16, 16}, 4, options, cpu.get());
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor x({2, 1, 16, 16});
  for (float& v : x.data) v = dist(rng);
  const std::vector<int32_t> labels = {1, 3};
  ASSERT_TRUE(model.ForwardBackward(x, labels).ok());
  for (Param* p : model.params()) {
    const std::vector<float> grad(p->grad.data(),
                                  p->grad.data() + p->grad.size());
    for (int64_t i = 0; i < p->value.size(); i += 1 + p->value.size() / 5) {
      float& v = p->value.data()[i];
      const float saved = v;
      v = saved + 2e-3f;
      const double plus = *model.ForwardBackward(x, labels);
      v = saved - 2e-3f;
      const double minus = *model.ForwardBackward(x, labels);
      v = saved;
      const double numeric = (plus - minus) / 4e-3;
      EXPECT_NEAR(grad[i], numeric, 2e-4 + 0.02 * std::fabs(numeric))
          << p->name << "[" << i << "]";
    }
  }
}

// With CPU staging the host spans are the model's own tensors.
TEST(ModelZoo, HostStagingCoversParamsThenBuffers) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model =
      MustCreate("resnet18", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->HostWeights().size(),
            model->params().size() + model->buffers().size());
  EXPECT_EQ(model->HostWeights()[0].data(), model->params()[0]->value.data());
  const size_t first_buffer = model->params().size();
  EXPECT_EQ(model->HostGradients()[first_buffer].data(),
            model->buffers()[0]->value.data());
  EXPECT_EQ(model->PsTensorNumElements().back(), 512);
}

// Model::AdamStep (the local optimizer train_bench uses) is the PS's update:
// three steps of it give the weights three host AdamUpdate calls give,
// from state that starts at zero, with the step count advancing. The same
// steps with the host staging off give the same losses.
TEST(ModelZoo, AdamStepIsTheShardsUpdate) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> local =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  std::unique_ptr<Model> shard =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(shard, nullptr);
  local->set_stage_gradients(false);
  Tensor x({4, 1, 28, 28});
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = std::sin(0.1 * i);
  const std::vector<int32_t> labels = {1, 2, 3, 4};
  AdamOptions adam;
  adam.lr = 0.01f;
  adam.weight_decay = 0.01f;
  std::vector<std::vector<float>> m, v;
  for (const Param* p : shard->params()) {
    m.emplace_back(p->value.size(), 0.0f);
    v.emplace_back(p->value.size(), 0.0f);
  }
  for (int step = 1; step <= 3; ++step) {
    absl::StatusOr<float> a = local->ForwardBackward(x, labels);
    absl::StatusOr<float> b = shard->ForwardBackward(x, labels);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << "step " << step;
    ASSERT_TRUE(local->AdamStep(adam).ok());
    for (size_t i = 0; i < shard->params().size(); ++i) {
      AdamUpdate(adam, step, shard->HostWeights()[i].data(),
                 shard->HostGradients()[i].data(), m[i].data(), v[i].data(),
                 m[i].size());
    }
  }
  for (size_t i = 0; i < shard->params().size(); ++i) {
    const DeviceTensor& w = local->params()[i]->value;
    const std::vector<float> got(w.data(), w.data() + w.size());
    const absl::Span<float> want = shard->HostWeights()[i];
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()))
        << shard->params()[i]->name;
  }
}

// The memory plan (ModelOptions::memory_plan) changes where tensors live,
// not what is computed: the same losses, gradients, running statistics and
// eval logits bit for bit as every tensor in its own memory, over steps
// with Adam between them, a batch-size change and back (a re-plan), and
// models with residual adds (accumulated gradients), in-place ReLUs, max
// pooling and dropout; in less memory.
TEST(MemoryPlan, SameValuesBitForBitInLessMemory) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  struct Case {
    const char* name;
    Shape chw;
    double max_share;  // Planned bytes / unplanned bytes at most.
  };
  for (const Case& c :
       {Case{"lenet5", {1, 28, 28}, 0.8}, Case{"resnet18", {3, 32, 32}, 0.6},
        Case{"resnet50", {3, 64, 64}, 0.6},
        Case{"alexnet", {3, 32, 32}, 0.8}}) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Model> models[2];
    for (int planned = 0; planned < 2; ++planned) {
      ModelOptions options;
      options.memory_plan = planned == 1;
      auto m = Model::Create(c.name, c.chw, 10, options, cpu.get());
      ASSERT_TRUE(m.ok()) << m.status();
      models[planned] = *std::move(m);
    }
    AdamOptions adam;
    adam.lr = 0.01f;
    for (int step = 0; step < 4; ++step) {
      const int batch = step == 2 ? 3 : 2;
      Tensor x({batch, c.chw[0], c.chw[1], c.chw[2]});
      for (size_t i = 0; i < x.data.size(); ++i) {
        x.data[i] = static_cast<float>(std::sin(0.37 * i + step));
      }
      const std::vector<int32_t> labels = {1, 7, 4};
      const absl::Span<const int32_t> batch_labels(labels.data(), batch);
      float loss[2];
      for (int planned = 0; planned < 2; ++planned) {
        absl::StatusOr<float> l =
            models[planned]->ForwardBackward(x, batch_labels);
        ASSERT_TRUE(l.ok()) << l.status();
        loss[planned] = *l;
      }
      EXPECT_EQ(loss[1], loss[0]) << "step " << step;
      for (int t = 0; t < models[0]->num_ps_tensors(); ++t) {
        const absl::Span<const float> a = models[0]->HostGradients()[t];
        const absl::Span<const float> b = models[1]->HostGradients()[t];
        ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin()))
            << "step " << step << " " << models[0]->PsTensorNames()[t];
      }
      for (int planned = 0; planned < 2; ++planned) {
        ASSERT_TRUE(models[planned]->AdamStep(adam).ok());
      }
      if (step == 3) {
        const Tensor a = **models[0]->Forward(x);
        const Tensor b = **models[1]->Forward(x);
        EXPECT_EQ(a.data, b.data) << "eval logits";
      }
    }
    const Shape batch2 = {2, c.chw[0], c.chw[1], c.chw[2]};
    Tensor x(batch2);
    ASSERT_TRUE(models[0]->ForwardBackward(x, {1, 2}).ok());
    ASSERT_TRUE(models[1]->ForwardBackward(x, {1, 2}).ok());
    const double share = static_cast<double>(models[1]->ActivationBytes()) /
                         models[0]->ActivationBytes();
    std::printf("%s: activation memory %lld -> %lld bytes (%.2f)\n", c.name,
                static_cast<long long>(models[0]->ActivationBytes()),
                static_cast<long long>(models[1]->ActivationBytes()), share);
    EXPECT_LE(share, c.max_share);
  }
}

// ModelOptions::fuse_add_relu: a ResNet with each add and its ReLU as one
// layer has fewer layers and the same losses and gradients bit for bit.
TEST(FusedLayers, ResNetWithAddReluMatchesTheUnfusedOne) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> models[2];
  for (int fused = 0; fused < 2; ++fused) {
    ModelOptions options;
    options.fuse_add_relu = fused == 1;
    auto m = Model::Create("resnet18", {3, 32, 32}, 10, options, cpu.get());
    ASSERT_TRUE(m.ok()) << m.status();
    models[fused] = *std::move(m);
  }
  EXPECT_NE(models[1]->Summary().find("add+relu"), std::string::npos);
  EXPECT_LT(models[1]->Summary().size(), models[0]->Summary().size());
  Tensor x({2, 3, 32, 32});
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = std::sin(0.3 * i);
  AdamOptions adam;
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<float> a = models[0]->ForwardBackward(x, {4, 2});
    absl::StatusOr<float> b = models[1]->ForwardBackward(x, {4, 2});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    for (int t = 0; t < models[0]->num_ps_tensors(); ++t) {
      const absl::Span<const float> ga = models[0]->HostGradients()[t];
      const absl::Span<const float> gb = models[1]->HostGradients()[t];
      ASSERT_TRUE(std::equal(ga.begin(), ga.end(), gb.begin()))
          << models[0]->PsTensorNames()[t];
    }
    ASSERT_TRUE(models[0]->AdamStep(adam).ok());
    ASSERT_TRUE(models[1]->AdamStep(adam).ok());
  }
}

// Layer timing: one entry per layer in forward order and one for the loss,
// each with time in both directions once steps ran, none while it is off,
// and the same loss as without timing (it only adds synchronization).
TEST(ModelZoo, LayerTimingCoversEveryLayerAndChangesNothing) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> timed =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  std::unique_ptr<Model> plain =
      MustCreate("lenet5", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(timed, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(timed->LayerTimes().empty());
  timed->EnableLayerTiming(true);
  Tensor x({4, 1, 28, 28});
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = std::sin(0.1 * i);
  const std::vector<int32_t> labels = {1, 2, 3, 4};
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<float> a = timed->ForwardBackward(x, labels);
    absl::StatusOr<float> b = plain->ForwardBackward(x, labels);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
  }
  const std::vector<LayerTime>& times = timed->LayerTimes();
  // conv1 relu1 pool1 conv2 relu2 pool2 flatten fc1 relu3 fc2 relu4 fc3.
  ASSERT_EQ(times.size(), 13u);
  EXPECT_EQ(times[0].name, "conv1");
  EXPECT_EQ(times[0].type, "conv2d");
  EXPECT_EQ(times[0].spec, "conv5x5-6");
  EXPECT_EQ(times[11].type, "linear");
  EXPECT_EQ(times.back().name, "loss");
  for (const LayerTime& t : times) {
    EXPECT_GT(t.forward_ms, 0) << t.name;
    if (t.name != "loss") {
      EXPECT_GT(t.backward_ms, 0) << t.name;
    }
  }
  timed->EnableLayerTiming(false);
  EXPECT_TRUE(timed->LayerTimes().empty());
}

// Backward announces every PS tensor once, each layer's parameters as soon as
// its backward is done (so later layers' first), the buffers last; and what
// it announced does not change before the pass ends.
TEST(ModelZoo, GradientsReadyAnnouncesEachTensorOnceWithFinalValues) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model =
      MustCreate("resnet18", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(model, nullptr);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor x({2, 1, 28, 28});
  for (float& v : x.data) v = dist(rng);
  const std::vector<int32_t> labels = {1, 7};
  std::vector<int> order;
  std::vector<std::vector<float>> announced(model->num_ps_tensors());
  ASSERT_TRUE(model
                  ->ForwardBackward(x, labels,
                                    [&](absl::Span<const int> tensors,
                                        std::shared_ptr<CopyFence> fence) {
                                      ASSERT_NE(fence, nullptr);
                                      ASSERT_TRUE(fence->Wait().ok());
                                      for (int t : tensors) {
                                        order.push_back(t);
                                        const absl::Span<const float> g =
                                            model->HostGradients()[t];
                                        announced[t].assign(g.begin(), g.end());
                                      }
                                    })
                  .ok());
  const int num_params = static_cast<int>(model->params().size());
  ASSERT_EQ(order.size(), static_cast<size_t>(model->num_ps_tensors()));
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int t = 0; t < model->num_ps_tensors(); ++t) ASSERT_EQ(sorted[t], t);
  // The fc layer (the last parameters) comes first, conv1's weight (tensor
  // 0) is the last parameter, then the buffers.
  EXPECT_EQ(order[0], num_params - 2);
  EXPECT_EQ(order[num_params - 1], 0);
  EXPECT_EQ(order[num_params], num_params);
  for (int t = 0; t < model->num_ps_tensors(); ++t) {
    const absl::Span<const float> g = model->HostGradients()[t];
    EXPECT_EQ(announced[t], std::vector<float>(g.begin(), g.end()))
        << "tensor " << t << " changed after it was announced";
  }
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Records what a training step asks of its WeightsGate (priority pulls,
// issue 39 item 4), and fails where told.
class RecordingGate : public WeightsGate {
 public:
  absl::Status AwaitTensor(int t) override {
    events.push_back(t);
    return t == fail_at ? absl::UnavailableError("pull failed")
                        : absl::OkStatus();
  }
  absl::Status AwaitAll() override {
    events.push_back(kAll);
    return absl::OkStatus();
  }
  static constexpr int kAll = -1;
  int fail_at = -2;
  std::vector<int> events;  // tensors, kAll
};

// ForwardBackward asks for each layer's PS tensors (BatchNorm's buffers
// too) before that layer's forward, the first layer's first, and for all
// once before backward announces any gradient; a failed wait is the
// step's error.
TEST(ModelWeightsGate, AsksPerLayerInForwardOrderThenForAllBeforeBackward) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model =
      MustCreate("resnet18", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(model, nullptr);
  RecordingGate gate;
  model->set_weights_gate(&gate);
  Tensor x({2, 1, 28, 28});
  for (int64_t i = 0; i < x.size(); ++i) {
    x.data[i] = static_cast<float>(0.5 * std::cos(0.37 * i));
  }
  size_t events_at_first_ready = 0;
  ASSERT_TRUE(model
                  ->ForwardBackward(
                      x, {3, 7},
                      [&](absl::Span<const int>, std::shared_ptr<CopyFence>) {
                        if (events_at_first_ready == 0) {
                          events_at_first_ready = gate.events.size();
                        }
                      })
                  .ok());
  const int tensors = model->num_ps_tensors();
  ASSERT_EQ(gate.events.size(), static_cast<size_t>(tensors) + 1);
  EXPECT_EQ(gate.events.front(), 0) << "layer 0's weight first";
  EXPECT_EQ(gate.events.back(), RecordingGate::kAll);
  EXPECT_EQ(events_at_first_ready, gate.events.size());
  std::vector<int> asked(gate.events.begin(), gate.events.end() - 1);
  std::sort(asked.begin(), asked.end());
  for (int t = 0; t < tensors; ++t) EXPECT_EQ(asked[t], t);

  RecordingGate failing;
  failing.fail_at = 1;
  model->set_weights_gate(&failing);
  absl::StatusOr<float> loss = model->ForwardBackward(x, {3, 7});
  EXPECT_TRUE(absl::IsUnavailable(loss.status())) << loss.status();
  model->set_weights_gate(nullptr);
}

// A pull that lands while the forward runs: AwaitTensor(t) writes tensor
// t's new weights into the host staging just then, as a pull's chunk
// arriving at the gate would.
class ArrivingGate : public WeightsGate {
 public:
  explicit ArrivingGate(Model* model) : model_(model) {}
  // The weights each tensor gets when it arrives.
  static float Arrived(float w) { return 0.5f * w + 0.01f; }
  absl::Status AwaitTensor(int t) override {
    for (float& w : model_->HostWeights()[t]) w = Arrived(w);
    ++tensors;
    return absl::OkStatus();
  }
  absl::Status AwaitAll() override {
    ++alls;
    return absl::OkStatus();
  }
  int tensors = 0;
  int alls = 0;

 private:
  Model* model_;
};

// Priority pulls on a device backend (the CPU backend behind a
// device-memory face, models/staged_backend.h): with a gate,
// LoadHostWeights() copies nothing, each layer's forward copies the
// weights its gate just let through, and the step equals an ungated one
// (the CPU backend) on the arrived weights bit for bit: loss, gradients
// and the BatchNorm buffers staged for the push. An evaluation forward
// after the next LoadHostWeights() asks for all and copies all. A model
// that copied at LoadHostWeights() would train on the weights from before
// the arrival and fail here.
TEST(ModelWeightsGate, DeviceBackendCopiesEachLayerAfterItsWait) {
  std::unique_ptr<StagedCpuBackend> staged = NewStagedCpuBackend();
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> device =
      MustCreate("resnet18", {1, 28, 28}, 10, staged.get());
  std::unique_ptr<Model> reference =
      MustCreate("resnet18", {1, 28, 28}, 10, cpu.get());
  ASSERT_NE(device, nullptr);
  ASSERT_NE(reference, nullptr);
  const int tensors = device->num_ps_tensors();
  Tensor x({2, 1, 28, 28});
  for (int64_t i = 0; i < x.size(); ++i) {
    x.data[i] = static_cast<float>(0.5 * std::cos(0.37 * i));
  }
  ArrivingGate gate(device.get());
  device->set_weights_gate(&gate);
  const int64_t copies_before = staged->copies_to_device();
  ASSERT_TRUE(device->LoadHostWeights().ok());
  EXPECT_EQ(staged->copies_to_device(), copies_before)
      << "LoadHostWeights() copied while the weights may still arrive";
  // The reference holds the arrived weights from the start.
  for (int t = 0; t < tensors; ++t) {
    for (float& w : reference->HostWeights()[t]) w = ArrivingGate::Arrived(w);
  }
  absl::StatusOr<float> gated = device->ForwardBackward(x, {3, 7});
  absl::StatusOr<float> plain = reference->ForwardBackward(x, {3, 7});
  ASSERT_TRUE(gated.ok()) << gated.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(gate.tensors, tensors);
  EXPECT_EQ(gate.alls, 1);
  EXPECT_EQ(staged->copies_to_device() - copies_before, tensors + 1)
      << "one copy per tensor, after its wait, and the input";
  EXPECT_EQ(*gated, *plain);
  for (int t = 0; t < tensors; ++t) {
    const absl::Span<const float> g = device->HostGradients()[t];
    const absl::Span<const float> want = reference->HostGradients()[t];
    ASSERT_EQ(g.size(), want.size());
    EXPECT_TRUE(std::equal(g.begin(), g.end(), want.begin()))
        << "tensor " << t << " (" << device->PsTensorNames()[t] << ")";
  }

  // The next pull arrived whole (the exchange completed it; the same
  // weights and BatchNorm buffers for both); an evaluation reads it, not
  // the device's older copies.
  for (int t = 0; t < tensors; ++t) {
    const absl::Span<float> want = reference->HostWeights()[t];
    for (float& w : want) w = ArrivingGate::Arrived(w);
    std::copy(want.begin(), want.end(), device->HostWeights()[t].begin());
  }
  ASSERT_TRUE(device->LoadHostWeights().ok());
  absl::StatusOr<const Tensor*> eval = device->Forward(x);
  ASSERT_TRUE(eval.ok()) << eval.status();
  const std::vector<float> device_logits = (*eval)->data;
  absl::StatusOr<const Tensor*> want = reference->Forward(x);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(device_logits, (*want)->data);
  EXPECT_EQ(gate.alls, 2) << "the evaluation waits for the whole pull";
  device->set_weights_gate(nullptr);
}

}  // namespace
}  // namespace pstrain
