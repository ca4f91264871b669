// Bearer-token authentication for the Trainer service. The token is a shared secret read from a
// file at start-up; it is never logged, exported in metrics, or echoed in an error message.
#pragma once

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attn::server {

// The token in `path`, surrounding whitespace trimmed. FailedPrecondition if the file is empty
// (or only whitespace), holds a control character or a space inside the token, or cannot be
// read.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Equality whose running time depends only on `presented`'s length, not on where the first
// difference is or on the secret's length.
bool ConstantTimeEquals(std::string_view presented, std::string_view secret);

// Checks the call's `authorization: Bearer <token>` metadata: OK, UNAUTHENTICATED (missing or
// not a bearer token) or PERMISSION_DENIED (wrong token).
absl::Status BearerTokenStatus(const grpc::ServerContextBase& context, const std::string& token);
// The same as the gRPC status a call finishes with.
grpc::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& token);

}  // namespace attn::server
