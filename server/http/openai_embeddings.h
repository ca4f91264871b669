// OpenAI's POST /v1/embeddings <-> the serving core's Encode: request JSON -> core::EncodeRequest
// (only the JSON's shape is checked here: counts, ranges and token ids are the core's), and the
// core's answer -> OpenAI's response JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/calls.h"

namespace attn::server::http {

// What the route does with an input over the model's limit (--openai-long-text, and per
// request "truncate" / "long_text").
enum class LongTextMode { kRefuse, kTruncate, kChunk };
// "refuse", "truncate" or "chunk" -> the mode; false for anything else.
bool ParseLongTextMode(std::string_view name, LongTextMode* mode);

struct EmbeddingsRequest {
  core::EncodeRequest encode;  // views into the storage below
  std::optional<std::string> model;
  bool base64 = false;        // encoding_format "base64": little-endian float32 bytes
  bool single_input = false;  // `input` was one string or one token-id array, not a list
  // Storage the request's inputs view.
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> token_ids;
};

// Parses OpenAI's request body into *request (whose inputs view its own storage: do not move
// it afterwards). INVALID_ARGUMENT naming the field (its name in *param) when the JSON is
// malformed or a field has the wrong type. Besides OpenAI's fields: "truncate" (bool) and
// "truncation_direction" ("right"/"left"), text-embeddings-inference's names; "long_text"
// ("refuse", "truncate" or "chunk") and "chunk_overlap". An input over the limit is dealt with
// as they say, else as `default_long_text` says. Token ids must be this model's tokenizer
// output ([CLS] ... [SEP], as /v1/tokenize returns them): LangChain's default sends tiktoken's.
absl::Status ParseEmbeddingsRequest(std::string_view body, EmbeddingsRequest* request,
                                    std::string* param,
                                    LongTextMode default_long_text = LongTextMode::kRefuse);

// OpenAI's response: {"object": "list", "data": [{"object": "embedding", "index", "embedding",
// "input_tokens", "truncated", "chunks"}], "model", "usage": {"prompt_tokens", "total_tokens"}}:
// per item, besides OpenAI's fields, the input's length in tokens ([CLS] and [SEP] included;
// with "input_tokens_lower_bound": true when it was counted only up to the tokenizer's
// look-ahead), whether it was truncated, and the windows it was encoded in.
std::string EmbeddingsResponseJson(const core::EncodeResponse& response, std::string_view model,
                                   bool base64);

}  // namespace attn::server::http
