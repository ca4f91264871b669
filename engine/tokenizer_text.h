// Text primitives of the WordPiece tokenizer (engine/tokenizer.cc: UTF-8, Hugging Face's
// character classes, BertNormalizer), shared with its block-by-block driver
// (engine/tokenizer_bounded.cc). Internal to the tokenizer: not an API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer.h"

namespace attn {

// One token of one text. Offsets are into that text: code points and UTF-8 bytes, [start, end).
struct WordPieceTokenizer::Piece {
  int32_t id;
  int32_t char_start, char_end;
  int32_t byte_start, byte_end;
};

}  // namespace attn

namespace attn::tokenizer_internal {

// Strict decoding (no overlong forms, no surrogates, nothing above U+10FFFF). `starts` gets the
// byte offset of every code point plus a final entry for the end of the text. Errors name
// `what` and the byte offset.
absl::Status DecodeUtf8(std::string_view text, std::string_view what, std::vector<char32_t>* cps,
                        std::vector<int32_t>* starts);
// The same check without storing anything; *code_points gets the count.
absl::Status ValidateUtf8(std::string_view text, std::string_view what, int64_t* code_points);
// The code point at byte `i` of text that ValidateUtf8 accepted; its length in *len.
char32_t CodePointAt(std::string_view text, size_t i, int* len);
// The byte offset of the code point before byte `i` (> 0) of valid UTF-8.
size_t PreviousCodePoint(std::string_view text, size_t i);
// Code points in text[begin, end) of valid UTF-8.
int64_t CountCodePoints(std::string_view text, size_t begin, size_t end);

void AppendUtf8(char32_t c, std::string* out);

// The crate's classes (see tokenizer.cc).
bool IsWhitespace(char32_t c);
bool IsPunctuation(char32_t c);
bool IsChineseChar(char32_t c);
int CombiningClass(char32_t c);

// BertNormalizer's output for the code point `c` on its own (CJK padding left out): clean
// text, strip accents (canonical decomposition, marks dropped), lower-case. The count written to
// `out`, which holds kMaxNormalizedChars; 0 when `c` vanishes (a control character, a lone mark).
constexpr int kMaxNormalizedChars = 16;
int NormalizeOne(const TokenizerOptions& options, char32_t c, char32_t* out);

// A normalized code point and the index of the original code point it came from.
struct NormChar {
  char32_t cp;
  int32_t orig;
  // First code point of its source char's decomposition.
  bool first;
};
// BertNormalizer over original code points [begin, end).
void Normalize(const TokenizerOptions& options, const std::vector<char32_t>& cps, int32_t begin,
               int32_t end, std::vector<NormChar>* out);

}  // namespace attn::tokenizer_internal
