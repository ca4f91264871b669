// Bounded tokenization (engine/tokenizer_bounded.cc, issue 31 finding 6): a text tokenized block
// by block must give exactly the tokens and offsets of tokenizing it whole. The reference is the
// same tokenizer with one block for the whole text (the algorithm before blocks, equal to Hugging
// Face on tests/golden/tokenizer_cases.json), and Hugging Face's own answers for the golden
// cases; blocks are made tiny (a cut every few bytes, "long words" from 32 bytes) so every rule
// about where a text may be cut is exercised. Then what bounding buys: a truncated text is
// tokenized only up to what is kept plus the look-ahead, and says its length is a lower bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

using Json = nlohmann::json;

WordPieceTokenizer Load(const std::string& dir, size_t block, size_t max_block) {
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(dir);
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    std::abort();
  }
  t->SetBlockSizesForTesting(block, max_block);
  return std::move(*t);
}

constexpr size_t kWhole = size_t{1} << 40;  // one block, whatever the text

std::string Describe(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += c < 0x20 ? absl::StrFormat("\\x%02X", c) : std::string(1, static_cast<char>(c));
  }
  return absl::StrFormat("%s... (%d bytes)", out, text.size());
}

// The tokens around the first place two encodings differ, for a failure message.
std::string FirstDifference(const Encoding& got, const Encoding& want) {
  size_t k = 0;
  while (k < got.ids.size() && k < want.ids.size() && got.ids[k] == want.ids[k] &&
         got.byte_start[k] == want.byte_start[k] && got.byte_end[k] == want.byte_end[k]) {
    ++k;
  }
  std::string out = absl::StrFormat("first difference at token %d:", k);
  for (const auto* e : {&got, &want}) {
    out += e == &got ? "\n  got: " : "\n  want:";
    for (size_t j = k > 3 ? k - 3 : 0; j < std::min(e->ids.size(), k + 6); ++j) {
      out += absl::StrFormat(" %s[%d,%d)", e->tokens[j], e->byte_start[j], e->byte_end[j]);
    }
  }
  return out;
}

// Every field of two encodings equal.
void ExpectSameEncoding(const Encoding& got, const Encoding& want, const std::string& what) {
  ASSERT_EQ(got.ids.size(), want.ids.size()) << what << "\n" << FirstDifference(got, want);
  for (size_t k = 0; k < want.ids.size(); ++k) {
    ASSERT_EQ(got.ids[k], want.ids[k]) << what << "\n" << FirstDifference(got, want);
    ASSERT_EQ(got.char_start[k], want.char_start[k]) << what << " token " << k;
    ASSERT_EQ(got.char_end[k], want.char_end[k]) << what << " token " << k;
    ASSERT_EQ(got.byte_start[k], want.byte_start[k]) << what << " token " << k;
    ASSERT_EQ(got.byte_end[k], want.byte_end[k]) << what << " token " << k;
  }
  EXPECT_EQ(got.type_ids, want.type_ids) << what;
  EXPECT_EQ(got.truncated, want.truncated) << what;
  EXPECT_EQ(got.untruncated_length, want.untruncated_length) << what;
}

TruncationOptions Truncate(int max_length, TruncationSide side, int look_ahead = -1) {
  TruncationOptions t;
  t.max_length = max_length;
  t.side = side;
  t.look_ahead = look_ahead;
  return t;
}

TruncationOptions NoTruncation() {
  TruncationOptions t;
  t.enabled = false;
  return t;
}

// Random text from fragments that stress the cut rules: words, spaces and line breaks,
// punctuation, CJK, accents (precomposed and combining), vanishing characters (zero-width, C0
// controls, lone marks), special tokens typed in the text, emoji, characters whose normalized
// form is punctuation (U+037E, U+1FEF), long letter runs (over the tiny long-word threshold).
std::string RandomText(std::mt19937* rng, size_t bytes, bool mpnet) {
  static const std::vector<std::string> kFragments = {
      "the",
      "cat",
      "Running",
      "unaffable",
      " ",
      " ",
      "  ",
      "\n",
      "\t",
      ",",
      ".",
      "!",
      "'s",
      "(x)",
      "[SEP]",
      "[CLS]",
      "[sep",
      "SEP]",
      "[",
      "]",
      "日本語",
      "中",
      "é",
      "e\xcc\x81",
      "a\xcc\x88\xcc\xa7",
      "\xe2\x80\x8b",
      "\x01",
      "\xcc\x81",
      "🙂",
      "\xcd\xbe",
      "\xe1\xbf\xaf",
      "İstanbul",
      "Ｆｕｌｌ！",
      "naïve",
      "façade",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
      "x\xe2\x80\x8b\xe2\x80\x8b\xe2\x80\x8b\xe2\x80\x8b\xe2\x80\x8b\xe2\x80\x8b\xe2\x80\x8b\xe2"
      "\x80\x8by",
      "\xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5",  // Thai, no
                                                                                   // spaces
      "1,234.5",
      "e-mail",
      "—",
      "«",
      "»"};
  static const std::vector<std::string> kMpnetFragments = {
      "<s>", "</s>", "<unk>", "<UNK>", "<pad>", "<mask>", "<", ">", "<un", "k>", ">>>"};
  std::string text;
  while (text.size() < bytes) {
    if (mpnet && (*rng)() % 4 == 0) {
      text += kMpnetFragments[(*rng)() % kMpnetFragments.size()];
    } else {
      text += kFragments[(*rng)() % kFragments.size()];
    }
  }
  return text;
}

// The same text through tokenizers that cut it differently must give the same encoding.
void CheckCuttingChangesNothing(const std::string& model_dir, bool mpnet) {
  const WordPieceTokenizer whole = Load(model_dir, kWhole, kWhole);
  const std::vector<WordPieceTokenizer> cut = {Load(model_dir, 8, 32), Load(model_dir, 1, 48),
                                               Load(model_dir, 100, 400)};
  std::mt19937 rng(20261201);
  for (int i = 0; i < 150; ++i) {
    const std::string text = RandomText(&rng, 200 + rng() % 3000, mpnet);
    for (const TruncationOptions& truncation :
         {NoTruncation(), Truncate(64, TruncationSide::kRight), Truncate(64, TruncationSide::kLeft),
          Truncate(600, TruncationSide::kLeft)}) {
      absl::StatusOr<Encoding> want = whole.Encode(text, truncation);
      ASSERT_TRUE(want.ok()) << want.status();
      for (size_t k = 0; k < cut.size(); ++k) {
        absl::StatusOr<Encoding> got = cut[k].Encode(text, truncation);
        ASSERT_TRUE(got.ok()) << got.status();
        ExpectSameEncoding(*got, *want,
                           absl::StrFormat("text %d, cut %d, max_length %d side %d: %s", i, k,
                                           truncation.enabled ? truncation.max_length : -1,
                                           static_cast<int>(truncation.side), Describe(text)));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    // Pairs, truncated longest-first.
    const std::string second = RandomText(&rng, 100 + rng() % 800, mpnet);
    const TruncationOptions pair = Truncate(97, TruncationSide::kRight);
    absl::StatusOr<Encoding> want = whole.EncodePair(text, second, pair);
    absl::StatusOr<Encoding> got = cut[0].EncodePair(text, second, pair);
    ASSERT_TRUE(want.ok() && got.ok());
    ExpectSameEncoding(*got, *want, "pair " + Describe(text));
  }
}

TEST(TokenizerBoundedTest, CuttingIntoBlocksChangesNothingMiniLM) {
  CheckCuttingChangesNothing(ATTN_TEST_MODEL_DIR, false);
}

TEST(TokenizerBoundedTest, CuttingIntoBlocksChangesNothingMPNet) {
  CheckCuttingChangesNothing(ATTN_TEST_MPNET_MODEL_DIR, true);
}

// Hugging Face's answers (tests/golden/tokenizer_cases.json) with a cut every few bytes.
TEST(TokenizerBoundedTest, GoldenCasesWithTinyBlocks) {
  const WordPieceTokenizer tiny = Load(ATTN_TEST_MODEL_DIR, 4, 32);
  std::ifstream in(std::string(ATTN_GOLDEN_DIR) + "/tokenizer_cases.json");
  std::stringstream contents;
  contents << in.rdbuf();
  const Json cases = Json::parse(contents.str());
  int checked = 0;
  for (const Json& c : cases) {
    TruncationOptions truncation = NoTruncation();
    if (!c["max_length"].is_null()) {
      truncation =
          Truncate(c["max_length"].get<int>(),
                   c["truncation_side"] == "left" ? TruncationSide::kLeft : TruncationSide::kRight);
    }
    const std::string text = c["text"];
    absl::StatusOr<Encoding> got =
        c["text_pair"].is_null()
            ? tiny.Encode(text, truncation)
            : tiny.EncodePair(text, c["text_pair"].get<std::string>(), truncation);
    if (!got.ok()) continue;  // the invalid-input cases are the other test's
    EXPECT_EQ(got->ids, c["input_ids"].get<std::vector<int32_t>>()) << Describe(text);
    const Json& offsets = c["offset_mapping"];
    for (size_t k = 0; k < offsets.size() && k < got->char_start.size(); ++k) {
      EXPECT_EQ(got->char_start[k], offsets[k][0].get<int>()) << Describe(text) << " token " << k;
      EXPECT_EQ(got->char_end[k], offsets[k][1].get<int>()) << Describe(text) << " token " << k;
    }
    ++checked;
  }
  EXPECT_GT(checked, 250);
}

// Words longer than the long-word threshold: one [UNK] over the word's surviving characters,
// unless at most 100 survive normalisation, which then tokenize as the word does.
TEST(TokenizerBoundedTest, LongWordsAsWhole) {
  const WordPieceTokenizer whole = Load(ATTN_TEST_MODEL_DIR, kWhole, kWhole);
  const WordPieceTokenizer bounded = Load(ATTN_TEST_MODEL_DIR, 16 << 10, 64 << 10);
  std::string marks;
  for (int i = 0; i < 100000; ++i) marks += "\xcc\x81";  // U+0301
  std::string zero_width;
  for (int i = 0; i < 100000; ++i) zero_width += "\xe2\x80\x8b";  // U+200B
  const std::vector<std::string> texts = {
      std::string(1 << 20, 'a'),
      "before " + std::string(300000, 'b') + " after",
      "a" + marks,
      "x" + marks + " tail",
      "\x01\x01" + std::string(100000, 'c') + "\x01",
      "ab" + zero_width + "cd" + zero_width + "ef and more",
      "unaff" + zero_width + "able",
  };
  for (const std::string& text : texts) {
    for (const TruncationOptions& truncation :
         {NoTruncation(), Truncate(8, TruncationSide::kLeft)}) {
      absl::StatusOr<Encoding> want = whole.Encode(text, truncation);
      absl::StatusOr<Encoding> got = bounded.Encode(text, truncation);
      ASSERT_TRUE(want.ok() && got.ok());
      ExpectSameEncoding(*got, *want, Describe(text));
    }
  }
}

// A truncated text is tokenized up to what is kept plus the look-ahead: its length is then a
// lower bound that says so, the kept tokens are exact (from either end), and a 40 MB text costs
// about what a short one does.
TEST(TokenizerBoundedTest, TruncatedTextsStopAfterTheLookAhead) {
  const WordPieceTokenizer bounded = Load(ATTN_TEST_MODEL_DIR, 16 << 10, 64 << 10);
  const WordPieceTokenizer whole = Load(ATTN_TEST_MODEL_DIR, kWhole, kWhole);
  std::string words;
  for (int i = 0; words.size() < (2 << 20); ++i) {
    words += "word" + std::to_string(i % 997) + (i % 13 == 0 ? ". " : " ");
  }
  for (TruncationSide side : {TruncationSide::kRight, TruncationSide::kLeft}) {
    absl::StatusOr<Encoding> want = whole.Encode(words, Truncate(256, side));
    absl::StatusOr<Encoding> got = bounded.Encode(words, Truncate(256, side, 8192));
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->ids, want->ids);
    EXPECT_EQ(got->byte_start, want->byte_start);
    EXPECT_EQ(got->char_start, want->char_start);
    EXPECT_TRUE(got->truncated);
    EXPECT_TRUE(got->untruncated_length_is_lower_bound);
    EXPECT_GE(got->untruncated_length, 256 + 8192);
    EXPECT_LT(got->untruncated_length, want->untruncated_length);
    EXPECT_FALSE(want->untruncated_length_is_lower_bound);
  }
  // Within the look-ahead the length is exact.
  absl::StatusOr<Encoding> short_text =
      bounded.Encode(words.substr(0, 20000), Truncate(256, TruncationSide::kRight, 8192));
  absl::StatusOr<Encoding> short_whole =
      whole.Encode(words.substr(0, 20000), Truncate(256, TruncationSide::kRight));
  ASSERT_TRUE(short_text.ok() && short_whole.ok());
  EXPECT_EQ(short_text->untruncated_length, short_whole->untruncated_length);
  EXPECT_FALSE(short_text->untruncated_length_is_lower_bound);

  std::string huge;
  huge.reserve(40 << 20);
  while (huge.size() < (40 << 20)) huge += words;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Encoding> right =
      bounded.Encode(huge, Truncate(256, TruncationSide::kRight, 8192));
  absl::StatusOr<Encoding> left = bounded.Encode(huge, Truncate(256, TruncationSide::kLeft, 8192));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(right.ok() && left.ok());
  EXPECT_EQ(right->size(), 256);
  EXPECT_EQ(left->size(), 256);
  // Both ends of 40 MB in well under a second (validating the UTF-8 reads it all once; whole,
  // tokenizing it took tens of seconds and about a gigabyte).
  EXPECT_LT(seconds, 5.0);
  std::printf("40 MB text truncated at both ends in %.3f s\n", seconds);
  // Invalid UTF-8 past what is kept is still found.
  std::string bad = words;
  bad[bad.size() - 10] = '\xff';
  absl::StatusOr<Encoding> refused =
      bounded.Encode(bad, Truncate(256, TruncationSide::kRight, 8192));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("invalid UTF-8 at byte offset"), std::string::npos);
}

}  // namespace
}  // namespace attn
