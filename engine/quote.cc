#include "engine/quote.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attn {

std::string QuoteInput(std::string_view text) {
  std::string_view shown = text;
  if (text.size() > kMaxQuotedBytes) {
    size_t end = kMaxQuotedBytes;
    // Back up over continuation bytes so the piece ends on a character boundary.
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    shown = text.substr(0, end);
  }
  std::string out = "'";
  for (char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02X", byte);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  if (shown.size() < text.size()) absl::StrAppend(&out, "\u2026(", text.size(), " bytes)");
  return out;
}

}  // namespace attn
