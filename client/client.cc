#include "client/client.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;
namespace health = ::grpc::health::v1;

constexpr char kUnreachablePayloadUrl[] = "type.attnserve.dev/client.unreachable";

// Messages gRPC core uses when no connection could be made at all.
bool LooksLikeConnectFailure(absl::string_view message) {
  return absl::StrContains(message, "failed to connect") ||
         absl::StrContains(message, "DNS resolution failed") ||
         absl::StrContains(message, "empty address list") ||
         absl::StrContains(message, "Connection refused") ||
         absl::StrContains(message, "Ssl handshake failed");
}

}  // namespace

std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target,
                                               const ClientOptions& options) {
  ::grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  std::shared_ptr<::grpc::ChannelCredentials> credentials;
  if (options.use_tls) {
    ::grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    credentials = ::grpc::SslCredentials(ssl);
  } else {
    credentials = ::grpc::InsecureChannelCredentials();
  }
  return ::grpc::CreateCustomChannel(target, credentials, args);
}

absl::Status FromGrpcStatus(const ::grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // gRPC and absl share the canonical code numbering (0..16).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsUnreachable(const absl::Status& status) {
  return status.GetPayload(kUnreachablePayloadUrl).has_value();
}

EncoderClient::EncoderClient(std::string target, ClientOptions options)
    : EncoderClient(CreateChannel(target, options), target, options) {}

EncoderClient::EncoderClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                             ClientOptions options)
    : target_(std::move(target)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      encoder_(v1::Encoder::NewStub(channel_)),
      health_(health::Health::NewStub(channel_)) {}

void EncoderClient::PrepareContext(::grpc::ClientContext* context) const {
  if (options_.timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options_.timeout);
  }
  context->set_wait_for_ready(options_.wait_for_ready);
}

absl::Status EncoderClient::ToAbslStatus(const ::grpc::Status& grpc_status) const {
  absl::Status status = FromGrpcStatus(grpc_status);
  if (status.ok()) return status;
  // A server that is loading or draining also answers UNAVAILABLE; only the channel state
  // (never got a connection) tells "nobody there" apart from "server said not now".
  const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/false);
  const bool not_connected =
      state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_CONNECTING;
  const bool transport_code = status.code() == absl::StatusCode::kUnavailable ||
                              status.code() == absl::StatusCode::kDeadlineExceeded;
  if (transport_code && (not_connected || (status.code() == absl::StatusCode::kUnavailable &&
                                           LooksLikeConnectFailure(status.message())))) {
    status.SetPayload(kUnreachablePayloadUrl, absl::Cord(target_));
  }
  return status;
}

absl::StatusOr<v1::EncodeResponse> EncoderClient::Encode(const v1::EncodeRequest& request) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  v1::EncodeResponse response;
  ::grpc::Status status = encoder_->Encode(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<v1::AttentionMapResponse> EncoderClient::AttentionMap(
    const v1::AttentionMapRequest& request) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  v1::AttentionMapResponse response;
  ::grpc::Status status = encoder_->AttentionMap(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<v1::TokenizeResponse> EncoderClient::Tokenize(const v1::TokenizeRequest& request) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  v1::TokenizeResponse response;
  ::grpc::Status status = encoder_->Tokenize(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<v1::ModelInfo> EncoderClient::GetModelInfo(const v1::GetModelInfoRequest& request) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  v1::ModelInfo response;
  ::grpc::Status status = encoder_->GetModelInfo(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<HealthStatus> EncoderClient::Health(const std::string& service) {
  ::grpc::ClientContext context;
  PrepareContext(&context);
  health::HealthCheckRequest request;
  request.set_service(service);
  health::HealthCheckResponse response;
  ::grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response.status();
}

}  // namespace attn::client
