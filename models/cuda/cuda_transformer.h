// The CUDA backend's transformer layers (issue 41): token + position
// embedding, LayerNorm, GELU, multi-head self-attention with a key padding
// mask, the post-LN TransformerEncoderLayer made of them, and the MLM
// head's row gather; the same mathematics as the CPU backend's
// (models/cpu_transformer.h, checked against PyTorch 1.13 fixtures), which
// models/cuda_test.cc holds them to.
//
// Libraries: cuBLAS for every matrix product (the projections with
// cublasSgemm, or cublasGemmEx under 16-bit precision; the attention's four
// products per (sample, head) in one cublasSgemmStridedBatched each, on
// per-head blocks models/cuda/transformer_kernels.h moves the packed
// projections into and out of). Our kernels for the rest
// (transformer_kernels.h); the dropouts draw models/dropout_mask.h's masks,
// the CPU backend's for the same seed. Not yet cuDNN's fused attention (its
// graph API).
//
// Precision (the backend's when a layer is created): fp32, or TF32 as the
// backend's cuBLAS handle says; under bf16 or fp16 the four projections of
// a block (q/k/v, output, the feed-forward's two) convert their input,
// weights and output gradient to the 16-bit type (kernels.h's LaunchTo16)
// and multiply on tensor cores with fp32 accumulation and fp32 outputs
// (cublasGemmEx, CUBLAS_COMPUTE_32F), as torch.autocast casts linear
// layers and as the CPU backend's bf16 (cpu_transformer.h). The attention's
// score and context products (about 3% of bert_base's multiply-adds at 128
// tokens), the softmax, LayerNorm, GELU, dropout, the embeddings and every
// bias stay fp32.
//
// Tensors are dense row-major fp32, [N, S, E] activations, [N, S] token ids
// and key padding masks (nonzero: padding), [P] gathered positions. The
// ids and positions are read back to the host once per forward to check
// them (a stream synchronisation): INVALID_ARGUMENT for a token id that is
// not an integer in [0, vocab), a position outside the rows, and for a
// sample whose every key is padding (PyTorch returns NaN there). Backward
// without a training forward of the same shape: FAILED_PRECONDITION.
// Gradients scattered into rows (the token table, a gathered row) are
// summed with atomic adds, so their rounding may differ from run to run.
//
// Thread-safety: as backend.h's layers, one training thread per layer.
#ifndef PSTRAIN_MODELS_CUDA_CUDA_TRANSFORMER_H_
#define PSTRAIN_MODELS_CUDA_CUDA_TRANSFORMER_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/backend.h"
#include "models/layer_spec.h"

namespace pstrain {

// Device buffers the transformer layers use within one Forward or Backward
// call and not after it (the backward's gradients of their inner tensors,
// the forward's packed projections), shared by every layer of a backend:
// the layers run one after another on one stream, so one set serves them
// all (bert_base at batch 96: about 8 GB less than a set per layer). What
// a layer keeps for its backward stays its own. Not thread-safe: the
// backend's training thread.
class CudaScratchPool {
 public:
  enum Slot {
    kQkv,        // attention: packed q/k/v [N, S, 3E] before the head split
    kCtxHeads,   // attention: per-head context before the merge
    kDctx,       // attention backward
    kDctxHeads,  // attention backward
    kDattn,      // attention backward: [N, H, S, S]
    kDheads,     // attention backward: [3, N, H, S, d]
    kDqkv,       // attention backward: [N, S, 3E]
    kDh2,        // encoder backward
    kDf,         // encoder backward
    kDg,         // encoder backward: [N, S, F]
    kDy1,        // encoder backward
    kDh1,        // encoder backward
    kDyXhat,     // LayerNorm backward: dy xhat, summed into dweight
    kA16,        // 16-bit precision: a projection's first operand
    kB16,        // 16-bit precision: a projection's second operand
    kNumSlots
  };
  explicit CudaScratchPool(Backend* backend) : backend_(backend) {}

  // Slot `slot` with room for `n` floats (grown as needed, never shrunk):
  // RESOURCE_EXHAUSTED when the device cannot allocate it. Growing frees
  // the old buffer (cudaFree waits for the work that used it).
  absl::StatusOr<float*> Get(Slot slot, int64_t n);
  // Slot `slot` with room for `n` 16-bit values (kA16, kB16).
  absl::StatusOr<uint16_t*> Get16(Slot slot, int64_t n);
  // `n` ones (for cuBLAS's column sums), filled once per growth.
  absl::StatusOr<const float*> Ones(int64_t n);
  // Frees every buffer (the backend's destructor, before its streams go).
  void Clear();

 private:
  Backend* const backend_;
  DeviceTensor slots_[kNumSlots];
  DeviceTensor ones_;
};

// What the layers use of the CUDA backend: its allocations (scratch
// tensors), its cuBLAS handle, its compute stream (the handle is bound to
// it), the shared scratch (owned by the backend, outliving the layers) and
// its precision when the layer is made.
struct CudaLayerContext {
  Backend* backend = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaStream_t stream = nullptr;
  CudaScratchPool* pool = nullptr;
  PrecisionKind precision = PRECISION_TF32;
};

// The layer for a spec of type kEmbedding, kLayerNorm, kGelu,
// kMultiheadAttention, kTransformerEncoderLayer or kGatherRows, with
// `params` as ParamSpecs(spec) lists them (device tensors); `seed` drives
// the dropout masks as on the CPU backend. INVALID_ARGUMENT as
// CheckTransformerLayer (layer_spec.h) says, or for another type.
absl::StatusOr<std::unique_ptr<Layer>> NewCudaTransformerLayer(
    const CudaLayerContext& context, const LayerSpec& spec,
    std::vector<Param*> params, uint64_t seed);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CUDA_CUDA_TRANSFORMER_H_
