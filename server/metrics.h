// Every Prometheus metric the server exports is declared here, with its help text, and nowhere
// else. Prefix attnserve_. Thread-safe.
#pragma once

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/core/serving_metrics.h"

namespace attn::server {

class Metrics final : public ServingMetrics, public TrainingMetrics {
 public:
  Metrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One finished call: attnserve_requests_total{protocol,method,code} and
  // attnserve_request_duration_seconds{protocol,method}. `protocol` is "grpc" or "http"; `code`
  // the canonical status name ("OK", "INVALID_ARGUMENT", ...) whatever the transport.
  void RecordRequest(std::string_view protocol, std::string_view method, std::string_view code,
                     double seconds);
  // A gRPC call (protocol "grpc").
  void RecordRequest(std::string_view method, grpc::StatusCode code, double seconds);
  void RecordQueueTime(double seconds) override;
  void RecordTokenizationTime(double seconds) override;
  void RecordInferenceTime(double seconds) override;
  // One packed engine batch.
  void RecordBatch(int64_t inputs, int64_t tokens) override;
  void SetQueueDepth(int64_t requests) override;
  void AddTokens(int64_t tokens) override;
  void RecordDropped(std::string_view reason, std::string_view stage) override;
  void SetMemoryInFlight(int64_t bytes) override;
  void RecordMemoryRefusal(std::string_view limit) override;
  // attnserve_model_info{version, model_dir, precision, ...} 1 for the served version.
  void SetModelInfo(const std::string& version, const std::string& architecture,
                    const std::string& precision, int layers, int hidden, int heads);

  // Fine-tuning: one completed optimisation step over `examples` examples with loss `loss`.
  void RecordFineTuneStep(int64_t examples, double loss) override;
  // A finished fine-tuning job: outcome "committed", "aborted", "failed" or "cancelled".
  void RecordFineTuneJob(std::string_view outcome) override;
  void RecordVersionPublished() override;
  // attnserve_serving_version_info{version} 1 for the version served by default (replaces the
  // previous series).
  void SetServingVersion(const std::string& version);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Histogram& queue_duration_;
  prometheus::Histogram& tokenization_duration_;
  prometheus::Histogram& inference_duration_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Gauge& queue_depth_;
  prometheus::Counter& tokens_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Gauge& memory_in_flight_;
  prometheus::Family<prometheus::Counter>& memory_refusals_;
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Gauge* current_model_info_ = nullptr;
  prometheus::Counter& finetune_steps_;
  prometheus::Gauge& finetune_loss_;
  prometheus::Counter& finetune_examples_;
  prometheus::Family<prometheus::Counter>& finetune_jobs_;
  prometheus::Counter& versions_published_;
  prometheus::Family<prometheus::Gauge>& serving_version_info_;
  prometheus::Gauge* current_serving_version_ = nullptr;
};

}  // namespace attn::server
