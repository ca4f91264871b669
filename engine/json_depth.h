// A nesting-depth limit for the JSON files the engine reads (safetensors headers, config.json,
// modules.json, tokenizer files). nlohmann::json parses any depth, but dump() (used in error
// messages) and copies recurse once per level: a file nested 200,000 deep overflowed the stack
// (found with fuzz/safetensors_fuzzer and fuzz/model_config_fuzzer). Real files nest < 10 deep.
#pragma once

#include <string_view>

namespace attn {

inline constexpr int kMaxJsonDepth = 64;

// True if `text` opens more than `max_depth` arrays/objects at once (brackets inside strings do
// not count). A linear scan without allocation, run before parsing.
inline bool JsonNestsDeeperThan(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace attn
