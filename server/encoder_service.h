// attnserve.v1.Encoder over the gRPC callback API: each method converts its request to the
// serving core's struct (proto_convert.h), calls the core (server/core/serving_core.h) and
// converts the response back. Methods are served from raw bytes (raw_method.h).
#pragma once

#include "attnserve/v1/encoder.grpc.pb.h"
#include "server/core/serving_core.h"
#include "server/metrics.h"

namespace attn::server {

class EncoderService final : public attnserve::v1::Encoder::CallbackService {
 public:
  // `max_message_bytes`: the largest request and response (--max-message-bytes).
  EncoderService(core::ServingCore* core, int64_t max_message_bytes, Metrics* metrics);

 private:
  // Encode and AttentionMap: the core answers on the batcher thread.
  template <typename CoreRequest, typename CoreResponse>
  using EngineCall = void (core::ServingCore::*)(const CoreRequest&, const core::CallControl&,
                                                 core::ServingCore::Done<CoreResponse>);
  template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
  void ServeEngineCall(int index, const char* method, EngineCall<CoreRequest, CoreResponse> call);

  core::ServingCore* const core_;
  const int64_t max_message_bytes_;
  Metrics* const metrics_;
};

}  // namespace attn::server
