// oneDNN plumbing the CPU backend's files share (cpu_backend.cc,
// cpu_layers.cc, cpu_transformer.cc): the engine, the calling thread's
// stream, the lock every primitive is created under, bf16 copies of fp32
// tensors, the conversion of oneDNN's exceptions into a status, and the
// inner product (torch.nn.Linear) both the CNN and transformer layers run.
// Internal to models/.
//
// Thread-safety: CpuEngine() and CreationMutex() are process-wide and safe
// from any thread; CpuStream() is the calling thread's own stream.
#ifndef PSTRAIN_MODELS_CPU_DNNL_H_
#define PSTRAIN_MODELS_CPU_DNNL_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "models/layer_spec.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {
namespace cpu_dnnl {

dnnl::engine& CpuEngine();

// The calling thread's stream on CpuEngine().
dnnl::stream& CpuStream();

// Held while a primitive is created (every primitive_desc and primitive
// constructor of the CPU backend). oneDNN looks each one up in its
// process-wide primitive cache, which synchronises its threads inside
// libdnnl: a pthread rwlock created lazily behind an inlined static guard,
// and std::shared_future for an entry another thread is still creating.
// Debian's libdnnl is not built with ThreadSanitizer, so TSan cannot see
// those orderings and reports races between two in-process workers that
// create primitives at once (tests/sync_equivalence_test). Creating under
// one lock makes the order visible, so the rest of oneDNN's use stays
// checked rather than suppressed. Creation happens once per layer and input
// shape, and the per-step reorders hit the cache (microseconds): the lock
// costs nothing measurable, and a worker process computes on one thread.
absl::Mutex& CreationMutex();

// A memory object over caller-owned fp32 data (oneDNN does not copy).
inline dnnl::memory Wrap(const dnnl::memory::desc& md, const float* data) {
  return dnnl::memory(md, CpuEngine(), const_cast<float*>(data));
}

// A reorder primitive from `src` to `dst`, created under CreationMutex().
dnnl::reorder MakeReorder(const dnnl::memory& src, const dnnl::memory& dst);

// The same tensor as `md` in type `type` (a bf16 copy's descriptor).
dnnl::memory::desc WithType(const dnnl::memory::desc& md,
                            dnnl::memory::data_type type);

// A oneDNN memory of `md` owned by oneDNN when `convert` (a layer's bf16
// copy of a tensor), else empty.
dnnl::memory CopyIf(bool convert, const dnnl::memory::desc& md);

// Converts `src` (a wrapped fp32 tensor) into `dst` when `dst` is a
// converted copy (not empty); returns what a primitive reads: `dst` after
// the conversion, else `src` itself.
dnnl::memory Converted(const dnnl::memory& src, const dnnl::memory& dst);

// Runs `f` and waits for the stream. oneDNN reports errors by exception;
// they become INTERNAL naming `what` (the layer, or the operation).
template <typename F>
absl::Status Run(absl::string_view what, F&& f) {
  try {
    std::forward<F>(f)();
    CpuStream().wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(what, ": oneDNN: ", e.what()));
  }
  return absl::OkStatus();
}
template <typename F>
absl::Status Run(const LayerSpec& spec, F&& f) {
  return Run(LayerName(spec), std::forward<F>(f));
}

}  // namespace cpu_dnnl
}  // namespace pstrain

#endif  // PSTRAIN_MODELS_CPU_DNNL_H_
