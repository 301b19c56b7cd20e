#include "common/malloc_tuning.h"

#include <malloc.h>

#include <cstdio>

namespace pstrain {

bool KeepFreedMemoryForReuse() {
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kMallocMmapThresholdBytes);
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, kMallocTrimThresholdBytes);
  const bool arenas_set = mallopt(M_ARENA_MAX, kMallocArenas);
  return mmap_set && trim_set && arenas_set;
}

void KeepFreedMemoryForReuseOrWarn(const char* program) {
  if (KeepFreedMemoryForReuse()) return;
  std::fprintf(stderr,
               "%s: glibc refused the malloc settings of "
               "common/malloc_tuning.h; running with its defaults\n",
               program);
}

}  // namespace pstrain
