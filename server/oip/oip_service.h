// inference.GRPCInferenceService (the Open Inference Protocol over gRPC, proto/inference/): a
// thin front end over the serving core beside attnserve.v1.Encoder, on the same port, with the
// same raw-bytes plumbing (raw_method.h: size limit, API key, metrics, drops) and the same
// status mapping (status_map.h). Each method turns its message into the transport-free OIP
// structs (infer_call.h, oip_metadata.h) and back.
//
//   ServerLive, ServerReady        no API key needed (probes); Ready follows the health service
//   ModelReady                     the model and version exist and the server serves
//   ServerMetadata, ModelMetadata, ModelConfig
//   ModelInfer                     Encode (and AttentionMap for ATTENTION) through the core
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "inference/grpc_service.grpc.pb.h"
#include "server/core/serving_core.h"
#include "server/metrics.h"
#include "server/oip/infer_call.h"
#include "server/raw_method.h"

namespace attn::server::oip {

struct OipOptions {
  int64_t max_message_bytes = 0;         // --max-message-bytes
  int64_t max_request_memory_bytes = 0;  // --max-request-memory-bytes
  std::string server_version;            // the release ServerMetadata names
};

class OipService final : public inference::GRPCInferenceService::CallbackService {
 public:
  OipService(core::ServingCore* core, MemoryBudget* memory_budget, OipOptions options,
             Metrics* metrics, std::optional<std::string> api_key = std::nullopt);

  // ServerReady/ModelReady: false until the models are loaded and again once draining starts.
  void SetServing(bool serving) { serving_.store(serving); }
  // Lame duck (--shutdown-delay-s): not ready for new clients while calls are still answered.
  void SetDraining(bool draining) { draining_.store(draining); }

 private:
  void ServeServerLive(int index);
  void ServeServerReady(int index);
  void ServeModelReady(int index);
  void ServeServerMetadata(int index);
  void ServeModelMetadata(int index);
  void ServeModelConfig(int index);
  void ServeModelInfer(int index);

  core::ServingCore* const core_;
  const OipOptions options_;
  Metrics* const metrics_;
  const Inferrer inferrer_;
  RawMethods::Precheck authorize_;  // empty without an API key
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
};

// The gRPC request as the transport-free InferRequest (views into `request`, which must outlive
// it); INVALID_ARGUMENT when raw_input_contents and the inputs do not pair up.
absl::StatusOr<InferRequest> FromProto(const inference::ModelInferRequest& request);

}  // namespace attn::server::oip
