// The CPU backend's transformer layers (issue 41): token + position
// embedding, LayerNorm, GELU, multi-head self-attention with a key padding
// mask, and the post-LN TransformerEncoderLayer block made of them
// (layer_spec.h says what each computes, after its PyTorch module).
// Internal to models/: the CPU backend's CreateLayer() calls it.
//
// Libraries: oneDNN 2.6 where it has the op: layer_normalization (LayerNorm),
// eltwise_gelu_erf (GELU), inner_product (InnerProductOp: the attention's
// q/k/v and output projections, the feed-forward's two linears) and matmul
// on strided [N, heads, S, S|d] views of the packed q/k/v (the attention's
// four products, batched over batch and heads, no copies).
//
// Precision: under bf16 (`bf16`, Backend::SetPrecision) the four
// projections of a block run in bf16 with fp32 accumulation, as
// torch.autocast casts linear layers (cpu_inner_product.h); everything else
// stays fp32: the attention's score and context products (matmul, 3% of
// bert_base's multiply-adds at 128 tokens), the softmax, LayerNorm, GELU,
// dropout and the embeddings. Our own loops: the embedding's gather and
// scatter-add, the masked softmax and its backward, and dropout
// (std::mt19937_64 and std::bernoulli_distribution, as the kDropout layer).
//
// Tensors are dense row-major fp32 (layout 0): an input in a blocked layout
// is INTERNAL. Forward errors: INVALID_ARGUMENT for a token id that is not
// an integer in [0, vocab) and for a sample whose every key is padding
// (PyTorch returns NaN there). Backward without a training forward of the
// same shape: FAILED_PRECONDITION.
//
// Embedding's backward overwrites the whole token-table gradient (zeros,
// then each used row's sum): the dense gradient the model pushes today; the
// row-sparse push of issue 41 will send only the rows used.
//
// Thread-safety: as backend.h's layers, one training thread per layer.
#ifndef PSTRAIN_MODELS_CPU_TRANSFORMER_H_
#define PSTRAIN_MODELS_CPU_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/backend.h"
#include "models/layer_spec.h"

namespace pstrain {

// The layer for a spec of type kEmbedding, kLayerNorm, kGelu,
// kMultiheadAttention, kTransformerEncoderLayer or kGatherRows, with `params`
// as ParamSpecs(spec) lists them; `seed` drives the dropout masks (the block's
// four dropouts draw from four generators derived from it); `bf16`: bf16
// projections (above; the caller checked CpuBf16Available).
// INVALID_ARGUMENT for another type, a wrong parameter count, heads that do
// not divide the hidden size, or a feed-forward width < 1.
absl::StatusOr<std::unique_ptr<Layer>> NewCpuTransformerLayer(
    const LayerSpec& spec, std::vector<Param*> params, uint64_t seed,
    bool bf16);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CPU_TRANSFORMER_H_
