// The serving core: one entry point per call of the public API, free of any transport. Each
// call looks up the model version, validates and tokenizes its inputs once (errors name the
// input index and the limit), hands the engine work to the batcher and post-processes each
// sequence (results.h). Front ends (the gRPC services) translate their messages to the structs
// in calls.h, call here, and translate the response back; statuses are absl::Status.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "server/core/batcher.h"
#include "server/core/calls.h"
#include "server/core/model_registry.h"
#include "server/core/request_plan.h"
#include "server/core/serving_metrics.h"

namespace attn::server::core {

class ServingCore {
 public:
  template <typename Response>
  using Done = std::function<void(absl::StatusOr<Response>)>;

  ServingCore(RequestLimits limits, ModelRegistry* registry, Batcher* batcher,
              ServingMetrics* metrics);

  // Engine calls. `done` is called exactly once: on the calling thread if the call fails before
  // it reaches the batcher, else on the batcher thread once the batch carrying it is done.
  // The request is read only before Encode/AttentionMap return.
  void Encode(const EncodeRequest& request, const CallControl& control, Done<EncodeResponse> done);
  void AttentionMap(const AttentionRequest& request, const CallControl& control,
                    Done<AttentionResponse> done);

  // Calls answered on the calling thread.
  absl::StatusOr<TokenizeResponse> Tokenize(const TokenizeRequest& request,
                                            const CallControl& control);
  absl::StatusOr<ModelInfo> GetModelInfo(const ModelInfoRequest& request);

 private:
  const RequestLimits limits_;
  ModelRegistry* const registry_;
  Batcher* const batcher_;
  ServingMetrics* const metrics_;
};

}  // namespace attn::server::core
