// Backend::Create: the CPU backend always, the CUDA backend in --config=cuda
// builds (PSTRAIN_WITH_CUDA).
#include "absl/strings/str_cat.h"
#include "models/backend.h"

namespace pstrain {

#ifdef PSTRAIN_WITH_CUDA
// In cuda_backend.cc.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int gpu);
absl::Status CudaDeviceAvailable(int gpu);
#endif

absl::Status Backend::CudaAvailable(int gpu) {
#ifdef PSTRAIN_WITH_CUDA
  return CudaDeviceAvailable(gpu);
#else
  return absl::FailedPreconditionError(
      "this build has no CUDA backend; rebuild with bazel build "
      "--config=cuda");
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> Backend::Create(
    const std::string& name, int gpu) {
  if (name == "cpu") return NewCpuBackend();
  if (name == "cuda") {
#ifdef PSTRAIN_WITH_CUDA
    return NewCudaBackend(gpu);
#else
    return CudaAvailable(gpu);
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", name, "\"; expected cpu or cuda"));
}

}  // namespace pstrain
