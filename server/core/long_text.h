// Inputs over max_length, on purpose (issue 31): Encode truncates them (the default), refuses
// them (TRUNCATION_NONE, and the OpenAI route unless asked), or chunks them (LongText::kChunk):
// the text's tokens in overlapping windows of max_length, encoded in the same packed batch and
// pooled into one embedding, the token-weighted mean of the windows'. Token ids that must be
// this model's tokenizer output (the OpenAI route) follow the same rules as texts.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/encoder.h"
#include "engine/model.h"
#include "server/core/calls.h"

namespace attn::server::core {

// Tokens a text is counted past max_length before tokenizing stops (TruncationOptions::
// look_ahead): a longer text's length is reported as a lower bound.
constexpr int kTokenizerLookAhead = 8192;

// How one Encode call treats inputs over max_length.
struct LongTextPlan {
  bool chunk = false;
  int overlap = 0;                 // chunk: tokens shared by consecutive windows
  int64_t max_chunked_tokens = 0;  // chunk: tokens of all inputs together, at most
  bool token_ids_from_tokenizer = false;
};

// The request's long_text and chunk_overlap, checked against its other fields (INVALID_ARGUMENT
// naming them). `max_length`: the resolved window length; `max_request_memory_bytes` bounds
// what chunking may tokenize (cost_model.h).
absl::StatusOr<LongTextPlan> ResolveLongText(const Model& model, const EncodeRequest& request,
                                             int max_length, int64_t max_request_memory_bytes);

// The windows of a whole-text encoding [CLS] t_0 .. t_{N-1} [SEP]: [CLS] t_s .. t_{s+W-1} [SEP]
// for s = 0, S, 2S, ... (W = max_length - 2, S = W - overlap), the last one the first that
// reaches t_{N-1}; one window when the encoding fits.
std::vector<SequenceInput> SplitIntoWindows(const Encoding& encoding, int max_length, int overlap,
                                            int32_t cls_id, int32_t sep_id);

// Token ids that must be this model's tokenizer output: INVALID_ARGUMENT carrying
// InputError::kForeignTokenIds unless they start with [CLS] and end with [SEP] (the range of
// every id is the tokenizer's check).
absl::Status CheckTokenizerOutput(const WordPieceTokenizer& tokenizer,
                                  absl::Span<const int32_t> ids, int index);

// Such ids over max_length, truncated as a text is: [CLS], the first (right) or last (left)
// max_length - 2 ids between [CLS] and [SEP], [SEP].
Encoding TruncateTokenizerOutput(const Encoding& encoding, const TruncationOptions& truncation);

// An input over `limit` tokens that may not be truncated: INVALID_ARGUMENT naming inputs[index],
// its length (exact or "more than") and the ways out, carrying InputError::kTooLong.
absl::Status TooLongError(const Model& model, int index, const Encoding& encoding, const char* what,
                          int limit);

// inputs[index] over what chunking may tokenize (`max_tokens`): RESOURCE_EXHAUSTED, too large.
absl::Status TooLongToChunkError(int index, int64_t max_tokens);

// The chunked embedding: sum_k T_k e_k / sum_k T_k over windows k of T_k tokens whose pooled
// (not yet normalised) embeddings are `window_embeddings` (K x H, row-major), into `out` (H).
void WeightedMeanOfWindows(const std::vector<float>& window_embeddings,
                           const std::vector<int64_t>& window_tokens, int64_t hidden, float* out);

}  // namespace attn::server::core
