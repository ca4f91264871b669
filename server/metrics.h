// Every Prometheus metric the server exports is declared here, with its help text, and nowhere
// else: prefix attnserve_, plus the process_* family every Prometheus client library exports.
// Thread-safe. What one served model does carries its name as the label `model` (ModelMetrics);
// calls by protocol and method, and the shared memory budget, are server-wide. Each family has
// one set of label names (tests/integration/metrics_test.cc checks the exposition with promtool).
#pragma once

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "server/core/serving_metrics.h"

namespace attn::server {

class Metrics;

// The `model` label of calls dropped before their request was read (a model name cannot hold
// parentheses).
inline constexpr char kUnreadModel[] = "(unread)";

// One served model's series (label model="<name>"): what its batcher, its share of the serving
// core and its fine-tuning jobs report. Made by Metrics::ForModel, owned by the Metrics.
class ModelMetrics final : public ServingMetrics, public TrainingMetrics {
 public:
  ModelMetrics(Metrics* metrics, const std::string& model);

  void RecordQueueTime(double seconds) override;
  void RecordTokenizationTime(double seconds) override;
  void RecordInferenceTime(double seconds) override;
  void RecordBatch(int64_t inputs, int64_t tokens) override;
  void SetQueueDepth(int64_t requests) override;
  void AddTokens(int64_t tokens) override;
  void RecordDropped(std::string_view reason, std::string_view stage) override;
  // Server-wide: the models share one memory budget.
  void SetMemoryInFlight(int64_t bytes) override;
  void RecordMemoryRefusal(std::string_view limit) override;
  // attnserve_model_info{model, version, architecture, precision, ...} 1 for the served version
  // (replaces the model's previous series).
  void SetModelInfo(const std::string& version, const std::string& architecture,
                    const std::string& precision, int layers, int hidden, int heads);

  void RecordFineTuneStep(int64_t examples, double loss) override;
  void RecordFineTuneJob(std::string_view outcome) override;
  void RecordVersionPublished() override;
  void RecordUpdateNorms(
      const std::vector<std::pair<std::string, double>>& update_norm_by_kind) override;
  void SetQueuedJobs(int64_t jobs) override;
  // attnserve_serving_version_info{model, version} 1 for the version the model serves by
  // default (replaces the model's previous series).
  void SetServingVersion(const std::string& version);
  // attnserve_served_version_weight_change{model}: ‖W − W_base‖/‖W_base‖ of the default version
  // against the version it was fine-tuned from (its training report); 0 for a loaded model.
  void SetServedVersionWeightChange(double relative_change);

 private:
  Metrics* const metrics_;
  const std::string model_;
  prometheus::Histogram& queue_duration_;
  prometheus::Histogram& tokenization_duration_;
  prometheus::Histogram& inference_duration_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Gauge& queue_depth_;
  prometheus::Counter& tokens_;
  prometheus::Counter& finetune_steps_;
  prometheus::Gauge& finetune_loss_;
  prometheus::Counter& finetune_examples_;
  prometheus::Counter& versions_published_;
  prometheus::Gauge& finetune_jobs_queued_;
  std::mutex info_mutex_;
  prometheus::Gauge* current_model_info_ = nullptr;
  prometheus::Gauge* current_serving_version_ = nullptr;
};

class Metrics {
 public:
  Metrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // The series of the served model `model` (created on the first call; the same object after).
  ModelMetrics* ForModel(const std::string& model);

  // One finished call: attnserve_requests_total{protocol,method,code} and
  // attnserve_request_duration_seconds{protocol,method}. `protocol` is "grpc" or "http"; `code`
  // the canonical status name ("OK", "INVALID_ARGUMENT", ...) whatever the transport.
  void RecordRequest(std::string_view protocol, std::string_view method, std::string_view code,
                     double seconds);
  // A gRPC call (protocol "grpc").
  void RecordRequest(std::string_view method, grpc::StatusCode code, double seconds);
  // A finished gRPC stream (FineTune, CreateJob, WatchJob: seconds to hours):
  // attnserve_requests_total and attnserve_stream_duration_seconds{method}, so that streams do
  // not skew attnserve_request_duration_seconds, the latency of unary calls.
  void RecordStream(std::string_view method, grpc::StatusCode code, double seconds);
  // A call dropped before its request was read, so before it named a model: counted under
  // model="(unread)" (kUnreadModel), which no model can be named.
  void RecordDropped(std::string_view reason, std::string_view stage);

  // What GET /metrics answers: every family of the registry and the process_* family (read
  // from /proc at each scrape), in Prometheus' text format 0.0.4.
  std::string Exposition() const;

 private:
  friend class ModelMetrics;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& stream_duration_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& tokenization_duration_;
  prometheus::Family<prometheus::Histogram>& inference_duration_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Gauge& memory_in_flight_;
  prometheus::Family<prometheus::Counter>& memory_refusals_;
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Family<prometheus::Counter>& finetune_steps_;
  prometheus::Family<prometheus::Gauge>& finetune_loss_;
  prometheus::Family<prometheus::Counter>& finetune_examples_;
  prometheus::Family<prometheus::Counter>& finetune_jobs_;
  prometheus::Family<prometheus::Gauge>& finetune_jobs_queued_;
  prometheus::Family<prometheus::Gauge>& finetune_update_norm_;
  prometheus::Family<prometheus::Gauge>& served_weight_change_;
  prometheus::Family<prometheus::Counter>& versions_published_;
  prometheus::Family<prometheus::Gauge>& serving_version_info_;
  std::mutex models_mutex_;
  std::map<std::string, std::unique_ptr<ModelMetrics>> models_;
};

}  // namespace attn::server
