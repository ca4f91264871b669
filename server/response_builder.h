// Encode/AttentionMap/Tokenize results as protobuf messages, built from the engine's output in
// the requested dtype directly (no full fp32 copy of a tensor before encoding it).
// server/cost_model.h estimates what these build; keep the two in step.
#pragma once

#include "attnserve/v1/encoder.pb.h"
#include "server/batcher.h"
#include "server/request_prep.h"

namespace attn::server {

void FillTokens(const Model& model, const Encoding& encoding,
                google::protobuf::RepeatedPtrField<attnserve::v1::Token>* tokens);

// Tokens and truncation info of one input, for any result message that has them.
template <typename Result>
void FillInputResult(const Model& model, const Encoding& encoding, Result* result) {
  FillTokens(model, encoding, result->mutable_tokens());
  result->set_truncated(encoding.truncated);
  result->set_untruncated_length(encoding.untruncated_length);
}

// Fills the Encode results from the batch output (one per input, in order).
void BuildEncodeResults(const Model& model, const EncodePlan& plan, const JobOutput& output,
                        attnserve::v1::EncodeResponse* response);

// Fills the AttentionMap results from the batch output (one per input, in order).
void BuildAttentionResults(const Model& model, const AttentionPlan& plan, const JobOutput& output,
                           attnserve::v1::AttentionMapResponse* response);

}  // namespace attn::server
