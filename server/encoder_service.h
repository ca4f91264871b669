// attnserve.v1.Encoder over the gRPC callback API: each method converts its request to the
// serving core's struct (proto_convert.h), calls the core (server/core/serving_core.h) and
// converts the response back. Methods are served from raw bytes (raw_method.h).
#pragma once

#include <optional>
#include <string>

#include "attnserve/v1/encoder.grpc.pb.h"
#include "server/core/serving_core.h"
#include "server/metrics.h"
#include "server/raw_method.h"

namespace attn::server {

class EncoderService final : public attnserve::v1::Encoder::CallbackService {
 public:
  // `max_message_bytes`: the largest request and response (--max-message-bytes). `api_key`: the
  // bearer token every call needs (--api-key-file; nullopt = none).
  EncoderService(core::ServingCore* core, int64_t max_message_bytes, Metrics* metrics,
                 std::optional<std::string> api_key = std::nullopt);

 private:
  // Encode, AttentionMap, Explain, Classify and Rerank: the core answers on the batcher thread.
  template <typename CoreRequest, typename CoreResponse>
  using EngineCall = void (core::ServingCore::*)(const CoreRequest&, const core::CallControl&,
                                                 core::ServingCore::Done<CoreResponse>);
  template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
  void ServeEngineCall(int index, const char* method, EngineCall<CoreRequest, CoreResponse> call);

  core::ServingCore* const core_;
  const int64_t max_message_bytes_;
  Metrics* const metrics_;
  RawMethods::Precheck authorize_;  // empty without an API key
};

}  // namespace attn::server
