#include "server/http/http_routes.h"

#include <google/protobuf/util/json_util.h>

#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "attnserve/v1/encoder.pb.h"
#include "engine/json_depth.h"
#include "engine/quote.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "server/http/cohere_rerank.h"
#include "server/http/json_message.h"
#include "server/http/openai_embeddings.h"
#include "server/oip/oip_rest.h"
#include "server/proto_convert.h"
#include "server/raw_method.h"
#include "server/status_map.h"

namespace attn::server::http {

namespace v1 = attnserve::v1;
using nlohmann::json;

namespace {

HttpReply JsonReply(std::string body) {
  HttpReply reply;
  reply.body = std::move(body);
  return reply;
}

}  // namespace

HttpReply ErrorReply(const absl::Status& status, std::string_view param, std::string_view code,
                     int http_status) {
  const HttpStatus mapped = ToHttpStatus(status);
  // An overriding status (405, 413) is about the request's form: OpenAI calls that invalid.
  json error = {{"message", std::string(status.message())},
                {"type", http_status != 0 ? "invalid_request_error" : std::string(mapped.type)},
                {"param", param.empty() ? json(nullptr) : json(std::string(param))},
                {"code", code.empty() ? json(nullptr) : json(std::string(code))}};
  HttpReply reply;
  reply.status = http_status != 0 ? http_status : mapped.code;
  reply.code_name = GrpcCodeName(static_cast<grpc::StatusCode>(status.code()));
  // json's dump refuses invalid UTF-8 by throwing; `replace` keeps a message quoting bad input
  // printable.
  reply.body =
      json{{"error", std::move(error)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  if (reply.status == 401) reply.headers.push_back({"WWW-Authenticate", "Bearer"});
  return reply;
}

HttpRoutes::HttpRoutes(HttpRoutesOptions options, core::ServingCore* core,
                       std::optional<std::string> api_key, Metrics* metrics)
    : options_(std::move(options)), core_(core), api_key_(std::move(api_key)), metrics_(metrics) {}

HttpReply HttpRoutes::TooLarge(int64_t bytes) {
  HttpReply reply =
      ErrorReply(CheckRequestSize(bytes, options_.max_message_bytes), "", "request_too_large", 413);
  metrics_->RecordRequest("http", "unknown", "RESOURCE_EXHAUSTED", 0);
  return reply;
}

HttpReply HttpRoutes::Refused(int http_status, const std::string& why) {
  HttpReply reply = ErrorReply(
      http_status == 408
          ? absl::DeadlineExceededError(why)
          : absl::InvalidArgumentError(absl::StrCat("the HTTP request was refused: ", why)),
      "", http_status == 408 ? "request_timeout" : "bad_http_request", http_status);
  metrics_->RecordRequest("http", "unknown", reply.code_name, 0);
  return reply;
}

HttpReply HttpRoutes::Handle(const HttpRequest& request) {
  const auto received = Clock::now();
  const char* method_label = "unknown";
  HttpReply reply = Dispatch(request, &method_label);
  metrics_->RecordRequest("http", method_label, reply.code_name,
                          std::chrono::duration<double>(Clock::now() - received).count());
  return reply;
}

const std::vector<HttpRoute>& HttpRouteTable() {
  static const auto* routes = new std::vector<HttpRoute>{
      {"POST", "/v1/embeddings", "Embeddings", "OpenAI-compatible embeddings"},
      {"POST", "/v1/encode", "Encode", "Encoder.Encode"},
      {"POST", "/v1/attention", "AttentionMap", "Encoder.AttentionMap"},
      {"POST", "/v1/tokenize", "Tokenize", "Encoder.Tokenize"},
      {"POST", "/v1/explain", "Explain", "Encoder.Explain"},
      {"POST", "/v1/classify", "Classify", "Encoder.Classify"},
      {"POST", "/v1/rerank", "Rerank", "Encoder.Rerank, or Cohere's v1 rerank shape"},
      {"POST", "/v2/rerank", "Rerank", "Cohere's v2 rerank shape"},
      {"POST", "/rerank", "Rerank", "Jina's/Infinity's rerank shape"},
      {"GET", "/v1/models", "GetModelInfo", "OpenAI's model list, with Encoder.GetModelInfo"},
      {"GET", "/v1/models/NAME", "GetModelInfo", "one model of that list"},
      {"GET", "/health", "Health", "200 while SERVING, else 503; no key needed"},
  };
  return *routes;
}

std::string HttpRouteSummary() {
  std::string out;
  std::string_view method;
  for (const HttpRoute& route : HttpRouteTable()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", route.method == method ? "" : route.method,
                    route.method == method ? "" : " ", route.path);
    method = route.method;
  }
  return out;
}

namespace {

// The table's route for `path`, or nullptr.
const HttpRoute* FindRoute(const std::string& request_path) {
  for (const HttpRoute& entry : HttpRouteTable()) {
    // "/v1/models/NAME": any name after the prefix.
    const std::string_view path = entry.path;
    const size_t name = path.find("NAME");
    if (name == std::string_view::npos
            ? request_path == path
            : request_path.size() > name && request_path.compare(0, name, path.data(), name) == 0) {
      return &entry;
    }
  }
  return nullptr;
}

}  // namespace

HttpReply HttpRoutes::Dispatch(const HttpRequest& request, const char** method_label) {
  // The Open Inference Protocol (/v2/... but /v2/rerank) answers in its own shapes
  // (server/oip/oip_rest.h).
  if (oip_ != nullptr && oip::OipRest::Owns(request.path))
    return oip_->Handle(request, method_label);
  const HttpRoute* route = FindRoute(request.path);
  if (route == nullptr) {
    return ErrorReply(
        absl::NotFoundError(absl::StrCat(
            "no route ", QuoteInput(request.path), "; this server answers ", HttpRouteSummary(),
            oip_ == nullptr
                ? ""
                : absl::StrCat("; the Open Inference Protocol's: ", oip::OipRouteSummary()))),
        "", "unknown_route");
  }
  *method_label = route->label;
  if (request.method != route->method) {
    HttpReply reply =
        ErrorReply(absl::UnimplementedError(absl::StrCat(route->path, " takes ", route->method,
                                                         ", not ", QuoteInput(request.method))),
                   "", "method_not_allowed", 405);
    reply.headers.push_back({"Allow", route->method});
    return reply;
  }
  const bool serving = serving_.load();
  if (std::string_view(route->label) == "Health") {
    if (serving && !draining_.load()) {
      return JsonReply(
          absl::StrCat("{\"status\":\"SERVING\",\"grpc_port\":", grpc_port_.load(), "}"));
    }
    return ErrorReply(absl::UnavailableError("NOT_SERVING: the model is loading or the server is "
                                             "shutting down"),
                      "", "not_serving");
  }
  if (api_key_.has_value()) {
    std::string_view header;
    if (request.authorization.has_value()) header = *request.authorization;
    absl::Status authorized =
        AuthorizationHeaderStatus(request.authorization.has_value() ? &header : nullptr, *api_key_,
                                  "this server (--api-key-file)");
    if (!authorized.ok()) return ErrorReply(authorized, "", "invalid_api_key");
  }
  if (!serving) {
    return ErrorReply(absl::UnavailableError("the server is not serving: the model is loading or "
                                             "the server is shutting down; retry shortly"),
                      "", "not_serving");
  }
  core::CallControl control;
  control.is_cancelled = request.client_gone;  // the client closed its connection
  control.deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(options_.request_timeout_s * 1e3));
  const std::string_view label = route->label;
  if (label == "Embeddings") return Embeddings(request, control);
  if (label == "Encode") {
    return EngineRoute<v1::EncodeRequest, v1::EncodeResponse>(request, control,
                                                              &core::ServingCore::Encode);
  }
  if (label == "AttentionMap") {
    return EngineRoute<v1::AttentionMapRequest, v1::AttentionMapResponse>(
        request, control, &core::ServingCore::AttentionMap);
  }
  if (label == "Explain") {
    return EngineRoute<v1::ExplainRequest, v1::ExplainResponse>(request, control,
                                                                &core::ServingCore::Explain);
  }
  if (label == "Classify") {
    return EngineRoute<v1::ClassifyRequest, v1::ClassifyResponse>(request, control,
                                                                  &core::ServingCore::Classify);
  }
  if (label == "Rerank") return Rerank(request, control);
  if (label == "Tokenize") {
    return DirectRoute<v1::TokenizeRequest, v1::TokenizeResponse>(request, control,
                                                                  &core::ServingCore::Tokenize);
  }
  return Models(request, control);
}

template <typename CoreRequest, typename CoreResponse>
absl::StatusOr<CoreResponse> HttpRoutes::Wait(
    void (core::ServingCore::*call)(const CoreRequest&, const core::CallControl&,
                                    core::ServingCore::Done<CoreResponse>),
    const CoreRequest& request, const core::CallControl& control) {
  absl::Notification done;
  absl::StatusOr<CoreResponse> result = absl::InternalError("no answer");
  (core_->*call)(request, control, [&](absl::StatusOr<CoreResponse> answer) {
    result = std::move(answer);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

namespace {

// A response message as JSON, after the same size check as gRPC's.
HttpReply MessageReply(const google::protobuf::Message& message, int64_t max_message_bytes) {
  if (absl::Status size = CheckResponseSize(message, max_message_bytes); !size.ok()) {
    return ErrorReply(size, "", "response_too_large");
  }
  std::string body;
  const auto status = google::protobuf::util::MessageToJsonString(message, &body);
  if (!status.ok()) {
    return ErrorReply(absl::InternalError(
        absl::StrCat("cannot write the response as JSON: ", status.message().as_string())));
  }
  return JsonReply(std::move(body));
}

}  // namespace

template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
HttpReply HttpRoutes::EngineRoute(
    const HttpRequest& http_request, const core::CallControl& control,
    void (core::ServingCore::*call)(const CoreRequest&, const core::CallControl&,
                                    core::ServingCore::Done<CoreResponse>)) {
  Request request;
  std::string param;
  if (absl::Status parsed = JsonToMessage(http_request.body, &request, &param); !parsed.ok()) {
    return ErrorReply(parsed, param);
  }
  const absl::StatusOr<CoreResponse> result = Wait(call, ToCore(request), control);
  if (!result.ok()) return ErrorReply(result.status());
  Response response;
  ToProto(*result, &response);
  return MessageReply(response, options_.max_message_bytes);
}

template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
HttpReply HttpRoutes::DirectRoute(const HttpRequest& http_request, const core::CallControl& control,
                                  absl::StatusOr<CoreResponse> (core::ServingCore::*call)(
                                      const CoreRequest&, const core::CallControl&)) {
  Request request;
  std::string param;
  if (absl::Status parsed = JsonToMessage(http_request.body, &request, &param); !parsed.ok()) {
    return ErrorReply(parsed, param);
  }
  const absl::StatusOr<CoreResponse> result = (core_->*call)(ToCore(request), control);
  if (!result.ok()) return ErrorReply(result.status());
  Response response;
  ToProto(*result, &response);
  return MessageReply(response, options_.max_message_bytes);
}

HttpReply HttpRoutes::Embeddings(const HttpRequest& http_request,
                                 const core::CallControl& control) {
  EmbeddingsRequest request;
  std::string param;
  LongTextMode long_text = LongTextMode::kRefuse;
  ParseLongTextMode(options_.openai_long_text, &long_text);  // validated by OptionsFromFlags
  if (absl::Status parsed = ParseEmbeddingsRequest(http_request.body, &request, &param, long_text);
      !parsed.ok()) {
    return ErrorReply(parsed, param);
  }
  // The model by its name ("all-MiniLM-L6-v2", or "sentence-transformers/all-MiniLM-L6-v2");
  // none = the default model.
  const absl::StatusOr<const ServedModel*> served =
      core_->models().Find(request.model.value_or(""));
  if (!served.ok()) return ErrorReply(served.status(), "model", "model_not_found");
  request.encode.model = (*served)->name;
  const absl::StatusOr<core::EncodeResponse> result =
      Wait(&core::ServingCore::Encode, request.encode, control);
  if (!result.ok()) {
    const EmbeddingsError error = ToEmbeddingsError(result.status(), request.single_input);
    return ErrorReply(error.status, error.param, error.code);
  }
  return JsonReply(EmbeddingsResponseJson(*result, (*served)->name, request.base64));
}

HttpReply HttpRoutes::Rerank(const HttpRequest& request, const core::CallControl& control) {
  // Cohere's and Jina's shape beside ours (cohere_rerank.h says how they share /v1/rerank).
  json body;
  const absl::Status parsed =
      JsonNestsDeeperThan(request.body)
          ? absl::InvalidArgumentError("the request body nests deeper than 64 levels")
          : ParseJsonBody(request.body,
                          "a JSON object {\"query\": \"...\", \"documents\": [\"...\"]}", &body);
  if (request.path != "/v1/rerank" || (parsed.ok() && IsCohereRerank(body))) {
    if (!parsed.ok()) return ErrorReply(parsed);
    return CohereRerank(body, control);
  }
  return EngineRoute<v1::RerankRequest, v1::RerankResponse>(request, control,
                                                            &core::ServingCore::Rerank);
}

HttpReply HttpRoutes::CohereRerank(const json& body, const core::CallControl& control) {
  std::string param;
  absl::StatusOr<core::RerankRequest> request = ParseCohereRerank(body, &param);
  if (!request.ok()) return ErrorReply(request.status(), param);
  const absl::StatusOr<const ServedModel*> served = core_->models().Find(request->model);
  if (!served.ok()) return ErrorReply(served.status(), "model", "model_not_found");
  request->model = (*served)->name;
  const absl::StatusOr<core::RerankResponse> result =
      Wait(&core::ServingCore::Rerank, *request, control);
  if (!result.ok()) return ErrorReply(InCohereTerms(result.status()), "documents");
  return JsonReply(CohereRerankJson(*result, (*served)->name, *request));
}

HttpReply HttpRoutes::Models(const HttpRequest& request, const core::CallControl& control) {
  const std::string prefix = "/v1/models/";
  std::string wanted;  // "" = the list
  if (absl::StartsWith(request.path, prefix)) {
    wanted = request.path.substr(prefix.size());
    if (absl::StatusOr<const ServedModel*> served = core_->models().Find(wanted); !served.ok()) {
      return ErrorReply(served.status(), "model", "model_not_found");
    } else {
      wanted = (*served)->name;
    }
  }
  const absl::StatusOr<std::vector<core::ModelInfo>> infos = core_->ListModels(control);
  if (!infos.ok()) return ErrorReply(infos.status());
  json data = json::array();
  for (const core::ModelInfo& info : *infos) {
    if (!wanted.empty() && info.name != wanted) continue;
    v1::ModelInfo proto;
    ToProto(info, &proto);
    std::string info_json;
    if (!google::protobuf::util::MessageToJsonString(proto, &info_json).ok()) {
      return ErrorReply(absl::InternalError("cannot write the model info as JSON"));
    }
    // OpenAI's model object; "info" is GetModelInfo's answer in protobuf's JSON mapping.
    data.push_back({{"id", info.name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "attnserve"},
                    {"info", json::parse(info_json)}});
  }
  if (!wanted.empty()) return JsonReply(data.at(0).dump());
  return JsonReply(json{{"object", "list"}, {"data", data}}.dump());
}

}  // namespace attn::server::http
