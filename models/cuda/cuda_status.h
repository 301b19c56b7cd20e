// CUDA, cuDNN and cuBLAS status codes as absl::Status, for the CUDA
// backend's files (cuda_backend.cc, cuda_layers.cc, cuda_transformer.cc):
// INTERNAL naming the library, the call's source text and the library's
// own message.
// Header-only; thread-safe (pure functions).
#ifndef PSTRAIN_MODELS_CUDA_CUDA_STATUS_H_
#define PSTRAIN_MODELS_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

inline absl::Status CudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA: ", call, ": ", cudaGetErrorString(e)));
}
inline absl::Status CudaStatus(cudnnStatus_t s, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuDNN: ", call, ": ", cudnnGetErrorString(s)));
}
inline absl::Status CudaStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuBLAS: ", call, ": ", cublasGetStatusString(s)));
}

}  // namespace pstrain

// Returns the status of `expr` (a CUDA, cuDNN or cuBLAS call) when it failed.
#define CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                              \
    absl::Status _cuda_status = ::pstrain::CudaStatus(expr, #expr); \
    if (!_cuda_status.ok()) return _cuda_status;                    \
  } while (0)

// A kernel launch: the launch error; asynchronous errors surface at the
// next synchronisation.
#define CUDA_RETURN_IF_LAUNCH_ERROR(launch) CUDA_RETURN_IF_ERROR(launch)

#endif  // PSTRAIN_MODELS_CUDA_CUDA_STATUS_H_
