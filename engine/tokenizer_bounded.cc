// Bounded tokenization: a text is tokenized block by block, each block cut where tokenizing the
// parts separately gives exactly the pieces of tokenizing the whole, and only the pieces an
// encoding keeps are stored. So a 50 MB text truncated to 256 tokens costs its first few blocks,
// not the ~28 bytes per byte that decoding, normalising and tokenizing all of it at once held
// (code points, their offsets, normalized chars with alignment, pieces).
//
// Where a text may be cut (BlockScanner::IsCut), before the code point c at byte p:
//  * c starts a new word whatever precedes it: its normalized form begins with whitespace or
//    punctuation, or it is a CJK ideograph (BertPreTokenizer splits there), and that first
//    character is a starter (canonical reordering never crosses it); or the last character
//    before p that survives normalisation ends a word that way and c is a starter that does not
//    vanish;
//  * no added token found verbatim in the raw text ("[SEP]") spans p: the leftmost-longest scan
//    is then in the same state at p whether it started at 0 or at p;
//  * no added token matched in the normalized text (MPNet's "<unk>") can span p.
// A run of 64 KiB without such a place is one long word (or, in contrived text, cuts ruled out
// by added tokens): see TokenizeLongWord.
#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_text.h"

namespace attn {

using namespace tokenizer_internal;  // NOLINT: the tokenizer's own primitives

namespace {

constexpr size_t kNone = std::string_view::npos;
// How far back (code points) a normalized added token is looked for before a cut.
constexpr int kNormalizedLookBack = 64;

}  // namespace

class WordPieceTokenizer::BlockScanner {
 public:
  BlockScanner(const WordPieceTokenizer& tokenizer, std::string_view text)
      : t_(tokenizer), text_(text) {}

  std::string_view text() const { return text_; }

  // Whether c's normalized form has a word boundary: at its start (`at_start`: a cut may go
  // before it) or anywhere (a word cannot run through it). *first: its first normalized char.
  bool Boundary(char32_t c, bool at_start, char32_t* first = nullptr) const {
    if (t_.options_.tokenize_chinese_chars && IsChineseChar(c)) {
      if (first != nullptr) *first = ' ';  // the padding
      return true;
    }
    char32_t out[kMaxNormalizedChars];
    const int n = NormalizeOne(t_.options_, c, out);
    if (n == 0) return false;
    if (first != nullptr) *first = out[0];
    for (int k = 0; k < (at_start ? 1 : n); ++k) {
      const bool splits = IsWhitespace(out[k]) || IsPunctuation(out[k]);
      if (splits && (!at_start || CombiningClass(out[k]) == 0)) return true;
    }
    return false;
  }

  // Whether the last character before p that survives normalisation ends a word: its normalized
  // form ends with whitespace or punctuation, or it is a padded CJK ideograph (none survives:
  // true). Cautious: false when more than kNormalizedLookBack vanishing characters precede p.
  bool AfterWordEnd(size_t p) const {
    char32_t out[kMaxNormalizedChars];
    for (int steps = 0; p > 0 && steps < kNormalizedLookBack; ++steps) {
      p = PreviousCodePoint(text_, p);
      int len;
      const char32_t c = CodePointAt(text_, p, &len);
      if (t_.options_.tokenize_chinese_chars && IsChineseChar(c)) return true;
      const int n = NormalizeOne(t_.options_, c, out);
      if (n > 0) return IsWhitespace(out[n - 1]) || IsPunctuation(out[n - 1]);
    }
    return p == 0;
  }

  // The length of a raw added token found at byte p, or 0.
  size_t AddedTokenAt(size_t p) const {
    for (const auto& added : t_.added_tokens_) {
      const std::string& token = added.first;
      if (text_.size() - p >= token.size() && text_.compare(p, token.size(), token) == 0) {
        return token.size();
      }
    }
    return 0;
  }

  bool IsCut(size_t p) const {
    if (p == 0 || p >= text_.size()) return true;
    int len;
    const char32_t c = CodePointAt(text_, p, &len);
    char32_t first = 0;
    if (!Boundary(c, true, &first)) {
      // Also right after a character that ends a word, before one that starts afresh (a
      // starter that does not vanish): the word before is over, the next begins at p.
      char32_t out[kMaxNormalizedChars];
      const int n = NormalizeOne(t_.options_, c, out);
      if (n == 0 || CombiningClass(out[0]) != 0) return false;
      first = out[0];
      if (!AfterWordEnd(p)) return false;
    }
    for (const auto& added : t_.added_tokens_) {
      const std::string& token = added.first;
      for (size_t j = 1; j < token.size() && j <= p; ++j) {
        if (text_.size() - (p - j) >= token.size() &&
            text_.compare(p - j, token.size(), token) == 0) {
          return false;
        }
      }
    }
    return !NormalizedTokenSpans(p, first);
  }

  // The first cut in [from, to) (code point boundaries only; the end of the text is one), or
  // kNone.
  size_t FindCutForward(size_t from, size_t to) const {
    const size_t end = std::min(to, text_.size());
    size_t p = from;
    while (p < end && IsContinuation(p)) ++p;
    while (p < end) {
      if (IsCut(p)) return p;
      int len;
      CodePointAt(text_, p, &len);
      p += len;
    }
    return to >= text_.size() && p >= text_.size() ? text_.size() : kNone;
  }

  // The last cut in (floor, from], or kNone.
  size_t FindCutBackward(size_t from, size_t floor) const {
    size_t p = std::min(from, text_.size());
    while (p > floor && p < text_.size() && IsContinuation(p)) --p;
    while (p > floor) {
      if (IsCut(p)) return p;
      p = PreviousCodePoint(text_, p);
    }
    return kNone;
  }

  // The last byte in (floor, from] where a word boundary is or a raw added token starts, or
  // kNone.
  size_t FindBoundaryBackward(size_t from, size_t floor) const {
    size_t p = std::min(from, text_.size() - 1);
    while (p > floor && IsContinuation(p)) --p;
    while (p > floor) {
      int len;
      if (Boundary(CodePointAt(text_, p, &len), false) || AddedTokenAt(p) > 0) return p;
      p = PreviousCodePoint(text_, p);
    }
    return kNone;
  }

  // The first byte at or after `from` where a word boundary is or a raw added token starts.
  size_t FindBoundaryForward(size_t from) const {
    size_t p = from;
    while (p < text_.size()) {
      int len;
      const char32_t c = CodePointAt(text_, p, &len);
      if (Boundary(c, false) || AddedTokenAt(p) > 0) return p;
      p += len;
    }
    return text_.size();
  }

 private:
  bool IsContinuation(size_t p) const {
    return (static_cast<unsigned char>(text_[p]) & 0xC0) == 0x80;
  }

  // Whether a normalized added token could match across p, where the normalized text goes on
  // with `first`: the token holds `first` at some position j > 0 and the j normalized chars
  // before p are its first j. Cautious: when vanishing characters hide what precedes p for
  // more than kNormalizedLookBack code points, p is not used.
  bool NormalizedTokenSpans(size_t p, char32_t first) const {
    for (const auto& added : t_.normalized_added_tokens_) {
      const std::u32string& token = added.first;
      for (size_t j = 1; j < token.size(); ++j) {
        if (token[j] != first) continue;
        // The j normalized chars before p, last first.
        std::u32string before;
        size_t q = p;
        int steps = 0;
        while (before.size() < j && q > 0 && steps++ < kNormalizedLookBack) {
          q = PreviousCodePoint(text_, q);
          int len;
          char32_t out[kMaxNormalizedChars];
          const int n = NormalizeOne(t_.options_, CodePointAt(text_, q, &len), out);
          for (int k = n - 1; k >= 0 && before.size() < j; --k) before.push_back(out[k]);
        }
        if (before.size() < j) {
          if (q > 0) return true;  // could not see far enough back
          continue;
        }
        std::reverse(before.begin(), before.end());
        if (before == token.substr(0, j)) return true;
      }
    }
    return false;
  }

  const WordPieceTokenizer& t_;
  std::string_view text_;
};

absl::Status WordPieceTokenizer::TokenizeBlock(std::string_view text, size_t begin, size_t end,
                                               int64_t char_base,
                                               std::vector<Piece>* pieces) const {
  pieces->clear();
  if (begin >= end) return absl::OkStatus();
  absl::Status status = TokenizeText(text.substr(begin, end - begin), "text", pieces);
  if (!status.ok()) return status;  // cannot happen: the whole text was validated
  const auto chars = static_cast<int32_t>(char_base);
  const auto bytes = static_cast<int32_t>(begin);
  for (Piece& p : *pieces) {
    p.char_start += chars;
    p.char_end += chars;
    p.byte_start += bytes;
    p.byte_end += bytes;
  }
  return absl::OkStatus();
}

// A word of text[begin, end) without a word boundary inside, over max_block_bytes_. WordPiece makes
// one [UNK] of a word that normalises to more than max_input_chars_per_word characters, from its
// first to its last character that survives normalisation; fewer survive only when nearly all of
// it vanishes (control or zero-width characters, lone combining marks): those few are tokenized
// on their own, with their offsets in the text.
absl::Status WordPieceTokenizer::TokenizeLongWord(std::string_view text, size_t begin, size_t end,
                                                  int64_t char_base,
                                                  std::vector<Piece>* pieces) const {
  pieces->clear();
  struct Survivor {
    int64_t chars;
    size_t byte;
    int len;
  };
  std::vector<Survivor> survivors;  // up to max_input_chars_per_word + 1
  const size_t max_chars = static_cast<size_t>(options_.max_input_chars_per_word);
  int64_t normalized = 0, chars = char_base;
  Survivor first{0, 0, 0}, last{0, 0, 0};
  char32_t out[kMaxNormalizedChars];
  for (size_t p = begin; p < end; ++chars) {
    int len;
    const int n = NormalizeOne(options_, CodePointAt(text, p, &len), out);
    if (n > 0) {
      last = {chars, p, len};
      if (normalized == 0) first = last;
      if (survivors.size() <= max_chars) survivors.push_back(last);
      normalized += n;
    }
    p += len;
  }
  if (normalized == 0) return absl::OkStatus();
  if (normalized > static_cast<int64_t>(max_chars)) {
    pieces->push_back({unk_id_, static_cast<int32_t>(first.chars),
                       static_cast<int32_t>(last.chars + 1), static_cast<int32_t>(first.byte),
                       static_cast<int32_t>(last.byte + last.len)});
    return absl::OkStatus();
  }
  // The surviving characters alone tokenize as the word does; their offsets map back.
  std::string kept;
  for (const Survivor& s : survivors) kept.append(text.substr(s.byte, s.len));
  absl::Status status = TokenizeText(kept, "text", pieces);
  if (!status.ok()) return status;
  std::vector<size_t> survivor_at_byte(kept.size() + 1, 0);
  size_t offset = 0;
  for (size_t k = 0; k < survivors.size(); ++k) {
    survivor_at_byte[offset] = k;
    offset += survivors[k].len;
  }
  for (Piece& p : *pieces) {
    const Survivor& a = survivors[survivor_at_byte[p.byte_start]];
    const Survivor& b = survivors[survivor_at_byte[PreviousCodePoint(kept, p.byte_end)]];
    p = {p.id, static_cast<int32_t>(a.chars), static_cast<int32_t>(b.chars + 1),
         static_cast<int32_t>(a.byte), static_cast<int32_t>(b.byte + b.len)};
  }
  return absl::OkStatus();
}

template <typename Visit>
absl::Status WordPieceTokenizer::ForEachBlock(const BlockScanner& scanner, size_t begin,
                                              int64_t char_base, Visit visit,
                                              bool* end_reached) const {
  const std::string_view text = scanner.text();
  const size_t n = text.size();
  std::vector<Piece> block;
  size_t pos = begin;
  int64_t chars = char_base;
  size_t no_cut_before = 0;  // no cut in (pos, no_cut_before): not looked for again
  *end_reached = false;
  while (pos < n) {
    size_t end = kNone;
    if (n - pos <= block_bytes_) {
      end = n;
    } else if (pos + 1 >= no_cut_before) {
      end = scanner.FindCutForward(pos + block_bytes_, pos + max_block_bytes_);
      if (end == kNone) end = scanner.FindCutBackward(pos + block_bytes_, pos);
      if (end == kNone) no_cut_before = pos + max_block_bytes_;
    }
    absl::Status status;
    if (end != kNone) {
      status = TokenizeBlock(text, pos, end, chars, &block);
    } else {
      // No cut within max_block_bytes_. An added token at pos is a block of its own. Before a
      // word longer than that, so is the word boundary at pos (a normalized added token that
      // starts there would need another boundary nearby), and the word is a long word.
      // Otherwise the boundaries nearby were all ruled out by added tokens around them (text
      // made for it): cut at the last one all the same.
      int len;
      const char32_t c = CodePointAt(text, pos, &len);
      const size_t added = scanner.AddedTokenAt(pos);
      const size_t next = scanner.FindBoundaryForward(pos + len);
      if (added > 0) {
        end = pos + added;
        status = TokenizeBlock(text, pos, end, chars, &block);
      } else if (next - pos > max_block_bytes_) {
        const bool boundary = scanner.Boundary(c, false);
        end = boundary ? pos + len : next;
        status = boundary ? TokenizeBlock(text, pos, end, chars, &block)
                          : TokenizeLongWord(text, pos, end, chars, &block);
      } else {
        end = scanner.FindBoundaryBackward(pos + max_block_bytes_, pos);
        if (end == kNone) end = next;
        status = TokenizeBlock(text, pos, end, chars, &block);
      }
    }
    if (!status.ok()) return status;
    chars += CountCodePoints(text, pos, end);
    pos = end;
    if (!visit(block)) break;
  }
  *end_reached = pos >= n;
  return absl::OkStatus();
}

absl::Status WordPieceTokenizer::TokenizeBounded(std::string_view text, std::string_view what,
                                                 TruncationSide side, int64_t keep,
                                                 int64_t count_limit, TextPieces* out) const {
  int64_t code_points = 0;
  if (absl::Status valid = ValidateUtf8(text, what, &code_points); !valid.ok()) return valid;
  out->pieces.clear();
  out->count = 0;
  out->complete = true;
  const BlockScanner scanner(*this, text);
  bool end_reached = false;
  if (side == TruncationSide::kRight || keep == std::numeric_limits<int64_t>::max()) {
    absl::Status status = ForEachBlock(
        scanner, 0, 0,
        [&](const std::vector<Piece>& block) {
          for (const Piece& p : block) {
            if (out->count++ < keep) out->pieces.push_back(p);
          }
          return out->count < count_limit;
        },
        &end_reached);
    out->complete = end_reached;
    return status;
  }
  // Left: the last `keep` pieces come from tokenizing forward from a cut far enough from the
  // end, moved back (twice as far each time) until it yields them all and the look-ahead, or
  // reaches the start.
  size_t distance = block_bytes_;
  while (true) {
    size_t start = 0;
    if (text.size() > distance) {
      start = scanner.FindCutBackward(text.size() - distance, 0);
      if (start == kNone) start = 0;
    }
    out->pieces.clear();
    out->count = 0;
    absl::Status status = ForEachBlock(
        scanner, start, code_points - CountCodePoints(text, start, text.size()),
        [&](const std::vector<Piece>& block) {
          out->pieces.insert(out->pieces.end(), block.begin(), block.end());
          out->count += static_cast<int64_t>(block.size());
          // Only the last `keep` are needed: drop the rest now and then (amortised).
          if (keep < std::numeric_limits<int64_t>::max() / 2 &&
              static_cast<int64_t>(out->pieces.size()) > 2 * keep + 1024) {
            out->pieces.erase(out->pieces.begin(), out->pieces.end() - keep);
          }
          return true;
        },
        &end_reached);
    if (!status.ok()) return status;
    if (static_cast<int64_t>(out->pieces.size()) > keep) {
      out->pieces.erase(out->pieces.begin(), out->pieces.end() - keep);
    }
    out->complete = start == 0;
    if (start == 0 || out->count >= count_limit) return absl::OkStatus();
    distance = std::max(2 * distance, text.size() - start + block_bytes_);
  }
}

}  // namespace attn
