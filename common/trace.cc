#include "common/trace.h"

#include <algorithm>
#include <cerrno>
#include <chrono>  // NOLINT(build/c++11)
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

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
// a flush taking them). A deque: growing a vector copied every event
// recorded so far at each doubling, and those copies and their page
// faults were most of an event's cost (common/trace_bench).
struct ThreadBuffer {
  absl::Mutex mu;
  int tid ABSL_GUARDED_BY(mu) = 0;
  std::string name ABSL_GUARDED_BY(mu);
  std::deque<Event> events ABSL_GUARDED_BY(mu);
};

struct Tracer {
  absl::Mutex mu;
  TraceOptions options ABSL_GUARDED_BY(mu);
  bool started ABSL_GUARDED_BY(mu) = false;
  // Every thread that recorded, kept for the process's life (a thread's
  // buffer outlives it, so its events are written after it ended).
  std::vector<std::shared_ptr<ThreadBuffer>> buffers ABSL_GUARDED_BY(mu);
  // Threads of one name share a row (a step's short-lived threads).
  std::map<std::string, int> tid_by_name ABSL_GUARDED_BY(mu);
  int next_tid ABSL_GUARDED_BY(mu) = 1;
  std::atomic<int64_t> recorded{0};
  std::atomic<int64_t> dropped{0};
  // The file, open from Start() to Stop(), and what has been written to
  // it: whether an event went in (the next is preceded by a comma) and the
  // thread rows already named.
  absl::Mutex write_mu;
  std::FILE* file ABSL_GUARDED_BY(write_mu) = nullptr;
  std::string path ABSL_GUARDED_BY(write_mu);
  int pid ABSL_GUARDED_BY(write_mu) = 0;
  bool wrote_event ABSL_GUARDED_BY(write_mu) = false;
  std::map<int, std::string> thread_names ABSL_GUARDED_BY(write_mu);
  absl::Status write_error ABSL_GUARDED_BY(write_mu);
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

// `text` as a JSON string literal (names are ours, but a thread name may
// hold anything).
std::string Quoted(const std::string& text) {
  return nlohmann::json(text).dump();
}

// Appends `json` (one event object) to the array, after a comma unless it
// is the first.
void AppendEvent(Tracer& t, const std::string& json)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.write_mu) {
  if (t.file == nullptr || !t.write_error.ok()) return;
  const std::string line = absl::StrCat(t.wrote_event ? ",\n" : "", json);
  t.wrote_event = true;
  if (std::fwrite(line.data(), 1, line.size(), t.file) != line.size()) {
    t.write_error = ErrnoToStatus(errno, absl::StrCat(t.path, ": write"));
  }
}

absl::Status FlushFile(Tracer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.write_mu) {
  if (t.file != nullptr && t.write_error.ok() && std::fflush(t.file) != 0) {
    t.write_error = ErrnoToStatus(errno, absl::StrCat(t.path, ": write"));
  }
  return t.write_error;
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
    // Lock order: write_mu, then mu, then a buffer's mu.
    absl::MutexLock write_lock(&t.write_mu);
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
    t.file = std::fopen(options.path.c_str(), "w");
    if (t.file == nullptr) return ErrnoToStatus(errno, options.path);
    t.path = options.path;
    t.pid = options.pid;
    t.wrote_event = false;
    t.thread_names.clear();
    t.write_error = absl::OkStatus();
    if (std::fputs("[\n", t.file) < 0) {
      t.write_error = ErrnoToStatus(errno, absl::StrCat(t.path, ": write"));
    }
    AppendEvent(t, absl::StrCat(R"({"ph":"M","name":"process_name","pid":)",
                                options.pid, R"(,"tid":0,"args":{"name":)",
                                Quoted(options.process_name), "}}"));
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
  return Flush();
}

void SetClockOffset(int64_t offset_us, int64_t rtt_us) {
  Tracer& t = GetTracer();
  absl::MutexLock lock(&t.write_mu);
  AppendEvent(t, absl::StrCat(R"({"ph":"M","name":"pstrain_clock","pid":)",
                              t.pid, R"(,"tid":0,"args":{"offset_us":)",
                              offset_us, R"(,"rtt_us":)", rtt_us, "}}"));
  FlushFile(t).IgnoreError();  // Stop() reports it
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
  if (t.file == nullptr) return absl::OkStatus();
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    absl::MutexLock lock(&t.mu);
    buffers = t.buffers;
  }
  std::string text;
  for (const std::shared_ptr<ThreadBuffer>& b : buffers) {
    std::deque<Event> events;
    std::string name;
    int tid;
    {
      // The events leave the buffer: memory stays bounded by what one
      // flush interval records.
      absl::MutexLock lock(&b->mu);
      events.swap(b->events);
      name = b->name;
      tid = b->tid;
    }
    if (events.empty()) continue;
    if (name.empty()) name = absl::StrCat("thread ", tid);
    auto [named, inserted] = t.thread_names.emplace(tid, name);
    if (inserted || named->second != name) {
      named->second = name;
      AppendEvent(t, absl::StrCat(R"({"ph":"M","name":"thread_name","pid":)",
                                  t.pid, R"(,"tid":)", tid,
                                  R"(,"args":{"name":)", Quoted(name), "}}"));
    }
    for (const Event& e : events) {
      text.clear();
      absl::StrAppend(&text, R"({"ph":"X","name":")", e.name, R"(","cat":")",
                      e.category, R"(","pid":)", t.pid, R"(,"tid":)", tid,
                      R"(,"ts":)", e.ts_us, R"(,"dur":)", e.dur_us,
                      R"(,"args":{)");
      for (int i = 0; i < e.num_args; ++i) {
        absl::StrAppend(&text, i == 0 ? "" : ",", "\"", e.args[i].key,
                        "\":", e.args[i].value);
      }
      absl::StrAppend(&text, "}}");
      AppendEvent(t, text);
    }
  }
  return FlushFile(t);
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
  {
    absl::MutexLock write_lock(&t.write_mu);
    AppendEvent(t, absl::StrCat(R"({"ph":"M","name":"pstrain_dropped","pid":)",
                                t.pid, R"(,"tid":0,"args":{"events":)",
                                t.dropped.load(), "}}"));
    if (t.write_error.ok() && std::fputs("\n]\n", t.file) < 0) {
      t.write_error = ErrnoToStatus(errno, absl::StrCat(t.path, ": write"));
    }
    if (std::fclose(t.file) != 0 && t.write_error.ok()) {
      t.write_error = ErrnoToStatus(errno, absl::StrCat(t.path, ": close"));
    }
    t.file = nullptr;
    s.Update(t.write_error);
  }
  absl::MutexLock lock(&t.mu);
  t.started = false;
  return s;
}

}  // namespace trace
}  // namespace pstrain
