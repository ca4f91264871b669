#include "server/core/training_thread.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/log.h"

namespace attn::server {

TrainingThread::TrainingThread(int omp_threads, int nice)
    : omp_threads_(omp_threads), nice_(nice), thread_([this] { Loop(); }) {}

TrainingThread::~TrainingThread() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  thread_.join();
}

void TrainingThread::Post(std::function<void()> task) {
  absl::MutexLock lock(&mutex_);
  tasks_.push_back(std::move(task));
}

void TrainingThread::Loop() {
  // OpenMP settings are per thread: this one only affects the engine work started here, so
  // training leaves the remaining cores to the batcher.
  if (omp_threads_ > 0) omp_set_num_threads(omp_threads_);
  // A lower CPU priority makes the scheduler prefer the batcher's OpenMP team whenever both
  // want a core: with libgomp's spinning barriers, a serving team that loses a core to the
  // trainer stalls at every barrier (Encode latency went from ~10 ms to ~100 ms on 2 cores
  // without this). Threads created from here inherit it.
  if (nice_ > 0) {
    const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
    const int nice = std::min(19, getpriority(PRIO_PROCESS, tid) + nice_);
    if (setpriority(PRIO_PROCESS, tid, nice) != 0) {
      Log(LogLevel::kWarning, "cannot lower the training thread's priority to nice %d: %s", nice,
          std::strerror(errno));
    }
  }
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return stopping_ || !tasks_.empty();
      };
      mutex_.Await(absl::Condition(&ready));
      // Tasks end their stream, so they run even while stopping (the server has drained).
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace attn::server
