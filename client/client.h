// attn::client::EncoderClient: a blocking C++ client for the attnserve.v1.Encoder service and the
// standard grpc.health.v1.Health service. Every call returns absl::StatusOr; a failed RPC becomes
// an absl::Status with the same code and the server's message, so callers never see grpc types
// in error paths.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/encoder.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"

namespace attn::client {

struct ClientOptions {
  // Per-call deadline. Zero or negative = no deadline.
  std::chrono::milliseconds timeout{30000};
  // Largest response accepted. AttentionMap responses with Q/K/V or many layers get large;
  // gRPC's 4 MiB default is too small for them.
  int max_receive_message_bytes = 256 << 20;
  int max_send_message_bytes = 64 << 20;
  // Queue calls while the channel is connecting instead of failing fast with UNAVAILABLE
  // (useful for scripts that start the server and the client together).
  bool wait_for_ready = false;
  // TLS: off by default (plaintext, for loopback and in-cluster traffic). With use_tls, the
  // server certificate is verified against tls_root_certs_pem, or the system roots when empty.
  bool use_tls = false;
  std::string tls_root_certs_pem;
};

using HealthStatus = ::grpc::health::v1::HealthCheckResponse::ServingStatus;

class EncoderClient {
 public:
  // Connects lazily to `target` ("host:port", or any gRPC target URI).
  EncoderClient(std::string target, ClientOptions options = {});
  // Uses an existing channel (tests, shared channels). `target` is only used in messages.
  EncoderClient(std::shared_ptr<::grpc::Channel> channel, std::string target,
                ClientOptions options = {});

  absl::StatusOr<attnserve::v1::EncodeResponse> Encode(const attnserve::v1::EncodeRequest& request);
  absl::StatusOr<attnserve::v1::AttentionMapResponse> AttentionMap(
      const attnserve::v1::AttentionMapRequest& request);
  absl::StatusOr<attnserve::v1::TokenizeResponse> Tokenize(
      const attnserve::v1::TokenizeRequest& request);
  absl::StatusOr<attnserve::v1::ModelInfo> GetModelInfo(
      const attnserve::v1::GetModelInfoRequest& request = {});

  // grpc.health.v1.Health/Check for `service` ("" = the server as a whole). A service the
  // server does not know comes back as NOT_FOUND (that is what the protocol specifies).
  absl::StatusOr<HealthStatus> Health(const std::string& service = "");

  const std::string& target() const { return target_; }
  const ClientOptions& options() const { return options_; }

 private:
  void PrepareContext(::grpc::ClientContext* context) const;
  absl::Status ToAbslStatus(const ::grpc::Status& status) const;

  std::string target_;
  ClientOptions options_;
  std::shared_ptr<::grpc::Channel> channel_;
  std::unique_ptr<attnserve::v1::Encoder::Stub> encoder_;
  std::unique_ptr<::grpc::health::v1::Health::Stub> health_;
};

// Creates the channel EncoderClient uses for `target` with `options` (message size limits,
// credentials).
std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target,
                                               const ClientOptions& options);

// True if `status` came from a call that never reached a server (connection refused, DNS
// failure, TLS handshake failure), as opposed to an UNAVAILABLE answered by a server that is
// loading or draining. Set by EncoderClient as a status payload.
bool IsUnreachable(const absl::Status& status);

// Maps a gRPC status to the absl status with the same code and message. OK -> OkStatus().
absl::Status FromGrpcStatus(const ::grpc::Status& status);

}  // namespace attn::client
