#include "common/usable_cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace pstrain {

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace pstrain
