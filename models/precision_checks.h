// Test helper: checks of 16-bit precision (Backend::SetPrecision) the CPU
// test (precision_test: bf16) and the GPU test (cuda_transformer_test: bf16
// and fp16) share, against a reference backend in fp32.
#ifndef PSTRAIN_MODELS_PRECISION_CHECKS_H_
#define PSTRAIN_MODELS_PRECISION_CHECKS_H_

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/layer_harness.h"
#include "models/layer_spec.h"
#include "models/model.h"

namespace pstrain {

// The unit roundoff of a 16-bit type (round to nearest): bf16 keeps 8
// significant bits, fp16 11.
inline constexpr double kBf16UnitRoundoff = 1.0 / 256;
inline constexpr double kFp16UnitRoundoff = 1.0 / 2048;

// The attention (hidden 16, 2 heads) and the encoder block (hidden 16, 2
// heads, feed-forward 32), dropout 0, on inputs [2, 6, 16] with
// PaddingMask(2, 6), on `sixteen` (a backend at 16-bit precision of unit
// roundoff `u`) against `reference` (fp32): the output more than 1e-5 off
// in relative L2 (the projections rounded: fp32 on two backends differs by
// about 1e-7); the output and input gradient within 16 u and every
// parameter gradient within 64 u. A block chains four rounded projections
// through a softmax and two LayerNorms, and some parameter gradients are
// sums that cancel; PyTorch 1.13 rounding the same operands
// (tools/torch/sixteen_bit_bounds.py, 20 seeds of U(-1, 1) weights)
// reached at most 1.0 u, 5.9 u and 13.5 u. A wrong operand, transpose or
// conversion is off by about 1.
inline void ExpectProjectionsRound(Backend* sixteen, Backend* reference,
                                   double u) {
  for (const LayerSpec& spec :
       {LayerSpec::MultiheadAttention(16, 2, 0.0f),
        LayerSpec::TransformerEncoderLayer(16, 2, 32, 0.0f)}) {
    const LayerDistance d = CompareLayer(sixteen, reference, spec, {2, 6, 16},
                                         {2, 6}, PaddingMask(2, 6));
    const std::string name = LayerName(spec);
    EXPECT_GT(d.out, 1e-5) << name << ": the projections did not round";
    EXPECT_LE(d.out, 16 * u) << name << " output";
    EXPECT_LE(d.din, 16 * u) << name << " input gradient";
    EXPECT_LE(d.grads, 64 * u) << name << " parameter gradients";
    std::printf(
        "%s on %s: relative L2 from %s: output %.3g, input gradient %.3g, "
        "worst parameter gradient %.3g (u = %.3g)\n",
        name.c_str(), sixteen->name().c_str(), reference->name().c_str(), d.out,
        d.din, d.grads, u);
  }
}

// bert_tiny (dropout 0, seed 5, 4 x 32 tokens of a 97-token vocabulary,
// PaddingMask, MlmLabels) from the same weights on a 16-bit `backend` and
// on `reference` (fp32): the loss within 1e-3 of the reference's and every
// gradient within 0.05 of it in relative L2. PyTorch 1.13 with the
// projections' operands rounded (tools/torch/sixteen_bit_bounds.py on
// torch_models.py's bert_tiny, 5 seeds) reached 6.6e-5 and 0.0053 in bf16,
// 5.2e-6 and 0.0020 in fp16.
inline void ExpectBertTinyCloseTo(Backend* backend, Backend* reference) {
  constexpr double kLossRel = 1e-3, kGradRel2 = 0.05;
  constexpr int64_t kBatch = 4, kSeq = 32, kVocab = 97;
  ModelOptions options;
  options.transformer_dropout = 0.0f;
  options.seed = 5;
  auto got = Model::Create("bert_tiny", {kSeq}, kVocab, options, backend);
  auto want = Model::Create("bert_tiny", {kSeq}, kVocab, options, reference);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  const std::vector<float> ids = TokenIds(kBatch * kSeq, kVocab);
  const std::vector<float> mask = PaddingMask(kBatch, kSeq);
  const std::vector<int32_t> labels = MlmLabels(ids, mask);
  absl::StatusOr<float> got_loss =
      (*got)->ForwardBackward(MakeTensor({kBatch, kSeq}, ids),
                              MakeTensor({kBatch, kSeq}, mask), labels);
  absl::StatusOr<float> want_loss =
      (*want)->ForwardBackward(MakeTensor({kBatch, kSeq}, ids),
                               MakeTensor({kBatch, kSeq}, mask), labels);
  ASSERT_TRUE(got_loss.ok()) << got_loss.status();
  ASSERT_TRUE(want_loss.ok()) << want_loss.status();
  EXPECT_NEAR(*got_loss, *want_loss, kLossRel * std::fabs(*want_loss));
  double worst = 0;
  std::string worst_name;
  for (size_t p = 0; p < (*want)->params().size(); ++p) {
    const absl::Span<const float> g = (*got)->HostGradients()[p];
    const absl::Span<const float> w = (*want)->HostGradients()[p];
    const double d = RelativeL2(std::vector<float>(g.begin(), g.end()),
                                std::vector<float>(w.begin(), w.end()));
    const std::string& name = (*want)->params()[p]->name;
    EXPECT_LE(d, kGradRel2) << name;
    if (d > worst) {
      worst = d;
      worst_name = name;
    }
  }
  std::printf(
      "bert_tiny on %s: loss %.6f (%s: %.6f); worst gradient relative L2 "
      "%.3g (%s)\n",
      backend->name().c_str(), *got_loss, reference->name().c_str(), *want_loss,
      worst, worst_name.c_str());
}

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_PRECISION_CHECKS_H_
