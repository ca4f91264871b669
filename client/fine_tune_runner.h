// attn::client::FineTuneRunner: drives one fine-tuning job over a FineTuneSession to its end.
//
// It sends the examples epoch by epoch in the shuffled order of EpochOrder(seed, epoch), one
// batch per optimisation step and at most `batches_in_flight` batches ahead of the server's
// answers (the next batch is always waiting when a step ends, and an interrupt stops the job
// within a step or two); a second thread reads the progress stream. After the last batch it
// commits (job.commit) or aborts the job, then waits for the server's last messages.
//
//   FineTuneRunner runner(session.get(), options, &observer);
//   FineTuneOutcome outcome = runner.Run(job);     // blocks until the stream has ended
//   // from a signal handler or another thread:  runner.Interrupt();
//
// Interrupt() once: the job is aborted after the current step (nothing published); if the
// commit was already sent, the runner waits for it instead. Interrupt() again: the call is
// cancelled at once. A server that sends nothing for `idle_timeout` while it owes an answer
// gets the call cancelled (outcome.timed_out).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/trainer.pb.h"
#include "client/client.h"

namespace attn::client {

struct FineTuneJob {
  // Sent first; its seed also seeds the per-epoch shuffle.
  attnserve::v1::FineTuneConfig config;
  std::vector<attnserve::v1::TrainingExample> examples;
  int epochs = 1;
  int batch_size = 16;
  // After the last batch: commit (publish a new version) instead of aborting the job.
  bool commit = false;
  std::string description;  // stored with the committed version
  bool promote = false;     // serve the committed version by default (else it is staged)
};

struct FineTuneRunnerOptions {
  // Batches sent ahead of the server's answers.
  int64_t batches_in_flight = 2;
  // Longest silence from the server while it owes an answer; zero = no limit.
  std::chrono::milliseconds idle_timeout{30000};
};

// Things the runner does on its own that a user should be told about.
enum class FineTuneEvent {
  kAbortingOnInterrupt,  // first Interrupt(): the job is being aborted after the current step
  kCommitPending,        // first Interrupt() after the commit was sent: waiting for it
  kDisconnecting,        // a further Interrupt(): the call is being cancelled
};

// Receives what happens during Run(). Calls are serialised (never two at once), made from the
// reader thread or the thread that called Run().
class FineTuneObserver {
 public:
  virtual ~FineTuneObserver() = default;
  // Every message from the server; `new_step` when it reports a step beyond the last one.
  virtual void OnProgress(const attnserve::v1::FineTuneProgress& progress, bool new_step) {}
  virtual void OnEvent(FineTuneEvent event) {}
};

struct FineTuneOutcome {
  // False when the stream could not be started (auth, unreachable, ...): `status` says why.
  bool started = false;
  // The call's final status (FineTuneSession::Finish()).
  absl::Status status;
  int64_t steps = 0;  // completed steps reported by the server
  int64_t batches_sent = 0;
  std::string job_id, base_version, committed_version;
  bool promoted = false;  // the committed version is now the default
  std::string promotion;  // the server's word on why it was staged or promoted
  double first_loss = std::numeric_limits<double>::quiet_NaN();
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  bool timed_out = false;      // cancelled after idle_timeout without a message
  bool interrupted = false;    // Interrupt() was called while the job ran
  bool aborted_by_us = false;  // the runner sent Abort (no commit, or an interrupt)

  // The job ended as asked: OK, or ABORTED/CANCELLED after our own abort.
  bool ended_ok() const {
    return status.ok() || (aborted_by_us && (status.code() == absl::StatusCode::kAborted ||
                                             status.code() == absl::StatusCode::kCancelled));
  }
};

class FineTuneRunner {
 public:
  // `session` (not started) and `observer` (may be null) must outlive the runner.
  FineTuneRunner(FineTuneSession* session, FineTuneRunnerOptions options = {},
                 FineTuneObserver* observer = nullptr);
  FineTuneRunner(const FineTuneRunner&) = delete;
  FineTuneRunner& operator=(const FineTuneRunner&) = delete;

  // Starts the session with job.config and runs the job to the end of the stream. Call once.
  FineTuneOutcome Run(const FineTuneJob& job);

  // Async-signal-safe (one lock-free atomic increment); see the header comment.
  void Interrupt() { interrupts_.fetch_add(1, std::memory_order_relaxed); }

 private:
  FineTuneSession* session_;
  FineTuneRunnerOptions options_;
  FineTuneObserver* observer_;
  std::atomic<int> interrupts_{0};
  static_assert(std::atomic<int>::is_always_lock_free, "Interrupt() must be signal-safe");
};

}  // namespace attn::client
