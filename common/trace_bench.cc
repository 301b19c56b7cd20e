// The tracer's cost per event site (common/trace.h), for BENCHMARKS.md:
// off (one relaxed load and a branch) and on (a Scope with two arguments
// recorded into the thread's buffer), in ns per site of this thread's CPU
// time (CLOCK_THREAD_CPUTIME_ID, so that other processes on a loaded
// machine do not count) and of wall time.
//
//   bazel run -c opt //common:trace_bench -- [events]
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "common/trace.h"

namespace {

double ThreadCpuNs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

struct Cost {
  double cpu_ns;
  double wall_ns;
};

// `n` Scopes as a hot loop would make them; the cost per Scope.
Cost TimeScopes(int64_t n) {
  const absl::Time start = absl::Now();
  const double cpu_start = ThreadCpuNs();
  for (int64_t i = 0; i < n; ++i) {
    pstrain::trace::Scope scope("bench", "bench", {{"i", i}, {"step", 7}});
  }
  return {
      (ThreadCpuNs() - cpu_start) / static_cast<double>(n),
      absl::ToDoubleNanoseconds(absl::Now() - start) / static_cast<double>(n)};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2'000'000;
  if (n <= 0 || n > pstrain::trace::kMaxEvents) {
    std::fprintf(stderr, "trace_bench: events %lld; expected 1 to %lld\n",
                 static_cast<long long>(n),
                 static_cast<long long>(pstrain::trace::kMaxEvents));
    return 2;
  }
  const Cost off = TimeScopes(n);
  pstrain::trace::TraceOptions options;
  options.path =
      std::string(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR")
                                                   : "/tmp") +
      "/trace_bench.json";
  options.process_name = "trace_bench";
  options.flush_interval = absl::ZeroDuration();
  if (!pstrain::trace::Start(options).ok()) return 1;
  const Cost on = TimeScopes(n);
  const double write_start = ThreadCpuNs();
  if (!pstrain::trace::Stop().ok()) return 1;
  const double write_ns =
      (ThreadCpuNs() - write_start) / static_cast<double>(n);
  std::printf(
      "#   events  off cpu  off wall   on cpu  on wall  write cpu\n"
      "#      (#)  (ns/site) (ns/site) (ns/ev)  (ns/ev)    (ns/ev)\n");
  std::printf("%10lld %8.2f %9.2f %8.1f %8.1f %10.1f\n",
              static_cast<long long>(n), off.cpu_ns, off.wall_ns, on.cpu_ns,
              on.wall_ns, write_ns);
  return 0;
}
