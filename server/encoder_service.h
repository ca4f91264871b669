// attnserve.v1.Encoder over the gRPC callback API: validate + tokenize on the gRPC thread, hand
// the engine work to the batcher, build the response when the batch is done.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "attnserve/v1/encoder.grpc.pb.h"
#include "server/batcher.h"
#include "server/cost_model.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/options.h"
#include "server/request_prep.h"

namespace attn::server {

class EncoderService final : public attnserve::v1::Encoder::CallbackService {
 public:
  // Registers every method as a raw-bytes handler (see ServeParsed).
  EncoderService(const ServerOptions& options, ModelRegistry* registry, Batcher* batcher,
                 MemoryBudget* memory_budget, Metrics* metrics);

 private:
  // Writes the typed response into the bytes gRPC sends; runs just before an OK finish.
  using SerializeFn = std::function<grpc::Status()>;
  template <typename Request, typename Response>
  using Handler = grpc::ServerUnaryReactor* (EncoderService::*)(grpc::CallbackServerContext*,
                                                                const Request*, Response*,
                                                                SerializeFn);
  template <typename Request, typename Plan>
  using PrepareFn = absl::StatusOr<Plan> (*)(const Model&, const Request&, const RequestLimits&);
  template <typename Plan, typename Response>
  using BuildFn = void (*)(const Model&, const Plan&, const JobOutput&, Response*);

  // Serves the method called `method` from raw bytes: checks the size, parses the request
  // itself and calls `handler`. gRPC's generated handler answers a request it cannot decode
  // (invalid UTF-8 in a string, malformed bytes) with a bare UNIMPLEMENTED and no metrics; this
  // answers INVALID_ARGUMENT naming the field and the problem, and counts the call.
  template <typename Request, typename Response>
  void ServeParsed(const char* method, Handler<Request, Response> handler);

  grpc::ServerUnaryReactor* HandleEncode(grpc::CallbackServerContext* context,
                                         const attnserve::v1::EncodeRequest* request,
                                         attnserve::v1::EncodeResponse* response,
                                         SerializeFn serialize);
  grpc::ServerUnaryReactor* HandleAttentionMap(grpc::CallbackServerContext* context,
                                               const attnserve::v1::AttentionMapRequest* request,
                                               attnserve::v1::AttentionMapResponse* response,
                                               SerializeFn serialize);
  grpc::ServerUnaryReactor* HandleTokenize(grpc::CallbackServerContext* context,
                                           const attnserve::v1::TokenizeRequest* request,
                                           attnserve::v1::TokenizeResponse* response,
                                           SerializeFn serialize);
  grpc::ServerUnaryReactor* HandleGetModelInfo(grpc::CallbackServerContext* context,
                                               const attnserve::v1::GetModelInfoRequest* request,
                                               attnserve::v1::ModelInfo* response,
                                               SerializeFn serialize);

  // The shared path of Encode and AttentionMap: version check, `prepare` (validate +
  // tokenize), submit to the batcher, then `build` the results when the batch is done.
  template <typename Request, typename Response, typename Plan>
  grpc::ServerUnaryReactor* RunEngineCall(const char* method, grpc::CallbackServerContext* context,
                                          const Request* request, Response* response,
                                          SerializeFn serialize, PrepareFn<Request, Plan> prepare,
                                          BuildFn<Plan, Response> build);

  const ServerOptions options_;
  ModelRegistry* const registry_;
  Batcher* const batcher_;
  MemoryBudget* const memory_budget_;
  Metrics* const metrics_;
};

}  // namespace attn::server
