#include "common/malloc_tuning.h"

#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The sanitizers replace malloc (their mallopt does nothing and returns
// 0), so glibc's settings cannot be tested under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Minor page faults of this process so far.
long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A step's buffers: 4, 8, 1 and 12 MiB (25 MiB, 6,400 pages) allocated,
// written and freed in that order, `steps` times; returns the minor faults
// of the steps after the first two (the heap grows in those).
long FaultsOfLaterSteps(int steps) {
  long before = 0;
  for (int s = 0; s < steps; ++s) {
    if (s == 2) before = MinorFaults();
    std::vector<char*> buffers;
    for (size_t bytes : {size_t{4} << 20, size_t{8} << 20, size_t{1} << 20,
                         size_t{12} << 20}) {
      char* buffer = static_cast<char*>(std::malloc(bytes));
      std::memset(buffer, s + 1, bytes);
      // volatile: the compiler may not drop the writes or the allocation.
      EXPECT_EQ(static_cast<volatile char*>(buffer)[bytes - 1], s + 1);
      buffers.push_back(buffer);
    }
    for (char* buffer : buffers) std::free(buffer);
  }
  return MinorFaults() - before;
}

// With glibc's defaults the freed memory goes back to the kernel (unmapped
// or trimmed) and every later step faults its pages in again (about 6,400
// a step); kept for reuse, the later steps fault hardly at all.
TEST(MallocTuningTest, AStepsFreedBuffersAreReusedWithoutPageFaults) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's malloc";
  const long by_default = FaultsOfLaterSteps(6);
  EXPECT_GE(by_default, 4 * 6400 / 2) << "glibc's defaults changed?";
  ASSERT_TRUE(KeepFreedMemoryForReuse());
  const long kept = FaultsOfLaterSteps(6);
  EXPECT_LT(kept, 4 * 6400 / 20);
}

// In a child process (fork: this process's malloc settings stay as they
// are): `settings` first, then one new thread allocates, writes and frees
// 24 blocks of 4 MiB (96 MiB: more than one 64-MiB heap of a thread's
// arena) `steps` times. Returns the minor faults of the steps after the
// first two, or -1 if the child failed.
template <typename Settings>
long ThreadFaultsOfLaterSteps(int steps, Settings settings) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    close(fds[0]);
    long faults = -1;
    // Small pages, as the counts below assume, even where transparent
    // huge pages are "always".
    if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 && settings()) {
      std::thread([&] {
        long before = 0;
        for (int s = 0; s < steps; ++s) {
          if (s == 2) before = MinorFaults();
          // Reserved first: a small block left between the large ones
          // would keep the second heap in use.
          std::vector<char*> blocks;
          blocks.reserve(24);
          for (int b = 0; b < 24; ++b) {
            char* block = static_cast<char*>(std::malloc(size_t{4} << 20));
            std::memset(block, s + 1, size_t{4} << 20);
            static_cast<volatile char*>(block)[b] = static_cast<char>(s);
            blocks.push_back(block);
          }
          for (char* block : blocks) std::free(block);
        }
        faults = MinorFaults() - before;
      }).join();
    }
    const bool sent = write(fds[1], &faults, sizeof(faults)) ==
                      static_cast<ssize_t>(sizeof(faults));
    _exit(sent ? 0 : 1);
  }
  close(fds[1]);
  long faults = -1;
  if (read(fds[0], &faults, sizeof(faults)) !=
      static_cast<ssize_t>(sizeof(faults))) {
    faults = -1;
  }
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? faults : -1;
}

// With only the two thresholds (and arenas for threads, as glibc's default
// of 8 per core gives; set here because another test of this process may
// have limited them already), a thread's arena unmaps its second heap
// whenever the step's blocks are freed, and every later step faults the
// blocks that did not fit the first heap in again (9 of the 24: 36 MiB,
// 9,216 pages); with one arena (the main heap, which only the trim
// threshold shrinks) the later steps fault hardly at all.
TEST(MallocTuningTest, AThreadsFreedBuffersAreReusedWithoutPageFaults) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's malloc";
  const long thresholds_only = ThreadFaultsOfLaterSteps(6, [] {
    return mallopt(M_MMAP_THRESHOLD, kMallocMmapThresholdBytes) == 1 &&
           mallopt(M_TRIM_THRESHOLD, kMallocTrimThresholdBytes) == 1 &&
           mallopt(M_ARENA_MAX, 8) == 1;
  });
  const long kept =
      ThreadFaultsOfLaterSteps(6, [] { return KeepFreedMemoryForReuse(); });
  ASSERT_GE(thresholds_only, 0);
  ASSERT_GE(kept, 0);
  EXPECT_GE(thresholds_only, 4 * 9216 / 2) << "glibc's arenas changed?";
  EXPECT_LT(kept, 4 * 9216 / 20);
}

}  // namespace
}  // namespace pstrain
