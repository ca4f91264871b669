#include "client/fine_tune_runner.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "client/training_data.h"
#include "engine/training/epoch_order.h"

namespace attn::client {

namespace v1 = ::attnserve::v1;

namespace {

using Clock = std::chrono::steady_clock;

// How often the sending and waiting loops look at interrupts and the idle clock.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

// The stream's end and the time of its last message. `mu` also guards the outcome's fields the
// reader thread writes and serialises the observer's calls.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  Clock::time_point last_message;
};

}  // namespace

FineTuneRunner::FineTuneRunner(FineTuneSession* session, FineTuneRunnerOptions options,
                               FineTuneObserver* observer)
    : session_(session), options_(options), observer_(observer) {}

FineTuneOutcome FineTuneRunner::Run(const FineTuneJob& job) {
  FineTuneOutcome outcome;
  if (absl::Status s = session_->Start(job.config); !s.ok()) {
    outcome.status = s;
    return outcome;
  }
  outcome.started = true;

  StreamState state;
  state.last_message = Clock::now();
  std::thread reader([&] {
    v1::FineTuneProgress progress;
    while (session_->Read(&progress)) {
      std::lock_guard<std::mutex> lock(state.mu);
      state.last_message = Clock::now();
      if (!progress.job_id().empty()) outcome.job_id = progress.job_id();
      if (!progress.base_version().empty()) outcome.base_version = progress.base_version();
      if (!progress.committed_version().empty()) {
        outcome.committed_version = progress.committed_version();
        outcome.promoted = progress.promoted();
        outcome.promotion = progress.promotion();
      }
      const bool new_step = progress.step() > outcome.steps;
      if (new_step) {
        if (std::isnan(outcome.first_loss)) outcome.first_loss = progress.loss();
        outcome.last_loss = progress.loss();
        outcome.steps = progress.step();
      }
      if (observer_ != nullptr) observer_->OnProgress(progress, new_step);
      state.cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(state.mu);
    state.ended = true;
    state.cv.notify_all();
  });

  const auto idle_timeout = options_.idle_timeout;
  // Between server messages, at most idle_timeout while the server owes an answer.
  auto idle_too_long = [&] {  // with state.mu held
    return idle_timeout.count() > 0 && Clock::now() - state.last_message > idle_timeout;
  };
  auto notify = [&](FineTuneEvent event) {  // with state.mu held
    if (observer_ != nullptr) observer_->OnEvent(event);
  };

  // Send the batches, at most batches_in_flight ahead of the server.
  bool broken = false;
  bool interrupted = false;
  for (int epoch = 0; epoch < job.epochs && !broken && !interrupted && !outcome.timed_out;
       ++epoch) {
    const std::vector<size_t> order = EpochOrder(job.examples.size(), job.config.seed(), epoch);
    // A contrastive batch needs 2 pairs: one pair has no in-batch negative.
    const size_t min_batch = job.config.objective() == v1::CONTRASTIVE ? 2 : 1;
    for (const auto& [begin, end] : EpochBatches(order.size(), job.batch_size, min_batch)) {
      {
        std::unique_lock<std::mutex> lock(state.mu);
        while (true) {
          if (interrupts_.load() > 0) {
            interrupted = true;
            break;
          }
          if (state.ended) {
            broken = true;
            break;
          }
          if (outcome.batches_sent - outcome.steps < options_.batches_in_flight) break;
          if (idle_too_long()) {
            outcome.timed_out = true;
            break;
          }
          state.cv.wait_for(lock, kPollInterval);
        }
      }
      if (broken || interrupted || outcome.timed_out) break;
      v1::TrainingBatch batch;
      for (size_t i = begin; i < end; ++i) *batch.add_examples() = job.examples[order[i]];
      if (!session_->SendBatch(batch)) {
        broken = true;
        break;
      }
      ++outcome.batches_sent;
    }
  }

  int interrupts_seen = 0;
  if (outcome.timed_out) {
    session_->Cancel();
  } else if (interrupted) {
    interrupts_seen = interrupts_.load();
    {
      std::lock_guard<std::mutex> lock(state.mu);
      notify(FineTuneEvent::kAbortingOnInterrupt);
    }
    session_->Abort();
    outcome.aborted_by_us = true;
  } else if (!broken) {
    if (job.commit) {
      session_->Commit(job.description, job.promote);
    } else {
      session_->Abort();
      outcome.aborted_by_us = true;
    }
  }

  // Wait for the server's last messages; a further interrupt or a silent server cancels the
  // call.
  {
    std::unique_lock<std::mutex> lock(state.mu);
    while (!state.ended) {
      const int interrupts = interrupts_.load();
      if (interrupts > interrupts_seen) {
        if (interrupts_seen == 0 && !interrupted && job.commit && !broken) {
          notify(FineTuneEvent::kCommitPending);
        } else {
          notify(FineTuneEvent::kDisconnecting);
          session_->Cancel();
        }
        interrupted = true;
        interrupts_seen = interrupts;
      }
      if (!outcome.timed_out && idle_too_long()) {
        outcome.timed_out = true;
        session_->Cancel();
      }
      state.cv.wait_for(lock, kPollInterval);
    }
  }
  reader.join();
  outcome.interrupted = interrupted;
  outcome.status = session_->Finish();
  return outcome;
}

}  // namespace attn::client
