// Rerank in the shape Cohere's and Jina's APIs (and Infinity, vLLM, TEI's peers) share, beside
// attnserve's own RerankRequest JSON:
//
//   POST /v1/rerank, /v2/rerank, /rerank
//   {"model"?, "query", "documents": ["...", {"text": "..."}], "top_n"?, "return_documents"?,
//    "max_tokens_per_doc"?}
//   -> {"id", "model", "results": [{"index", "relevance_score", "document"?: {"text"}}],
//       "meta": {...}, "usage": {"total_tokens"}}
//
// How the two shapes share /v1/rerank: a body that uses any of attnserve's own fields
// (method, tokenization, modelVersion/model_version) or writes a field in protobuf's
// lowerCamelCase (topN, returnDocuments) is attnserve's RerankRequest and gets RerankResponse;
// any other body is Cohere's shape (its field names are snake_case, and it has no fields of
// ours). /v2/rerank (Cohere's v2) and /rerank (Jina's, Infinity's) take the Cohere shape only.
// Scores are the core's Rerank, exactly: the version's cross-encoder when it has one, else the
// cosine of the embeddings. A document longer than the model takes is refused (naming it)
// unless max_tokens_per_doc asks to cut it there; max_chunks_per_doc (Cohere v1's chunking) and
// rank_fields other than "text" are refused, not ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/core/calls.h"

namespace attn::server::http {

// Whether a /v1/rerank body (parsed) is Cohere-shaped rather than attnserve's RerankRequest.
bool IsCohereRerank(const nlohmann::json& body);

// A Cohere-shaped body as the core's request (viewing `body`, which must outlive it). `param`
// gets the field an error is about.
absl::StatusOr<core::RerankRequest> ParseCohereRerank(const nlohmann::json& body,
                                                      std::string* param);

// The core's refusal of an input in the request's terms: "inputs[2]: text has 702 tokens, ..."
// becomes "documents[1]: text has 702 tokens, ...; ... max_tokens_per_doc ...".
absl::Status InCohereTerms(const absl::Status& status);

// The core's answer in Cohere's (and Jina's) response shape. `documents`: the request's texts,
// for return_documents.
std::string CohereRerankJson(const core::RerankResponse& response, std::string_view model,
                             const core::RerankRequest& request);

}  // namespace attn::server::http
