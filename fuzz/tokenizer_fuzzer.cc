// Fuzz target: the WordPiece tokenizer (Encode, EncodePair, FromIds) with the default model's
// vocabulary. Input layout (fuzz/make_seeds.py writes seeds in it):
//   byte 0  flags: bit 0 pair, bit 1 truncation on, bit 2 truncate on the left, bit 3 id mode
//   byte 1  truncation max_length
//   rest    text_a [0xFF text_b]   (0xFF never occurs in UTF-8)
//           or, in id mode, little-endian int32 ids (first half) and type ids (second half)
// Besides memory errors, every accepted encoding is checked for what the server relies on when
// it builds responses: parallel arrays of one length, ids in the vocabulary, the length limit,
// offsets inside their text on UTF-8 boundaries, char offsets that count the code points before
// the byte offsets.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer.h"
#include "fuzz/fuzz_check.h"

namespace {

std::optional<attn::WordPieceTokenizer> g_tokenizer;

bool IsContinuationByte(unsigned char c) { return (c & 0xC0) == 0x80; }

int CountCodePoints(std::string_view text, size_t bytes) {
  int count = 0;
  for (size_t i = 0; i < bytes; ++i) count += !IsContinuationByte(text[i]);
  return count;
}

void CheckOffsets(std::string_view text, const attn::Encoding& enc, int i) {
  const int32_t b0 = enc.byte_start[i], b1 = enc.byte_end[i];
  FUZZ_CHECK(0 <= b0 && b0 <= b1 && static_cast<size_t>(b1) <= text.size(),
             "token %d bytes [%d, %d) outside a text of %zu bytes", i, b0, b1, text.size());
  FUZZ_CHECK(b0 == static_cast<int32_t>(text.size()) || !IsContinuationByte(text[b0]),
             "token %d starts inside a UTF-8 sequence at byte %d", i, b0);
  FUZZ_CHECK(b1 == static_cast<int32_t>(text.size()) || !IsContinuationByte(text[b1]),
             "token %d ends inside a UTF-8 sequence at byte %d", i, b1);
  FUZZ_CHECK(enc.char_start[i] == CountCodePoints(text, b0) &&
                 enc.char_end[i] == CountCodePoints(text, b1),
             "token %d chars [%d, %d) disagree with bytes [%d, %d)", i, enc.char_start[i],
             enc.char_end[i], b0, b1);
}

void CheckEncoding(const attn::Encoding& enc, std::string_view a, std::optional<std::string_view> b,
                   const attn::TruncationOptions& truncation) {
  const int n = enc.size();
  FUZZ_CHECK(enc.type_ids.size() == static_cast<size_t>(n) &&
                 enc.tokens.size() == static_cast<size_t>(n) &&
                 enc.char_start.size() == static_cast<size_t>(n) &&
                 enc.char_end.size() == static_cast<size_t>(n) &&
                 enc.byte_start.size() == static_cast<size_t>(n) &&
                 enc.byte_end.size() == static_cast<size_t>(n) &&
                 enc.special_tokens_mask.size() == static_cast<size_t>(n) &&
                 enc.sequence_index.size() == static_cast<size_t>(n),
             "parallel arrays differ in length from %d ids", n);
  if (truncation.enabled) {
    FUZZ_CHECK(n <= truncation.max_length, "%d tokens, max_length %d", n, truncation.max_length);
  }
  FUZZ_CHECK(enc.untruncated_length >= n && enc.truncated == (enc.untruncated_length > n),
             "truncated=%d, untruncated_length %d, length %d", enc.truncated,
             enc.untruncated_length, n);
  FUZZ_CHECK(n >= 2 && enc.ids[0] == g_tokenizer->cls_id(), "no leading [CLS]");
  for (int i = 0; i < n; ++i) {
    FUZZ_CHECK(enc.ids[i] >= 0 && enc.ids[i] < g_tokenizer->vocab_size(), "id %d", enc.ids[i]);
    FUZZ_CHECK(enc.tokens[i] == g_tokenizer->IdToToken(enc.ids[i]), "token %d text", i);
    const int source = enc.sequence_index[i];
    FUZZ_CHECK(source == -1 || source == 0 || (source == 1 && b.has_value()),
               "token %d sequence_index %d", i, source);
    // Segment ids: 0 for the first text, 1 for the second, never going back from 1 to 0.
    FUZZ_CHECK((source == -1 || enc.type_ids[i] == source) &&
                   (enc.type_ids[i] == 0 || (enc.type_ids[i] == 1 && b.has_value())) &&
                   (i == 0 || enc.type_ids[i] >= enc.type_ids[i - 1]),
               "token %d type id %d (sequence %d)", i, enc.type_ids[i], source);
    FUZZ_CHECK(enc.special_tokens_mask[i] == (source == -1), "token %d special mask", i);
    if (source == -1) {
      FUZZ_CHECK(enc.byte_start[i] == 0 && enc.byte_end[i] == 0 && enc.char_start[i] == 0 &&
                     enc.char_end[i] == 0,
                 "special token %d has offsets", i);
    } else {
      CheckOffsets(source == 0 ? a : *b, enc, i);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* dir = std::getenv("ATTN_FUZZ_MODEL_DIR");
  auto tokenizer = attn::WordPieceTokenizer::FromModelDir(dir ? dir : ATTN_DEFAULT_MODEL_DIR);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "tokenizer_fuzzer: %s\n", tokenizer.status().ToString().c_str());
    std::abort();
  }
  g_tokenizer.emplace(*std::move(tokenizer));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  attn::TruncationOptions truncation;
  truncation.enabled = flags & 0x02;
  truncation.side = flags & 0x04 ? attn::TruncationSide::kLeft : attn::TruncationSide::kRight;
  truncation.max_length = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);

  if (flags & 0x08) {
    const size_t count = rest.size() / 4;
    std::vector<int32_t> ids(count / 2 + count % 2), type_ids(count / 2);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    if (!type_ids.empty()) {
      std::memcpy(type_ids.data(), rest.data() + ids.size() * 4, type_ids.size() * 4);
    }
    auto enc = g_tokenizer->FromIds(ids, type_ids);
    if (enc.ok()) {
      FUZZ_CHECK(enc->ids == ids, "FromIds changed the ids");
      FUZZ_CHECK(enc->type_ids.size() == ids.size(), "type ids length");
    }
    return 0;
  }

  if (flags & 0x01) {
    const size_t split = rest.find('\xff');
    const std::string_view a = rest.substr(0, split);
    const std::string_view b = split == std::string_view::npos ? "" : rest.substr(split + 1);
    auto enc = g_tokenizer->EncodePair(a, b, truncation);
    if (enc.ok()) CheckEncoding(*enc, a, b, truncation);
  } else {
    auto enc = g_tokenizer->Encode(rest, truncation);
    if (enc.ok()) CheckEncoding(*enc, rest, std::nullopt, truncation);
  }
  return 0;
}
