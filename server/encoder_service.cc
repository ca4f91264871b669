#include "server/encoder_service.h"

#include <chrono>
#include <memory>
#include <optional>
#include <type_traits>

#include "server/auth.h"
#include "server/proto_convert.h"
#include "server/raw_method.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

// Finishes `call` with the core's answer converted to `Proto`.
template <typename Proto, typename Response>
void Reply(UnaryCall& call, const absl::StatusOr<Response>& result, int64_t max_message_bytes) {
  if (!result.ok()) {
    call.Finish(result.status());
    return;
  }
  Proto response;
  ToProto(*result, &response);
  if constexpr (std::is_same_v<Response, core::EncodeResponse> ||
                std::is_same_v<Response, core::AttentionResponse> ||
                std::is_same_v<Response, core::ExplainResponse> ||
                std::is_same_v<Response, core::ClassifyResponse> ||
                std::is_same_v<Response, core::RerankResponse>) {
    call.Hold(result->admission);  // the memory is in use until the bytes are written
  }
  call.Finish(CheckResponseSize(response, max_message_bytes), response);
}

}  // namespace

template <typename Request, typename Response, typename CoreRequest, typename CoreResponse>
void EncoderService::ServeEngineCall(int index, const char* method,
                                     EngineCall<CoreRequest, CoreResponse> call) {
  const int64_t max_bytes = max_message_bytes_;
  MarkMethodRawCallback(
      index,
      RawMethods::Unary<Request>(
          method, metrics_, max_bytes, authorize_,
          [core = core_, call, max_bytes](std::shared_ptr<UnaryCall> unary,
                                          grpc::CallbackServerContext* context, Request request) {
            const core::CallControl control = unary->Control();
            (core->*call)(ToCore(request), control,
                          [unary, max_bytes](absl::StatusOr<CoreResponse> result) {
                            Reply<Response>(*unary, result, max_bytes);
                          });
          },
          /*answer_dropped=*/true));
}

EncoderService::EncoderService(core::ServingCore* core, int64_t max_message_bytes, Metrics* metrics,
                               std::optional<std::string> api_key)
    : core_(core), max_message_bytes_(max_message_bytes), metrics_(metrics) {
  if (api_key.has_value()) {
    authorize_ = [key = std::move(*api_key)](const grpc::CallbackServerContext& context) {
      return BearerTokenStatus(context, key, "the Encoder service (--api-key-file)");
    };
  }
  const google::protobuf::FileDescriptor& file = *v1::EncodeRequest::descriptor()->file();
  auto index = [&file](const char* method) { return MethodIndex(file, "Encoder", method); };
  const int64_t max_bytes = max_message_bytes_;

  ServeEngineCall<v1::EncodeRequest, v1::EncodeResponse>(index("Encode"), "Encode",
                                                         &core::ServingCore::Encode);
  ServeEngineCall<v1::AttentionMapRequest, v1::AttentionMapResponse>(
      index("AttentionMap"), "AttentionMap", &core::ServingCore::AttentionMap);
  ServeEngineCall<v1::ExplainRequest, v1::ExplainResponse>(index("Explain"), "Explain",
                                                           &core::ServingCore::Explain);
  ServeEngineCall<v1::ClassifyRequest, v1::ClassifyResponse>(index("Classify"), "Classify",
                                                             &core::ServingCore::Classify);
  ServeEngineCall<v1::RerankRequest, v1::RerankResponse>(index("Rerank"), "Rerank",
                                                         &core::ServingCore::Rerank);
  MarkMethodRawCallback(
      index("Tokenize"),
      RawMethods::Unary<v1::TokenizeRequest>(
          "Tokenize", metrics_, max_bytes, authorize_,
          [this, max_bytes](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext* context,
                            v1::TokenizeRequest request) {
            Reply<v1::TokenizeResponse>(*call, core_->Tokenize(ToCore(request), call->Control()),
                                        max_bytes);
          },
          /*answer_dropped=*/true));
  MarkMethodRawCallback(
      index("GetModelInfo"),
      RawMethods::Unary<v1::GetModelInfoRequest>(
          "GetModelInfo", metrics_, max_bytes, authorize_,
          [this, max_bytes](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                            v1::GetModelInfoRequest request) {
            Reply<v1::ModelInfo>(*call, core_->GetModelInfo(ToCore(request), call->Control()),
                                 max_bytes);
          },
          /*answer_dropped=*/true));
  MarkMethodRawCallback(index("ListModels"),
                        RawMethods::Unary<v1::ListModelsRequest>(
                            "ListModels", metrics_, max_bytes, authorize_,
                            [this, max_bytes](std::shared_ptr<UnaryCall> call,
                                              grpc::CallbackServerContext*, v1::ListModelsRequest) {
                              absl::StatusOr<std::vector<core::ModelInfo>> models =
                                  core_->ListModels(call->Control());
                              if (!models.ok()) {
                                call->Finish(models.status());
                                return;
                              }
                              v1::ListModelsResponse response;
                              for (const core::ModelInfo& info : *models)
                                ToProto(info, response.add_models());
                              call->Finish(CheckResponseSize(response, max_bytes), response);
                            },
                            /*answer_dropped=*/true));
}

}  // namespace attn::server
