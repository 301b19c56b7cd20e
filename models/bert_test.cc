// The masked-language-model pieces on the CPU backend (issue 41), against
// PyTorch 1.13 (testdata/bert_fixture.txt, written by
// testdata/gen_bert_fixture.py with Debian's python3-torch):
//  - "mlm_head": the per-token Linear with the token table as its weight and
//    the cross-entropy that ignores label -100 (logits, loss, dL/dh, dW,
//    db), within kAbs + kRel * |expected| (fp32 sums in other orders);
//  - the ignore index's edge cases and errors.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_fixture.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"

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

}  // namespace
}  // namespace pstrain
