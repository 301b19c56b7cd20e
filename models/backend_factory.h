// Creating a backend by its kind (JobConfig.backend, catalog/job_config.h):
// the CPU backend (oneDNN) always, the CUDA backend (cuDNN, cuBLAS) in
// --config=cuda builds. Backend::Create (models/backend.h) is the same
// for a backend's spelling.
//
// Thread-safety: may be called from any thread; each call returns a new
// backend, used as models/backend.h says.
#ifndef PSTRAIN_MODELS_BACKEND_FACTORY_H_
#define PSTRAIN_MODELS_BACKEND_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "catalog/job_config.h"
#include "models/backend.h"

namespace pstrain {

// BACKEND_CPU, or BACKEND_CUDA on GPU `gpu` (0-based). FAILED_PRECONDITION
// when this build has no CUDA ("rebuild with --config=cuda") or GPU `gpu`
// is not visible; INVALID_ARGUMENT for BACKEND_UNSPECIFIED or a number
// outside the enum.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind,
                                                       int gpu = 0);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_BACKEND_FACTORY_H_
