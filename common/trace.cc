#include "common/trace.h"

#include <algorithm>
#include <cerrno>
#include <chrono>  // NOLINT(build/c++11)
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"

namespace pstrain {
namespace trace {
namespace internal {
std::atomic<bool> enabled{false};
}  // namespace internal

namespace {

struct Event {
  const char* name;
  const char* category;
  int64_t ts_us;
  int64_t dur_us;
  int num_args;
  Arg args[kMaxArgs];
};

// One thread's events. The thread appends under mu (uncontended but for
// a flush copying them).
struct ThreadBuffer {
  absl::Mutex mu;
  int tid ABSL_GUARDED_BY(mu) = 0;
  std::string name ABSL_GUARDED_BY(mu);
  std::vector<Event> events ABSL_GUARDED_BY(mu);
};

struct Tracer {
  absl::Mutex mu;
  TraceOptions options ABSL_GUARDED_BY(mu);
  bool started ABSL_GUARDED_BY(mu) = false;
  int64_t offset_us ABSL_GUARDED_BY(mu) = 0;
  int64_t rtt_us ABSL_GUARDED_BY(mu) = -1;
  // Every thread that recorded, kept for the process's life (a thread's
  // buffer outlives it, so its events are written after it ended).
  std::vector<std::shared_ptr<ThreadBuffer>> buffers ABSL_GUARDED_BY(mu);
  // Threads of one name share a row (a step's short-lived threads).
  std::map<std::string, int> tid_by_name ABSL_GUARDED_BY(mu);
  int next_tid ABSL_GUARDED_BY(mu) = 1;
  std::atomic<int64_t> recorded{0};
  std::atomic<int64_t> dropped{0};
  // Serializes whole-file writes.
  absl::Mutex write_mu;
  std::unique_ptr<absl::Notification> stop_flusher;
  std::thread flusher;
};

Tracer& GetTracer() {
  static Tracer* const tracer = new Tracer;
  return *tracer;
}

ThreadBuffer& ThisThread() {
  thread_local std::shared_ptr<ThreadBuffer> buffer = [] {
    auto b = std::make_shared<ThreadBuffer>();
    Tracer& t = GetTracer();
    absl::MutexLock lock(&t.mu);
    absl::MutexLock buffer_lock(&b->mu);
    b->tid = t.next_tid++;
    t.buffers.push_back(b);
    return b;
  }();
  return *buffer;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return ErrnoToStatus(errno, tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int error = errno;
  if (std::fclose(f) != 0 || !ok) {
    return ErrnoToStatus(ok ? errno : error, absl::StrCat(tmp, ": write"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat(path, ": rename"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

void Record(const char* name, const char* category, int64_t start_us,
            int64_t end_us, const Arg* args, int num_args) {
  Tracer& t = GetTracer();
  if (t.recorded.fetch_add(1, std::memory_order_relaxed) >= kMaxEvents) {
    t.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event e;
  e.name = name;
  e.category = category;
  e.ts_us = start_us;
  e.dur_us = std::max<int64_t>(0, end_us - start_us);
  e.num_args = std::min(num_args, kMaxArgs);
  std::copy(args, args + e.num_args, e.args);
  ThreadBuffer& b = ThisThread();
  absl::MutexLock lock(&b.mu);
  b.events.push_back(e);
}

}  // namespace internal

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Scope::End() {
  if (start_us_ < 0) return;
  internal::Record(name_, category_, start_us_, NowUs(), args_, num_args_);
  start_us_ = -1;
}

absl::Status Start(const TraceOptions& options) {
  Tracer& t = GetTracer();
  {
    absl::MutexLock lock(&t.mu);
    if (t.started) return absl::FailedPreconditionError("trace: started twice");
    std::error_code error;
    const std::filesystem::path dir =
        std::filesystem::path(options.path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, error);
    if (error) {
      return ErrnoToStatus(error.value(),
                           absl::StrCat(dir.string(), ": cannot create"));
    }
    t.options = options;
    t.started = true;
    for (const std::shared_ptr<ThreadBuffer>& b : t.buffers) {
      absl::MutexLock buffer_lock(&b->mu);
      b->events.clear();
    }
    t.recorded = 0;
    t.dropped = 0;
  }
  internal::enabled.store(true, std::memory_order_relaxed);
  if (options.flush_interval > absl::ZeroDuration()) {
    t.stop_flusher = std::make_unique<absl::Notification>();
    absl::Notification* stop = t.stop_flusher.get();
    const absl::Duration interval = options.flush_interval;
    t.flusher = std::thread([stop, interval] {
      while (!stop->WaitForNotificationWithTimeout(interval)) {
        Flush().IgnoreError();  // Stop() reports a write that fails
      }
    });
  }
  // The file exists (empty of events) from the start.
  return Flush();
}

void SetClockOffset(int64_t offset_us, int64_t rtt_us) {
  Tracer& t = GetTracer();
  absl::MutexLock lock(&t.mu);
  t.offset_us = offset_us;
  t.rtt_us = rtt_us;
}

void SetThreadName(const std::string& name) {
  ThreadBuffer& b = ThisThread();
  Tracer& t = GetTracer();
  absl::MutexLock lock(&t.mu);
  absl::MutexLock buffer_lock(&b.mu);
  auto [it, inserted] = t.tid_by_name.emplace(name, b.tid);
  b.tid = it->second;
  b.name = name;
}

absl::Status Flush() {
  Tracer& t = GetTracer();
  absl::MutexLock write_lock(&t.write_mu);
  TraceOptions options;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  nlohmann::json other = nlohmann::json::object();
  {
    absl::MutexLock lock(&t.mu);
    if (!t.started) return absl::OkStatus();
    options = t.options;
    buffers = t.buffers;
    other["task"] = options.process_name;
    other["clock_offset_us"] = t.offset_us;
    other["clock_rtt_us"] = t.rtt_us;
    other["dropped_events"] = t.dropped.load();
  }
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", options.pid},
                    {"tid", 0},
                    {"args", {{"name", options.process_name}}}});
  std::set<int> named;
  for (const std::shared_ptr<ThreadBuffer>& b : buffers) {
    std::vector<Event> copy;
    std::string name;
    int tid;
    {
      absl::MutexLock lock(&b->mu);
      copy = b->events;
      name = b->name;
      tid = b->tid;
    }
    if (copy.empty()) continue;
    if (named.insert(tid).second) {
      events.push_back(
          {{"ph", "M"},
           {"name", "thread_name"},
           {"pid", options.pid},
           {"tid", tid},
           {"args",
            {{"name", name.empty() ? absl::StrCat("thread ", tid) : name}}}});
    }
    for (const Event& e : copy) {
      nlohmann::json args = nlohmann::json::object();
      for (int i = 0; i < e.num_args; ++i)
        args[e.args[i].key] = e.args[i].value;
      events.push_back({{"ph", "X"},
                        {"name", e.name},
                        {"cat", e.category},
                        {"pid", options.pid},
                        {"tid", tid},
                        {"ts", e.ts_us},
                        {"dur", e.dur_us},
                        {"args", std::move(args)}});
    }
  }
  nlohmann::json file = {{"traceEvents", std::move(events)},
                         {"displayTimeUnit", "ms"},
                         {"otherData", std::move(other)}};
  return WriteFile(options.path, file.dump());
}

absl::Status Stop() {
  Tracer& t = GetTracer();
  {
    absl::MutexLock lock(&t.mu);
    if (!t.started) return absl::OkStatus();
  }
  if (t.stop_flusher != nullptr) {
    t.stop_flusher->Notify();
    t.flusher.join();
    t.stop_flusher.reset();
  }
  internal::enabled.store(false, std::memory_order_relaxed);
  absl::Status s = Flush();
  absl::MutexLock lock(&t.mu);
  t.started = false;
  return s;
}

}  // namespace trace
}  // namespace pstrain
