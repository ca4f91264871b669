#include "server/raw_method.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/codegen/server_callback_handlers.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "server/core/cost_model.h"
#include "server/core/serving_core.h"
#include "server/request_parse.h"
#include "server/status_map.h"

namespace attn::server {

UnaryCall::UnaryCall(const char* method, Metrics* metrics, grpc::CallbackServerContext* context)
    : method_(method), metrics_(metrics), context_(context), reactor_(context->DefaultReactor()) {}

core::CallControl UnaryCall::Control() const {
  core::CallControl control;
  control.received = received_;
  const auto deadline = context_->deadline();
  // gRPC reports "no deadline" as the far future.
  if (deadline < std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    control.deadline = deadline;
  }
  grpc::CallbackServerContext* context = context_;
  control.is_cancelled = [context] { return context->IsCancelled(); };
  return control;
}

grpc::ServerUnaryReactor* UnaryCall::FinishEarly(const absl::Status& status) {
  if (!answer_dropped_) return Finish(status);
  Metrics* metrics = metrics_;
  return Finish(core::UnlessDropped(Control(), status, "queue",
                                    [metrics](std::string_view reason, std::string_view stage) {
                                      metrics->RecordDropped(reason, stage);
                                    }));
}

grpc::ServerUnaryReactor* UnaryCall::Finish(const absl::Status& status) {
  return FinishGrpc(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* UnaryCall::Finish(const absl::Status& status,
                                            const google::protobuf::Message& response) {
  if (!status.ok()) return Finish(status);
  bool own_buffer = false;
  return FinishGrpc(grpc::SerializationTraits<google::protobuf::Message>::Serialize(
      response, response_bytes_, &own_buffer));
}

grpc::ServerUnaryReactor* UnaryCall::FinishGrpc(const grpc::Status& status) {
  held_.reset();
  metrics_->RecordRequest(
      method_, status.error_code(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - received_).count());
  // The client's own mistakes are not logged; nor is anything about authentication, so that no
  // credential can reach the log.
  const grpc::StatusCode code = status.error_code();
  if (code != grpc::StatusCode::OK && code != grpc::StatusCode::INVALID_ARGUMENT &&
      code != grpc::StatusCode::NOT_FOUND && code != grpc::StatusCode::UNAUTHENTICATED &&
      code != grpc::StatusCode::PERMISSION_DENIED && code != grpc::StatusCode::UNIMPLEMENTED) {
    Log(LogLevel::kDebug, "%s failed: %s %s", method_,
        std::string(GrpcCodeName(status.error_code())), status.error_message());
  }
  reactor_->Finish(status);
  return reactor_;
}

int MethodIndex(const google::protobuf::FileDescriptor& file, const char* service,
                const char* method) {
  return file.FindServiceByName(service)->FindMethodByName(method)->index();
}

absl::Status RawMethods::ParseOrLog(const char* method, const grpc::ByteBuffer& bytes,
                                    google::protobuf::Message* message) {
  absl::Status parsed = ParseRequestBytes(bytes, message);
  if (!parsed.ok()) Log(LogLevel::kDebug, "%s: %s", method, parsed.message());
  return parsed;
}

grpc::internal::MethodHandler* RawMethods::UnaryBytes(const char* method, Metrics* metrics,
                                                      int64_t max_message_bytes, Precheck precheck,
                                                      bool answer_dropped, BytesHandler handle) {
  auto serve = [=](grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
                   grpc::ByteBuffer* response_bytes) {
    auto call = std::make_shared<UnaryCall>(method, metrics, context);
    call->response_bytes_ = response_bytes;
    call->answer_dropped_ = answer_dropped;
    grpc::ServerUnaryReactor* reactor = call->reactor();
    if (answer_dropped && !request_bytes->Valid()) {
      // No message at all (a zero-byte request is still a valid buffer): the call ended before
      // its body arrived, i.e. the client cancelled it or its deadline passed. gRPC may not
      // report it cancelled yet, and parsing nothing would count it as bad input.
      const char* reason = call->Control().DropReason();
      const bool expired = reason != nullptr && std::string_view(reason) == "deadline";
      metrics->RecordDropped(expired ? "deadline" : "cancelled", "queue");
      return call->Finish(
          expired ? absl::DeadlineExceededError("the deadline passed before the request arrived")
                  : absl::CancelledError("the call ended before its request arrived"));
    }
    absl::Status rejected =
        CheckRequestSize(static_cast<int64_t>(request_bytes->Length()), max_message_bytes);
    if (rejected.ok() && precheck) rejected = precheck(*context);
    if (!rejected.ok()) return call->FinishEarly(rejected);
    handle(std::move(call), context, *request_bytes);
    return reactor;
  };
  return new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(serve);
}

grpc::internal::MethodHandler* RawMethods::Bidi(
    std::function<BidiReactor*(grpc::CallbackServerContext*)> open) {
  return new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
      std::move(open));
}

grpc::internal::MethodHandler* RawMethods::ServerStream(
    std::function<WriteReactor*(grpc::CallbackServerContext*, const grpc::ByteBuffer*)> open) {
  return new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
      std::move(open));
}

absl::Status CheckRequestSize(int64_t bytes, int64_t limit) {
  if (bytes <= limit) return absl::OkStatus();
  return TooLargeError(
      absl::StrCat("the request is ", bytes, " bytes, more than the ", limit,
                   "-byte limit (--max-message-bytes); split it into several calls or raise "
                   "--max-message-bytes on the server"));
}

absl::Status CheckResponseSize(const google::protobuf::Message& response, int64_t limit) {
  const size_t bytes = response.ByteSizeLong();
  if (static_cast<int64_t>(bytes) <= limit) return absl::OkStatus();
  return TooLargeError(
      absl::StrCat("the response would be ", bytes, " bytes, more than the ", limit,
                   "-byte limit (--max-message-bytes); ask for fewer inputs, layers or heads, use "
                   "top_k or float16, or raise --max-message-bytes on the server and the "
                   "client's maximum receive size"));
}

}  // namespace attn::server
