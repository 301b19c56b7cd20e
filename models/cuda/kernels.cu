#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "models/cuda/kernels.h"
#include "models/dropout_mask.h"

namespace pstrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// One block per row; threads stride over the k classes.
__global__ void SoftmaxCrossEntropyKernel(const float* logits,
                                          const int32_t* labels, int64_t n,
                                          int64_t k, int32_t ignore_index,
                                          float count, float* dlogits,
                                          float* loss) {
  __shared__ float shared[kThreads];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    if (labels[row] == ignore_index) {
      if (threadIdx.x == 0) loss[row] = 0.0f;
      if (dlogits != nullptr) {
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
          dlogits[row * k + j] = 0.0f;
        }
      }
      continue;
    }
    const float* x = logits + row * k;
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
      max = fmaxf(max, x[j]);
    shared[threadIdx.x] = max;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        shared[threadIdx.x] =
            fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
      }
      __syncthreads();
    }
    max = shared[0];
    __syncthreads();
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
      sum += expf(x[j] - max);
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
      __syncthreads();
    }
    const float log_sum = logf(shared[0]);
    __syncthreads();
    const int32_t label = labels[row];
    if (threadIdx.x == 0) loss[row] = log_sum - (x[label] - max);
    if (dlogits != nullptr) {
      for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const float p = expf(x[j] - max - log_sum);
        dlogits[row * k + j] = (p - (j == label ? 1.0f : 0.0f)) / count;
      }
    }
  }
}

__global__ void AddKernel(const float* a, const float* b, int64_t n,
                          float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void AddReluKernel(const float* a, const float* b, int64_t n,
                              float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = fmaxf(__fadd_rn(a[i], b[i]), 0.0f);
  }
}

__global__ void AddReluBackwardKernel(const float* dy, const float* y,
                                      int64_t n, float* da, float* db) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float d = y[i] > 0.0f ? dy[i] : 0.0f;
    da[i] = d;
    if (db != nullptr) db[i] = d;
  }
}

__global__ void MultiplyKernel(const float* a, const float* b, int64_t n,
                               float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = a[i] * b[i];
  }
}

// models/dropout_mask.h's draw: the CPU backend's masks for the same seed.
__global__ void DropoutKernel(const float* x, int64_t n, float keep,
                              uint64_t seed, float* mask, float* y) {
  const float scale = keep > 0.0f ? 1.0f / keep : 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float m = DropoutMaskValue(seed, i, keep, scale);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

// Each operation rounded on its own (the _rn intrinsics are never fused
// into FMAs), as the host's AdamUpdate computes it: the two agree bit for
// bit (models/cuda_test.cc).
__global__ void AdamKernel(AdamStepConstants c, float* w, const float* g,
                           float* m, float* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float gi = g[i];
    const float mi =
        __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, gi));
    const float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]),
                               __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float wi = c.decoupled ? __fmul_rn(w[i], c.decay) : w[i];
    const float denom =
        __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_bias_correction2_sqrt),
                  c.epsilon);
    w[i] = __fsub_rn(wi, __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
  }
}

// Grid-stride conversions between fp32 and a 16-bit type (round to nearest
// even; fp16 overflows to infinity as a cast does).
__global__ void To16Kernel(const float* x, int64_t n, bool bf16,
                           uint16_t* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    if (bf16) {
      const __nv_bfloat16 v = __float2bfloat16_rn(x[i]);
      y[i] = *reinterpret_cast<const uint16_t*>(&v);
    } else {
      const __half v = __float2half_rn(x[i]);
      y[i] = *reinterpret_cast<const uint16_t*>(&v);
    }
  }
}

__global__ void From16Kernel(const uint16_t* x, int64_t n, bool bf16,
                             float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    y[i] = bf16 ? __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(
                      &x[i]))
                : __half2float(*reinterpret_cast<const __half*>(&x[i]));
  }
}

__global__ void ScaleKernel(float a, float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    x[i] = __fmul_rn(x[i], a);
  }
}

// *flag |= 1 if any of x is NaN or infinite (its exponent bits all ones).
__global__ void NonFiniteKernel(const float* x, int64_t n, int* flag) {
  int found = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    found |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
  }
  if (found) atomicOr(flag, 1);
}

}  // namespace

cudaError_t LaunchTo16(const float* x, int64_t n, bool bf16, uint16_t* y,
                       cudaStream_t stream) {
  To16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, bf16, y);
  return cudaGetLastError();
}

cudaError_t LaunchFrom16(const uint16_t* x, int64_t n, bool bf16, float* y,
                         cudaStream_t stream) {
  From16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, bf16, y);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float a, float* x, int64_t n, cudaStream_t stream) {
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(a, x, n);
  return cudaGetLastError();
}

cudaError_t LaunchFlagNonFinite(const float* x, int64_t n, int* flag,
                                cudaStream_t stream) {
  NonFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, flag);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, int64_t n,
                                      int64_t k, int32_t ignore_index,
                                      float count, float* dlogits, float* loss,
                                      cudaStream_t stream) {
  const int blocks = static_cast<int>(n < 65535 ? (n > 0 ? n : 1) : 65535);
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(
      logits, labels, n, k, ignore_index, count, dlogits, loss);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out,
                      cudaStream_t stream) {
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchAddRelu(const float* a, const float* b, int64_t n,
                          float* out, cudaStream_t stream) {
  AddReluKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchAddReluBackward(const float* dy, const float* y, int64_t n,
                                  float* da, float* db, cudaStream_t stream) {
  AddReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, y, n, da, db);
  return cudaGetLastError();
}

cudaError_t LaunchDropout(const float* x, int64_t n, float keep, uint64_t seed,
                          float* mask, float* y, cudaStream_t stream) {
  DropoutKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, keep, seed, mask, y);
  return cudaGetLastError();
}

cudaError_t LaunchMultiply(const float* a, const float* b, int64_t n,
                           float* out, cudaStream_t stream) {
  MultiplyKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdam(const AdamStepConstants& c, float* w, const float* g,
                       float* m, float* v, int64_t n, cudaStream_t stream) {
  AdamKernel<<<Blocks(n), kThreads, 0, stream>>>(c, w, g, m, v, n);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace pstrain
