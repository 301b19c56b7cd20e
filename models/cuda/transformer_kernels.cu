#include <cstdint>

#include "models/cuda/transformer_kernels.h"

namespace pstrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

int Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// Blocks for one warp per row.
int WarpBlocks(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The warp-per-row loops: every lane of a warp takes the same rows, so the
// shuffles inside see the whole warp.
#define PSTRAIN_FOR_EACH_WARP_ROW(row, rows)                                  \
  for (int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32; \
       row < (rows); row += int64_t{gridDim.x} * kWarpsPerBlock)

#define PSTRAIN_GRID_STRIDE(i, n)                                           \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

__global__ void EmbeddingForwardKernel(const int32_t* ids, int64_t rows,
                                       int64_t s, int64_t e, const float* token,
                                       const float* position, float* out) {
  PSTRAIN_GRID_STRIDE(i, rows * e) {
    const int64_t r = i / e, j = i % e;
    out[i] = token[ids[r] * e + j] + position[(r % s) * e + j];
  }
}

__global__ void EmbeddingTokenGradKernel(const int32_t* ids, int64_t rows,
                                         int64_t e, const float* dout,
                                         float* dtoken) {
  PSTRAIN_GRID_STRIDE(i, rows * e) {
    atomicAdd(&dtoken[ids[i / e] * e + i % e], dout[i]);
  }
}

__global__ void EmbeddingPositionGradKernel(int64_t n, int64_t s, int64_t e,
                                            const float* dout,
                                            float* dposition) {
  PSTRAIN_GRID_STRIDE(i, s * e) {
    float sum = 0.0f;
    for (int64_t b = 0; b < n; ++b) sum += dout[b * s * e + i];
    dposition[i] = sum;
  }
}

__global__ void LayerNormForwardKernel(const float* x, int64_t rows,
                                       int64_t cols, float eps,
                                       const float* weight, const float* bias,
                                       float* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % 32;
  PSTRAIN_FOR_EACH_WARP_ROW(r, rows) {
    const float* xr = x + r * cols;
    float sum = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) sum += xr[c];
    const float m = WarpSum(sum) / cols;
    float squares = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
      const float d = xr[c] - m;
      squares += d * d;
    }
    const float var = WarpSum(squares) / cols;
    const float rs = 1.0f / sqrtf(var + eps);
    float* yr = y + r * cols;
    for (int64_t c = lane; c < cols; c += 32) {
      yr[c] = (xr[c] - m) * rs * weight[c] + bias[c];
    }
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

__global__ void LayerNormBackwardKernel(const float* x, const float* dy,
                                        const float* mean, const float* rstd,
                                        const float* weight, int64_t rows,
                                        int64_t cols, float* dx,
                                        float* dy_xhat) {
  const int lane = threadIdx.x % 32;
  PSTRAIN_FOR_EACH_WARP_ROW(r, rows) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
      const float g = dyr[c] * weight[c];
      sum_g += g;
      sum_gx += g * (xr[c] - m) * rs;
    }
    const float mean_g = WarpSum(sum_g) / cols;
    const float mean_gx = WarpSum(sum_gx) / cols;
    for (int64_t c = lane; c < cols; c += 32) {
      const float xhat = (xr[c] - m) * rs;
      const float d = dyr[c];
      dy_xhat[r * cols + c] = d * xhat;
      if (dx != nullptr) {
        dx[r * cols + c] = rs * (d * weight[c] - mean_g - xhat * mean_gx);
      }
    }
  }
}

__global__ void BroadcastRowsKernel(const float* bias, int64_t rows,
                                    int64_t cols, float* y) {
  PSTRAIN_GRID_STRIDE(i, rows * cols) { y[i] = bias[i % cols]; }
}

constexpr float kSqrtHalf = 0.70710678118654752f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)

__global__ void GeluForwardKernel(const float* x, int64_t n, float* y) {
  PSTRAIN_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * kSqrtHalf));
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, int64_t n,
                                   float* dx) {
  PSTRAIN_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * kSqrtHalf));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// Index of packed [n, s, parts, h, d] element i in heads [parts, n, h, s, d].
__device__ int64_t HeadsIndex(int64_t i, int64_t n, int64_t s, int64_t parts,
                              int64_t h, int64_t d) {
  const int64_t k = i % d;
  int64_t rest = i / d;
  const int64_t head = rest % h;
  rest /= h;
  const int64_t part = rest % parts;
  rest /= parts;
  const int64_t t = rest % s;
  const int64_t b = rest / s;
  return (((part * n + b) * h + head) * s + t) * d + k;
}

__global__ void SplitHeadsKernel(const float* packed, int64_t n, int64_t s,
                                 int64_t parts, int64_t h, int64_t d,
                                 float* heads) {
  PSTRAIN_GRID_STRIDE(i, n * s * parts * h * d) {
    heads[HeadsIndex(i, n, s, parts, h, d)] = packed[i];
  }
}

__global__ void MergeHeadsKernel(const float* heads, int64_t n, int64_t s,
                                 int64_t parts, int64_t h, int64_t d,
                                 float* packed) {
  PSTRAIN_GRID_STRIDE(i, n * s * parts * h * d) {
    packed[i] = heads[HeadsIndex(i, n, s, parts, h, d)];
  }
}

__global__ void MaskedSoftmaxKernel(const float* pad, int64_t n, int64_t h,
                                    int64_t s, float* probs) {
  const int lane = threadIdx.x % 32;
  PSTRAIN_FOR_EACH_WARP_ROW(r, n * h * s) {
    const float* p = pad + (r / (h * s)) * s;
    float* row = probs + r * s;
    float max = -INFINITY;
    for (int64_t j = lane; j < s; j += 32) {
      if (p[j] == 0.0f) max = fmaxf(max, row[j]);
    }
    max = WarpMax(max);
    float sum = 0.0f;
    for (int64_t j = lane; j < s; j += 32) {
      const float v = p[j] == 0.0f ? expf(row[j] - max) : 0.0f;
      row[j] = v;
      sum += v;
    }
    const float inv = 1.0f / WarpSum(sum);
    for (int64_t j = lane; j < s; j += 32) row[j] *= inv;
  }
}

__global__ void SoftmaxBackwardKernel(const float* probs, int64_t rows,
                                      int64_t s, float scale, float* dattn) {
  const int lane = threadIdx.x % 32;
  PSTRAIN_FOR_EACH_WARP_ROW(r, rows) {
    const float* a = probs + r * s;
    float* da = dattn + r * s;
    float dot = 0.0f;
    for (int64_t j = lane; j < s; j += 32) dot += a[j] * da[j];
    dot = WarpSum(dot);
    for (int64_t j = lane; j < s; j += 32) {
      da[j] = a[j] * (da[j] - dot) * scale;
    }
  }
}

__global__ void GatherRowsKernel(const float* x, const int32_t* rows, int64_t p,
                                 int64_t e, float* out) {
  PSTRAIN_GRID_STRIDE(i, p * e) { out[i] = x[rows[i / e] * e + i % e]; }
}

__global__ void ScatterAddRowsKernel(const float* dout, const int32_t* rows,
                                     int64_t p, int64_t e, float* dx) {
  PSTRAIN_GRID_STRIDE(i, p * e) {
    atomicAdd(&dx[rows[i / e] * e + i % e], dout[i]);
  }
}

}  // namespace

cudaError_t LaunchEmbeddingForward(const int32_t* ids, int64_t rows, int64_t s,
                                   int64_t e, const float* token,
                                   const float* position, float* out,
                                   cudaStream_t stream) {
  EmbeddingForwardKernel<<<Blocks(rows * e), kThreads, 0, stream>>>(
      ids, rows, s, e, token, position, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingTokenGrad(const int32_t* ids, int64_t rows,
                                     int64_t e, const float* dout,
                                     float* dtoken, cudaStream_t stream) {
  EmbeddingTokenGradKernel<<<Blocks(rows * e), kThreads, 0, stream>>>(
      ids, rows, e, dout, dtoken);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingPositionGrad(int64_t n, int64_t s, int64_t e,
                                        const float* dout, float* dposition,
                                        cudaStream_t stream) {
  EmbeddingPositionGradKernel<<<Blocks(s * e), kThreads, 0, stream>>>(
      n, s, e, dout, dposition);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormForward(const float* x, int64_t rows, int64_t cols,
                                   float eps, const float* weight,
                                   const float* bias, float* y, float* mean,
                                   float* rstd, cudaStream_t stream) {
  LayerNormForwardKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(
      x, rows, cols, eps, weight, bias, y, mean, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const float* x, const float* dy,
                                    const float* mean, const float* rstd,
                                    const float* weight, int64_t rows,
                                    int64_t cols, float* dx, float* dy_xhat,
                                    cudaStream_t stream) {
  LayerNormBackwardKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(
      x, dy, mean, rstd, weight, rows, cols, dx, dy_xhat);
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastRows(const float* bias, int64_t rows, int64_t cols,
                                float* y, cudaStream_t stream) {
  BroadcastRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(bias, rows,
                                                                    cols, y);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(const float* x, int64_t n, float* y,
                              cudaStream_t stream) {
  GeluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const float* x, const float* dy, int64_t n,
                               float* dx, cudaStream_t stream) {
  GeluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, dy, n, dx);
  return cudaGetLastError();
}

cudaError_t LaunchSplitHeads(const float* packed, int64_t n, int64_t s,
                             int64_t parts, int64_t h, int64_t d, float* heads,
                             cudaStream_t stream) {
  SplitHeadsKernel<<<Blocks(n * s * parts * h * d), kThreads, 0, stream>>>(
      packed, n, s, parts, h, d, heads);
  return cudaGetLastError();
}

cudaError_t LaunchMergeHeads(const float* heads, int64_t n, int64_t s,
                             int64_t parts, int64_t h, int64_t d, float* packed,
                             cudaStream_t stream) {
  MergeHeadsKernel<<<Blocks(n * s * parts * h * d), kThreads, 0, stream>>>(
      heads, n, s, parts, h, d, packed);
  return cudaGetLastError();
}

cudaError_t LaunchMaskedSoftmax(const float* pad, int64_t n, int64_t h,
                                int64_t s, float* probs, cudaStream_t stream) {
  MaskedSoftmaxKernel<<<WarpBlocks(n * h * s), kThreads, 0, stream>>>(pad, n, h,
                                                                      s, probs);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxBackward(const float* probs, int64_t rows, int64_t s,
                                  float scale, float* dattn,
                                  cudaStream_t stream) {
  SoftmaxBackwardKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(
      probs, rows, s, scale, dattn);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t p,
                             int64_t e, float* out, cudaStream_t stream) {
  GatherRowsKernel<<<Blocks(p * e), kThreads, 0, stream>>>(x, rows, p, e, out);
  return cudaGetLastError();
}

cudaError_t LaunchScatterAddRows(const float* dout, const int32_t* rows,
                                 int64_t p, int64_t e, float* dx,
                                 cudaStream_t stream) {
  ScatterAddRowsKernel<<<Blocks(p * e), kThreads, 0, stream>>>(dout, rows, p, e,
                                                               dx);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace pstrain
