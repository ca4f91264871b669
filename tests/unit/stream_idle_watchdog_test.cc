// StreamIdleWatchdog: only time spent waiting for the client counts, the cancel runs once and
// outside the lock (so it may end the stream inline, destroying the watch), and a watch being
// destroyed on another thread waits for a cancel in progress. Real threads and a real clock, with
// margins of many periods (no timing is asserted tighter than "within seconds").
#include "server/stream_idle_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"

namespace attn::server {
namespace {

using namespace std::chrono_literals;

// Polls `done` every millisecond for up to `limit`.
template <typename Done>
bool WaitUntil(const Done& done, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(StreamIdleWatchdog, CancelsOnceAfterTheTimeoutOfWaiting) {
  StreamIdleWatchdog watchdog(100ms);
  std::atomic<int> cancels{0};
  std::unique_ptr<StreamIdleWatchdog::Watch> watch = watchdog.Start([&] { ++cancels; });
  const auto start = std::chrono::steady_clock::now();
  watch->Waiting();
  ASSERT_TRUE(WaitUntil([&] { return cancels.load() == 1; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_TRUE(watch->timed_out());
  std::this_thread::sleep_for(300ms);  // still waiting, but cancelled once only
  EXPECT_EQ(cancels.load(), 1);
}

TEST(StreamIdleWatchdog, TimeNotWaitingForTheClientDoesNotCount) {
  StreamIdleWatchdog watchdog(150ms);
  std::atomic<int> cancels{0};
  std::unique_ptr<StreamIdleWatchdog::Watch> watch = watchdog.Start([&] { ++cancels; });
  // Never waiting (the server busy with a long step) for 4 timeouts.
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(cancels.load(), 0);
  // A client answering every 30 ms for 4 timeouts: each message restarts the clock.
  for (int i = 0; i < 20; ++i) {
    watch->Waiting();
    std::this_thread::sleep_for(30ms);
    watch->Received();
  }
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_FALSE(watch->timed_out());
  watch->Waiting();
  EXPECT_TRUE(WaitUntil([&] { return cancels.load() == 1; }));
}

TEST(StreamIdleWatchdog, ZeroNeverCancels) {
  StreamIdleWatchdog watchdog(0s);
  std::atomic<int> cancels{0};
  std::unique_ptr<StreamIdleWatchdog::Watch> watch = watchdog.Start([&] { ++cancels; });
  watch->Waiting();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_FALSE(watch->timed_out());
}

TEST(StreamIdleWatchdog, TheCancelMayDestroyItsOwnWatch) {
  // The gRPC case: TryCancel can run the reactor's OnDone inline, which deletes the watch.
  StreamIdleWatchdog watchdog(50ms);
  std::unique_ptr<StreamIdleWatchdog::Watch> watch;
  std::atomic<bool> destroyed{false};
  watch = watchdog.Start([&] {
    watch.reset();
    destroyed = true;
  });
  watch->Waiting();
  ASSERT_TRUE(WaitUntil([&] { return destroyed.load(); }));
  // The watchdog goes on watching others.
  std::atomic<int> cancels{0};
  std::unique_ptr<StreamIdleWatchdog::Watch> other = watchdog.Start([&] { ++cancels; });
  other->Waiting();
  EXPECT_TRUE(WaitUntil([&] { return cancels.load() == 1; }));
}

TEST(StreamIdleWatchdog, DestroyingAWatchWaitsForItsCancelInProgress) {
  StreamIdleWatchdog watchdog(50ms);
  absl::Notification cancel_started, release_cancel;
  std::atomic<bool> cancel_returned{false};
  auto watch = watchdog.Start([&] {
    cancel_started.Notify();
    release_cancel.WaitForNotification();
    cancel_returned = true;
  });
  watch->Waiting();
  cancel_started.WaitForNotification();
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    watch.reset();  // must block until the cancel has returned
    EXPECT_TRUE(cancel_returned.load());
    destroyed = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(destroyed.load());
  release_cancel.Notify();
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

TEST(StreamIdleWatchdog, TheStatusSaysWhatWasAwaitedAndTheFlag) {
  const absl::Status status =
      IdleTimeout("FineTune", 300s, "the next batch, commit or abort", "job j1 discarded");
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status.message(),
            "FineTune: no message from the client for 300 s while waiting for the next batch, "
            "commit or abort (--stream-idle-timeout-s); job j1 discarded");
}

}  // namespace
}  // namespace attn::server
