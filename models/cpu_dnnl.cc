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

dnnl::reorder MakeReorder(const dnnl::memory& src, const dnnl::memory& dst) {
  absl::MutexLock lock(&CreationMutex());
  return dnnl::reorder(src, dst);
}

dnnl::memory::desc WithType(const dnnl::memory::desc& md,
                            dnnl::memory::data_type type) {
  if (md.data_type() == type) return md;
  dnnl_memory_desc_t data = md.data;
  data.data_type = static_cast<dnnl_data_type_t>(type);
  return dnnl::memory::desc(data);
}

dnnl::memory CopyIf(bool convert, const dnnl::memory::desc& md) {
  return convert ? dnnl::memory(md, CpuEngine()) : dnnl::memory();
}

dnnl::memory Converted(const dnnl::memory& src, const dnnl::memory& dst) {
  if (dst.get(true) == nullptr) return src;
  dnnl::memory& out = const_cast<dnnl::memory&>(dst);
  MakeReorder(src, out).execute(CpuStream(), const_cast<dnnl::memory&>(src),
                                out);
  return dst;
}

}  // namespace cpu_dnnl
}  // namespace pstrain
