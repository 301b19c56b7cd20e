#include "common/malloc_tuning.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

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
  const long by_default = FaultsOfLaterSteps(6);
  EXPECT_GE(by_default, 4 * 6400 / 2) << "glibc's defaults changed?";
  ASSERT_TRUE(KeepFreedMemoryForReuse());
  const long kept = FaultsOfLaterSteps(6);
  EXPECT_LT(kept, 4 * 6400 / 20);
}

}  // namespace
}  // namespace pstrain
