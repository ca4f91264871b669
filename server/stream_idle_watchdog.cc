#include "server/stream_idle_watchdog.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/log.h"

namespace attn::server {

StreamIdleWatchdog::StreamIdleWatchdog(std::chrono::duration<double> timeout) : timeout_(timeout) {
  if (timeout_.count() > 0) thread_ = std::thread([this] { Run(); });
}

StreamIdleWatchdog::~StreamIdleWatchdog() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<StreamIdleWatchdog::Watch> StreamIdleWatchdog::Start(std::function<void()> cancel) {
  absl::MutexLock lock(&mutex_);
  std::unique_ptr<Watch> watch(new Watch(this, next_id_++, std::move(cancel)));
  watches_.emplace(watch->id_, watch.get());
  return watch;
}

StreamIdleWatchdog::Watch::~Watch() {
  absl::MutexLock lock(&owner_->mutex_);
  if (std::this_thread::get_id() != owner_->thread_.get_id()) {
    while (cancelling_) owner_->changed_.Wait(&owner_->mutex_);
  }
  owner_->watches_.erase(id_);
}

void StreamIdleWatchdog::Watch::Waiting() {
  absl::MutexLock lock(&owner_->mutex_);
  waiting_ = true;
  waiting_since_ = Clock::now();
}

void StreamIdleWatchdog::Watch::Received() {
  absl::MutexLock lock(&owner_->mutex_);
  waiting_ = false;
}

bool StreamIdleWatchdog::Watch::timed_out() const {
  absl::MutexLock lock(&owner_->mutex_);
  return timed_out_;
}

void StreamIdleWatchdog::Run() {
  // A quarter of the timeout between checks (at most 1 s, at least 10 ms): a quiet stream ends
  // between 1 and 1.25 timeouts after its client's last message.
  const absl::Duration period = absl::Seconds(std::clamp(timeout_.count() / 4, 0.01, 1.0));
  absl::MutexLock lock(&mutex_);
  while (!stopping_) {
    changed_.WaitWithTimeout(&mutex_, period);
    const Clock::time_point now = Clock::now();
    // Each quiet watch's id and a copy of its cancel: the cancel may end the stream inline and
    // so destroy its own watch (and the function inside it) while it runs.
    std::vector<std::pair<uint64_t, std::function<void()>>> quiet;
    for (auto& [id, watch] : watches_) {
      if (watch->waiting_ && !watch->timed_out_ && now - watch->waiting_since_ >= timeout_) {
        watch->timed_out_ = true;
        watch->cancelling_ = true;  // its destructor (on another thread) waits for the cancel
        quiet.emplace_back(id, watch->cancel_);
      }
    }
    for (auto& [id, cancel] : quiet) {
      // A stream ended inline by an earlier cancel on this thread did not wait: skip it.
      if (watches_.count(id) == 0) continue;
      mutex_.Unlock();
      cancel();
      mutex_.Lock();
      // Destroyed inside the cancel (the stream ended inline): gone, nothing to clear.
      const auto still_watched = watches_.find(id);
      if (still_watched != watches_.end()) still_watched->second->cancelling_ = false;
      changed_.SignalAll();
    }
  }
}

absl::Status IdleTimeout(const char* call, std::chrono::duration<double> timeout,
                         const std::string& awaited, const std::string& consequence) {
  const std::string message = absl::StrFormat(
      "%s: no message from the client for %g s while waiting for %s "
      "(--stream-idle-timeout-s); %s",
      call, timeout.count(), awaited, consequence);
  Log(LogLevel::kWarning, "%s", message);
  return absl::DeadlineExceededError(message);
}

}  // namespace attn::server
