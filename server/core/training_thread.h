// The one thread that runs every fine-tuning step (Trainer creation, tokenization of batches,
// Step, checkpoint writing), with its own OpenMP thread count and a lower CPU priority, so that
// training leaves the other cores to the batcher serving Encode/AttentionMap.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace attn::server {

class TrainingThread {
 public:
  // `omp_threads` 0 = the OpenMP default; `nice` 0 = the server's priority.
  TrainingThread(int omp_threads, int nice);
  // Runs the tasks still queued (they end their streams), then joins.
  ~TrainingThread();

  // Runs `task` on the training thread, after the ones posted before.
  void Post(std::function<void()> task);

 private:
  void Loop();

  const int omp_threads_;
  const int nice_;
  absl::Mutex mutex_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace attn::server
