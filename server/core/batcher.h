// Dynamic batcher: merges concurrent requests' sequences into packed engine batches of up to
// --max-batch-tokens tokens and runs them one batch at a time (the engine already uses every
// core through OpenMP, so one batch at a time is the fastest schedule).
//
// Admission is bounded by --max-concurrent-requests (queued + running); beyond it Submit()
// fails at once with RESOURCE_EXHAUSTED. A request larger than the token budget is split into
// chunks. Cancellation and deadlines are checked when a batch is formed (stage "queue"), between
// encoder layers (the engine's stop_requested: the forward stops once no request of the batch
// is wanted) and after the forward (stage "compute"); dropped requests are counted in metrics.
// A batch starts with the cheapest queued request by its admission estimate (Job::cost_bytes;
// ties: the oldest), and with the oldest chunk after a batch that skipped it, so ordinary calls
// wait for about one batch, not behind every chunk of the costly requests queued before them
// (a 512-token AttentionMap with every map is few tokens but costly), and costly ones keep going.
// Requests are merged only when they keep the same extra outputs (hidden layers, static
// embeddings, attention parts), so a batch never keeps more for a request than its own cost
// estimate (server/core/cost_model.h) counted.
// Task jobs (Explain: many forwards and backwards of their own) queue like the others but run
// alone, on the same thread; at each of the task's yield points the batcher first checks that the
// task is still wanted, then runs the forward batches queued meanwhile, so a long task delays an
// Encode by one yield interval, not by the whole task.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/encoder.h"
#include "engine/model.h"
#include "server/core/serving_metrics.h"

namespace attn::server {

// Where one sequence's outputs live: a shared batch result and the sequence's index in it.
struct SequenceView {
  std::shared_ptr<const ForwardResult> result;
  int index = 0;

  int64_t row_begin() const { return result->seq_offsets[index]; }
  int64_t length() const { return result->seq_offsets[index + 1] - result->seq_offsets[index]; }
  // Hidden state rows (T, H) of `layer`; the layer must have been requested.
  const float* hidden(int layer, int64_t hidden_size) const {
    return result->HiddenState(layer)->data() + row_begin() * hidden_size;
  }
  const SequenceAttention& attention(int layer) const {
    return result->Attention(layer)->sequences[index];
  }
};

struct JobOutput {
  std::vector<SequenceView> sequences;  // one per submitted sequence, in order
  double queue_seconds = 0;             // enqueue -> first chunk starts
  double inference_seconds = 0;         // sum of the forwards that carried this job
  int batch_inputs = 0;                 // largest batch that carried this job
};

// Runs a task job: call `yield` between units of work and stop (returning its CANCELLED) when
// it returns true.
using TaskFn = std::function<absl::Status(const std::function<bool()>& yield)>;

struct Job {
  std::shared_ptr<const Model> model;
  std::vector<SequenceInput> sequences;
  ForwardOptions forward;  // what to keep; pool must be false
  // The admission estimate of the call's working memory (cost_model.h): batches start with the
  // cheapest queued request, so an ordinary call does not wait behind costly ones.
  int64_t cost_bytes = 0;
  // A task job instead of a forward: `sequences` empty; `task_tokens` its cost in token-forward
  // equivalents (for the light-first rule).
  TaskFn task;
  int64_t task_tokens = 0;
  std::optional<std::chrono::system_clock::time_point> deadline;
  std::function<bool()> is_cancelled;  // may be empty
  // Called exactly once, on the batcher thread: OK with the output, or why it failed.
  std::function<void(absl::Status, JobOutput)> done;
};

struct BatcherOptions {
  // Set from ServerOptions (server/options.h holds the defaults).
  int64_t max_batch_tokens = 0;
  int max_concurrent_requests = 0;
  int threads = 0;  // OpenMP threads of the batcher thread; 0 = the OpenMP default (all cores)
};

class Batcher {
 public:
  Batcher(BatcherOptions options, ServingMetrics* metrics);
  ~Batcher();

  // Queues the job. RESOURCE_EXHAUSTED when full, UNAVAILABLE after Stop().
  absl::Status Submit(std::shared_ptr<Job> job);
  // Stops admitting, finishes everything queued, joins the worker. Idempotent.
  void Stop();

 private:
  struct JobState;
  struct Chunk {
    std::shared_ptr<JobState> job;
    int begin = 0, end = 0;  // sequence range within the job
    int64_t tokens = 0;
  };

  void Loop();
  // The next batch from the queue (a task chunk alone); `forwards_only`: skip task chunks.
  std::vector<Chunk> TakeBatch(bool forwards_only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RunBatch(std::vector<Chunk> batch);
  void RunTask(const Chunk& chunk);
  void Finish(const std::shared_ptr<JobState>& job, absl::Status status);
  // Drop check; returns false (and finishes the job, counting it as dropped at `stage`) if
  // nobody waits for it any more.
  bool StillWanted(const std::shared_ptr<JobState>& job, const char* stage);

  const BatcherOptions options_;
  ServingMetrics* const metrics_;
  mutable absl::Mutex mutex_;
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mutex_);
  int64_t admitted_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool light_went_ahead_ ABSL_GUARDED_BY(mutex_) = false;  // the last batch skipped older chunks
  std::thread worker_;
};

}  // namespace attn::server
