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

struct EmbeddingsRequest {
  core::EncodeRequest encode;  // views into the storage below
  std::optional<std::string> model;
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes
  // Storage the request's inputs view.
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> token_ids;
};

// Parses OpenAI's request body into *request (whose inputs view its own storage: do not move
// it afterwards). INVALID_ARGUMENT naming the field (its name in *param) when the JSON is
// malformed or a field has the wrong type.
absl::Status ParseEmbeddingsRequest(std::string_view body, EmbeddingsRequest* request,
                                    std::string* param);

// OpenAI's response: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage": {"prompt_tokens", "total_tokens"}}.
std::string EmbeddingsResponseJson(const core::EncodeResponse& response, std::string_view model,
                                   bool base64);

}  // namespace attn::server::http
