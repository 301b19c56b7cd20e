// Our own CUDA kernels, for the operations cuDNN and cuBLAS do not have:
// softmax cross-entropy, elementwise add (and add + ReLU fused: cuDNN 9's
// fused BatchNorm + add + ReLU, cudnnBatchNormalizationForwardTrainingEx
// with CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, takes NHWC half tensors
// only), dropout and the Adam step. Each
// launcher enqueues on `stream` and returns cudaGetLastError() after the launch
// (the caller turns it into a status: cuda_backend.cc, cuda_layers.cc).
//
// All pointers are device pointers; sizes are element counts.
#ifndef PSTRAIN_MODELS_CUDA_KERNELS_H_
#define PSTRAIN_MODELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "optim/adam.h"

namespace pstrain {
namespace cuda {

// Per row i of logits [n, k] with label[i] in [0, k) or `ignore_index`:
// loss[i] = logsumexp(row) - row[label[i]] (0 when ignored); dlogits (may
// be null) = (softmax(row) - onehot(label)) / count, 0 on ignored rows
// (count = n and an ignore_index no label has: the plain mean loss).
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, int64_t n,
                                      int64_t k, int32_t ignore_index,
                                      float count, float* dlogits, float* loss,
                                      cudaStream_t stream);

// out = a + b.
cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out,
                      cudaStream_t stream);

// out = max(a + b, 0) (the residual add and its ReLU in one pass).
cudaError_t LaunchAddRelu(const float* a, const float* b, int64_t n, float* out,
                          cudaStream_t stream);

// da = db = dy where y > 0, else 0: the gradient of LaunchAddRelu from its
// output. `db` may be null.
cudaError_t LaunchAddReluBackward(const float* dy, const float* y, int64_t n,
                                  float* da, float* db, cudaStream_t stream);

// mask[i] = (hash(seed, i) < keep) ? 1 / keep : 0; y = x * mask. The hash is
// a counter-based generator (SplitMix64 of seed and index), so no state
// lives on the device.
cudaError_t LaunchDropout(const float* x, int64_t n, float keep, uint64_t seed,
                          float* mask, float* y, cudaStream_t stream);

// out = a * b, elementwise.
cudaError_t LaunchMultiply(const float* a, const float* b, int64_t n,
                           float* out, cudaStream_t stream);

// Mixed precision (Backend::SetPrecision): y = x rounded to bf16 (`bf16`)
// or fp16 (round to nearest even; fp16 overflows to infinity), stored as
// their 16 bits; and back to fp32 (exact).
cudaError_t LaunchTo16(const float* x, int64_t n, bool bf16, uint16_t* y,
                       cudaStream_t stream);
cudaError_t LaunchFrom16(const uint16_t* x, int64_t n, bool bf16, float* y,
                         cudaStream_t stream);

// x *= a (loss scaling's scale and unscale).
cudaError_t LaunchScale(float a, float* x, int64_t n, cudaStream_t stream);

// *flag |= 1 (device int) when any of x is NaN or infinite.
cudaError_t LaunchFlagNonFinite(const float* x, int64_t n, int* flag,
                                cudaStream_t stream);

// One Adam/AdamW step (optim/adam.h's formula and order; the scalars from
// AdamConstantsFor()): m, v, w updated in place from g.
cudaError_t LaunchAdam(const AdamStepConstants& c, float* w, const float* g,
                       float* m, float* v, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CUDA_KERNELS_H_
