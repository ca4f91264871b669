// What the serving core reports while it works. The server's Prometheus metrics
// (server/metrics.h) implement it; the core itself exports nothing, so it builds and is tested
// without an exporter. Implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

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
  // A request dropped before it was computed: reason "cancelled" or "deadline".
  virtual void RecordDropped(std::string_view reason) = 0;
};

}  // namespace attn::server
