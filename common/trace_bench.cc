// The tracer's cost per event site (common/trace.h), for BENCHMARKS.md:
// off (one relaxed load and a branch) and on (a Scope with two arguments
// recorded into the thread's buffer), in ns per site, on this thread.
//
//   bazel run -c opt //common:trace_bench -- [events]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "common/trace.h"

namespace {

// `n` Scopes as a hot loop would make them; returns ns per Scope.
double TimeScopes(int64_t n) {
  const absl::Time start = absl::Now();
  for (int64_t i = 0; i < n; ++i) {
    pstrain::trace::Scope scope("bench", "bench", {{"i", i}, {"step", 7}});
  }
  return absl::ToDoubleNanoseconds(absl::Now() - start) /
         static_cast<double>(n);
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
  const double off_ns = TimeScopes(n);
  pstrain::trace::TraceOptions options;
  options.path =
      std::string(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR")
                                                   : "/tmp") +
      "/trace_bench.json";
  options.process_name = "trace_bench";
  options.flush_interval = absl::ZeroDuration();
  if (!pstrain::trace::Start(options).ok()) return 1;
  const double on_ns = TimeScopes(n);
  const absl::Time write_start = absl::Now();
  if (!pstrain::trace::Stop().ok()) return 1;
  const double write_ns_per_event =
      absl::ToDoubleNanoseconds(absl::Now() - write_start) /
      static_cast<double>(n);
  std::printf(
      "#   events   off (ns/site)   on (ns/event)   write (ns/event)\n");
  std::printf("%10lld %15.2f %15.1f %18.1f\n", static_cast<long long>(n),
              off_ns, on_ns, write_ns_per_event);
  return 0;
}
