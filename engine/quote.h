// Quoting user input in error messages: at most a short, valid-UTF-8 piece of it, so a
// message stays readable and far below gRPC's 8 KiB metadata limit whatever the client sent.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attn {

// Most bytes of user input an error message repeats.
inline constexpr size_t kMaxQuotedBytes = 64;

// 'text' in single quotes when it has at most kMaxQuotedBytes bytes; otherwise its first
// kMaxQuotedBytes bytes (cut back to a UTF-8 character boundary) followed by "…(N bytes)",
// N being the whole input's size. Control characters are shown as \xNN.
std::string QuoteInput(std::string_view text);

}  // namespace attn
