// glibc malloc settings for processes that allocate and free the same large
// buffers every step (a shard's chunk messages and updates, a worker's
// pushes and pulls: megabytes each, thousands of times a run).
//
// glibc serves an allocation above its mmap threshold with its own mmap and
// unmaps it on free, and gives freed memory at the top of a heap back to
// the kernel once more than the trim threshold is free there. Either way
// the next step's buffer of the same size is fresh memory again, and the
// kernel zeroes it page by page on first touch (one fault per 4 KiB). On
// 2 cores, ps_bench's 100 MB push+pull spent about a fifth of its time in
// page faults and unmaps (perf), and ran 1.2x faster with these settings
// (BENCHMARKS.md, "malloc settings").
//
// KeepFreedMemoryForReuse() sets both thresholds (mallopt, glibc's
// documented tunables; the GLIBC_TUNABLES environment variable's
// glibc.malloc.mmap_threshold and glibc.malloc.trim_threshold):
//   - M_MMAP_THRESHOLD to kMallocMmapThresholdBytes (32 MiB, glibc's largest
//     on 64 bits): smaller blocks come from the heap and are reused;
//   - M_TRIM_THRESHOLD to kMallocTrimThresholdBytes (1 GiB): freed memory
//     stays mapped for the next step, so a process's resident size stays at
//     its peak (a step's working set) instead of shrinking between steps.
// Call it at the start of main, before any thread allocates. Returns false
// if glibc refused a value (mallopt returned 0). Not thread-safe.
#ifndef PSTRAIN_COMMON_MALLOC_TUNING_H_
#define PSTRAIN_COMMON_MALLOC_TUNING_H_

#include <cstdint>

namespace pstrain {

constexpr int kMallocMmapThresholdBytes = 32 << 20;
constexpr int kMallocTrimThresholdBytes = 1 << 30;

bool KeepFreedMemoryForReuse();

// KeepFreedMemoryForReuse() for a program's main: if glibc refuses, one
// line on stderr ("<program>: glibc refused ...") and the program runs on
// with glibc's defaults.
void KeepFreedMemoryForReuseOrWarn(const char* program);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MALLOC_TUNING_H_
