#include "server/http/cohere_rerank.h"

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/quote.h"
#include "server/http/json_message.h"

namespace attn::server::http {

using nlohmann::json;

namespace {

// Fields only attnserve's RerankRequest has, or that only protobuf's JSON mapping writes.
constexpr std::string_view kOwnFields[] = {"method",        "tokenization", "modelVersion",
                                           "model_version", "topN",         "returnDocuments"};
constexpr std::string_view kCohereFields[] = {"model",
                                              "query",
                                              "documents",
                                              "top_n",
                                              "return_documents",
                                              "rank_fields",
                                              "max_chunks_per_doc",
                                              "max_tokens_per_doc"};

absl::Status Bad(std::string* param, std::string_view field, const std::string& message) {
  *param = std::string(field);
  return absl::InvalidArgumentError(message);
}

}  // namespace

bool IsCohereRerank(const json& body) {
  if (!body.is_object()) return false;
  for (const auto& [key, value] : body.items()) {
    if (std::find(std::begin(kOwnFields), std::end(kOwnFields), key) != std::end(kOwnFields)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<core::RerankRequest> ParseCohereRerank(const json& body, std::string* param) {
  if (!body.is_object()) return Bad(param, "", "the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(std::begin(kCohereFields), std::end(kCohereFields), it.key()) ==
        std::end(kCohereFields)) {
      return Bad(
          param, it.key(),
          absl::StrCat(UnknownFieldMessage(it.key(), "a rerank request",
                                           std::vector<std::string>(std::begin(kCohereFields),
                                                                    std::end(kCohereFields))),
                       " (or attnserve's own fields: see /v1/rerank)"));
    }
  }
  core::RerankRequest request;
  request.method = core::RerankMethod::kUnspecified;  // the cross-encoder if any, else cosine
  request.tokenization.truncation = core::Truncation::kNone;
  if (body.contains("model")) {
    if (!body["model"].is_string()) return Bad(param, "model", "model must be a string");
    request.model = body["model"].get_ref<const std::string&>();
  }
  if (!body.contains("query") || !body["query"].is_string()) {
    return Bad(param, "query", "query must be a string (the text to rank the documents for)");
  }
  request.query = body["query"].get_ref<const std::string&>();
  if (!body.contains("documents") || !body["documents"].is_array()) {
    return Bad(param, "documents",
               "documents must be a list of strings or {\"text\": ...} objects");
  }
  const json& documents = body["documents"];
  for (size_t i = 0; i < documents.size(); ++i) {
    const json& d = documents[i];
    const json* text =
        d.is_string() ? &d : (d.is_object() && d.contains("text") ? &d["text"] : nullptr);
    if (text == nullptr || !text->is_string() || (d.is_object() && d.size() != 1)) {
      return Bad(param, "documents",
                 absl::StrCat("documents[", i,
                              "] must be a string or {\"text\": \"...\"} (this "
                              "server ranks by the text alone)"));
    }
    request.documents.push_back(text->get_ref<const std::string&>());
  }
  if (body.contains("top_n")) {
    if (!body["top_n"].is_number_unsigned() || body["top_n"].get<uint64_t>() < 1 ||
        body["top_n"].get<uint64_t>() > 1u << 20) {
      return Bad(param, "top_n", "top_n must be a positive integer");
    }
    request.top_n = static_cast<int32_t>(body["top_n"].get<uint64_t>());
  }
  if (body.contains("return_documents")) {
    if (!body["return_documents"].is_boolean()) {
      return Bad(param, "return_documents", "return_documents must be true or false");
    }
    request.return_documents = body["return_documents"].get<bool>();
  }
  if (body.contains("rank_fields") && body["rank_fields"] != json::array({"text"})) {
    return Bad(param, "rank_fields", "rank_fields: this server ranks by [\"text\"] only");
  }
  if (body.contains("max_chunks_per_doc")) {
    return Bad(param, "max_chunks_per_doc",
               "max_chunks_per_doc: this server does not chunk documents; a document longer than "
               "the model takes is refused, or cut with max_tokens_per_doc");
  }
  if (body.contains("max_tokens_per_doc")) {
    const json& max = body["max_tokens_per_doc"];
    if (!max.is_number_unsigned() || max.get<uint64_t>() < 1 || max.get<uint64_t>() > 1u << 20) {
      return Bad(param, "max_tokens_per_doc", "max_tokens_per_doc must be a positive integer");
    }
    request.tokenization.truncation = core::Truncation::kRight;
    request.tokenization.max_length = static_cast<int32_t>(max.get<uint64_t>());
  }
  return request;
}

absl::Status InCohereTerms(const absl::Status& status) {
  absl::string_view message = status.message();
  if (status.code() != absl::StatusCode::kInvalidArgument ||
      !absl::ConsumePrefix(&message, "inputs[")) {
    return status;
  }
  // The core numbers the query 0 and documents[i] i + 1.
  const size_t close = message.find("]: ");
  int index = 0;
  if (close == absl::string_view::npos || !absl::SimpleAtoi(message.substr(0, close), &index)) {
    return status;
  }
  absl::string_view what = message.substr(close + 3);
  what = what.substr(0, what.find(" and truncation is"));
  what = what.substr(0, what.find("; "));
  return absl::InvalidArgumentError(absl::StrCat(
      index == 0 ? std::string("the query") : absl::StrCat("documents[", index - 1, "]"), ": ",
      what, "; shorten it, or set max_tokens_per_doc to cut each document there"));
}

std::string CohereRerankJson(const core::RerankResponse& response, std::string_view model,
                             const core::RerankRequest& request) {
  static std::atomic<uint64_t> counter{0};
  json results = json::array();
  for (const core::RerankResult& r : response.results) {
    json result = {{"index", r.index}, {"relevance_score", r.score}};
    if (request.return_documents) {
      result["document"] = {{"text", std::string(request.documents[r.index])}};
    }
    results.push_back(std::move(result));
  }
  const std::string id = absl::StrCat("rerank-", response.model_version, "-", ++counter);
  return json{
      {"id", id},
      {"model", std::string(model)},
      {"results", std::move(results)},
      {"meta", {{"api_version", {{"version", "1"}}}, {"billed_units", {{"search_units", 1}}}}},
      {"usage", {{"total_tokens", response.metadata.token_count}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace attn::server::http
