// model.safetensors against PyTorch (fixtures from
// testdata/gen_model_file_fixture.py, no torch at test time), round trips,
// and the errors of files that do not fit the model.
#include "models/model_file.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "models/model.h"

namespace pstrain {
namespace {

std::unique_ptr<Model> Make(const std::string& name, const Shape& chw,
                            Backend* backend, uint64_t seed = 1) {
  ModelOptions options;
  options.seed = seed;
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Create(name, chw, 10, options, backend);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

Tensor SinInput() {
  Tensor x({2, 1, 28, 28});
  for (size_t i = 0; i < x.data.size(); ++i) {
    x.data[i] = static_cast<float>(std::sin(0.37 * i + 0.1));
  }
  return x;
}

ModelFileInfo InfoOf(const Model& m, int64_t steps) {
  ModelFileInfo info;
  info.model = m.name();
  info.input_chw = m.input_chw();
  info.num_classes = 10;
  info.steps = steps;
  info.dataset = "fashion_mnist";
  return info;
}

// PyTorch's LeNet-5 state_dict loads into pstrain's LeNet-5 and gives
// PyTorch's logits: names, layouts (OIHW, [out, in]) and order agree.
TEST(ModelFile, PyTorchStateDictLoadsAndGivesPyTorchsLogits) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> m = Make("lenet5", {1, 28, 28}, cpu.get());
  ASSERT_NE(m, nullptr);
  // PyTorch's file has no metadata: loading needs only the tensors.
  ASSERT_TRUE(LoadModelFile("testdata/lenet5_torch.safetensors", m.get()).ok());
  absl::StatusOr<const Tensor*> logits = m->Forward(SinInput());
  ASSERT_TRUE(logits.ok()) << logits.status();
  std::ifstream in("testdata/lenet5_torch_logits.txt");
  std::vector<float> expected;
  for (float v; in >> v;) expected.push_back(v);
  ASSERT_EQ(expected.size(), 20u);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR((*logits)->data[i], expected[i], 1e-5) << i;
  }
}

// pstrain trains on (pixel / 255 - mean) / stddev (worker/dataset.cc), so a
// model file computes its trained function only of standardised input, and
// says how in its metadata: without input_mean and input_stddev a LeNet-5
// trained one epoch on Fashion-MNIST (0.8447 test accuracy) scored 0.68 in
// PyTorch fed pixel / 255. Fixture (those weights, the first 3 test images
// as bytes, PyTorch's logits of the standardised images) from
// tools/torch/gen_standardised_input_fixture.py.
TEST(ModelFile, StandardisedInputGivesPyTorchsLogits) {
  absl::StatusOr<ModelFileInfo> info =
      ReadModelFileInfo("testdata/lenet5_standardised.safetensors");
  ASSERT_TRUE(info.ok()) << info.status();
  std::ifstream in("testdata/lenet5_standardised_fixture.txt");
  double mean = 0, stddev = 0;
  ASSERT_TRUE(in >> mean >> stddev);
  EXPECT_EQ(info->input_mean, std::vector<double>{mean});
  EXPECT_EQ(info->input_stddev, std::vector<double>{stddev});
  constexpr int kImages = 3, kPixels = 28 * 28, kClasses = 10;
  Tensor x({kImages, 1, 28, 28});
  Tensor unscaled({kImages, 1, 28, 28});
  std::vector<float> expected;
  std::vector<int> labels;
  for (int i = 0; i < kImages; ++i) {
    std::string word;
    int label = -1;
    ASSERT_TRUE(in >> word >> label && word == "image") << i;
    labels.push_back(label);
    for (int j = 0; j < kPixels; ++j) {
      int byte = -1;
      ASSERT_TRUE(in >> byte) << i << " " << j;
      // As worker/dataset.cc: byte * (1 / 255), then standardised in float.
      const float unit = byte * (1.0f / 255.0f);
      unscaled.data[i * kPixels + j] = unit;
      x.data[i * kPixels + j] = static_cast<float>(
          (unit - info->input_mean[0]) / info->input_stddev[0]);
    }
    ASSERT_TRUE(in >> word && word == "logits") << i;
    for (int k = 0; k < kClasses; ++k) {
      float v = 0;
      ASSERT_TRUE(in >> v) << i << " " << k;
      expected.push_back(v);
    }
  }
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> m = Make("lenet5", {1, 28, 28}, cpu.get());
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(
      LoadModelFile("testdata/lenet5_standardised.safetensors", m.get()).ok());
  absl::StatusOr<const Tensor*> logits = m->Forward(x);
  ASSERT_TRUE(logits.ok()) << logits.status();
  // Logits up to ~13 from sums of ~400 fp32 products in another order.
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR((*logits)->data[i], expected[i], 1e-4) << i;
  }
  // The trained weights classify the standardised images; pixel / 255 gives
  // other logits (the defect's 0.68 in PyTorch).
  for (int i = 0; i < kImages; ++i) {
    const float* row = (*logits)->data.data() + i * kClasses;
    EXPECT_EQ(std::max_element(row, row + kClasses) - row, labels[i]) << i;
  }
  absl::StatusOr<const Tensor*> wrong = m->Forward(unscaled);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  float max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_diff = std::max(max_diff, std::abs((*wrong)->data[i] - expected[i]));
  }
  EXPECT_GT(max_diff, 1.0f);
}

// The writer records the standardisation; the reader returns it, and refuses
// a list that does not have one positive stddev per channel.
TEST(ModelFile, InputStandardisationRoundTripsAndBadValuesAreRefused) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> m = Make("lenet5", {3, 32, 32}, cpu.get());
  ASSERT_NE(m, nullptr);
  ModelFileInfo info = InfoOf(*m, 1);
  info.input_mean = {0.4914, 0.4822, 0.4465};
  info.input_stddev = {0.2470, 0.2435, 0.2616};
  const std::string path = TempPath("standardised.safetensors");
  ASSERT_TRUE(SaveModelFile(*m, m->HostWeights(), info, path).ok());
  absl::StatusOr<ModelFileInfo> read = ReadModelFileInfo(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->input_mean, info.input_mean);
  EXPECT_EQ(read->input_stddev, info.input_stddev);

  info.input_stddev = {0.2470, 0.0, 0.2616};
  ASSERT_TRUE(SaveModelFile(*m, m->HostWeights(), info, path).ok());
  absl::Status s = ReadModelFileInfo(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "input_stddev \"0.247,0,0.2616\""))
      << s;
  info.input_mean = {0.5};
  info.input_stddev = {0.25};
  ASSERT_TRUE(SaveModelFile(*m, m->HostWeights(), info, path).ok());
  s = ReadModelFileInfo(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "expected 3 comma-separated"))
      << s;
}

// What pstrain writes for ResNet-18 has exactly the names, dtypes and shapes
// of PyTorch's state_dict (BatchNorm's num_batches_tracked included), so
// load_state_dict(strict=True) accepts it.
TEST(ModelFile, ResNet18FileHasPyTorchsStateDictKeys) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> m = Make("resnet18", {1, 28, 28}, cpu.get());
  ASSERT_NE(m, nullptr);
  const std::string path = TempPath("resnet18.safetensors");
  ASSERT_TRUE(SaveModelFile(*m, m->HostWeights(), InfoOf(*m, 42), path).ok());
  absl::StatusOr<safetensors::File> file = safetensors::File::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> ours;
  for (const safetensors::Tensor& t : file->tensors()) {
    ours.push_back(absl::StrCat(t.name, " ", safetensors::DtypeName(t.dtype),
                                " ", absl::StrJoin(t.shape, ",")));
  }
  std::sort(ours.begin(), ours.end());
  std::ifstream in("testdata/resnet18_torch_keys.txt");
  std::vector<std::string> torch;
  for (std::string line; std::getline(in, line);) torch.push_back(line);
  std::sort(torch.begin(), torch.end());
  ASSERT_EQ(torch.size(), 122u);  // 62 params, 40 BN stats, 20 counters.
  EXPECT_EQ(ours, torch);
  absl::StatusOr<const safetensors::Tensor*> tracked =
      file->Get("bn1.num_batches_tracked", safetensors::Dtype::kI64, {});
  ASSERT_TRUE(tracked.ok()) << tracked.status();
  int64_t steps = 0;
  std::memcpy(&steps, (*tracked)->bytes.data(), sizeof(steps));
  EXPECT_EQ(steps, 42);
}

// bert_tiny's file has the keys and shapes of tools/torch/torch_models.py's
// Bert state_dict (testdata/gen_bert_fixture.py): the tied decoder weight
// once, as the token embedding. It round-trips, with input_chw {S}.
TEST(ModelFile, BertTinyFileHasPyTorchsStateDictKeysAndRoundTrips) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> a =
      Model::Create("bert_tiny", {128}, 97, ModelOptions(), cpu.get());
  ASSERT_TRUE(a.ok()) << a.status();
  ModelOptions other;
  other.seed = 2;
  absl::StatusOr<std::unique_ptr<Model>> b =
      Model::Create("bert_tiny", {128}, 97, other, cpu.get());
  ASSERT_TRUE(b.ok()) << b.status();
  ModelFileInfo info = InfoOf(**a, 3);
  info.num_classes = 97;
  const std::string path = TempPath("bert_tiny.safetensors");
  ASSERT_TRUE(SaveModelFile(**a, (*a)->HostWeights(), info, path).ok());
  absl::StatusOr<safetensors::File> file = safetensors::File::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> ours;
  for (const safetensors::Tensor& t : file->tensors()) {
    ours.push_back(absl::StrCat(t.name, " ", safetensors::DtypeName(t.dtype),
                                " ", absl::StrJoin(t.shape, ",")));
  }
  std::sort(ours.begin(), ours.end());
  std::ifstream in("testdata/bert_tiny_torch_keys.txt");
  std::vector<std::string> torch;
  for (std::string line; std::getline(in, line);) torch.push_back(line);
  std::sort(torch.begin(), torch.end());
  ASSERT_EQ(torch.size(), 33u);
  EXPECT_EQ(ours, torch);
  ASSERT_TRUE(LoadModelFile(path, b->get()).ok());
  for (size_t i = 0; i < (*a)->HostWeights().size(); ++i) {
    const absl::Span<float> wa = (*a)->HostWeights()[i];
    const absl::Span<float> wb = (*b)->HostWeights()[i];
    EXPECT_TRUE(std::equal(wa.begin(), wa.end(), wb.begin())) << i;
  }
  absl::StatusOr<ModelFileInfo> read = ReadModelFileInfo(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->input_chw, (Shape{128}));
  EXPECT_EQ(read->num_classes, 97);
}

TEST(ModelFile, RoundTripRestoresWeightsBuffersAndMetadata) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> a = Make("resnet18", {1, 28, 28}, cpu.get(), 1);
  std::unique_ptr<Model> b = Make("resnet18", {1, 28, 28}, cpu.get(), 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  // Non-default buffers, so that they are seen to travel.
  a->HostWeights().back()[0] = 0.75f;
  const std::string path = TempPath("round_trip.safetensors");
  ASSERT_TRUE(SaveModelFile(*a, a->HostWeights(), InfoOf(*a, 7), path).ok());
  ASSERT_TRUE(LoadModelFile(path, b.get()).ok());
  for (size_t t = 0; t < a->HostWeights().size(); ++t) {
    const auto& wa = a->HostWeights()[t];
    const auto& wb = b->HostWeights()[t];
    ASSERT_EQ(std::vector<float>(wa.begin(), wa.end()),
              std::vector<float>(wb.begin(), wb.end()))
        << t;
  }
  absl::StatusOr<ModelFileInfo> info = ReadModelFileInfo(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model, "resnet18");
  EXPECT_EQ(info->input_chw, (Shape{1, 28, 28}));
  EXPECT_EQ(info->num_classes, 10);
  EXPECT_EQ(info->steps, 7);
  EXPECT_EQ(info->dataset, "fashion_mnist");
}

// A file for another model or input is refused naming the file and the
// tensor, and the model keeps its weights.
TEST(ModelFile, FileOfAnotherModelIsRefusedAndChangesNothing) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> lenet = Make("lenet5", {1, 28, 28}, cpu.get());
  std::unique_ptr<Model> mlp = Make("mlp", {1, 28, 28}, cpu.get());
  std::unique_ptr<Model> lenet_rgb = Make("lenet5", {3, 32, 32}, cpu.get());
  ASSERT_TRUE(lenet && mlp && lenet_rgb);
  const std::vector<float> before(lenet_rgb->HostWeights()[0].begin(),
                                  lenet_rgb->HostWeights()[0].end());
  const std::string path = "testdata/lenet5_torch.safetensors";

  // The MLP's fc1 is [256, 784]; LeNet-5's fc1 in the file is [120, 400].
  absl::Status s = LoadModelFile(path, mlp.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "fc1.weight")) << s;

  s = LoadModelFile(path, lenet_rgb.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "conv1.weight")) << s;
  EXPECT_EQ(std::vector<float>(lenet_rgb->HostWeights()[0].begin(),
                               lenet_rgb->HostWeights()[0].end()),
            before);

  EXPECT_EQ(LoadModelFile(TempPath("missing.safetensors"), lenet.get()).code(),
            absl::StatusCode::kNotFound);
  // PyTorch's own file has no pstrain metadata.
  absl::StatusOr<ModelFileInfo> info = ReadModelFileInfo(path);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(info.status().message(), path));
}

// A NaN or infinity in a weight (a poisoned or diverged file) is refused
// naming the tensor and the element, and the model keeps its weights; text
// taken from the file is escaped in the message.
TEST(ModelFile, NonFiniteWeightsAndControlBytesAreRefused) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> a = Make("lenet5", {1, 28, 28}, cpu.get(), 1);
  std::unique_ptr<Model> b = Make("lenet5", {1, 28, 28}, cpu.get(), 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const std::vector<float> before(b->HostWeights()[0].begin(),
                                  b->HostWeights()[0].end());
  for (const float poison : {std::nanf(""), INFINITY, -INFINITY}) {
    a->HostWeights()[0][17] = poison;  // conv1.weight
    const std::string path = TempPath("poisoned.safetensors");
    ASSERT_TRUE(SaveModelFile(*a, a->HostWeights(), InfoOf(*a, 7), path).ok());
    const absl::Status s = LoadModelFile(path, b.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'conv1.weight' element 17"))
        << s;
    EXPECT_EQ(std::vector<float>(b->HostWeights()[0].begin(),
                                 b->HostWeights()[0].end()),
              before);
  }
  // Metadata with control bytes (a terminal escape among them).
  const std::string path = TempPath("odd_format.safetensors");
  const std::vector<float> w = {1};
  absl::StatusOr<safetensors::WriteResult> written =
      safetensors::Write(path, {safetensors::F32View("w", {1}, w)},
                         {{"format", "pstrain.model/1\n\x1b[31m"}});
  ASSERT_TRUE(written.ok()) << written.status();
  const absl::Status s = ReadModelFileInfo(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "\n")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "\x1b")) << s;
}

TEST(ModelFile, FolderMeansItsModelFile) {
  EXPECT_EQ(ModelFilePath("testdata"), "testdata/model.safetensors");
  EXPECT_EQ(ModelFilePath("testdata/"), "testdata/model.safetensors");
  EXPECT_EQ(ModelFilePath("testdata/lenet5_torch.safetensors"),
            "testdata/lenet5_torch.safetensors");
}

}  // namespace
}  // namespace pstrain
