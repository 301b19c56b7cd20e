// ThreadSanitizer annotations for Abseil's synchronization primitives, for
// --config=tsan builds only (.bazelrc links this into every binary through
// --custom_malloc).
//
// Debian's Abseil is a shared library built without -fsanitize=thread, so
// TSan cannot see that absl::Mutex, CondVar, Notification and
// BlockingCounter order memory (they are futexes and atomics inside the
// library, not pthread calls TSan intercepts): every field guarded by an
// absl::Mutex would be reported as a race. Here the entry points our code
// calls are defined again in the executable, which interposes them: each
// calls the library's own function (looked up with dlsym(RTLD_NEXT)) and
// tells TSan the happens-before edge it implies (__tsan_acquire after a lock
// or a completed wait, __tsan_release before an unlock or a notify). Reader
// locks are treated as exclusive ones (more ordering than is true: a race
// between two readers' critical sections would be missed, never invented).
//
// Thread-safety: each function is as thread-safe as the one it wraps.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

template <typename Fn>
Fn Real(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: no %s\n", symbol);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// The library's function `symbol` of type `Fn`, looked up once.
#define REAL(Fn, symbol)                     \
  static const auto real = Real<Fn>(symbol); \
  (void)0

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using MutexFn = void (*)(Mutex*);
using MutexBoolFn = bool (*)(Mutex*);
using MutexCondFn = void (*)(Mutex*, const Condition&);
using MutexCondTimeoutFn = bool (*)(Mutex*, const Condition&, Duration);
using MutexCondDeadlineFn = bool (*)(Mutex*, const Condition&, Time);

void Mutex::Lock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  REAL(MutexBoolFn, "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  REAL(MutexBoolFn, "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
void Mutex::Unlock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  REAL(MutexFn, "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::LockWhen(const Condition& cond) {
  REAL(MutexCondFn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(MutexCondFn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(MutexCondTimeoutFn,
       "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE");
  const bool met = real(this, cond, timeout);
  __tsan_acquire(this);
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(MutexCondDeadlineFn,
       "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_"
       "4TimeE");
  const bool met = real(this, cond, deadline);
  __tsan_acquire(this);
  return met;
}
void Mutex::Await(const Condition& cond) {
  REAL(MutexCondFn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(MutexCondTimeoutFn,
       "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE");
  __tsan_release(this);
  const bool met = real(this, cond, timeout);
  __tsan_acquire(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(MutexCondDeadlineFn,
       "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_"
       "4TimeE");
  __tsan_release(this);
  const bool met = real(this, cond, deadline);
  __tsan_acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  REAL(void (*)(CondVar*, Mutex*),
       "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(bool (*)(CondVar*, Mutex*, Duration),
       "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(bool (*)(CondVar*, Mutex*, Time),
       "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}
void Notification::WaitForNotification() const {
  REAL(void (*)(const Notification*),
       "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL(bool (*)(const Notification*, Duration),
       "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_"
       "8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL(bool (*)(const Notification*, Time),
       "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_"
       "4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool BlockingCounter::DecrementCount() {
  REAL(bool (*)(BlockingCounter*),
       "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}
void BlockingCounter::Wait() {
  REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
