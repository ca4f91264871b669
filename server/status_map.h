// The one place where engine/internal statuses become gRPC statuses.
#pragma once

#include <grpcpp/support/status.h>

#include <string_view>

#include "absl/status/status.h"

namespace attn::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// A fine-tuning step's error. The engine reports a diverged step (NaN/Inf loss or gradient) as
// OUT_OF_RANGE; for the client that is the job ABORTED (retrying the same job cannot help, a
// new one with other settings can). Everything else as ToGrpcStatus.
grpc::Status TrainingStepStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...: the label used in metrics.
std::string_view GrpcCodeName(grpc::StatusCode code);

}  // namespace attn::server
