// Cancels client streams that wait too long for their client's next message
// (--stream-idle-timeout-s). A FineTune stream holds its model's only fine-tuning slot and a
// CreateJob upload holds a place in the job queue; a client that stops sending (killed, stopped,
// or gone behind a network partition that TCP will not notice for hours) would otherwise hold
// them until the server restarts, and every other job would wait behind it.
//
// Only time spent waiting for the client counts: a stream whose server side is busy (a training
// step) is not idle. One thread checks every watched stream a few times per timeout.
#ifndef ATTN_SERVER_STREAM_IDLE_WATCHDOG_H_
#define ATTN_SERVER_STREAM_IDLE_WATCHDOG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace attn::server {

class StreamIdleWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout` <= 0: streams are never cancelled (no thread runs).
  explicit StreamIdleWatchdog(std::chrono::duration<double> timeout);
  // Every Watch must be gone (the gRPC server has shut down).
  ~StreamIdleWatchdog();
  StreamIdleWatchdog(const StreamIdleWatchdog&) = delete;
  StreamIdleWatchdog& operator=(const StreamIdleWatchdog&) = delete;

  // One stream's idle clock. Waiting() when a read of the client's next message starts,
  // Received() when it completes; after `timeout` of waiting, the watchdog calls `cancel` once,
  // on its own thread and outside its lock (so `cancel` may end the stream, even inline).
  class Watch {
   public:
    // Unregisters. If `cancel` is running on the watchdog's thread, waits for it to return
    // first (unless called from inside it), so what `cancel` uses may be destroyed after.
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    void Waiting();
    void Received();
    // Whether `cancel` was called: the stream ended because its client went quiet.
    bool timed_out() const;

   private:
    friend class StreamIdleWatchdog;
    Watch(StreamIdleWatchdog* owner, uint64_t id, std::function<void()> cancel)
        : owner_(owner), id_(id), cancel_(std::move(cancel)) {}

    StreamIdleWatchdog* const owner_;
    // Names the watch across an unlocked cancel, which may destroy it and let a new watch
    // take its address.
    const uint64_t id_;
    const std::function<void()> cancel_;
    // Guarded by owner_->mutex_.
    bool waiting_ = false;
    Clock::time_point waiting_since_;
    bool timed_out_ = false;
    bool cancelling_ = false;
  };

  // Watches one stream until the Watch is destroyed.
  std::unique_ptr<Watch> Start(std::function<void()> cancel);

  std::chrono::duration<double> timeout() const { return timeout_; }

 private:
  void Run();

  const std::chrono::duration<double> timeout_;
  mutable absl::Mutex mutex_;
  absl::CondVar changed_;
  std::map<uint64_t, Watch*> watches_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: started once the members above exist
};

// The status a stream ends with once its watch timed out (DEADLINE_EXCEEDED; logged as a
// warning, since the client, cancelled, hears only CANCELLED): "<call>: no message from the
// client for N s while waiting for <awaited> (--stream-idle-timeout-s); <consequence>".
absl::Status IdleTimeout(const char* call, std::chrono::duration<double> timeout,
                         const std::string& awaited, const std::string& consequence);

}  // namespace attn::server

#endif  // ATTN_SERVER_STREAM_IDLE_WATCHDOG_H_
