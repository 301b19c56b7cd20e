// CUDA kernels of the transformer layers (issue 41; the layers are
// models/cuda/cuda_transformer.h): the embedding's gather and scatter-add,
// LayerNorm, GELU, the attention's masked softmax and the moves between
// the packed [N, S, parts, H, d] projections and per-head [parts, N, H, S,
// d] blocks (so that cuBLAS's strided batched GEMM runs every (sample,
// head) product in one call) and row gathers.
// The matrix products themselves are cuBLAS's.
//
// Each launcher enqueues on `stream` and returns cudaGetLastError() after
// the launch. All pointers are device pointers, all sizes element counts,
// all matrices row-major fp32.
#ifndef PSTRAIN_MODELS_CUDA_TRANSFORMER_KERNELS_H_
#define PSTRAIN_MODELS_CUDA_TRANSFORMER_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pstrain {
namespace cuda {

// out[r, :] = token[ids[r], :] + position[r % s, :] for r < rows, each row
// `e` wide.
cudaError_t LaunchEmbeddingForward(const int32_t* ids, int64_t rows, int64_t s,
                                   int64_t e, const float* token,
                                   const float* position, float* out,
                                   cudaStream_t stream);
// dtoken[ids[r], :] += dout[r, :] (atomic adds: rows sharing a token sum in
// any order), for dtoken zeroed by the caller.
cudaError_t LaunchEmbeddingTokenGrad(const int32_t* ids, int64_t rows,
                                     int64_t e, const float* dout,
                                     float* dtoken, cudaStream_t stream);
// dposition[t, :] = sum over b < n of dout[b * s + t, :] (in b's order).
cudaError_t LaunchEmbeddingPositionGrad(int64_t n, int64_t s, int64_t e,
                                        const float* dout, float* dposition,
                                        cudaStream_t stream);

// LayerNorm over each of `rows` rows of `cols` (Ba et al. 2016;
// torch.nn.LayerNorm): mean, biased variance, rstd = 1 / sqrt(var + eps),
// y = (x - mean) rstd weight + bias; mean and rstd saved per row.
cudaError_t LaunchLayerNormForward(const float* x, int64_t rows, int64_t cols,
                                   float eps, const float* weight,
                                   const float* bias, float* y, float* mean,
                                   float* rstd, cudaStream_t stream);
// Per row, with g = dy weight and xhat = (x - mean) rstd: dx = rstd (g -
// mean(g) - xhat mean(g xhat)) when `dx` is not null (it may alias `dy`),
// and dy_xhat = dy xhat, whose column sums are dweight (cuBLAS sums them,
// and dy's for dbias).
cudaError_t LaunchLayerNormBackward(const float* x, const float* dy,
                                    const float* mean, const float* rstd,
                                    const float* weight, int64_t rows,
                                    int64_t cols, float* dx, float* dy_xhat,
                                    cudaStream_t stream);
// y[r, c] = bias[c] (before a GEMM adds x W^T with beta 1).
cudaError_t LaunchBroadcastRows(const float* bias, int64_t rows, int64_t cols,
                                float* y, cudaStream_t stream);

// GELU, erf form (Hendrycks & Gimpel 2016; torch.nn.functional.gelu with
// approximate='none'): y = x Phi(x); dx = dy (Phi(x) + x phi(x)) (`dx` may
// alias `dy`).
cudaError_t LaunchGeluForward(const float* x, int64_t n, float* y,
                              cudaStream_t stream);
cudaError_t LaunchGeluBackward(const float* x, const float* dy, int64_t n,
                               float* dx, cudaStream_t stream);

// packed [n, s, parts, h, d] -> heads [parts, n, h, s, d] (Split) and back
// (Merge).
cudaError_t LaunchSplitHeads(const float* packed, int64_t n, int64_t s,
                             int64_t parts, int64_t h, int64_t d, float* heads,
                             cudaStream_t stream);
cudaError_t LaunchMergeHeads(const float* heads, int64_t n, int64_t s,
                             int64_t parts, int64_t h, int64_t d, float* packed,
                             cudaStream_t stream);

// Softmax over each row of probs [n, h, s, s] (holding the scaled scores)
// in place, keys j with pad[b, j] != 0 left out (weight exactly 0, as
// PyTorch's -inf mask). Every sample has an unpadded key (the caller
// checks).
cudaError_t LaunchMaskedSoftmax(const float* pad, int64_t n, int64_t h,
                                int64_t s, float* probs, cudaStream_t stream);
// dattn (dLoss/dA, in place) becomes dLoss/d(q k^T): A (dA - sum_j A dA)
// scale, per row of `s`.
cudaError_t LaunchSoftmaxBackward(const float* probs, int64_t rows, int64_t s,
                                  float scale, float* dattn,
                                  cudaStream_t stream);

// out[p, :] = x[rows[p], :], `e` wide.
cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t p,
                             int64_t e, float* out, cudaStream_t stream);
// dx[rows[p], :] += dout[p, :] (atomic: a row gathered twice sums), for dx
// zeroed by the caller.
cudaError_t LaunchScatterAddRows(const float* dout, const int32_t* rows,
                                 int64_t p, int64_t e, float* dx,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CUDA_TRANSFORMER_KERNELS_H_
