// A small timeline tracer: each task (worker, shard) records "complete"
// events (a name, a start and a duration, a few integer arguments) on the
// threads that do the work, and writes them as a Chrome trace file in the
// Trace Event Format's JSON array form, which Perfetto and chrome://tracing
// load, and which may be read while it grows (the closing "]" is optional
// in that form):
//
//   [
//   {"ph":"M","name":"process_name","pid":P,"tid":0,"args":{"name":"worker
//   0"}},
//   {"ph":"M","name":"pstrain_clock","pid":P,"tid":0,
//    "args":{"offset_us":-27,"rtt_us":154}},
//   {"ph":"M","name":"thread_name","pid":P,"tid":T,"args":{"name":"train"}},
//   {"ph":"X","name":"push","cat":"ps","pid":P,"tid":T,"ts":..,"dur":..,
//    "args":{"step":3,"param":7,"chunk":0,"shard":1,"bytes":4120}},
//   ...
//   {"ph":"M","name":"pstrain_dropped","pid":P,"tid":0,"args":{"events":0}}
//   ]
//
// Times: ts and dur in microseconds; ts on this host's system clock
// (microseconds since the Unix epoch). pstrain_clock's offset_us is what to
// add to this task's ts to get the coordinator's clock, measured by the
// task (coordinator/task_agent.h MeasureClockOffset) from a sample of round
// trip rtt_us; `pstrain trace` (cli/trace_merge.h) shifts each file by it
// to merge tasks onto one clock. pid: the caller's (tasks use shard k's
// index, 100 + worker j's); tid: a per-process number per thread name
// (SetThreadName), else per thread.
//
// Writing: Start() creates the file; a flush (every flush_interval on a
// background thread, and at Stop()) appends the events recorded since the
// last one and takes them out of memory, so memory holds one interval's
// events and a flush costs what it writes; Stop() closes the array.
//
// Cost: off (the default), every Scope and Complete is one relaxed atomic
// load and a branch. On, an event is appended to the calling thread's own
// buffer (its mutex is taken only by this thread and by a flush), at most
// kMaxEvents per run (later ones are counted in pstrain_dropped).
// common/trace_bench measures both (BENCHMARKS.md).
//
// Names, categories and argument keys must be string literals (or
// otherwise outlive the tracer) without characters JSON escapes: events
// keep the pointers and write them as they are.
//
// Thread-safety: every function is thread-safe. Start/Stop are for a
// task's main thread; events from any thread.
#ifndef PSTRAIN_COMMON_TRACE_H_
#define PSTRAIN_COMMON_TRACE_H_

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pstrain {
namespace trace {

inline constexpr int kMaxArgs = 5;
inline constexpr int64_t kMaxEvents = 4'000'000;

struct Arg {
  const char* key;
  int64_t value;
};

struct TraceOptions {
  // The file written (replaced) by every flush and by Stop().
  std::string path;
  // "worker 0", "ps 1": the process row's name in the viewer.
  std::string process_name;
  int pid = 0;
  // Besides Stop(), the file is rewritten this often by a background
  // thread (zero: only at Stop()).
  absl::Duration flush_interval = absl::Seconds(10);
};

namespace internal {
extern std::atomic<bool> enabled;
void Record(const char* name, const char* category, int64_t start_us,
            int64_t end_us, const Arg* args, int num_args);
}  // namespace internal

// Whether events are being recorded (one relaxed load).
inline bool Enabled() {
  return internal::enabled.load(std::memory_order_relaxed);
}

// This host's system clock, microseconds since the Unix epoch.
int64_t NowUs();

// Starts recording (events recorded before are discarded). Creates the
// file's folder; errors name the path. FAILED_PRECONDITION if started.
absl::Status Start(const TraceOptions& options);
// The measured offset (coordinator clock minus this host's, us) and the
// round trip of the sample it came from; written (pstrain_clock) at once.
void SetClockOffset(int64_t offset_us, int64_t rtt_us);
// Names the calling thread's row ("push shard 1"); threads given the same
// name share one row (tid), e.g. a step's short-lived threads.
void SetThreadName(const std::string& name);
// Appends the events recorded since the last flush to the file and
// flushes it to the OS. No-op when not started. A write error is returned
// by this call and every later one (and by Stop()).
absl::Status Flush();
// Stops recording and the flush thread, flushes, closes the array and
// the file. No-op when not started.
absl::Status Stop();

// An event from `start_us` to `end_us` (NowUs() clock) on this thread.
inline void Complete(const char* name, const char* category, int64_t start_us,
                     int64_t end_us, std::initializer_list<Arg> args = {}) {
  if (!Enabled()) return;
  internal::Record(name, category, start_us, end_us, args.begin(),
                   static_cast<int>(args.size()));
}

// An event from construction to destruction; arguments may be added
// (up to kMaxArgs in all) while it lives.
class Scope {
 public:
  Scope(const char* name, const char* category,
        std::initializer_list<Arg> args = {})
      : name_(name), category_(category) {
    if (!Enabled()) return;
    start_us_ = NowUs();
    for (const Arg& a : args) AddArg(a.key, a.value);
  }
  ~Scope() { End(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  void AddArg(const char* key, int64_t value) {
    if (start_us_ < 0 || num_args_ == kMaxArgs) return;
    args_[num_args_++] = {key, value};
  }
  // Ends the event now (the destructor then does nothing).
  void End();

 private:
  const char* name_;
  const char* category_;
  int64_t start_us_ = -1;
  int num_args_ = 0;
  Arg args_[kMaxArgs] = {};
};

}  // namespace trace
}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TRACE_H_
