// pull_scan_bench: what a shard's pull spends finding its ready chunks, as
// the chunk count grows (issue 39: priority pulls' 256-KiB partitions give
// a model 16 times the chunks of 4 MiB). A pull looks for ready chunks
// after every update (ParameterShard::VisitReadyChunks), each unsent chunk
// under its lock, and with front-first order (priority pulls) again after
// every chunk it sends; this times one sync step of one worker on one
// shard holding N one-chunk tensors of `chunk_elements` floats, so that
// the scan, not the copy, is what grows:
//   ready:  the step's pushes and end are in before the pull starts;
//   racing: the pull waits while the pushes come in backward's order (the
//           last tensor first), as in training.
// Columns: chunks; order (plan or front-first); case; ms = median of the
// repeats from the pull's start (ready) or the first push (racing) to the
// pull's end; per chunk = ms / N in microseconds; x plan = the ratio to
// plan order's ms for the same chunks and case (the baseline, measured in
// the same run); ok = every chunk visited once, at the step's version.
//
//   bazel-bin/bench/pull_scan_bench --chunks=100,1000,4000 --repeats=5
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags_util.h"
#include "server/parameter_shard.h"

ABSL_FLAG(std::string, chunks, "100,1000,4000",
          "Comma-separated chunk counts (one-chunk tensors) to time.");
ABSL_FLAG(int, chunk_elements, 64, "Floats per chunk.");
ABSL_FLAG(int, repeats, 5, "Timed steps per row (medians).");

namespace pstrain {
namespace {

struct Timing {
  double ms = 0;
  bool ok = true;
};

// One sync step on a fresh shard: ms from the start to the pull's end.
Timing TimeStep(int n, int elements, bool front_first, bool racing) {
  ShardOptions options;
  options.job_id = "bench";
  options.num_workers = 1;
  options.adam.lr = 0.01f;
  ParameterShard shard(options);
  std::vector<int64_t> sizes(n, elements);
  std::vector<InitChunk> chunks(n);
  for (int t = 0; t < n; ++t) {
    chunks[t].param_id = t;
    chunks[t].values.assign(elements, 0.5f);
  }
  Timing timing;
  if (!shard.Initialize(sizes, 4 * elements, std::move(chunks)).ok()) {
    timing.ok = false;
    return timing;
  }
  const std::vector<float> gradient(elements, 0.25f);
  auto push_all = [&] {
    for (int t = n - 1; t >= 0; --t) {
      if (!shard.Push(0, t, 0, 0, gradient).ok()) timing.ok = false;
    }
    if (!shard.EndStep(0, 0, nullptr).ok()) timing.ok = false;
  };
  std::vector<int> visits(n, 0);
  PullOrder order;
  order.front_first = front_first;
  auto pull = [&] {
    const absl::Status s = shard.Pull(
        1, 0, absl::Now() + absl::Seconds(120),
        [&](const ChunkSpec& c, int64_t version, absl::Span<const float>) {
          if (version != 1) timing.ok = false;
          ++visits[c.param_id];
        },
        nullptr, nullptr, 0, nullptr, nullptr, {}, order);
    if (!s.ok()) timing.ok = false;
  };
  absl::Time start;
  if (racing) {
    std::thread puller(pull);
    absl::SleepFor(absl::Milliseconds(20));  // the pull waits first
    start = absl::Now();
    push_all();
    puller.join();
  } else {
    push_all();
    start = absl::Now();
    pull();
  }
  timing.ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  for (int v : visits) timing.ok = timing.ok && v == 1;
  return timing;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const int elements = absl::GetFlag(FLAGS_chunk_elements);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::printf(
      "# pull_scan_bench: one sync step, 1 worker, 1 shard, one-chunk "
      "tensors of %d floats; median of %d\n",
      elements, repeats);
  std::printf(
      "| chunks | case | order | ms | per chunk (us) | x plan | ok |\n");
  std::printf("|---:|---|---|---:|---:|---:|---|\n");
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_chunks), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(text, &n) || n < 1 || n > 1000000) {
      std::fprintf(stderr,
                   "pull_scan_bench: --chunks: %s; expected 1 to "
                   "1000000 each\n",
                   std::string(text).c_str());
      return 2;
    }
    for (const bool racing : {false, true}) {
      double plan_ms = 0;
      for (const bool front_first : {false, true}) {
        std::vector<double> ms;
        bool ok = true;
        for (int r = 0; r < repeats; ++r) {
          const Timing t = TimeStep(n, elements, front_first, racing);
          ms.push_back(t.ms);
          ok = ok && t.ok;
        }
        const double median = Median(ms);
        if (!front_first) plan_ms = median;
        std::printf("| %d | %s | %s | %.2f | %.2f | %.2fx | %s |\n", n,
                    racing ? "racing" : "ready",
                    front_first ? "front-first" : "plan", median,
                    1000 * median / n, median / plan_ms, ok ? "yes" : "NO");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pull_scan_bench [--flags]: what a shard's pull spends finding its "
      "ready chunks as the chunk count grows.");
  pstrain::ParseFlagsOrExit(argc, argv, "pull_scan_bench",
                            "pull_scan_bench --help");
  pstrain::ExitOnFlagError(
      "pull_scan_bench",
      pstrain::FirstError(
          {pstrain::CheckFlagRange("chunk_elements",
                                   absl::GetFlag(FLAGS_chunk_elements), 1,
                                   1 << 24),
           pstrain::CheckFlagRange("repeats", absl::GetFlag(FLAGS_repeats), 1,
                                   1000)}));
  return pstrain::Main();
}
