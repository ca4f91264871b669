#include "server/metrics.h"

#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/status_map.h"

namespace attn::server {
namespace {

// Latency buckets from 0.5 ms to 30 s: single-sentence calls take milliseconds, big attention
// maps seconds.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return *buckets;
}

// Stream durations: a WatchJob of a finished job takes a second, a FineTune stream hours.
const prometheus::Histogram::BucketBoundaries& StreamBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400};
  return *buckets;
}

// Sets a gauge only to a number: a NaN loss (a job that diverged) would otherwise be exported
// as NaN, which no alert rule can compare.
void SetFinite(prometheus::Gauge& gauge, double value) {
  if (std::isfinite(value)) gauge.Set(value);
}

prometheus::MetricFamily ProcessFamily(const char* name, const char* help,
                                       prometheus::MetricType type, double value) {
  prometheus::ClientMetric metric;
  (type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value) = value;
  return prometheus::MetricFamily{name, help, type, {metric}};
}

// The process_* family of the Prometheus client libraries (same names, units and meaning), read
// from /proc at each scrape.
std::vector<prometheus::MetricFamily> ProcessFamilies() {
  std::vector<prometheus::MetricFamily> families;
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // The fields after the command name, which is in parentheses and may hold spaces: the first
  // is field 3 (state) of proc(5).
  const size_t close = stat.rfind(')');
  std::vector<std::string> fields;
  if (close != std::string::npos) fields = absl::StrSplit(stat.substr(close + 2), ' ');
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  auto field = [&fields](int number) {
    double value = 0;
    const size_t index = static_cast<size_t>(number - 3);
    return index < fields.size() && absl::SimpleAtod(fields[index], &value) ? value : 0.0;
  };
  using prometheus::MetricType;
  if (fields.size() >= 22) {
    families.push_back(ProcessFamily("process_cpu_seconds_total",
                                     "Total user and system CPU time spent in seconds.",
                                     MetricType::Counter, (field(14) + field(15)) / ticks));
    families.push_back(ProcessFamily("process_virtual_memory_bytes",
                                     "Virtual memory size in bytes.", MetricType::Gauge,
                                     field(23)));
    families.push_back(ProcessFamily("process_resident_memory_bytes",
                                     "Resident memory size in bytes.", MetricType::Gauge,
                                     field(24) * static_cast<double>(sysconf(_SC_PAGESIZE))));
    std::ifstream proc_stat("/proc/stat");
    double boot_time = 0;
    for (std::string line; std::getline(proc_stat, line);) {
      if (absl::StartsWith(line, "btime ")) absl::SimpleAtod(line.substr(6), &boot_time);
    }
    families.push_back(ProcessFamily("process_start_time_seconds",
                                     "Start time of the process since unix epoch in seconds.",
                                     MetricType::Gauge, boot_time + field(22) / ticks));
  }
  std::error_code error;
  double open_fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++open_fds;
  }
  families.push_back(ProcessFamily("process_open_fds", "Number of open file descriptors.",
                                   MetricType::Gauge, open_fds));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    families.push_back(ProcessFamily("process_max_fds", "Maximum number of open file descriptors.",
                                     MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return families;
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("attnserve_requests_total")
                    .Help("Finished calls and streams by protocol (grpc, http), method and "
                          "status code (the gRPC code name; an HTTP answer is counted by the code "
                          "behind its status, a request refused before routing as method "
                          "unknown).")
                    .Register(*registry_)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("attnserve_request_duration_seconds")
                            .Help("Server-side latency of unary calls, receipt to response, by "
                                  "protocol and method (streams: "
                                  "attnserve_stream_duration_seconds).")
                            .Register(*registry_)),
      stream_duration_(prometheus::BuildHistogram()
                           .Name("attnserve_stream_duration_seconds")
                           .Help("How long gRPC streams stayed open (FineTune, CreateJob, "
                                 "WatchJob: seconds to hours), by method.")
                           .Register(*registry_)),
      queue_duration_(prometheus::BuildHistogram()
                          .Name("attnserve_queue_duration_seconds")
                          .Help("Time requests wait in their model's batcher queue before their "
                                "batch runs, by model.")
                          .Register(*registry_)),
      tokenization_duration_(prometheus::BuildHistogram()
                                 .Name("attnserve_tokenization_duration_seconds")
                                 .Help("Time to validate and tokenize one request's inputs, by "
                                       "model.")
                                 .Register(*registry_)),
      inference_duration_(prometheus::BuildHistogram()
                              .Name("attnserve_inference_duration_seconds")
                              .Help("Engine forward time of one packed batch, by model.")
                              .Register(*registry_)),
      batch_size_(prometheus::BuildHistogram()
                      .Name("attnserve_batch_size")
                      .Help("Inputs (sequences) per packed engine batch, by model.")
                      .Register(*registry_)),
      batch_tokens_(prometheus::BuildHistogram()
                        .Name("attnserve_batch_tokens")
                        .Help("Tokens per packed engine batch, by model.")
                        .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("attnserve_queue_depth")
                       .Help("Requests admitted and not yet finished (queued or running), by "
                             "model (each model has its own queue).")
                       .Register(*registry_)),
      tokens_(prometheus::BuildCounter()
                  .Name("attnserve_tokens_total")
                  .Help("Tokens run through the engine (special tokens included), by model.")
                  .Register(*registry_)),
      dropped_(prometheus::BuildCounter()
                   .Name("attnserve_dropped_requests_total")
                   .Help("Requests dropped because nobody waited for the answer, by model "
                         "((unread): dropped before the request was read), reason (cancelled, "
                         "deadline) and stage (queue, compute, reply).")
                   .Register(*registry_)),
      memory_in_flight_(prometheus::BuildGauge()
                            .Name("attnserve_memory_in_flight_bytes")
                            .Help("Estimated working memory of admitted Encode/AttentionMap calls "
                                  "(counted against --memory-budget-bytes).")
                            .Register(*registry_)
                            .Add({})),
      memory_refusals_(prometheus::BuildCounter()
                           .Name("attnserve_memory_refusals_total")
                           .Help("Calls refused before any work because of their estimated cost, "
                                 "by model and limit (message, request, budget).")
                           .Register(*registry_)),
      model_info_(prometheus::BuildGauge()
                      .Name("attnserve_model_info")
                      .Help("Each served model's default version and its shape, by model; value "
                            "is always 1.")
                      .Register(*registry_)),
      finetune_steps_(prometheus::BuildCounter()
                          .Name("attnserve_finetune_steps_total")
                          .Help("Completed fine-tuning optimisation steps, by model.")
                          .Register(*registry_)),
      finetune_loss_(prometheus::BuildGauge()
                         .Name("attnserve_finetune_loss")
                         .Help("Loss of the last completed fine-tuning step, by model.")
                         .Register(*registry_)),
      finetune_examples_(prometheus::BuildCounter()
                             .Name("attnserve_finetune_examples_total")
                             .Help("Training examples consumed by completed fine-tuning steps, "
                                   "by model.")
                             .Register(*registry_)),
      finetune_jobs_(prometheus::BuildCounter()
                         .Name("attnserve_finetune_jobs_total")
                         .Help("Finished fine-tuning jobs by model and outcome (committed, "
                               "aborted, failed, cancelled).")
                         .Register(*registry_)),
      finetune_jobs_queued_(prometheus::BuildGauge()
                                .Name("attnserve_finetune_jobs_queued")
                                .Help("Server-side fine-tuning jobs waiting to run (CreateJob; "
                                      "at most --max-queued-jobs), by model.")
                                .Register(*registry_)),
      finetune_update_norm_(prometheus::BuildGauge()
                                .Name("attnserve_finetune_update_norm")
                                .Help("Last telemetry step of the last fine-tuning job: the "
                                      "update norm ||W_after - W_before|| per parameter kind "
                                      "(W_Q, W_K, W_V, W_O, FFN_in, FFN_out, LayerNorm, "
                                      "embeddings, head; all layers together), by model.")
                                .Register(*registry_)),
      served_weight_change_(prometheus::BuildGauge()
                                .Name("attnserve_served_version_weight_change")
                                .Help("How far the default version's weights are from the "
                                      "version it was fine-tuned from, ||W - W_parent|| / "
                                      "||W_parent|| over all encoder parameters (from its "
                                      "training report; 0 for a model loaded from a directory), "
                                      "by model.")
                                .Register(*registry_)),
      versions_published_(prometheus::BuildCounter()
                              .Name("attnserve_model_versions_published_total")
                              .Help("Model versions committed by fine-tuning since start, by "
                                    "model.")
                              .Register(*registry_)),
      serving_version_info_(prometheus::BuildGauge()
                                .Name("attnserve_serving_version_info")
                                .Help("The version each model serves by default, by model; value "
                                      "is always 1.")
                                .Register(*registry_)) {
  // Zeros before the first drop, so that rate() sees them.
  for (const char* reason : {"cancelled", "deadline"}) {
    dropped_.Add({{"model", kUnreadModel}, {"reason", reason}, {"stage", "queue"}});
  }
}

ModelMetrics* Metrics::ForModel(const std::string& model) {
  std::lock_guard<std::mutex> lock(models_mutex_);
  std::unique_ptr<ModelMetrics>& metrics = models_[model];
  if (metrics == nullptr) metrics = std::make_unique<ModelMetrics>(this, model);
  return metrics.get();
}

ModelMetrics::ModelMetrics(Metrics* metrics, const std::string& model)
    : metrics_(metrics),
      model_(model),
      queue_duration_(metrics->queue_duration_.Add({{"model", model}}, LatencyBuckets())),
      tokenization_duration_(
          metrics->tokenization_duration_.Add({{"model", model}}, LatencyBuckets())),
      inference_duration_(metrics->inference_duration_.Add({{"model", model}}, LatencyBuckets())),
      batch_size_(metrics->batch_size_.Add(
          {{"model", model}},
          prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})),
      batch_tokens_(metrics->batch_tokens_.Add(
          {{"model", model}}, prometheus::Histogram::BucketBoundaries{16, 64, 256, 512, 1024, 2048,
                                                                      4096, 8192, 16384, 32768})),
      queue_depth_(metrics->queue_depth_.Add({{"model", model}})),
      tokens_(metrics->tokens_.Add({{"model", model}})),
      finetune_steps_(metrics->finetune_steps_.Add({{"model", model}})),
      finetune_loss_(metrics->finetune_loss_.Add({{"model", model}})),
      finetune_examples_(metrics->finetune_examples_.Add({{"model", model}})),
      versions_published_(metrics->versions_published_.Add({{"model", model}})),
      finetune_jobs_queued_(metrics->finetune_jobs_queued_.Add({{"model", model}})) {
  // Pre-create the common series so dashboards and rate() see zeros before the first event.
  for (const char* reason : {"cancelled", "deadline"}) {
    for (const char* stage : {"queue", "compute", "reply"}) {
      metrics->dropped_.Add({{"model", model}, {"reason", reason}, {"stage", stage}});
    }
  }
  for (const char* limit : {"message", "request", "budget"}) {
    metrics->memory_refusals_.Add({{"model", model}, {"limit", limit}});
  }
  for (const char* outcome : {"committed", "aborted", "failed", "cancelled"}) {
    metrics->finetune_jobs_.Add({{"model", model}, {"outcome", outcome}});
  }
}

void Metrics::RecordRequest(std::string_view protocol, std::string_view method,
                            std::string_view code, double seconds) {
  const std::string protocol_label(protocol), method_label(method);
  requests_
      .Add({{"protocol", protocol_label}, {"method", method_label}, {"code", std::string(code)}})
      .Increment();
  request_duration_.Add({{"protocol", protocol_label}, {"method", method_label}}, LatencyBuckets())
      .Observe(seconds);
}

void Metrics::RecordRequest(std::string_view method, grpc::StatusCode code, double seconds) {
  RecordRequest("grpc", method, GrpcCodeName(code), seconds);
}

void Metrics::RecordStream(std::string_view method, grpc::StatusCode code, double seconds) {
  const std::string method_label(method);
  requests_
      .Add({{"protocol", "grpc"},
            {"method", method_label},
            {"code", std::string(GrpcCodeName(code))}})
      .Increment();
  stream_duration_.Add({{"method", method_label}}, StreamBuckets()).Observe(seconds);
}

void Metrics::RecordDropped(std::string_view reason, std::string_view stage) {
  dropped_
      .Add(
          {{"model", kUnreadModel}, {"reason", std::string(reason)}, {"stage", std::string(stage)}})
      .Increment();
}

std::string Metrics::Exposition() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& family : ProcessFamilies()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

void ModelMetrics::RecordQueueTime(double seconds) { queue_duration_.Observe(seconds); }
void ModelMetrics::RecordTokenizationTime(double seconds) {
  tokenization_duration_.Observe(seconds);
}
void ModelMetrics::RecordInferenceTime(double seconds) { inference_duration_.Observe(seconds); }

void ModelMetrics::RecordBatch(int64_t inputs, int64_t tokens) {
  batch_size_.Observe(static_cast<double>(inputs));
  batch_tokens_.Observe(static_cast<double>(tokens));
}

void ModelMetrics::SetQueueDepth(int64_t requests) {
  queue_depth_.Set(static_cast<double>(requests));
}
void ModelMetrics::AddTokens(int64_t tokens) { tokens_.Increment(static_cast<double>(tokens)); }

void ModelMetrics::RecordDropped(std::string_view reason, std::string_view stage) {
  metrics_->dropped_
      .Add({{"model", model_}, {"reason", std::string(reason)}, {"stage", std::string(stage)}})
      .Increment();
}

void ModelMetrics::SetMemoryInFlight(int64_t bytes) {
  metrics_->memory_in_flight_.Set(static_cast<double>(bytes));
}

void ModelMetrics::RecordMemoryRefusal(std::string_view limit) {
  metrics_->memory_refusals_.Add({{"model", model_}, {"limit", std::string(limit)}}).Increment();
}

void ModelMetrics::SetModelInfo(const std::string& version, const std::string& architecture,
                                const std::string& precision, int layers, int hidden, int heads) {
  std::lock_guard<std::mutex> lock(info_mutex_);
  if (current_model_info_ != nullptr) metrics_->model_info_.Remove(current_model_info_);
  current_model_info_ = &metrics_->model_info_.Add({{"model", model_},
                                                    {"version", version},
                                                    {"architecture", architecture},
                                                    {"precision", precision},
                                                    {"layers", std::to_string(layers)},
                                                    {"hidden_size", std::to_string(hidden)},
                                                    {"heads", std::to_string(heads)}});
  current_model_info_->Set(1);
}

void ModelMetrics::RecordFineTuneStep(int64_t examples, double loss) {
  finetune_steps_.Increment();
  finetune_examples_.Increment(static_cast<double>(examples));
  SetFinite(finetune_loss_, loss);
}

void ModelMetrics::RecordFineTuneJob(std::string_view outcome) {
  metrics_->finetune_jobs_.Add({{"model", model_}, {"outcome", std::string(outcome)}}).Increment();
}

void ModelMetrics::RecordVersionPublished() { versions_published_.Increment(); }

void ModelMetrics::SetQueuedJobs(int64_t jobs) {
  finetune_jobs_queued_.Set(static_cast<double>(jobs));
}

void ModelMetrics::SetServedVersionWeightChange(double relative_change) {
  SetFinite(metrics_->served_weight_change_.Add({{"model", model_}}), relative_change);
}

void ModelMetrics::RecordUpdateNorms(
    const std::vector<std::pair<std::string, double>>& update_norm_by_kind) {
  for (const auto& [kind, norm] : update_norm_by_kind) {
    SetFinite(metrics_->finetune_update_norm_.Add({{"model", model_}, {"kind", kind}}), norm);
  }
}

void ModelMetrics::SetServingVersion(const std::string& version) {
  std::lock_guard<std::mutex> lock(info_mutex_);
  if (current_serving_version_ != nullptr) {
    metrics_->serving_version_info_.Remove(current_serving_version_);
  }
  current_serving_version_ =
      &metrics_->serving_version_info_.Add({{"model", model_}, {"version", version}});
  current_serving_version_->Set(1);
}

}  // namespace attn::server
