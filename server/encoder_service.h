// attnserve.v1.Encoder over the gRPC callback API: validate + tokenize on the gRPC thread, hand
// the engine work to the batcher, build the response when the batch is done.
#pragma once

#include <atomic>
#include <memory>

#include "attnserve/v1/encoder.grpc.pb.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/options.h"

namespace attn::server {

class EncoderService final : public attnserve::v1::Encoder::CallbackService {
 public:
  EncoderService(const ServerOptions& options, ModelRegistry* registry, Batcher* batcher,
                 Metrics* metrics);

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const attnserve::v1::EncodeRequest* request,
                                   attnserve::v1::EncodeResponse* response) override;
  grpc::ServerUnaryReactor* AttentionMap(grpc::CallbackServerContext* context,
                                         const attnserve::v1::AttentionMapRequest* request,
                                         attnserve::v1::AttentionMapResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const attnserve::v1::TokenizeRequest* request,
                                     attnserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const attnserve::v1::GetModelInfoRequest* request,
                                         attnserve::v1::ModelInfo* response) override;

 private:
  const ServerOptions options_;
  ModelRegistry* const registry_;
  Batcher* const batcher_;
  Metrics* const metrics_;
};

}  // namespace attn::server
