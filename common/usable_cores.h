// The number of cores this process may run on.
#ifndef PSTRAIN_COMMON_USABLE_CORES_H_
#define PSTRAIN_COMMON_USABLE_CORES_H_

namespace pstrain {

// The cores in this process's CPU affinity mask (sched_getaffinity), or,
// if that cannot be read, the online processors (sysconf); at least 1.
// Thread-safe.
int UsableCores();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_USABLE_CORES_H_
