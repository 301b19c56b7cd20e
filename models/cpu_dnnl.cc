#include "models/cpu_dnnl.h"

namespace pstrain {
namespace cpu_dnnl {

dnnl::engine& CpuEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& CpuStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

absl::Mutex& CreationMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

}  // namespace cpu_dnnl
}  // namespace pstrain
