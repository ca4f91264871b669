// Per-sequence post-processing of a finished batch into the core's responses: pooling and L2
// normalisation, hidden-state views, head selection, top-k, mean over heads and rollout.
#pragma once

#include "engine/model.h"
#include "server/core/batcher.h"
#include "server/core/calls.h"
#include "server/core/request_plan.h"

namespace attn::server::core {

// One result per input, in order. Moves the encodings out of `plan`; the views in the results
// point into `output`'s batch results, which the caller keeps alive with the response.
void BuildEncodeResults(const Model& model, EncodePlan& plan, const JobOutput& output,
                        std::vector<EncodeResult>* results);
void BuildAttentionResults(const Model& model, AttentionPlan& plan, const JobOutput& output,
                           std::vector<AttentionResult>* results);

}  // namespace attn::server::core
