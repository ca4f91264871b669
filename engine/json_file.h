// Reading the small JSON files of a model directory (config.json, modules.json, tokenizer
// files): one implementation for every loader, with the same error wording.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace attn {

// dir + '/' + name (no doubled slash); just `name` when dir is empty.
std::string JoinPath(const std::string& dir, std::string_view name);

// The file's contents, or nullopt when it does not exist (optional files fall back to defaults);
// any other I/O failure is an error naming the path.
absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path);

// Parses `text` as one JSON object. Errors are INVALID_ARGUMENT prefixed with `source` (a file
// name): too deeply nested (see json_depth.h), not JSON, or not an object.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source);

}  // namespace attn
