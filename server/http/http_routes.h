// The HTTP/JSON front end's routes: a second thin adapter over the serving core, beside the gRPC
// services. Each route turns its JSON into the core's request struct (OpenAI's shape for
// /v1/embeddings, protobuf's JSON mapping of attnserve.v1 messages for the others), calls the
// same core call as gRPC and writes the answer back as JSON. Validation, batching, limits and
// deadlines are the core's; statuses map to HTTP in server/status_map.cc; every error is
// OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.
//
// The routes are listed once, in HttpRouteTable(): dispatch, the "no route" message and
// attnserve --help all read it. /v1/rerank also takes Cohere's shape, /v2/rerank and /rerank
// Cohere's/Jina's (cohere_rerank.h); the rest of /v2/... is the Open Inference Protocol's
// (server/oip/oip_rest.h, its own route table).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "server/core/serving_core.h"
#include "server/http/http_server.h"
#include "server/metrics.h"

namespace attn::server::oip {
class OipRest;
}  // namespace attn::server::oip

namespace attn::server::http {

// One route: `path` is exact, except that "NAME" at its end stands for any name.
struct HttpRoute {
  const char* method;  // "GET" or "POST"
  const char* path;
  const char* label;  // the metrics' method label
  const char* what;   // for --help
};
// Every route the HTTP front end answers, in the order --help lists them.
const std::vector<HttpRoute>& HttpRouteTable();
// "POST /v1/embeddings, /v1/encode, ..., GET /v1/models, ...": the table in one line.
std::string HttpRouteSummary();

struct HttpRoutesOptions {
  std::string model_name;         // the `model` clients name (--model-name)
  double request_timeout_s = 60;  // deadline of each call (--http-request-timeout-s)
  int64_t max_message_bytes = 0;  // request body and response limit (--max-message-bytes)
  // /v1/embeddings with an over-long input the request says nothing about (--openai-long-text).
  std::string openai_long_text = "refuse";
};

class HttpRoutes {
 public:
  // `api_key`: the bearer token every route but /health needs (nullopt = none).
  HttpRoutes(HttpRoutesOptions options, core::ServingCore* core, std::optional<std::string> api_key,
             Metrics* metrics);

  // Health: false until the model is loaded and again once draining starts.
  void SetServing(bool serving) { serving_.store(serving); }
  // Lame duck (--shutdown-delay-s): /health answers 503 while the routes still serve.
  void SetDraining(bool draining) { draining_.store(draining); }
  // The gRPC port, which /health names: a gRPC client pointed at this port by mistake (attnctl
  // --server HOST:HTTP_PORT) learns where to go.
  void SetGrpcPort(int port) { grpc_port_.store(port); }
  // The Open Inference Protocol's REST routes (server/oip/oip_rest.h): every path under /v2 goes
  // to it. Set before the listener starts.
  void SetOipRoutes(const oip::OipRest* oip) { oip_ = oip; }

  HttpReply Handle(const HttpRequest& request);
  // 413 for a body of `bytes` bytes over the limit (the listener refuses it unread).
  HttpReply TooLarge(int64_t bytes);
  // A request the listener refused itself (its status and reason).
  HttpReply Refused(int http_status, const std::string& why);

 private:
  using Clock = std::chrono::steady_clock;

  HttpReply Dispatch(const HttpRequest& request, const char** method_label);
  HttpReply Embeddings(const HttpRequest& request, const core::CallControl& control);
  HttpReply Models(const HttpRequest& request, const core::CallControl& control);
  // Rerank in Cohere's/Jina's shape (cohere_rerank.h); `body` parsed (discarded = not JSON).
  // /v1/rerank (attnserve's RerankRequest or Cohere's shape), /v2/rerank and /rerank (Cohere's).
  HttpReply Rerank(const HttpRequest& request, const core::CallControl& control);
  HttpReply CohereRerank(const nlohmann::json& body, const core::CallControl& control);
  template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
  HttpReply EngineRoute(const HttpRequest& request, const core::CallControl& control,
                        void (core::ServingCore::*call)(const CoreRequest&,
                                                        const core::CallControl&,
                                                        core::ServingCore::Done<CoreResponse>));
  template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
  HttpReply DirectRoute(const HttpRequest& request, const core::CallControl& control,
                        absl::StatusOr<CoreResponse> (core::ServingCore::*call)(
                            const CoreRequest&, const core::CallControl&));
  // Runs an engine call of the core and waits for its answer (the worker thread blocks; the
  // core answers on the batcher thread).
  template <typename CoreRequest, typename CoreResponse>
  absl::StatusOr<CoreResponse> Wait(
      void (core::ServingCore::*call)(const CoreRequest&, const core::CallControl&,
                                      core::ServingCore::Done<CoreResponse>),
      const CoreRequest& request, const core::CallControl& control);

  const HttpRoutesOptions options_;
  core::ServingCore* const core_;
  const std::optional<std::string> api_key_;
  Metrics* const metrics_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> grpc_port_{0};
  const oip::OipRest* oip_ = nullptr;
};

// An OpenAI-shaped error reply for `status` (server/status_map.cc picks the HTTP status and the
// type); `http_status` overrides the status (405, 413), `param` and `code` fill those fields
// (empty = null).
HttpReply ErrorReply(const absl::Status& status, std::string_view param = {},
                     std::string_view code = {}, int http_status = 0);

}  // namespace attn::server::http
