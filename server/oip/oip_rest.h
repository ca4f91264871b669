// The Open Inference Protocol over HTTP (REST, under /v2): a front end beside the HTTP/JSON
// routes on the same port (the HTTP listener hands it every path under /v2). Same core calls as
// the gRPC service (infer_call.h, oip_metadata.h), same API key, same status mapping
// (status_map.h's HTTP statuses); errors are the protocol's {"error": "<message>"}.
//
// ModelInfer reads the protocol's JSON tensors ("data": nested or flat lists) and Triton's
// binary tensor extension (what tritonclient sends by default): the JSON header's length in
// the Inference-Header-Content-Length header, each input's raw bytes after it in order, sized
// by its "binary_data_size" parameter; outputs come back raw the same way when asked
// ("binary_data": true per output, or "binary_data_output": true for the request).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "server/core/serving_core.h"
#include "server/http/http_server.h"
#include "server/oip/infer_call.h"
#include "server/oip/oip_service.h"

namespace attn::server::oip {

// One REST route; "NAME" stands for a model name and "[/versions/V]" for an optional version.
struct OipRoute {
  const char* method;
  const char* path;
  const char* label;  // the metrics' method label (the gRPC method's name)
  const char* what;   // for --help
};
// Every route, in the order --help lists them.
const std::vector<OipRoute>& OipRouteTable();
// "GET /v2, GET /v2/health/live, ...": the table in one line (the "no route" messages).
std::string OipRouteSummary();

class OipRest {
 public:
  // `request_timeout_s`: the deadline of each call (--http-request-timeout-s).
  OipRest(core::ServingCore* core, MemoryBudget* memory_budget, OipOptions options,
          double request_timeout_s, std::optional<std::string> api_key);

  void SetServing(bool serving) { serving_.store(serving); }
  // Lame duck (--shutdown-delay-s): not ready for new clients while calls are still answered.
  void SetDraining(bool draining) { draining_.store(draining); }

  // Whether `path` is this front end's (/v2 and everything below it).
  static bool Owns(std::string_view path);
  // Answers a request for one of its paths; `*label` gets the metrics' method label.
  http::HttpReply Handle(const http::HttpRequest& request, const char** label) const;

 private:
  http::HttpReply Infer(const http::HttpRequest& request, std::string_view model,
                        std::string_view version, const core::CallControl& control) const;

  core::ServingCore* const core_;
  const OipOptions options_;
  const double request_timeout_s_;
  const std::optional<std::string> api_key_;
  const Inferrer inferrer_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
};

// The protocol's error reply: {"error": message}, the status from status_map.h.
http::HttpReply OipErrorReply(const absl::Status& status, int http_status = 0);

}  // namespace attn::server::oip
