// What the serving core reports while it works. The server's Prometheus metrics
// (server/metrics.h) implement it; the core itself exports nothing, so it builds and is tested
// without an exporter. Implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attn::server {

class ServingMetrics {
 public:
  virtual ~ServingMetrics() = default;

  virtual void RecordQueueTime(double seconds) = 0;
  virtual void RecordTokenizationTime(double seconds) = 0;
  virtual void RecordInferenceTime(double seconds) = 0;
  // One packed engine batch.
  virtual void RecordBatch(int64_t inputs, int64_t tokens) = 0;
  virtual void SetQueueDepth(int64_t requests) = 0;
  virtual void AddTokens(int64_t tokens) = 0;
  // A request dropped because nobody waits for its answer: reason "cancelled" or "deadline";
  // stage "queue" (before its batch ran: on arrival, in tokenization or in the queue),
  // "compute" (stopped between layers or after the forward) or "reply" (before serialising).
  virtual void RecordDropped(std::string_view reason, std::string_view stage) = 0;
  // Memory admission: bytes of estimated working memory held by admitted calls, and calls
  // refused by a per-request limit or the server-wide budget (limit "message", "request" or
  // "budget").
  virtual void SetMemoryInFlight(int64_t bytes) = 0;
  virtual void RecordMemoryRefusal(std::string_view limit) = 0;
};

// What fine-tuning jobs report (fine_tuning.h). Implementations must be thread-safe.
class TrainingMetrics {
 public:
  virtual ~TrainingMetrics() = default;

  // One training step of `examples` examples that ended with `loss`.
  virtual void RecordFineTuneStep(int64_t examples, double loss) = 0;
  // A job's end: "committed", "aborted", "failed" or "cancelled".
  virtual void RecordFineTuneJob(std::string_view outcome) = 0;
  virtual void RecordVersionPublished() = 0;
  // A telemetry step's update norm per parameter kind (W_Q, FFN_in, word_embeddings, ...: a
  // bounded set), all layers together: sqrt(sum of the groups' squared update norms).
  virtual void RecordUpdateNorms(
      const std::vector<std::pair<std::string, double>>& update_norm_by_kind) = 0;
  // Server-side jobs waiting to run (job_runner.h).
  virtual void SetQueuedJobs(int64_t jobs) = 0;
};

}  // namespace attn::server
