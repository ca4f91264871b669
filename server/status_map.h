// The one place where engine/internal statuses become gRPC statuses.
#pragma once

#include <grpcpp/support/status.h>

#include <string_view>

#include "absl/status/status.h"

namespace attn::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...: the label used in metrics.
std::string_view GrpcCodeName(grpc::StatusCode code);

}  // namespace attn::server
