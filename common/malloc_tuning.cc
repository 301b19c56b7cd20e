#include "common/malloc_tuning.h"

#include <malloc.h>

namespace pstrain {

bool KeepFreedMemoryForReuse() {
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kMallocMmapThresholdBytes);
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, kMallocTrimThresholdBytes);
  return mmap_set && trim_set;
}

}  // namespace pstrain
