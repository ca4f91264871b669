#include "server/auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/status_map.h"

namespace attn::server {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, std::string_view what_view) {
  const std::string what(what_view);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the ", what, " file ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", what, " file ", path, " is empty; put a secret token in it"));
  }
  for (unsigned char c : token) {
    // A bearer token travels in an HTTP/2 header: visible ASCII only.
    if (c <= 0x20 || c >= 0x7f) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ", what, " in ", path,
                       " has a space, control or non-ASCII character; use visible ASCII only"));
    }
  }
  return token;
}

bool ConstantTimeEquals(std::string_view presented, std::string_view secret) {
  // Every byte of `presented` is compared (against the secret, cycled), and the length
  // difference is folded in, so neither the position of the first mismatch nor the secret's
  // length shows in the time taken.
  volatile unsigned char difference = presented.size() == secret.size() ? 0 : 1;
  if (secret.empty()) return false;
  for (size_t i = 0; i < presented.size(); ++i) {
    difference = difference | static_cast<unsigned char>(presented[i] ^ secret[i % secret.size()]);
  }
  return difference == 0;
}

absl::Status AuthorizationHeaderStatus(const std::string_view* header, const std::string& token,
                                       std::string_view service_view) {
  const std::string service(service_view);
  if (header == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat(service, " needs the header 'authorization: Bearer <token>'"));
  }
  // Debian's Abseil has its own string_view type, so the absl helpers get absl::string_view.
  const absl::string_view value(header->data(), header->size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("the authorization header must be 'Bearer <token>'");
  }
  const absl::string_view presented = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  if (!ConstantTimeEquals(std::string_view(presented.data(), presented.size()), token)) {
    return absl::PermissionDeniedError("the bearer token is not valid");
  }
  return absl::OkStatus();
}

absl::Status BearerTokenStatus(const grpc::ServerContextBase& context, const std::string& token,
                               std::string_view service) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return AuthorizationHeaderStatus(nullptr, token, service);
  const std::string_view value(it->second.data(), it->second.size());
  return AuthorizationHeaderStatus(&value, token, service);
}

grpc::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& token) {
  return ToGrpcStatus(BearerTokenStatus(context, token));
}

}  // namespace attn::server
