// For tests: the CPU backend behind a device-memory face. It answers
// host_memory() false, so a Model stages its weights and gradients in
// separate host buffers and copies them as it does on CUDA
// (LoadHostWeights, the gated forward's per-tensor copies, the gradients'
// copies before a CopyFence), while every layer still runs on the CPU:
// staging logic that only a GPU would exercise runs here, and a copy the
// Model forgets shows up as stale values. Copies are memcpy, complete
// when they return; device and host memory come from separate
// allocations. Not thread-safe beyond what the CPU backend is.
#ifndef PSTRAIN_MODELS_STAGED_BACKEND_H_
#define PSTRAIN_MODELS_STAGED_BACKEND_H_

#include <cstdint>
#include <memory>

#include "models/backend.h"

namespace pstrain {

class StagedCpuBackend : public Backend {
 public:
  // Host-to-device copies so far: calls and elements.
  virtual int64_t copies_to_device() const = 0;
  virtual int64_t elements_to_device() const = 0;
};

// The CPU backend (NewCpuBackend) with host_memory() false; name() is
// "staged cpu". Counts the CopyToDevice() calls and elements.
std::unique_ptr<StagedCpuBackend> NewStagedCpuBackend();

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_STAGED_BACKEND_H_
