// The masked-language-model pieces on the CPU backend (issue 41), against
// PyTorch 1.13 (testdata/bert_fixture.txt, written by
// testdata/gen_bert_fixture.py with Debian's python3-torch):
//  - "mlm_head": the per-token Linear with the token table as its weight and
//    the cross-entropy that ignores label -100 (logits, loss, dL/dh, dW,
//    db), within kAbs + kRel * |expected| (fp32 sums in other orders);
//  - the ignore index's edge cases and errors;
//  - "bert_tiny": the zoo model (vocab 97, dropout 0) on a fixed batch of
//    2 x 128 tokens with padding and MLM labels: the loss, the first logits
//    and every parameter's gradient (its first 64 values and its sum of
//    squares) against PyTorch's Bert of tools/torch/torch_models.py, whose
//    state_dict keys are the PS tensor names;
//  - "bert_tiny_adam": ten Adam steps, each step's loss against PyTorch's;
//  - parameter counts, MACs, the tie and the errors of sequence inputs.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_fixture.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"
#include "models/model.h"
#include "optim/adam.h"

namespace pstrain {
namespace {

constexpr float kAbs = 2e-6f;
constexpr float kRel = 2e-5f;

void ExpectAllNear(const std::vector<float>& actual,
                   const std::vector<float>& expected, const std::string& what,
                   float abs = kAbs, float rel = kRel) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], abs + rel * std::fabs(expected[i]))
        << what << "[" << i << "]";
  }
}

std::map<std::string, FixtureCase> Fixture() {
  std::map<std::string, FixtureCase> by_name;
  for (FixtureCase& c : ReadLayerFixture("testdata/bert_fixture.txt")) {
    by_name[c.name] = std::move(c);
  }
  return by_name;
}

std::vector<int32_t> Labels(const std::vector<float>& values) {
  return std::vector<int32_t>(values.begin(), values.end());
}

TEST(MlmHead, TiedDecoderAndIgnoringLossMatchPyTorch) {
  std::map<std::string, FixtureCase> fixture = Fixture();
  ASSERT_TRUE(fixture.count("mlm_head"));
  const auto& v = fixture["mlm_head"].values;
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  // The decoder is a per-token Linear(E 8 -> vocab 11) whose weight is the
  // token table [11, 8].
  Harness h(cpu.get(), LayerSpec::Linear(8, 11));
  h.SetValues(&h.params()[0].value, v.at("param:weight"));
  h.SetValues(&h.params()[1].value, v.at("param:bias"));
  DeviceTensor x = h.Make({2, 5, 8}, v.at("input"));
  const std::vector<float> logits = h.Forward({&x});
  EXPECT_EQ(h.out_shape(), (Shape{2, 5, 11}));
  ExpectAllNear(logits, v.at("out"), "logits");

  DeviceTensor dlogits(cpu.get());
  ASSERT_TRUE(dlogits.Resize(h.out_shape()).ok());
  absl::StatusOr<float> loss = cpu->SoftmaxCrossEntropyIgnoring(
      *h.mutable_out(), Labels(v.at("labels")), kIgnoreLabel, &dlogits);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, v.at("loss")[0], kAbs + kRel * v.at("loss")[0]);
  const std::vector<std::vector<float>> din = h.Backward({&x}, Values(dlogits));
  ExpectAllNear(din[0], v.at("din"), "dL/dh");
  ExpectAllNear(Values(h.params()[0].grad), v.at("grad:weight"), "dW");
  ExpectAllNear(Values(h.params()[1].grad), v.at("grad:bias"), "db");
}

TEST(MlmHead, PerTokenLinearCountsMacsPerToken) {
  const LayerSpec spec = LayerSpec::Linear(8, 11);
  EXPECT_EQ(ForwardMacsPerSample(spec, {1, 5, 8}), 5 * 8 * 11);
  EXPECT_EQ(ForwardMacsPerSample(spec, {1, 8}), 8 * 11);
  // A 3-D input of another width is flattened, as before.
  EXPECT_EQ(*OutputShape(spec, {{3, 2, 4}}), (Shape{3, 11}));
}

TEST(IgnoringCrossEntropy, IgnoredRowsCostNothingAndGetNoGradient) {
  const std::vector<float> logits = {1, 2, 3, 0.5f, -1, 2};
  std::vector<float> d(6, 7.0f);
  // Row 0 ignored: the loss is row 1's alone, and row 0's gradient is 0.
  absl::StatusOr<float> loss = HostSoftmaxCrossEntropyIgnoring(
      logits.data(), 2, 3, std::vector<int32_t>{kIgnoreLabel, 2}, kIgnoreLabel,
      d.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::vector<float> row1(3);
  absl::StatusOr<float> alone = HostSoftmaxCrossEntropy(
      logits.data() + 3, 1, 3, std::vector<int32_t>{2}, row1.data());
  EXPECT_FLOAT_EQ(*loss, *alone);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(d[j], 0.0f);
    EXPECT_FLOAT_EQ(d[3 + j], row1[j]);
  }
  // Every row ignored: 0 and zero gradients (PyTorch: NaN).
  loss = HostSoftmaxCrossEntropyIgnoring(
      logits.data(), 2, 3, std::vector<int32_t>{kIgnoreLabel, kIgnoreLabel},
      kIgnoreLabel, d.data());
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(*loss, 0.0f);
  for (float x : d) EXPECT_EQ(x, 0.0f);
}

// The CPU backend's oneDNN path (log-softmax, exp) against the host loop:
// a vocabulary's rows with some ignored, and every row ignored.
TEST(IgnoringCrossEntropy, TheCpuBackendMatchesTheHostLoop) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  constexpr int64_t kRows = 7, kVocab = 30522;
  std::vector<float> values(kRows * kVocab);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 8.0f * std::sin(0.37f * i) + 0.01f * (i % 101);
  }
  DeviceTensor logits(cpu.get()), dlogits(cpu.get());
  ASSERT_TRUE(logits.Resize({kRows, kVocab}).ok());
  ASSERT_TRUE(dlogits.Resize({kRows, kVocab}).ok());
  std::copy(values.begin(), values.end(), logits.data());
  for (const std::vector<int32_t>& labels :
       {std::vector<int32_t>{5, kIgnoreLabel, 30521, 0, kIgnoreLabel, 77, 9},
        std::vector<int32_t>(kRows, kIgnoreLabel)}) {
    std::vector<float> expected(values.size());
    absl::StatusOr<float> host = HostSoftmaxCrossEntropyIgnoring(
        values.data(), kRows, kVocab, labels, kIgnoreLabel, expected.data());
    ASSERT_TRUE(host.ok()) << host.status();
    std::fill(dlogits.data(), dlogits.data() + dlogits.size(), 7.0f);
    absl::StatusOr<float> loss = cpu->SoftmaxCrossEntropyIgnoring(
        logits, labels, kIgnoreLabel, &dlogits);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, *host, 1e-5 * std::fabs(*host) + 1e-7);
    ExpectAllNear(Values(dlogits), expected, "dlogits", 1e-9f, 1e-5f);
  }
  absl::StatusOr<float> bad = cpu->SoftmaxCrossEntropyIgnoring(
      logits, std::vector<int32_t>(kRows, kVocab), kIgnoreLabel, &dlogits);
  EXPECT_EQ(bad.status().message(),
            "label 30522 of row 0 is outside [0, 30522) and not the ignore "
            "index -100");
}

TEST(IgnoringCrossEntropy, BadLabelsAreInvalidArguments) {
  const std::vector<float> logits(6, 0.0f);
  absl::StatusOr<float> loss = HostSoftmaxCrossEntropyIgnoring(
      logits.data(), 2, 3, std::vector<int32_t>{-1, 0}, kIgnoreLabel, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loss.status().message(),
            "label -1 of row 0 is outside [0, 3) and not the ignore index "
            "-100");
  loss = HostSoftmaxCrossEntropyIgnoring(
      logits.data(), 2, 3, std::vector<int32_t>{0}, kIgnoreLabel, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
}

// The fixture's bert_tiny weights: PS tensor k, element i = 0.02 sin(0.7 i +
// 1.3 k), plus 1 for LayerNorm weights (gen_bert_fixture.py).
void SetFixtureWeights(Model& model) {
  const std::vector<std::string> names = model.PsTensorNames();
  for (size_t k = 0; k < names.size(); ++k) {
    const bool norm_weight = absl::StrContains(names[k], "norm") &&
                             absl::EndsWith(names[k], "weight");
    absl::Span<float> w = model.HostWeights()[k];
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<float>(0.02 * std::sin(0.7 * i + 1.3 * k) +
                                (norm_weight ? 1.0 : 0.0));
    }
  }
  ASSERT_TRUE(model.LoadHostWeights().ok());
}

// Zoo model `name` with dropout 0 (deterministic steps), sequences of
// `seq` tokens, vocabulary `vocab`.
absl::StatusOr<std::unique_ptr<Model>> NoDropoutBert(const std::string& name,
                                                     int64_t seq, int vocab,
                                                     Backend* backend) {
  ModelOptions options;
  options.transformer_dropout = 0.0f;
  return Model::Create(name, {seq}, vocab, options, backend);
}

std::unique_ptr<Model> MakeBertTiny(Backend* backend, bool memory_plan) {
  ModelOptions options;
  options.transformer_dropout = 0.0f;
  options.memory_plan = memory_plan;
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("bert_tiny", {128}, 97, options, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

Tensor MakeTensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t(shape);
  EXPECT_EQ(t.size(), static_cast<int64_t>(values.size()));
  t.data = values;
  return t;
}

TEST(BertTiny, TrainingStepMatchesPyTorch) {
  std::map<std::string, FixtureCase> fixture = Fixture();
  ASSERT_TRUE(fixture.count("bert_tiny"));
  const auto& v = fixture["bert_tiny"].values;
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::unique_ptr<Model> model = MakeBertTiny(cpu.get(), true);
  ASSERT_NE(model, nullptr);
  SetFixtureWeights(*model);
  const Tensor ids = MakeTensor({2, 128}, v.at("input"));
  const Tensor mask = MakeTensor({2, 128}, v.at("input2"));
  const std::vector<int32_t> labels = Labels(v.at("labels"));
  absl::StatusOr<float> loss = model->ForwardBackward(ids, mask, labels);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, v.at("loss")[0], 1e-5f * v.at("loss")[0]);
  // Every PS tensor, by PyTorch's state_dict key, and nothing else.
  const std::vector<std::string> names = model->PsTensorNames();
  int checked = 0;
  for (const auto& [tag, values] : v) {
    if (!absl::StartsWith(tag, "head:")) continue;
    const std::string name = tag.substr(5);
    auto it = std::find(names.begin(), names.end(), name);
    ASSERT_NE(it, names.end()) << name;
    const absl::Span<const float> grad =
        model->HostGradients()[it - names.begin()];
    ExpectAllNear(std::vector<float>(grad.begin(), grad.begin() + 64), values,
                  "grad " + name, 1e-6f, 2e-4f);
    double sumsq = 0;
    for (float g : grad) sumsq += double{g} * g;
    const double expected = v.at("sumsq:" + name)[0];
    EXPECT_NEAR(sumsq, expected, 1e-12 + 2e-4 * expected) << name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(names.size()));
  EXPECT_EQ(names.size(), 33u);

  absl::StatusOr<const Tensor*> logits = model->Forward(ids, mask, true);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ((*logits)->shape, (Shape{2, 128, 97}));
  ExpectAllNear(
      std::vector<float>((*logits)->data.begin(), (*logits)->data.begin() + 64),
      v.at("logits_head"), "logits", 1e-5f, 1e-4f);
}

// Ten steps of Adam (Model::AdamStep, optim/adam.h's PyTorch-order update)
// on the fixture's batches from the same initial weights: every step's
// loss within 1e-4 relative of torch.optim.Adam's (the acceptance
// asks 2% after N steps).
TEST(BertTiny, AdamTrainingFollowsPyTorchStepForStep) {
  std::map<std::string, FixtureCase> fixture = Fixture();
  ASSERT_TRUE(fixture.count("bert_tiny_adam"));
  const auto& v = fixture["bert_tiny_adam"].values;
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      NoDropoutBert("bert_tiny", 32, 97, cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  SetFixtureWeights(**model);
  (*model)->set_stage_gradients(false);
  const std::vector<float>& expected = v.at("losses");
  ASSERT_EQ(expected.size(), 10u);
  AdamOptions adam;
  adam.lr = 1e-3f;
  for (int k = 0; k < 10; ++k) {
    const std::string step = absl::StrCat(k);
    absl::StatusOr<float> loss =
        (*model)->ForwardBackward(MakeTensor({4, 32}, v.at("ids:" + step)),
                                  MakeTensor({4, 32}, v.at("mask:" + step)),
                                  Labels(v.at("labels:" + step)));
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, expected[k], 1e-4f * expected[k]) << "step " << k;
    ASSERT_TRUE((*model)->AdamStep(adam).ok());
  }
}

TEST(BertTiny, MemoryPlanChangesNoBit) {
  std::map<std::string, FixtureCase> fixture = Fixture();
  ASSERT_TRUE(fixture.count("bert_tiny"));
  const auto& v = fixture["bert_tiny"].values;
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::vector<std::vector<float>> grads[2];
  float losses[2] = {0, 0};
  for (int plan = 0; plan < 2; ++plan) {
    std::unique_ptr<Model> model = MakeBertTiny(cpu.get(), plan == 1);
    ASSERT_NE(model, nullptr);
    SetFixtureWeights(*model);
    absl::StatusOr<float> loss = model->ForwardBackward(
        MakeTensor({2, 128}, v.at("input")),
        MakeTensor({2, 128}, v.at("input2")), Labels(v.at("labels")));
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses[plan] = *loss;
    for (absl::Span<const float> g : model->HostGradients()) {
      grads[plan].emplace_back(g.begin(), g.end());
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(BertZoo, ParameterCountsAndTheTiedDecoder) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> tiny =
      Model::Create("bert_tiny", {128}, 8192, ModelOptions(), cpu.get());
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  // tools/torch/torch_models.py's bert("bert_tiny", 8192) and
  // ("bert_base", 30522): sum(p.numel() for p in parameters()).
  EXPECT_EQ((*tiny)->NumParameters(), 1535872);
  EXPECT_TRUE((*tiny)->sequence_model());
  EXPECT_EQ((*tiny)->input_chw(), (Shape{128}));
  // The decoder's weight is the token table: one PS tensor, and the head
  // has only its bias.
  const std::vector<std::string> names = (*tiny)->PsTensorNames();
  EXPECT_EQ(names.front(), "embeddings.token.weight");
  EXPECT_EQ(names.back(), "head.decoder.bias");
  EXPECT_EQ(std::count(names.begin(), names.end(), "head.decoder.weight"), 0);
  absl::StatusOr<std::unique_ptr<Model>> base =
      Model::Create("bert_base", {128}, 30522, ModelOptions(), cpu.get());
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ((*base)->NumParameters(), 109512762);
  // Per sequence of 128: 12 blocks of 4 S E^2 + 2 S^2 E + 2 S E F, the
  // head's S E^2 and the decoder's S E V (14.3 GMACs; the embeddings,
  // LayerNorms and softmax are not counted).
  const int64_t s = 128, e = 768, f = 3072, v = 30522;
  EXPECT_EQ((*base)->ForwardMacsPerSample(),
            12 * (4 * s * e * e + 2 * s * s * e + 2 * s * e * f) + s * e * e +
                s * e * v);
  EXPECT_EQ((*base)->PsTensorNames().size(), 4u + 12 * 12 + 5);
}

// The "_untied" BERTs (issue 41): head.decoder has its own weight, so the
// token table's gradient is row-sparse. With the decoder's weight equal to
// the token table, the untied model computes the tied one's loss, and the
// tied table's gradient is the sum of the untied model's two (the tie adds
// the decoder's into the table's: float sums in another order).
TEST(BertZoo, UntiedDecoderMatchesTheTiedOneAndItsTableIsRowSparse) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> tied =
      NoDropoutBert("bert_tiny", 16, 97, cpu.get());
  absl::StatusOr<std::unique_ptr<Model>> untied =
      NoDropoutBert("bert_tiny_untied", 16, 97, cpu.get());
  ASSERT_TRUE(tied.ok() && untied.ok()) << untied.status();
  EXPECT_EQ((*untied)->NumParameters(), (*tied)->NumParameters() + 97 * 128);
  const std::vector<std::string> names = (*untied)->PsTensorNames();
  ASSERT_EQ(names.size(), (*tied)->PsTensorNames().size() + 1);
  EXPECT_EQ(names[names.size() - 2], "head.decoder.weight");
  EXPECT_EQ((*untied)->PsTensorShapes()[names.size() - 2], (Shape{97, 128}));
  std::vector<int64_t> rows(names.size(), 0);
  rows[0] = 128;  // embeddings.token.weight; position.weight stays dense
  EXPECT_EQ((*untied)->PsTensorRowElements(), rows);
  EXPECT_EQ((*tied)->PsTensorRowElements(),
            std::vector<int64_t>(names.size() - 1, 0));

  SetFixtureWeights(**tied);
  SetFixtureWeights(**untied);
  // Same weights by name; the decoder's is the token table.
  const std::vector<std::string> tied_names = (*tied)->PsTensorNames();
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& source = names[k] == "head.decoder.weight"
                                    ? "embeddings.token.weight"
                                    : names[k];
    const size_t j = std::find(tied_names.begin(), tied_names.end(), source) -
                     tied_names.begin();
    ASSERT_LT(j, tied_names.size()) << source;
    absl::Span<const float> from = (*tied)->HostWeights()[j];
    std::copy(from.begin(), from.end(), (*untied)->HostWeights()[k].begin());
  }
  ASSERT_TRUE((*untied)->LoadHostWeights().ok());
  // Two sequences of 16 tokens; ids 0..59 only, so rows 60..96 are never
  // read; the second sequence's last 4 positions are padding.
  std::vector<float> ids(32), mask(32, 0.0f);
  std::vector<int32_t> labels(32, kIgnoreLabel);
  for (int i = 0; i < 32; ++i) {
    ids[i] = static_cast<float>((7 * i + 3) % 60);
    if (i % 3 == 0) labels[i] = (5 * i + 1) % 97;
  }
  for (int i = 28; i < 32; ++i) {
    mask[i] = 1.0f;
    labels[i] = kIgnoreLabel;
  }
  const Tensor id_tensor = MakeTensor({2, 16}, ids);
  const Tensor mask_tensor = MakeTensor({2, 16}, mask);
  absl::StatusOr<float> tied_loss =
      (*tied)->ForwardBackward(id_tensor, mask_tensor, labels);
  absl::StatusOr<float> untied_loss =
      (*untied)->ForwardBackward(id_tensor, mask_tensor, labels);
  ASSERT_TRUE(tied_loss.ok() && untied_loss.ok()) << untied_loss.status();
  EXPECT_NEAR(*untied_loss, *tied_loss, 1e-6f * *tied_loss);
  const absl::Span<const float> table = (*untied)->HostGradients()[0];
  const absl::Span<const float> decoder =
      (*untied)->HostGradients()[names.size() - 2];
  const absl::Span<const float> tied_table = (*tied)->HostGradients()[0];
  int64_t nonzero_outside = 0, nonzero_decoder_outside = 0;
  for (int64_t row = 0; row < 97; ++row) {
    for (int64_t j = 0; j < 128; ++j) {
      const int64_t i = row * 128 + j;
      EXPECT_NEAR(table[i] + decoder[i], tied_table[i],
                  1e-7f + 1e-4f * std::fabs(tied_table[i]))
          << "row " << row << " element " << j;
      if (row >= 60) {
        nonzero_outside += table[i] != 0.0f;
        nonzero_decoder_outside += decoder[i] != 0.0f;
      }
    }
  }
  // The untied table's gradient is exactly zero off the batch's ids; the
  // decoder's (and so the tied table's) is dense over the vocabulary.
  EXPECT_EQ(nonzero_outside, 0);
  EXPECT_GT(nonzero_decoder_outside, 37 * 128 / 2);
}

// The MLM head runs at the predicted positions only (head.gather): a
// training step's loss is the cross-entropy of the full per-token logits
// (Forward, every position) at the labelled tokens, and a step that
// predicts nothing costs 0 and moves no weight.
TEST(BertTiny, TheHeadRunsAtThePredictedPositions) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      NoDropoutBert("bert_tiny_untied", 16, 50, cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  // Per sample the head's rows are its 16 positions (all, as Forward's).
  EXPECT_TRUE(absl::StrContains((*model)->Summary(), "gather128"))
      << (*model)->Summary();
  EXPECT_TRUE(absl::StrContains((*model)->Summary(), "[16, 50]"));
  Tensor ids({3, 16});
  std::vector<int32_t> labels(48, kIgnoreLabel);
  for (int i = 0; i < 48; ++i) ids.data[i] = 5 + (i * 7) % 45;
  for (int i : {1, 9, 20, 21, 47}) labels[i] = 5 + (i * 3) % 45;
  absl::StatusOr<const Tensor*> logits = (*model)->Forward(ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits.value()->shape, (Shape{3, 16, 50}));
  double expected = 0;
  for (int i = 0; i < 48; ++i) {
    if (labels[i] == kIgnoreLabel) continue;
    const float* row = logits.value()->data.data() + i * 50;
    const float top = *std::max_element(row, row + 50);
    double sum = 0;
    for (int k = 0; k < 50; ++k) sum += std::exp(double{row[k]} - top);
    expected += std::log(sum) + top - row[labels[i]];
  }
  const std::vector<float> full = logits.value()->data;
  // ForwardAt (evaluation): the same rows at the positions asked.
  const Tensor no_padding({3, 16});
  absl::StatusOr<const Tensor*> at =
      (*model)->ForwardAt(ids, no_padding, {47.0f, 1.0f, 9.0f});
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_EQ(at.value()->shape, (Shape{3, 50}));
  for (int r = 0; r < 3; ++r) {
    const int t = r == 0 ? 47 : r == 1 ? 1 : 9;
    for (int k = 0; k < 50; ++k) {
      EXPECT_NEAR(at.value()->data[r * 50 + k], full[t * 50 + k], 1e-5)
          << "row " << t << ", logit " << k;
    }
  }
  EXPECT_EQ((*model)->ForwardAt(ids, no_padding, {48.0f}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->ForwardAt(ids, no_padding, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<float> loss = (*model)->ForwardBackward(ids, labels);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, expected / 5, 1e-5);
  // Forward after a step still gives every position's logits.
  logits = (*model)->Forward(ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits.value()->shape, (Shape{3, 16, 50}));

  loss = (*model)->ForwardBackward(ids, std::vector<int32_t>(48, kIgnoreLabel));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(*loss, 0.0f);
  for (absl::Span<const float> g : (*model)->HostGradients()) {
    EXPECT_TRUE(
        std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST(BertZoo, SequenceInputErrorsAreNamed) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create("bert_tiny", {1, 28, 28}, 10, ModelOptions(), cpu.get());
  EXPECT_EQ(model.status().message(),
            "bert_tiny: input [1, 28, 28]; expected [S], the sequence length, "
            "with 1 <= S <= 512");
  model = Model::Create("bert_tiny", {8}, 20, ModelOptions(), cpu.get());
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor ids({2, 8});
  absl::StatusOr<const Tensor*> out = (*model)->Forward(Tensor({2, 9}));
  EXPECT_EQ(out.status().message(),
            "bert_tiny: input [2, 9]; expected token ids [N, 8]");
  out = (*model)->Forward(ids, Tensor({2, 7}));
  EXPECT_EQ(out.status().message(),
            "bert_tiny: padding mask [2, 7]; expected the input's [2, 8]");
  ids.data[3] = 20;  // Out of the vocabulary.
  out = (*model)->Forward(ids);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  ids.data[3] = 0;
  // One label per token.
  absl::StatusOr<float> loss =
      (*model)->ForwardBackward(ids, std::vector<int32_t>(2, 1));
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> labels(16, kIgnoreLabel);
  labels[5] = 7;
  loss = (*model)->ForwardBackward(ids, labels);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(20.0), 1.0);  // About uniform at init.

  absl::StatusOr<std::unique_ptr<Model>> lenet =
      Model::Create("lenet5", {1, 28, 28}, 10, ModelOptions(), cpu.get());
  ASSERT_TRUE(lenet.ok());
  out = (*lenet)->Forward(Tensor({1, 1, 28, 28}), Tensor({1, 1, 28, 28}));
  EXPECT_EQ(out.status().message(),
            "lenet5: padding mask [1, 1, 28, 28]; only sequence models take "
            "one");
}

}  // namespace
}  // namespace pstrain
