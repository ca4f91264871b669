// The Explain call's validation, cost and work: a query and up to --max-explain-documents
// documents, each attributed against the query by engine/explain/attribution.h. The work runs as
// one task job on the batcher thread (batcher.h), yielding to queued forward batches between
// units of work so Encode keeps its latency.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "server/core/calls.h"
#include "server/core/cost_model.h"
#include "server/core/request_plan.h"

namespace attn::server::core {

struct ExplainPlan {
  TokenizedInputs inputs;  // the query, then the documents (total_tokens for the metadata)
  AttributionOptions options;
  int64_t cost_tokens = 0;  // AttributionCostTokens summed over the documents
  // Filled by RunExplain on the batcher thread, one per document.
  std::vector<ExplainResult> results;
};

// INVALID_ARGUMENT naming the field and the limit: no or too many documents, an empty text,
// unknown method or baseline, steps outside [1, 256], layer outside [0, L], a text over the
// method's token limit (texts are never truncated: an attribution of part of a text would
// explain a different similarity).
// `check` (the lower-bound admission of Encode) is not used: an Explain's texts are capped at
// 512 tokens each and 16 documents, so tokenizing one is never the expensive part.
absl::StatusOr<ExplainPlan> PrepareExplain(const Model& model, const ExplainRequest& request,
                                           const RequestLimits& limits,
                                           const LowerBoundCheck<ExplainPlan>& check);

// Response bytes (tokens, per-token and pair attributions, words) and working memory (the saved
// activations of one run of path points, capped by the engine at ~256 MB, the Jacobian-vector
// product batch, the per-text gradients, the response twice).
RequestCost EstimateCost(const Model& model, const ExplainPlan& plan, int64_t version_bytes);

// Attributes every document against the query into plan->results; `yield` is the batcher's
// (true = stop, CANCELLED).
absl::Status RunExplain(const Model& model, ExplainPlan* plan, const std::function<bool()>& yield);

}  // namespace attn::server::core
