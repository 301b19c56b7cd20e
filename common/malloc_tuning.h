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
// A third way applies to threads: glibc gives each thread that allocates
// while another holds the main heap's lock an arena of its own, made of
// 64-MiB mmap'd heaps (HEAP_MAX_SIZE), and unmaps every heap of such an
// arena but its first as soon as it is wholly free (arena.c's heap_trim:
// delete_heap, whatever the trim threshold). A gRPC thread that receives
// a step's 100 MB grows its arena past one heap and loses the rest when
// the step's buffers are freed: ps_bench, 1 shard, faulted about 1,600
// pages a step that way, and in a VM whose page faults are dear
// (2026-12-02's machine) the step took 1.6-2.4x as long.
//
// KeepFreedMemoryForReuse() sets (mallopt, glibc's documented tunables;
// the GLIBC_TUNABLES environment variable's glibc.malloc.mmap_threshold,
// glibc.malloc.trim_threshold and glibc.malloc.arena_max):
//   - M_MMAP_THRESHOLD to kMallocMmapThresholdBytes (32 MiB, glibc's largest
//     on 64 bits): smaller blocks come from the heap and are reused;
//   - M_TRIM_THRESHOLD to kMallocTrimThresholdBytes (1 GiB): freed memory
//     stays mapped for the next step, so a process's resident size stays at
//     its peak (a step's working set) instead of shrinking between steps;
//   - M_ARENA_MAX to kMallocArenas (1): every thread allocates from the
//     main heap, which only the trim threshold shrinks. The cost is one
//     lock for every thread's allocations of more than tcache's 1 KiB;
//     ps_bench with 4 workers on 2 cores lost nothing by it, and a 16-core
//     host has not measured it yet (ps_bench --malloc_one_arena=false
//     compares).
// Call it at the start of main, before any thread allocates. Returns false
// if glibc refused a value (mallopt returned 0). Not thread-safe.
#ifndef PSTRAIN_COMMON_MALLOC_TUNING_H_
#define PSTRAIN_COMMON_MALLOC_TUNING_H_

#include <cstdint>

namespace pstrain {

constexpr int kMallocMmapThresholdBytes = 32 << 20;
constexpr int kMallocTrimThresholdBytes = 1 << 30;
constexpr int kMallocArenas = 1;

bool KeepFreedMemoryForReuse();

// KeepFreedMemoryForReuse() for a program's main: if glibc refuses, one
// line on stderr ("<program>: glibc refused ...") and the program runs on
// with glibc's defaults.
void KeepFreedMemoryForReuseOrWarn(const char* program);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MALLOC_TUNING_H_
