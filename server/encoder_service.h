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
#include "server/request_prep.h"

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
  template <typename Request, typename Plan>
  using PrepareFn = absl::StatusOr<Plan> (*)(const Model&, const Request&, const RequestLimits&);
  template <typename Plan, typename Response>
  using BuildFn = void (*)(const Model&, const Plan&, const JobOutput&, Response*);

  // The shared path of Encode and AttentionMap: size and version checks, `prepare` (validate +
  // tokenize), submit to the batcher, then `build` the results when the batch is done.
  template <typename Request, typename Response, typename Plan>
  grpc::ServerUnaryReactor* RunEngineCall(const char* method, grpc::CallbackServerContext* context,
                                          const Request* request, Response* response,
                                          PrepareFn<Request, Plan> prepare,
                                          BuildFn<Plan, Response> build);

  const ServerOptions options_;
  ModelRegistry* const registry_;
  Batcher* const batcher_;
  Metrics* const metrics_;
};

}  // namespace attn::server
