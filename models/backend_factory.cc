// CreateBackend and Backend::Create: the CPU backend always, the CUDA
// backend in --config=cuda builds (PSTRAIN_WITH_CUDA).
#include "models/backend_factory.h"

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

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind,
                                                       int gpu) {
  switch (kind) {
    case BACKEND_CPU:
      return NewCpuBackend();
    case BACKEND_CUDA:
#ifdef PSTRAIN_WITH_CUDA
      return NewCudaBackend(gpu);
#else
      return Backend::CudaAvailable(gpu);
#endif
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "backend: ", static_cast<int>(kind), "; expected cpu or cuda"));
  }
}

absl::StatusOr<std::unique_ptr<Backend>> Backend::Create(
    const std::string& name, int gpu) {
  absl::StatusOr<BackendKind> kind = ParseBackend(name);
  if (!kind.ok()) return kind.status();
  return CreateBackend(*kind, gpu);
}

}  // namespace pstrain
