// ThreadSanitizer annotations for Debian's (uninstrumented) Abseil Mutex and CondVar.
//
// Why: Debian builds libabsl_synchronization without -fsanitize=thread, so absl::Mutex takes and
// releases its lock with atomics TSan never sees. Without help, TSan finds no happens-before
// between two critical sections of one mutex and reports every mutex-guarded access (the
// batcher's queue, the model registry) as a data race.
//
// How: scripts/sanitize.sh LD_PRELOADs this library into the TSan test run, so calls from
// attnserve and from gRPC (which also locks absl::Mutex) reach these definitions first. They call
// the real function (dlsym RTLD_NEXT) and tell TSan the happens-before edges: release before an
// unlock or a wait, acquire after a lock or a wait. Memory accesses inside the real call are
// ignored, as in Abseil's own TSan build: Abseil evaluates waiters' absl::Condition functions in
// there, possibly on another thread. (TSan's full mutex model, __tsan_mutex_pre_lock and friends,
// reported "unlock of an unlocked mutex" inside gRPC's condition-variable waits; plain
// acquire/release has no ownership to get wrong, at the price of no lock-order checking for
// absl::Mutex.)
//
// Built without -fsanitize=thread and with weak references to the TSan API, so a process without
// TSan that inherits LD_PRELOAD (a shell, Prometheus) just calls through.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE == 1,
              "the mangled names below assume Abseil's inline namespace");

extern "C" {
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
void AnnotateIgnoreReadsBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char* file, int line) __attribute__((weak));
}

namespace {

#define ATTN_STRINGIFY2(x) #x
#define ATTN_STRINGIFY(x) ATTN_STRINGIFY2(x)

// "_ZN4absl" + <inline namespace> + `suffix`, e.g. "5Mutex4LockEv" -> absl::Mutex::Lock().
template <typename Fn>
Fn Real(const char* suffix) {
  const std::string ns = ATTN_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + suffix;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

bool Active() { return __tsan_acquire != nullptr; }

// The happens-before edges of a mutex: everything before a release is visible after the next
// acquire of the same mutex.
void Acquire(void* mu) {
  if (Active()) __tsan_acquire(mu);
}
void Release(void* mu) {
  if (Active()) __tsan_release(mu);
}

// Runs the real Abseil call with TSan ignoring memory accesses: Abseil evaluates other threads'
// absl::Condition functions inside Lock/Unlock/Await, where they read guarded state.
template <typename Call>
auto Ignoring(Call call) {
  if (Active()) {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  auto result = call();
  if (Active()) {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  return result;
}

// Lock and LockWhen*: acquire once held.
template <typename Call>
auto Locking(absl::Mutex* mu, Call call) {
  auto result = Ignoring(call);
  Acquire(mu);
  return result;
}

// A wait that releases the held mutex and holds it again on return (Await, CondVar::Wait).
template <typename Call>
auto ReleaseWhile(absl::Mutex* mu, Call call) {
  Release(mu);
  auto result = Ignoring(call);
  Acquire(mu);
  return result;
}

struct Done {};  // the result of a void call, so the helpers can return it

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Locking(this, [&] { return real(this), Done{}; });
}
void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Locking(this, [&] { return real(this), Done{}; });
}
bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = Ignoring([&] { return real(this); });
  if (locked) Acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool locked = Ignoring([&] { return real(this); });
  if (locked) Acquire(this);
  return locked;
}
void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Release(this);
  Ignoring([&] { return real(this), Done{}; });
}
void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Release(this);
  Ignoring([&] { return real(this), Done{}; });
}

// LockWhen*WithTimeout/Deadline return whether the condition held, but hold the lock either way.
void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, [&] { return real(this, cond), Done{}; });
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, [&] { return real(this, cond), Done{}; });
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, [&] { return real(this, cond, timeout); });
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, [&] { return real(this, cond, timeout); });
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, [&] { return real(this, cond, deadline); });
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  ReleaseWhile(this, [&] { return real(this, cond), Done{}; });
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return ReleaseWhile(this, [&] { return real(this, cond, timeout); });
}
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return ReleaseWhile(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  ReleaseWhile(mu, [&] { return real(this, mu), Done{}; });
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return ReleaseWhile(mu, [&] { return real(this, mu, timeout); });
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return ReleaseWhile(mu, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
