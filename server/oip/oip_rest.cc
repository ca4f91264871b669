#include "server/oip/oip_rest.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "engine/json_depth.h"
#include "engine/quote.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "server/oip/oip_metadata.h"
#include "server/status_map.h"

namespace attn::server::oip {

using http::HttpReply;
using http::HttpRequest;
using nlohmann::json;

const std::vector<OipRoute>& OipRouteTable() {
  static const auto* routes = new std::vector<OipRoute>{
      {"GET", "/v2", "ServerMetadata", "Open Inference Protocol: server metadata"},
      {"GET", "/v2/health/live", "ServerLive", "OIP: 200 once listening; no key needed"},
      {"GET", "/v2/health/ready", "ServerReady", "OIP: 200 while SERVING, else 503; no key"},
      {"GET", "/v2/models/NAME[/versions/V]", "ModelMetadata", "OIP: a model's tensors"},
      {"GET", "/v2/models/NAME[/versions/V]/ready", "ModelReady", "OIP: 200 when it can infer"},
      {"GET", "/v2/models/NAME[/versions/V]/config", "ModelConfig", "OIP: Triton's model config"},
      {"POST", "/v2/models/NAME[/versions/V]/infer", "ModelInfer",
       "OIP: TEXT or INPUT_IDS in, EMBEDDING (and more) out"},
  };
  return *routes;
}

std::string OipRouteSummary() {
  std::string list;
  for (const OipRoute& route : OipRouteTable()) {
    absl::StrAppend(&list, list.empty() ? "" : ", ", route.method, " ", route.path);
  }
  return list;
}

HttpReply OipErrorReply(const absl::Status& status, int http_status) {
  HttpReply reply;
  reply.status = http_status != 0 ? http_status : ToHttpStatus(status).code;
  reply.code_name = GrpcCodeName(static_cast<grpc::StatusCode>(status.code()));
  reply.body = json{{"error", std::string(status.message())}}.dump(-1, ' ', false,
                                                                   json::error_handler_t::replace);
  if (reply.status == 401) reply.headers.push_back({"WWW-Authenticate", "Bearer"});
  return reply;
}

namespace {

HttpReply JsonReply(const json& body) {
  HttpReply reply;
  reply.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return reply;
}

// "%2F" -> "/" in a path segment; false on a malformed escape.
bool PercentDecode(absl::string_view in, std::string* out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    int value = 0;
    if (i + 2 >= in.size()) return false;
    if (!absl::SimpleHexAtoi(in.substr(i + 1, 2), &value)) return false;
    out->push_back(static_cast<char>(value));
    i += 2;
  }
  return true;
}

// A /v2/models/... path split into its model, version and action ("", "ready", "config",
// "infer"). The name may hold '/' ("sentence-transformers/all-MiniLM-L6-v2").
struct ModelPath {
  std::string model, version, action;
};

absl::StatusOr<ModelPath> ParseModelPath(absl::string_view path) {
  absl::ConsumePrefix(&path, "/v2/models/");
  ModelPath parsed;
  for (const char* action : {"ready", "config", "infer"}) {
    if (absl::ConsumeSuffix(&path, absl::StrCat("/", action))) {
      parsed.action = action;
      break;
    }
  }
  absl::string_view version;
  if (const size_t at = path.rfind("/versions/"); at != absl::string_view::npos) {
    version = path.substr(at + 10);
    path = path.substr(0, at);
  }
  if (path.empty() || !PercentDecode(path, &parsed.model) ||
      !PercentDecode(version, &parsed.version)) {
    return absl::NotFoundError(absl::StrCat("no model in the path ", QuoteInput(std::string(path)),
                                            "; the routes are /v2/models/NAME"
                                            "[/versions/V][/ready|/config|/infer]"));
  }
  return parsed;
}

core::CallControl ControlOf(const HttpRequest& request, double timeout_s) {
  core::CallControl control;
  control.is_cancelled = request.client_gone;
  control.deadline = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  return control;
}

json SignatureJson(const ModelDescription& model) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& [specs, out] : {std::pair{&model.signature.inputs, &inputs},
                                   std::pair{&model.signature.outputs, &outputs}}) {
    for (const TensorSpec& spec : *specs) {
      out->push_back({{"name", spec.name}, {"datatype", spec.datatype}, {"shape", spec.shape}});
    }
  }
  return {{"name", model.name},
          {"versions", model.versions},
          {"platform", kPlatform},
          {"inputs", inputs},
          {"outputs", outputs}};
}

json ConfigJson(const ModelDescription& model) {
  json inputs = json::array(), outputs = json::array(), parameters = json::object();
  for (const TensorSpec& spec : model.signature.inputs) {
    inputs.push_back({{"name", spec.name},
                      {"data_type", ConfigDataType(spec.datatype)},
                      {"dims", spec.shape},
                      {"optional", spec.optional}});
  }
  for (const TensorSpec& spec : model.signature.outputs) {
    outputs.push_back(
        {{"name", spec.name}, {"data_type", ConfigDataType(spec.datatype)}, {"dims", spec.shape}});
  }
  for (const auto& [key, value] : ConfigParameters(model)) {
    parameters[key] = {{"string_value", value}};
  }
  return {{"name", model.name},      {"platform", kPlatform}, {"backend", kPlatform},
          {"max_batch_size", 0},     {"input", inputs},       {"output", outputs},
          {"parameters", parameters}};
}

}  // namespace

OipRest::OipRest(core::ServingCore* core, MemoryBudget* memory_budget, OipOptions options,
                 double request_timeout_s, std::optional<std::string> api_key)
    : core_(core),
      options_(std::move(options)),
      request_timeout_s_(request_timeout_s),
      api_key_(std::move(api_key)),
      inferrer_(core, memory_budget,
                {options_.max_message_bytes, options_.max_request_memory_bytes}) {}

bool OipRest::Owns(std::string_view path) {
  // /v2/rerank is Cohere's v2 rerank (server/http/cohere_rerank.h), not the protocol's.
  return (path == "/v2" || path == "/v2/" || path.substr(0, 4) == "/v2/") && path != "/v2/rerank";
}

namespace {

// The table's route for `path` (nullptr: none), and for model routes the parsed path.
const OipRoute* FindRoute(absl::string_view path, absl::StatusOr<ModelPath>* model) {
  if (path == "/v2/") path = "/v2";
  const bool models = absl::StartsWith(path, "/v2/models/");
  if (models) *model = ParseModelPath(path);
  for (const OipRoute& route : OipRouteTable()) {
    const absl::string_view pattern = route.path;
    const size_t name = pattern.find("NAME[/versions/V]");
    if (name == absl::string_view::npos) {
      if (path == pattern) return &route;
      continue;
    }
    // "/v2/models/NAME[/versions/V]/ready": the action is what follows the version.
    absl::string_view action = pattern.substr(name + std::strlen("NAME[/versions/V]"));
    absl::ConsumePrefix(&action, "/");
    if (models && (!model->ok() || (*model)->action == action)) return &route;
  }
  return nullptr;
}

}  // namespace

HttpReply OipRest::Handle(const HttpRequest& request, const char** label) const {
  absl::StatusOr<ModelPath> model = ModelPath{};
  const OipRoute* route = FindRoute(request.path, &model);
  if (route == nullptr) {
    *label = "unknown";
    return OipErrorReply(absl::NotFoundError(
        absl::StrCat("no route ", QuoteInput(request.path),
                     " under /v2; the Open Inference Protocol's are ", OipRouteSummary())));
  }
  *label = route->label;
  if (request.method != route->method) {
    HttpReply reply = OipErrorReply(
        absl::UnimplementedError(absl::StrCat(QuoteInput(request.path), " takes ", route->method,
                                              ", not ", QuoteInput(request.method))),
        405);
    reply.headers.push_back({"Allow", route->method});
    return reply;
  }
  const absl::string_view name = route->label;
  const bool serving = serving_.load();
  if (name == "ServerLive" || name == "ServerReady") {  // probes: no key
    const bool live = name == "ServerLive";
    if (live || (serving && !draining_.load())) return JsonReply({{live ? "live" : "ready", true}});
    return OipErrorReply(
        absl::UnavailableError("not ready: the model is loading or the server is shutting down"));
  }
  if (api_key_.has_value()) {
    std::string_view header;
    if (request.authorization.has_value()) header = *request.authorization;
    absl::Status authorized =
        AuthorizationHeaderStatus(request.authorization.has_value() ? &header : nullptr, *api_key_,
                                  "this server (--api-key-file)");
    if (!authorized.ok()) return OipErrorReply(authorized);
  }
  if (!model.ok()) return OipErrorReply(model.status());
  const core::CallControl control = ControlOf(request, request_timeout_s_);
  if (name == "ServerMetadata") {
    const ServerDescription server = DescribeServer(options_.server_version);
    return JsonReply(
        {{"name", server.name}, {"version", server.version}, {"extensions", server.extensions}});
  }
  if (name == "ModelInfer") {
    if (!serving) {
      return OipErrorReply(absl::UnavailableError(
          "the server is not serving: the model is loading or the server is shutting down; "
          "retry shortly"));
    }
    return Infer(request, model->model, model->version, control);
  }
  absl::StatusOr<ModelDescription> described =
      DescribeModel(core_, model->model, model->version, control);
  if (!described.ok()) return OipErrorReply(described.status());
  if (name == "ModelReady") {
    if (serving && !draining_.load())
      return JsonReply({{"name", described->name}, {"ready", true}});
    return OipErrorReply(absl::UnavailableError("not ready: the server is not serving"));
  }
  return JsonReply(name == "ModelConfig" ? ConfigJson(*described) : SignatureJson(*described));
}

}  // namespace attn::server::oip
