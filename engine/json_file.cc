#include "engine/json_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/json_depth.h"

namespace attn {

std::string JoinPath(const std::string& dir, std::string_view name) {
  std::string joined = dir;
  if (!joined.empty() && joined.back() != '/') joined += '/';
  joined.append(name.data(), name.size());
  return joined;
}

absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return std::optional<std::string>();
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrFormat("%s: cannot open: %s", path, std::strerror(err)));
  }
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrFormat("%s: cannot read: %s", path, std::strerror(err)));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return std::optional<std::string>(std::move(contents));
}

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source) {
  if (JsonNestsDeeperThan(text)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: JSON nests deeper than %d levels", source, kMaxJsonDepth));
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON: %s", source, e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected a JSON object, found %s", source, json.type_name()));
  }
  return json;
}

}  // namespace attn
