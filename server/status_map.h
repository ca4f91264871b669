// The one place where engine/internal statuses become transport statuses: gRPC codes, and HTTP
// statuses with OpenAI's error type for the HTTP front end (server/http/).
#pragma once

#include <grpcpp/support/status.h>

#include <string_view>

#include "absl/status/status.h"

namespace attn::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...: the label used in metrics.
std::string_view GrpcCodeName(grpc::StatusCode code);

// How a status travels over HTTP: the status code and the OpenAI error `type`
// ({"error": {"message", "type", "param", "code"}}).
struct HttpStatus {
  int code = 200;
  std::string_view type;  // "invalid_request_error", "authentication_error", ...
};
HttpStatus ToHttpStatus(const absl::Status& status);
// The Open Inference Protocol (server/oip/) uses the same two: gRPC codes from ToGrpcStatus, and
// REST statuses from ToHttpStatus with the protocol's {"error": "<message>"} body instead of
// OpenAI's (oip::OipErrorReply).

}  // namespace attn::server
