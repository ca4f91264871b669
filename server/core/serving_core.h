// The serving core: one entry point per call of the public API, free of any transport. Each
// call looks up the model version, validates and tokenizes its inputs once (errors name the
// input index and the limit), hands the engine work to the batcher and post-processes each
// sequence (results.h). Front ends (the gRPC services) translate their messages to the structs
// in calls.h, call here, and translate the response back; statuses are absl::Status.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/batcher.h"
#include "server/core/calls.h"
#include "server/core/model_registry.h"
#include "server/core/model_set.h"
#include "server/core/request_plan.h"
#include "server/core/serving_metrics.h"
#include "server/core/version_heads.h"

namespace attn::server::core {

// The core's share of the server options (server/options.h has the defaults).
struct CoreOptions {
  RequestLimits limits;
  int64_t max_message_bytes = 0;         // the response limit (--max-message-bytes)
  int64_t max_request_memory_bytes = 0;  // one call's working memory (cost_model.h)
  // The one-model constructor's model store, where Classify and Rerank find heads ("" = none;
  // a ModelSet names each model's own store).
  std::string model_store;
};

// `status` as the caller should get it: DEADLINE_EXCEEDED or CANCELLED (counted as dropped at
// `stage`: "queue", "compute" or "reply") when nobody waits for the answer any more, whatever
// else happened (an expired call is never counted OK, a cancelled one never as bad input).
absl::Status UnlessDropped(const CallControl& control, absl::Status status, const char* stage,
                           ServingMetrics* metrics);
// The same, the drop counted by `record_dropped(reason, stage)` (a front end's refusal before
// the request named its model).
absl::Status UnlessDropped(
    const CallControl& control, absl::Status status, const char* stage,
    const std::function<void(std::string_view, std::string_view)>& record_dropped);

class ServingCore {
 public:
  template <typename Response>
  using Done = std::function<void(absl::StatusOr<Response>)>;

  // One model (named "default"): its versions in `registry`, its queue in `batcher`.
  ServingCore(CoreOptions options, ModelRegistry* registry, Batcher* batcher,
              MemoryBudget* memory_budget, ServingMetrics* metrics);
  // Several models (model_set.h), each with its own versions, queue and metrics; they share the
  // memory budget. `metrics` counts what fails before a model is known (an unknown name).
  ServingCore(CoreOptions options, const ModelSet* models, MemoryBudget* memory_budget,
              ServingMetrics* metrics);

  // A request's model (by name, empty = the default) and version (empty = the one it serves):
  // NOT_FOUND naming the served models or that model's versions. Every call looks up through
  // here.
  struct Resolved {
    const ServedModel* served = nullptr;
    ModelVersion version;
  };
  absl::StatusOr<Resolved> Resolve(std::string_view model, std::string_view version) const;
  const ModelSet& models() const { return *models_; }

  // Engine calls. Each is costed before any work (cost_model.h) and admitted against the
  // per-request limits and the memory budget. `done` is called exactly once: on the calling
  // thread if the call fails before it reaches the batcher, else on the batcher thread once the
  // batch carrying it is done. The request is read only before Encode/AttentionMap return.
  void Encode(const EncodeRequest& request, const CallControl& control, Done<EncodeResponse> done);
  void AttentionMap(const AttentionRequest& request, const CallControl& control,
                    Done<AttentionResponse> done);
  // Attributions of the query-document similarities (explain.h): one task on the batcher
  // thread that yields to queued forward batches; costed from AttributionCostTokens (the light-
  // first rule) and its working memory (the budget).
  void Explain(const ExplainRequest& request, const CallControl& control,
               Done<ExplainResponse> done);
  // A version's classification head over the pooled, normalised embeddings of the inputs (the
  // embedding the head was trained on): an Encode of the inputs, then the head per input.
  void Classify(const ClassifyRequest& request, const CallControl& control,
                Done<ClassifyResponse> done);
  // Documents scored against the query and sorted: one Encode of the query and the documents
  // (cosine), or of the (query, document) pairs through the version's pair head (cross-encoder).
  void Rerank(const RerankRequest& request, const CallControl& control, Done<RerankResponse> done);

  // Calls answered on the calling thread.
  absl::StatusOr<TokenizeResponse> Tokenize(const TokenizeRequest& request,
                                            const CallControl& control);
  absl::StatusOr<ModelInfo> GetModelInfo(const ModelInfoRequest& request,
                                         const CallControl& control);
  // Every served model's info (its served version), the default first.
  absl::StatusOr<std::vector<ModelInfo>> ListModels(const CallControl& control);

 private:
  template <typename Request, typename Plan, typename Response, typename Prepare, typename Build>
  void RunEngineCall(const Request& request, const CallControl& control, Prepare prepare,
                     Build build, Done<Response> done);

  ModelInfo Info(const ServedModel& served, const ModelVersion& version) const;

  const CoreOptions options_;
  ModelSet own_models_;  // the one-model constructor's set
  const ModelSet* const models_;
  // The default model's versions and queue.
  ModelRegistry* const registry_;
  Batcher* const batcher_;
  MemoryBudget* const memory_budget_;
  ServingMetrics* const metrics_;
  VersionHeads heads_;
};

}  // namespace attn::server::core
