// Bearer-token authentication: the Trainer service (--trainer-token-file) and, when
// --api-key-file is set, the inference calls over gRPC and HTTP. A token is a shared secret read
// from a file at start-up; it is never logged, exported in metrics, or echoed in an error
// message.
#pragma once

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attn::server {

// The token in `path`, surrounding whitespace trimmed. FailedPrecondition if the file is empty
// (or only whitespace), holds a control character or a space inside the token, or cannot be
// read.
// `what` names the file in errors ("trainer token", "API key").
absl::StatusOr<std::string> ReadTokenFile(const std::string& path,
                                          std::string_view what = "trainer token");

// Equality whose running time depends only on `presented`'s length, not on where the first
// difference is or on the secret's length.
bool ConstantTimeEquals(std::string_view presented, std::string_view secret);

// Checks an `authorization` header's value (nullptr: the header is absent) against `token`: OK,
// UNAUTHENTICATED (missing or not a bearer token) or PERMISSION_DENIED (wrong token). `service`
// names what needs it in the error ("the Trainer service"). The transport-free check that the
// gRPC metadata check below and the HTTP front end share.
absl::Status AuthorizationHeaderStatus(const std::string_view* header, const std::string& token,
                                       std::string_view service);

// Checks the call's `authorization: Bearer <token>` metadata: OK, UNAUTHENTICATED (missing or
// not a bearer token) or PERMISSION_DENIED (wrong token).
absl::Status BearerTokenStatus(const grpc::ServerContextBase& context, const std::string& token,
                               std::string_view service = "the Trainer service");
// The same as the gRPC status a call finishes with.
grpc::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& token);

}  // namespace attn::server
