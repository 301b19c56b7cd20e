// The CPU backend's transformer layers (issue 41):
//  - against PyTorch 1.13 (testdata/transformer_fixture.txt, written by
//    testdata/gen_transformer_fixture.py with Debian's python3-torch):
//    forward output, input gradient and every parameter gradient, within
//    kAbs + kRel * |expected|;
//  - by central finite differences of L = sum(out * R) (R fixed, random),
//    step 1e-2, in double: agreement within kFdTolerance * max(1, |grad|).
//    Attention with dropout too: every evaluation builds the layer afresh
//    with the same seed, so it draws the same mask;
//  - their errors, the key padding mask, dropout's seeding, and the
//    BackwardReadsOf() contract.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_fixture.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"

namespace pstrain {
namespace {

// fp32 against PyTorch's fp32: the sums run in other orders.
constexpr float kAbs = 2e-6f;
constexpr float kRel = 2e-5f;
constexpr float kStep = 1e-2f;
constexpr float kFdTolerance = 2e-3f;

void ExpectAllNear(const std::vector<float>& actual,
                   const std::vector<float>& expected,
                   const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], kAbs + kRel * std::fabs(expected[i]))
        << what << "[" << i << "]";
  }
}

// A fixture case: the spec, the input shape, and the mask's shape for
// attention (empty: one input).
struct TransformerCase {
  std::string name;
  LayerSpec spec;
  Shape shape;
  Shape mask_shape;
};

std::vector<TransformerCase> Cases() {
  return {
      {"layernorm", LayerSpec::LayerNorm(8), {2, 3, 8}, {}},
      {"layernorm_2d", LayerSpec::LayerNorm(6), {4, 6}, {}},
      {"gelu", LayerSpec::Gelu(), {2, 3, 8}, {}},
      {"embedding", LayerSpec::Embedding(11, 7, 6), {2, 5}, {}},
      {"mha", LayerSpec::MultiheadAttention(8, 2, 0.0f), {2, 5, 8}, {2, 5}},
      {"mha_heads4",
       LayerSpec::MultiheadAttention(12, 4, 0.0f),
       {3, 4, 12},
       {3, 4}},
      {"encoder",
       LayerSpec::TransformerEncoderLayer(8, 2, 16, 0.0f),
       {2, 5, 8},
       {2, 5}},
  };
}

TEST(PyTorchFixtures, TransformerLayersMatchForwardAndEveryGradient) {
  const std::vector<FixtureCase> fixture =
      ReadLayerFixture("testdata/transformer_fixture.txt");
  std::map<std::string, const FixtureCase*> by_name;
  for (const FixtureCase& c : fixture) by_name[c.name] = &c;
  for (const TransformerCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(by_name.count(c.name)) << "fixture has no case " << c.name;
    const auto& v = by_name[c.name]->values;
    std::unique_ptr<Backend> cpu = NewCpuBackend();
    Harness h(cpu.get(), c.spec);
    for (Param& p : h.params()) {
      ASSERT_TRUE(v.count("param:" + p.name)) << p.name;
      h.SetValues(&p.value, v.at("param:" + p.name));
    }
    DeviceTensor x = h.Make(c.shape, v.at("input"));
    DeviceTensor mask;
    std::vector<DeviceTensor*> inputs = {&x};
    if (!c.mask_shape.empty()) {
      mask = h.Make(c.mask_shape, v.at("input2"));
      inputs.push_back(&mask);
    }
    ExpectAllNear(h.Forward(inputs), v.at("out"), "out");
    const auto din = h.Backward(inputs, v.at("dout"));
    if (v.count("din")) {
      ExpectAllNear(din[0], v.at("din"), "din");
    } else {
      // Token ids: no gradient.
      EXPECT_EQ(din[0], std::vector<float>(din[0].size(), 0.0f));
    }
    for (Param& p : h.params()) {
      ExpectAllNear(Values(p.grad), v.at("grad:" + p.name), "grad:" + p.name);
    }
  }
}

// ---- Finite differences ----

std::vector<float> Uniform(int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Inputs of one check: x (differentiated unless `x_fixed`) and, for
// attention, the mask.
struct FdInputs {
  Shape shape;
  std::vector<float> x;
  Shape mask_shape;
  std::vector<float> mask;
  bool x_fixed = false;
};

// Checks d(sum(layer(x) * R))/dx and /dparams against central differences
// in training mode. Each loss evaluation runs a new layer with `seed` (the
// same dropout mask as the analytic pass's) and the current values.
void CheckGradients(const LayerSpec& spec, FdInputs in, uint64_t seed) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  std::vector<std::vector<float>> params;
  {
    Harness h(cpu.get(), spec, seed);
    for (Param& p : h.params()) params.push_back(Values(p.value));
  }
  std::vector<float> r;
  // Runs a fresh layer; returns the output, and with `dout` the gradients
  // (input first, then parameters).
  auto run = [&](const std::vector<float>* dout,
                 std::vector<std::vector<float>>* grads) {
    Harness h(cpu.get(), spec, seed);
    for (size_t p = 0; p < params.size(); ++p) {
      h.SetValues(&h.params()[p].value, params[p]);
    }
    DeviceTensor x = h.Make(in.shape, in.x);
    DeviceTensor mask;
    std::vector<DeviceTensor*> inputs = {&x};
    if (!in.mask_shape.empty()) {
      mask = h.Make(in.mask_shape, in.mask);
      inputs.push_back(&mask);
    }
    std::vector<float> out = h.Forward(inputs);
    if (dout != nullptr) {
      grads->push_back(h.Backward(inputs, *dout)[0]);
      for (Param& p : h.params()) grads->push_back(Values(p.grad));
    }
    return out;
  };
  std::vector<std::vector<float>> grads;
  {
    std::vector<std::vector<float>> none;
    const std::vector<float> out = run(nullptr, &none);
    r = Uniform(out.size(), -1.0f, 1.0f, seed + 100);
  }
  run(&r, &grads);
  auto loss = [&] {
    const std::vector<float> o = run(nullptr, nullptr);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += double{o[i]} * r[i];
    return s;
  };
  auto check = [&](std::vector<float>* values, const std::vector<float>& grad,
                   const std::string& what) {
    for (size_t i = 0; i < values->size(); ++i) {
      const float saved = (*values)[i];
      (*values)[i] = saved + kStep;
      const double plus = loss();
      (*values)[i] = saved - kStep;
      const double minus = loss();
      (*values)[i] = saved;
      const double numeric = (plus - minus) / (2.0 * kStep);
      const double scale =
          std::max({1.0, std::fabs(double{grad[i]}), std::fabs(numeric)});
      EXPECT_NEAR(grad[i], numeric, kFdTolerance * scale)
          << what << "[" << i << "]";
    }
  };
  if (!in.x_fixed) check(&in.x, grads[0], LayerName(spec) + " input");
  const std::vector<TensorSpec> names = ParamSpecs(spec);
  for (size_t p = 0; p < params.size(); ++p) {
    check(&params[p], grads[p + 1], LayerName(spec) + " " + names[p].name);
  }
}

TEST(FiniteDifferences, LayerNorm) {
  CheckGradients(LayerSpec::LayerNorm(5),
                 {{2, 3, 5}, Uniform(30, -2.0f, 2.0f, 1), {}, {}}, 2);
}

TEST(FiniteDifferences, Gelu) {
  CheckGradients(LayerSpec::Gelu(),
                 {{3, 7}, Uniform(21, -3.0f, 3.0f, 3), {}, {}}, 4);
}

TEST(FiniteDifferences, EmbeddingTables) {
  // Token 2 twice, token 4 unused; 3 of 4 positions.
  FdInputs in{{2, 3}, {2, 0, 2, 1, 3, 2}, {}, {}};
  in.x_fixed = true;
  CheckGradients(LayerSpec::Embedding(5, 4, 3), in, 5);
}

TEST(FiniteDifferences, AttentionWithPadding) {
  // Sample 1's last two keys are padding.
  CheckGradients(LayerSpec::MultiheadAttention(6, 2, 0.0f),
                 {{2, 4, 6},
                  Uniform(48, -1.0f, 1.0f, 6),
                  {2, 4},
                  {0, 0, 0, 0, 0, 0, 1, 1}},
                 7);
}

TEST(FiniteDifferences, AttentionWithDropout) {
  CheckGradients(
      LayerSpec::MultiheadAttention(4, 2, 0.3f),
      {{2, 3, 4}, Uniform(24, -1.0f, 1.0f, 8), {2, 3}, {0, 0, 0, 0, 1, 0}}, 9);
}

TEST(FiniteDifferences, EncoderLayerWithPadding) {
  CheckGradients(
      LayerSpec::TransformerEncoderLayer(4, 2, 6, 0.0f),
      {{2, 3, 4}, Uniform(24, -1.0f, 1.0f, 12), {2, 3}, {0, 0, 0, 0, 0, 1}},
      13);
}

// Four dropouts (attention weights, after attention, after GELU, after
// linear2), each mask the same in every evaluation.
TEST(FiniteDifferences, EncoderLayerWithDropout) {
  CheckGradients(
      LayerSpec::TransformerEncoderLayer(4, 2, 6, 0.25f),
      {{2, 3, 4}, Uniform(24, -1.0f, 1.0f, 14), {2, 3}, {0, 0, 0, 0, 0, 0}},
      15);
}

TEST(EncoderLayer, DropoutIsOffInEval) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const std::vector<float> x = Uniform(2 * 4 * 8, -1.0f, 1.0f, 16);
  const std::vector<float> mask = {0, 0, 0, 0, 0, 0, 1, 1};
  auto forward = [&](float p, bool training) {
    Harness h(cpu.get(), LayerSpec::TransformerEncoderLayer(8, 2, 16, p), 5);
    DeviceTensor t = h.Make({2, 4, 8}, x);
    DeviceTensor m = h.Make({2, 4}, mask);
    return h.Forward({&t, &m}, training);
  };
  const std::vector<float> plain = forward(0.0f, true);
  EXPECT_EQ(forward(0.3f, false), plain);
  EXPECT_NE(forward(0.3f, true), plain);
}

// ---- Behaviours ----

// A key marked padding changes nothing: the output of the other keys equals
// that of the sequence without the padded key.
TEST(MultiheadAttention, PaddedKeysAreIgnored) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const LayerSpec spec = LayerSpec::MultiheadAttention(4, 2, 0.0f);
  Harness full(cpu.get(), spec, 3), cut(cpu.get(), spec, 3);
  const std::vector<float> x = Uniform(4 * 4, -1.0f, 1.0f, 10);
  std::vector<float> garbage = x;
  for (int j = 12; j < 16; ++j) garbage[j] = 50.0f;  // The padded token.
  DeviceTensor a = full.Make({1, 4, 4}, garbage);
  DeviceTensor am = full.Make({1, 4}, {0, 0, 0, 1});
  DeviceTensor b =
      cut.Make({1, 3, 4}, std::vector<float>(x.begin(), x.begin() + 12));
  DeviceTensor bm = cut.Make({1, 3}, {0, 0, 0});
  const std::vector<float> ya = full.Forward({&a, &am});
  const std::vector<float> yb = cut.Forward({&b, &bm});
  for (int j = 0; j < 12; ++j) EXPECT_NEAR(ya[j], yb[j], 1e-6) << j;
}

TEST(MultiheadAttention, DropoutIsSeededAndOffInEval) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const std::vector<float> x = Uniform(2 * 6 * 8, -1.0f, 1.0f, 11);
  const std::vector<float> mask(12, 0.0f);
  auto forward = [&](float p, uint64_t seed, bool training) {
    Harness h(cpu.get(), LayerSpec::MultiheadAttention(8, 2, p), 5);
    // Same weights for every p and seed; `seed` only drives dropout.
    Harness seeded(cpu.get(), LayerSpec::MultiheadAttention(8, 2, p), seed);
    for (size_t i = 0; i < h.params().size(); ++i) {
      seeded.SetValues(&seeded.params()[i].value, Values(h.params()[i].value));
    }
    DeviceTensor t = seeded.Make({2, 6, 8}, x);
    DeviceTensor m = seeded.Make({2, 6}, mask);
    return seeded.Forward({&t, &m}, training);
  };
  const std::vector<float> plain = forward(0.0f, 1, true);
  EXPECT_EQ(forward(0.5f, 1, false), plain);
  EXPECT_NE(forward(0.5f, 1, true), plain);
  EXPECT_EQ(forward(0.5f, 1, true), forward(0.5f, 1, true));
  EXPECT_NE(forward(0.5f, 1, true), forward(0.5f, 2, true));
}

// BERT's gather_indexes: rows of [N, S, E] at flat positions; the backward
// adds each output row's gradient into the row it came from (twice for a
// row gathered twice), zero elsewhere.
TEST(GatherRows, PicksRowsAndScattersTheirGradientsBack) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  Harness h(cpu.get(), LayerSpec::GatherRows(2));
  // x [2, 3, 2]: row r holds (r, 10 r).
  std::vector<float> x;
  for (int r = 0; r < 6; ++r) x.insert(x.end(), {1.0f * r, 10.0f * r});
  DeviceTensor xt = h.Make({2, 3, 2}, x);
  DeviceTensor at = h.Make({3}, {4, 1, 4});
  EXPECT_EQ(h.Forward({&xt, &at}), (std::vector<float>{4, 40, 1, 10, 4, 40}));
  EXPECT_EQ(h.out_shape(), (Shape{3, 2}));
  const std::vector<std::vector<float>> din =
      h.Backward({&xt, &at}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(din[0], (std::vector<float>{0, 0, 3, 4, 0, 0, 0, 0, 6, 8, 0, 0}));
  EXPECT_EQ(din[1], (std::vector<float>{0, 0, 0}));
}

TEST(GatherRows, PositionsOutsideTheRowsAreInvalid) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const LayerSpec spec = LayerSpec::GatherRows(2);
  std::unique_ptr<Layer> layer = *cpu->CreateLayer(spec, {}, {}, 1);
  Harness h(cpu.get(), spec);
  DeviceTensor x = h.Make({1, 3, 2}, std::vector<float>(6, 1.0f));
  DeviceTensor out(cpu.get());
  ASSERT_TRUE(out.Resize({2, 2}).ok());
  for (float bad : {3.0f, -1.0f, 0.5f, std::nanf("")}) {
    DeviceTensor at = h.Make({2}, {0.0f, bad});
    const std::vector<const DeviceTensor*> in = {&x, &at};
    absl::Status s = layer->Forward(in, &out, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "is not a row index in [0, 3)"))
        << s;
  }
  EXPECT_EQ(OutputShape(spec, {{1, 3, 2}, {0}}).status().message(),
            "gather2: input [0]; expected positions [P] with P >= 1");
  EXPECT_EQ(OutputShape(spec, {{1, 3, 4}, {2}}).status().message(),
            "gather2: input [1, 3, 4]; expected [..., 2]");
}

TEST(MultiheadAttention, EveryKeyPaddedIsInvalid) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const LayerSpec spec = LayerSpec::MultiheadAttention(4, 2, 0.0f);
  Harness h(cpu.get(), spec);
  DeviceTensor x = h.Make({2, 2, 4}, std::vector<float>(16, 0.5f));
  DeviceTensor m = h.Make({2, 2}, {0, 1, 1, 1});
  DeviceTensor out(cpu.get());
  ASSERT_TRUE(out.Resize({2, 2, 4}).ok());
  std::vector<Param*> params;
  for (Param& p : h.params()) params.push_back(&p);
  std::unique_ptr<Layer> layer = *cpu->CreateLayer(spec, params, {}, 1);
  const std::vector<const DeviceTensor*> in = {&x, &m};
  absl::Status s = layer->Forward(in, &out, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "mha4/2: every key of sample 1 is padding (key padding mask all "
            "nonzero)");
}

TEST(MultiheadAttention, BackwardWithoutTrainingForwardFails) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const LayerSpec spec = LayerSpec::MultiheadAttention(4, 2, 0.0f);
  Harness h(cpu.get(), spec);
  std::vector<Param*> params;
  for (Param& p : h.params()) params.push_back(&p);
  std::unique_ptr<Layer> layer = *cpu->CreateLayer(spec, params, {}, 1);
  DeviceTensor x = h.Make({1, 2, 4}, std::vector<float>(8, 0.5f));
  DeviceTensor m = h.Make({1, 2}, {0, 0});
  DeviceTensor out = h.Make({1, 2, 4}, std::vector<float>(8, 0.0f));
  DeviceTensor dx = h.Make({1, 2, 4}, std::vector<float>(8, 0.0f));
  const std::vector<const DeviceTensor*> in = {&x, &m};
  ASSERT_TRUE(layer->Forward(in, &out, false).ok());
  const std::vector<DeviceTensor*> din = {&dx, nullptr};
  EXPECT_EQ(layer->Backward(in, out, out, din).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Embedding, BadTokenIdsAreInvalid) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  const LayerSpec spec = LayerSpec::Embedding(5, 4, 3);
  for (float bad : {5.0f, -1.0f, 1.5f, std::nanf("")}) {
    Harness h(cpu.get(), spec);
    std::vector<Param*> params;
    for (Param& p : h.params()) params.push_back(&p);
    std::unique_ptr<Layer> layer = *cpu->CreateLayer(spec, params, {}, 1);
    DeviceTensor ids = h.Make({1, 3}, {0, 1, bad});
    DeviceTensor out(cpu.get());
    ASSERT_TRUE(out.Resize({1, 3, 3}).ok());
    const std::vector<const DeviceTensor*> in = {&ids};
    absl::Status s = layer->Forward(in, &out, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("at [0, 2] is not an integer in [0, 5)"),
              absl::string_view::npos)
        << s;
  }
}

TEST(LayerSpecs, ShapesNamesAndErrors) {
  EXPECT_EQ(*OutputShape(LayerSpec::Embedding(30522, 512, 768), {{96, 128}}),
            (Shape{96, 128, 768}));
  EXPECT_EQ(
      OutputShape(LayerSpec::Embedding(10, 4, 8), {{2, 5}}).status().message(),
      "embedding10x8+pos4: input [2, 5]; expected token ids [N, S] with "
      "1 <= S <= 4 (max_positions)");
  EXPECT_EQ(OutputShape(LayerSpec::MultiheadAttention(10, 3, 0.0f),
                        {{1, 2, 10}, {1, 2}})
                .status()
                .message(),
            "mha10/3: hidden 10 is not a multiple of heads 3");
  EXPECT_FALSE(OutputShape(LayerSpec::MultiheadAttention(8, 2, 0.0f),
                           {{1, 2, 8}, {1, 3}})
                   .ok());
  EXPECT_FALSE(OutputShape(LayerSpec::LayerNorm(8), {{2, 7}}).ok());
  EXPECT_EQ(NumInputs(LayerSpec::MultiheadAttention(8, 2, 0.0f)), 2);
  EXPECT_EQ(LayerTypeName(LayerType::kMultiheadAttention),
            "multiheadattention");
  const LayerSpec encoder =
      LayerSpec::TransformerEncoderLayer(768, 12, 3072, 0.1f);
  EXPECT_EQ(LayerName(encoder), "encoder768/12-3072");
  EXPECT_EQ(NumInputs(encoder), 2);
  int64_t params = 0;
  for (const TensorSpec& t : ParamSpecs(encoder))
    params += NumElements(t.shape);
  // One BERT-base layer: 7,087,872 parameters.
  EXPECT_EQ(params, 7087872);
  EXPECT_EQ(ParamSpecs(encoder)[0].name, "self_attn.in_proj_weight");
  EXPECT_EQ(ParamSpecs(encoder).back().name, "norm2.bias");
  EXPECT_EQ(
      ForwardMacsPerSample(encoder, {96, 128, 768}),
      4LL * 128 * 768 * 768 + 2LL * 128 * 128 * 768 + 2LL * 128 * 768 * 3072);
  // BERT-base's attention: 4 x 128 x 768^2 + 2 x 128^2 x 768.
  EXPECT_EQ(ForwardMacsPerSample(LayerSpec::MultiheadAttention(768, 12, 0.1f),
                                 {96, 128, 768}),
            4LL * 128 * 768 * 768 + 2LL * 128 * 128 * 768);
}

// layer_spec.h's BackwardReadsOf(): with the output (which none of these
// reads) overwritten by NaN before the backward, every gradient is the
// same bit for bit.
TEST(BackwardReads, TransformerLayersReadNoOutput) {
  std::unique_ptr<Backend> cpu = NewCpuBackend();
  for (const TransformerCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(BackwardReadsOf(c.spec).output);
    std::vector<std::vector<float>> grads[2];
    for (int poisoned = 0; poisoned < 2; ++poisoned) {
      Harness h(cpu.get(), c.spec, 11);
      std::vector<float> x(NumElements(c.shape));
      for (size_t j = 0; j < x.size(); ++j) {
        x[j] = c.spec.type == LayerType::kEmbedding
                   ? static_cast<float>(j % 11)
                   : static_cast<float>(std::sin(0.41 * j) - 0.2);
      }
      DeviceTensor in = h.Make(c.shape, x);
      DeviceTensor mask;
      std::vector<DeviceTensor*> inputs = {&in};
      if (!c.mask_shape.empty()) {
        std::vector<float> m(NumElements(c.mask_shape), 0.0f);
        m.back() = 1.0f;
        mask = h.Make(c.mask_shape, m);
        inputs.push_back(&mask);
      }
      const std::vector<float> out = h.Forward(inputs);
      std::vector<float> dout(out.size());
      for (size_t j = 0; j < dout.size(); ++j) dout[j] = std::cos(0.29 * j);
      if (poisoned == 1) h.Poison(h.mutable_out());
      grads[poisoned] = h.Backward(inputs, dout);
      for (Param& p : h.params()) grads[poisoned].push_back(Values(p.grad));
    }
    EXPECT_EQ(grads[1], grads[0]);
  }
}

}  // namespace
}  // namespace pstrain
