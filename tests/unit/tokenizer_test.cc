// WordPieceTokenizer against Hugging Face's BertTokenizerFast (tests/golden/tokenizer_cases.json,
// made by tests/golden/make_tokenizer_cases.py), plus direct tests of offsets, UTF-8 validation,
// FromIds and FromModelDir.
#include "engine/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

using Json = nlohmann::json;

const WordPieceTokenizer& DefaultTokenizer() {
  static const WordPieceTokenizer* tok = [] {
    absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(ATTN_TEST_MODEL_DIR);
    if (!t.ok()) {
      std::fprintf(stderr, "cannot load tokenizer: %s\n", t.status().ToString().c_str());
      std::abort();
    }
    return new WordPieceTokenizer(std::move(*t));
  }();
  return *tok;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

// Printable rendering of a text for failure messages: non-ASCII stays (UTF-8), controls escape.
std::string Escape(const std::string& s, size_t max_bytes = 120) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\x%02X", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max_bytes) out += absl::StrFormat("... (%d bytes)", s.size());
  return out;
}

// Byte offset of each code point of a (valid) UTF-8 string, plus the end.
std::vector<int> CodePointStarts(const std::string& s) {
  std::vector<int> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(static_cast<int>(i));
  }
  starts.push_back(static_cast<int>(s.size()));
  return starts;
}

struct GoldenCase {
  int index;
  std::string text;
  bool has_pair;
  std::string text_pair;
  TruncationOptions truncation;
  std::vector<int32_t> ids, type_ids;
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> offsets;
};

std::vector<GoldenCase> LoadGoldenCases() {
  const std::string path = std::string(ATTN_GOLDEN_DIR) + "/tokenizer_cases.json";
  const std::string text = ReadFile(path);
  EXPECT_FALSE(text.empty()) << "cannot read " << path;
  const Json json = Json::parse(text);
  std::vector<GoldenCase> cases;
  for (size_t i = 0; i < json.size(); ++i) {
    const Json& c = json[i];
    GoldenCase g;
    g.index = static_cast<int>(i);
    g.text = c["text"].get<std::string>();
    g.has_pair = !c["text_pair"].is_null();
    if (g.has_pair) g.text_pair = c["text_pair"].get<std::string>();
    g.truncation.enabled = !c["max_length"].is_null();
    if (g.truncation.enabled) g.truncation.max_length = c["max_length"].get<int>();
    g.truncation.side =
        c["truncation_side"] == "left" ? TruncationSide::kLeft : TruncationSide::kRight;
    g.ids = c["input_ids"].get<std::vector<int32_t>>();
    g.type_ids = c["token_type_ids"].get<std::vector<int32_t>>();
    g.tokens = c["tokens"].get<std::vector<std::string>>();
    for (const Json& o : c["offset_mapping"]) {
      g.offsets.emplace_back(o[0].get<int32_t>(), o[1].get<int32_t>());
    }
    cases.push_back(std::move(g));
  }
  return cases;
}

// Empty if the encoding equals the golden one; otherwise a readable description of the first
// mismatch.
std::string Compare(const GoldenCase& g, const Encoding& e) {
  const size_t n = std::max(g.ids.size(), e.ids.size());
  for (size_t i = 0; i < n; ++i) {
    auto describe = [&](const char* what, const std::string& want, const std::string& got) {
      std::string s = absl::StrFormat("first mismatch at position %d (%s): want %s, got %s\n", i,
                                      what, want, got);
      const size_t lo = i >= 3 ? i - 3 : 0;
      for (size_t k = lo; k < std::min(n, i + 4); ++k) {
        auto side = [&](bool golden) {
          const size_t size = golden ? g.ids.size() : e.ids.size();
          if (k >= size) return std::string("-");
          return golden ? absl::StrFormat("%s(%d) t%d [%d,%d)", g.tokens[k], g.ids[k],
                                          g.type_ids[k], g.offsets[k].first, g.offsets[k].second)
                        : absl::StrFormat("%s(%d) t%d [%d,%d)", e.tokens[k], e.ids[k],
                                          e.type_ids[k], e.char_start[k], e.char_end[k]);
        };
        s += absl::StrFormat("  %s%3d  hf: %-32s  ours: %s\n", k == i ? ">" : " ", k, side(true),
                             side(false));
      }
      return s;
    };
    if (i >= g.ids.size() || i >= e.ids.size()) {
      return describe("length", std::to_string(g.ids.size()), std::to_string(e.ids.size()));
    }
    if (g.ids[i] != e.ids[i]) {
      return describe("id", std::to_string(g.ids[i]), std::to_string(e.ids[i]));
    }
    if (g.tokens[i] != e.tokens[i]) return describe("token", g.tokens[i], e.tokens[i]);
    if (g.type_ids[i] != e.type_ids[i]) {
      return describe("type id", std::to_string(g.type_ids[i]), std::to_string(e.type_ids[i]));
    }
    if (g.offsets[i].first != e.char_start[i] || g.offsets[i].second != e.char_end[i]) {
      return describe("char offsets",
                      absl::StrFormat("[%d,%d)", g.offsets[i].first, g.offsets[i].second),
                      absl::StrFormat("[%d,%d)", e.char_start[i], e.char_end[i]));
    }
  }
  return "";
}

absl::StatusOr<Encoding> EncodeCase(const WordPieceTokenizer& tok, const GoldenCase& g) {
  return g.has_pair ? tok.EncodePair(g.text, g.text_pair, g.truncation)
                    : tok.Encode(g.text, g.truncation);
}

TEST(TokenizerGolden, MatchesHuggingFaceOnEveryCase) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  const std::vector<GoldenCase> cases = LoadGoldenCases();
  ASSERT_GE(cases.size(), 150u);
  int failures = 0;
  for (const GoldenCase& g : cases) {
    absl::StatusOr<Encoding> e = EncodeCase(tok, g);
    std::string problem = e.ok() ? Compare(g, *e) : e.status().ToString();
    if (problem.empty()) continue;
    ++failures;
    if (failures <= 20) {
      ADD_FAILURE() << "case " << g.index << ": text \"" << Escape(g.text) << "\""
                    << (g.has_pair ? " pair \"" + Escape(g.text_pair) + "\"" : std::string())
                    << (g.truncation.enabled
                            ? absl::StrFormat(
                                  " max_length %d %s", g.truncation.max_length,
                                  g.truncation.side == TruncationSide::kLeft ? "left" : "right")
                            : std::string())
                    << "\n"
                    << problem;
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << cases.size() << " cases differ";
}

// Byte offsets must be the char offsets converted through the text's UTF-8, for every golden
// case, and the other per-token fields must be consistent.
TEST(TokenizerGolden, ByteOffsetsAgreeWithCharOffsets) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  for (const GoldenCase& g : LoadGoldenCases()) {
    absl::StatusOr<Encoding> e = EncodeCase(tok, g);
    ASSERT_TRUE(e.ok()) << e.status();
    const std::vector<int> starts_a = CodePointStarts(g.text);
    const std::vector<int> starts_b = CodePointStarts(g.text_pair);
    ASSERT_EQ(e->byte_start.size(), e->ids.size());
    ASSERT_EQ(e->special_tokens_mask.size(), e->ids.size());
    ASSERT_EQ(e->sequence_index.size(), e->ids.size());
    for (int i = 0; i < e->size(); ++i) {
      if (e->sequence_index[i] < 0) {
        EXPECT_EQ(e->special_tokens_mask[i], 1);
        EXPECT_EQ(e->byte_start[i], 0);
        EXPECT_EQ(e->byte_end[i], 0);
        continue;
      }
      EXPECT_EQ(e->special_tokens_mask[i], 0);
      EXPECT_EQ(e->sequence_index[i], e->type_ids[i]);
      const std::vector<int>& starts = e->sequence_index[i] == 0 ? starts_a : starts_b;
      ASSERT_LT(e->char_end[i], static_cast<int>(starts.size())) << "case " << g.index;
      EXPECT_EQ(e->byte_start[i], starts[e->char_start[i]]) << "case " << g.index << " pos " << i;
      EXPECT_EQ(e->byte_end[i], starts[e->char_end[i]]) << "case " << g.index << " pos " << i;
    }
  }
}

TEST(Tokenizer, LoadsDefaultModelOptions) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  EXPECT_EQ(tok.vocab_size(), 30522);
  EXPECT_EQ(tok.cls_id(), 101);
  EXPECT_EQ(tok.sep_id(), 102);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.unk_id(), 100);
  EXPECT_EQ(tok.TokenToId("hello"), 7592);
  EXPECT_EQ(tok.TokenToId("no-such-token"), -1);
  EXPECT_EQ(tok.IdToToken(7592), "hello");
  const TokenizerOptions& o = tok.options();
  EXPECT_TRUE(o.lowercase);
  EXPECT_TRUE(o.strip_accents);  // null in the config: follows lowercase
  EXPECT_TRUE(o.clean_text);
  EXPECT_TRUE(o.tokenize_chinese_chars);
  EXPECT_EQ(o.max_input_chars_per_word, 100);
  EXPECT_EQ(o.model_max_length, 512);
}

TEST(Tokenizer, ByteOffsetsSliceTheOriginalText) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  // "Café naïve 😀 [SEP] 日本 été", the first é of "été" as e + U+0301. "été" becomes "et" "##e",
  // so a piece boundary falls right after the combining mark.
  const std::string text =
      "Caf\xC3\xA9 na\xC3\xAFve \xF0\x9F\x98\x80 [SEP] \xE6\x97\xA5\xE6\x9C\xAC "
      "e\xCC\x81t\xC3\xA9";
  absl::StatusOr<Encoding> e = tok.Encode(text);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<std::string> slices;
  for (int i = 0; i < e->size(); ++i) {
    if (e->sequence_index[i] < 0) continue;
    ASSERT_LE(e->byte_start[i], e->byte_end[i]);
    ASSERT_LE(e->byte_end[i], static_cast<int>(text.size()));
    slices.push_back(text.substr(e->byte_start[i], e->byte_end[i] - e->byte_start[i]));
  }
  const std::vector<std::string> want = {"Caf\xC3\xA9", "na\xC3\xAFve", "\xF0\x9F\x98\x80",
                                         "[SEP]",       "\xE6\x97\xA5", "\xE6\x9C\xAC",
                                         "e\xCC\x81t",  "\xC3\xA9"};
  EXPECT_EQ(slices, want);
  // The emoji is one code point but four bytes: char and byte offsets differ from there on.
  EXPECT_EQ(e->tokens[3], "[UNK]");
  EXPECT_EQ(e->char_start[3], 11);
  EXPECT_EQ(e->char_end[3], 12);
  EXPECT_EQ(e->byte_start[3], 13);
  EXPECT_EQ(e->byte_end[3], 17);
  // "[SEP]" typed in the text is the [SEP] id but not a template special token.
  EXPECT_EQ(e->ids[4], tok.sep_id());
  EXPECT_EQ(e->special_tokens_mask[4], 0);
  EXPECT_EQ(e->sequence_index[4], 0);
}

TEST(Tokenizer, SpecialTokensAndPairMetadata) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  absl::StatusOr<Encoding> e = tok.EncodePair("hello world", "bye");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens,
            (std::vector<std::string>{"[CLS]", "hello", "world", "[SEP]", "bye", "[SEP]"}));
  EXPECT_EQ(e->type_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(e->special_tokens_mask, (std::vector<uint8_t>{1, 0, 0, 1, 0, 1}));
  EXPECT_EQ(e->sequence_index, (std::vector<int8_t>{-1, 0, 0, -1, 1, -1}));
  EXPECT_EQ(e->char_start[4], 0);  // offsets of the second text refer to the second text
  EXPECT_EQ(e->char_end[4], 3);
  EXPECT_FALSE(e->truncated);
  EXPECT_EQ(e->untruncated_length, 6);
}

TEST(Tokenizer, TruncationReportsLengths) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  TruncationOptions t;
  t.max_length = 4;
  absl::StatusOr<Encoding> e = tok.Encode("one two three four five", t);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "one", "two", "[SEP]"}));
  EXPECT_TRUE(e->truncated);
  EXPECT_EQ(e->untruncated_length, 7);

  t.side = TruncationSide::kLeft;
  e = tok.Encode("one two three four five", t);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "four", "five", "[SEP]"}));

  // Longest-first as the tokenizers crate does it: equal lengths split budget/2 to the first,
  // the rest to the second (a one-at-a-time loop would give (3, 2) here).
  t.side = TruncationSide::kRight;
  t.max_length = 8;
  e = tok.EncodePair("a b c d e", "f g h i j", t);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens,
            (std::vector<std::string>{"[CLS]", "a", "b", "[SEP]", "f", "g", "h", "[SEP]"}));

  t.enabled = false;
  e = tok.Encode("one two three four five", t);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->size(), 7);
  EXPECT_FALSE(e->truncated);
}

TEST(Tokenizer, MaxLengthShorterThanSpecialTokensIsAnError) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  TruncationOptions t;
  t.max_length = 1;
  absl::StatusOr<Encoding> e = tok.Encode("hello", t);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  t.max_length = 2;
  EXPECT_TRUE(tok.Encode("hello", t).ok());
  e = tok.EncodePair("a", "b", t);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("max_length 2"), std::string::npos) << e.status();
}

TEST(Tokenizer, InvalidUtf8NamesTheByteOffset) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  struct Bad {
    std::string text;
    int offset;
    const char* what;
  };
  const Bad bad[] = {
      {std::string("ab\x80"
                   "cd"),
       2, "lone continuation byte"},
      {std::string("abc\xE2\x82"), 3, "truncated 3-byte sequence at the end"},
      {std::string("x\xE2\x82y"), 1, "truncated 3-byte sequence inside"},
      {std::string("\xC0\xAF"), 0, "overlong 2-byte encoding of '/'"},
      {std::string("ok \xE0\x80\xAF"), 3, "overlong 3-byte encoding"},
      {std::string("\xF0\x80\x80\xAF"), 0, "overlong 4-byte encoding"},
      {std::string("xy\xED\xA0\x80"), 2, "high surrogate U+D800"},
      {std::string("\xED\xBF\xBFz"), 0, "low surrogate U+DFFF"},
      {std::string("\xF4\x90\x80\x80"), 0, "above U+10FFFF"},
      {std::string("\xC3\xA9\xFF"), 2, "byte 0xFF"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<Encoding> e = tok.Encode(b.text);
    ASSERT_FALSE(e.ok()) << b.what;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << b.what;
    EXPECT_NE(e.status().message().find(absl::StrFormat("byte offset %d", b.offset)),
              std::string::npos)
        << b.what << ": " << e.status();
  }
  absl::StatusOr<Encoding> e = tok.EncodePair("fine", "bad\x80");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("text_b"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("byte offset 3"), std::string::npos) << e.status();
  // The largest valid code points and a NUL are fine.
  EXPECT_TRUE(tok.Encode(std::string("\xF4\x8F\xBF\xBF \xEF\xBF\xBF a\0b", 12)).ok());
}

TEST(Tokenizer, FromIdsValidates) {
  const WordPieceTokenizer& tok = DefaultTokenizer();
  absl::StatusOr<Encoding> e = tok.FromIds({101, 7592, 102}, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "hello", "[SEP]"}));
  EXPECT_EQ(e->type_ids, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(e->special_tokens_mask, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(e->char_end, (std::vector<int32_t>{0, 0, 0}));

  e = tok.FromIds({101, 7592, 102, 2088, 102}, {0, 0, 0, 1, 1});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type_ids[3], 1);

  e = tok.FromIds({101, -1, 102});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("position 1"), std::string::npos) << e.status();

  e = tok.FromIds({101, 102, tok.vocab_size()});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("position 2"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("30522"), std::string::npos) << e.status();

  e = tok.FromIds({101, 102}, {0, 2});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("position 1"), std::string::npos) << e.status();

  e = tok.FromIds({101, 102}, {0});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);

  e = tok.FromIds({});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0);
}

// A scratch directory under /tmp, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/attn_tokenizer_test_XXXXXX";
    const char* dir = ::mkdtemp(pattern);
    EXPECT_NE(dir, nullptr);
    path_ = dir != nullptr ? dir : "/tmp";
  }
  ~TempDir() {
    for (const std::string& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string p = path_ + "/" + name;
    WriteFile(p, contents);
    files_.push_back(p);
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

TEST(Tokenizer, FromModelDirErrorsNameTheProblem) {
  absl::StatusOr<WordPieceTokenizer> t =
      WordPieceTokenizer::FromModelDir("/nonexistent/attn/model/dir");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/attn/model/dir"), std::string::npos)
      << t.status();

  TempDir dir;
  t = WordPieceTokenizer::FromModelDir(dir.path());  // empty: no vocab anywhere
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("vocab.txt"), std::string::npos) << t.status();

  dir.Write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n");
  dir.Write("tokenizer_config.json", "{\"do_lower_case\": tru");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos) << t.status();

  dir.Write("tokenizer_config.json", "{\"do_lower_case\": \"yes\"}");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_NE(t.status().message().find("do_lower_case"), std::string::npos) << t.status();

  dir.Write("tokenizer_config.json", "{\"unk_token\": \"<unk>\"}");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_NE(t.status().message().find("<unk>"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("vocab.txt"), std::string::npos) << t.status();

  dir.Write("tokenizer_config.json", "{}");
  dir.Write("tokenizer.json", "{\"normalizer\": {\"type\": \"NFKC\"}}");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("NFKC"), std::string::npos) << t.status();

  dir.Write("tokenizer.json", "{\"normalizer\": \"BertNormalizer\"}");  // wrong structure
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos) << t.status();

  dir.Write("tokenizer.json",
            "{\"added_tokens\": [{\"id\": 5, \"content\": \"hello\", \"single_word\": true}]}");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  EXPECT_NE(t.status().message().find("single_word"), std::string::npos) << t.status();

  dir.Write("tokenizer.json", "{}");
  t = WordPieceTokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->vocab_size(), 6);
}

TEST(Tokenizer, AddedTokensFromTokenizerJsonMatchVerbatim) {
  TempDir dir;
  dir.Write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nHeLLo\nx\ny\n");
  dir.Write("tokenizer.json",
            "{\"added_tokens\": [{\"id\": 5, \"content\": \"HeLLo\", \"special\": false, "
            "\"normalized\": false, \"lstrip\": false, \"rstrip\": false, "
            "\"single_word\": false}]}");
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  // Matched in the raw text, inside a word and case-sensitively; the rest is normalized.
  absl::StatusOr<Encoding> e = t->Encode("XHeLLoY hello");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "x", "HeLLo", "y", "[UNK]", "[SEP]"}));
  EXPECT_EQ(e->char_start, (std::vector<int32_t>{0, 0, 1, 6, 8, 0}));
  EXPECT_EQ(e->char_end, (std::vector<int32_t>{0, 1, 6, 7, 13, 0}));
}

// normalized=true (MPNet's "<unk>"): matched in the normalized text, so case-insensitively
// under lower-casing, and only between the raw-text matches.
TEST(Tokenizer, NormalizedAddedTokensMatchAfterNormalization) {
  TempDir dir;
  dir.Write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n<unk>\nx\n<\n>\nunk\n");
  dir.Write("tokenizer.json",
            "{\"added_tokens\": [{\"id\": 5, \"content\": \"<unk>\", \"normalized\": true, "
            "\"lstrip\": true}]}");
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Encoding> e = t->Encode("x<UNK>x <unk>");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "x", "<unk>", "x", "<unk>", "[SEP]"}));
  EXPECT_EQ(e->char_start, (std::vector<int32_t>{0, 0, 1, 6, 8, 0}));
  EXPECT_EQ(e->char_end, (std::vector<int32_t>{0, 1, 6, 7, 13, 0}));
}

TEST(Tokenizer, EmptySpecialTokenIsRejected) {
  TokenizerOptions o;
  o.mask_token = "";
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", ""};
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromVocab(vocab, o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("mask_token"), std::string::npos) << t.status();
}

// Without vocab.txt the vocab comes from tokenizer.json; the encodings must not change.
TEST(Tokenizer, FromModelDirFallsBackToTokenizerJson) {
  TempDir dir;
  const std::string model = ATTN_TEST_MODEL_DIR;
  dir.Write("tokenizer.json", ReadFile(model + "/tokenizer.json"));
  dir.Write("tokenizer_config.json", ReadFile(model + "/tokenizer_config.json"));
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->vocab_size(), 30522);
  const WordPieceTokenizer& ref = DefaultTokenizer();
  for (const char* text : {"Hello, world!", "naïve café 日本語 [SEP] 😀", "unaffable"}) {
    absl::StatusOr<Encoding> a = t->Encode(text);
    absl::StatusOr<Encoding> b = ref.Encode(text);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->ids, b->ids) << text;
    EXPECT_EQ(a->char_start, b->char_start) << text;
  }
}

TEST(Tokenizer, ConfigOverridesTokenizerJsonNormalizer) {
  // As in transformers: tokenizer_config.json's do_lower_case wins over tokenizer.json, and a
  // null strip_accents then follows it.
  TempDir dir;
  dir.Write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nHello\n");
  dir.Write("tokenizer.json",
            "{\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, "
            "\"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true}}");
  dir.Write("tokenizer_config.json", "{\"do_lower_case\": false, \"strip_accents\": null}");
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->options().lowercase);
  EXPECT_FALSE(t->options().strip_accents);
  absl::StatusOr<Encoding> e = t->Encode("Hello hello");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "Hello", "hello", "[SEP]"}));
}

std::vector<std::string> SmallVocab() {
  return {"[PAD]", "[UNK]",  "[CLS]", "[SEP]",      "[MASK]", "un",
          "##aff", "##able", "i",     "##\xCC\x87", "a",      "##a"};
}

TEST(Tokenizer, FromVocabRequiresSpecialTokens) {
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromVocab({"a", "b"}, {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("[UNK]"), std::string::npos) << t.status();
  EXPECT_TRUE(WordPieceTokenizer::FromVocab(SmallVocab(), {}).ok());
}

TEST(Tokenizer, WordPieceGreedyAndUnknownWords) {
  TokenizerOptions o;
  o.max_input_chars_per_word = 5;
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromVocab(SmallVocab(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Encoding> e = t->Encode("unaffable aaaaa aaaaaa");
  ASSERT_TRUE(e.ok()) << e.status();
  // "unaffable" (9 chars) and "aaaaaa" (6) are longer than 5 chars: one [UNK] each.
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "[UNK]", "a", "##a", "##a", "##a", "##a",
                                                 "[UNK]", "[SEP]"}));
  EXPECT_EQ(e->char_start[7], 16);
  EXPECT_EQ(e->char_end[7], 22);

  o.max_input_chars_per_word = 100;
  t = WordPieceTokenizer::FromVocab(SmallVocab(), o);
  ASSERT_TRUE(t.ok());
  // "unaffx" starts "un" "##aff" but "x" has no piece: the whole word is one [UNK].
  e = t->Encode("unaffable unaffx");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tokens,
            (std::vector<std::string>{"[CLS]", "un", "##aff", "##able", "[UNK]", "[SEP]"}));
  EXPECT_EQ(e->char_start[4], 10);
  EXPECT_EQ(e->char_end[4], 16);
}

TEST(Tokenizer, LowercaseWithoutStrippingKeepsFullLowercaseAlignment) {
  // Rust's to_lowercase maps U+0130 to "i" + U+0307: two normalized chars, both aligned to the
  // one original char.
  TokenizerOptions o;
  o.strip_accents = false;
  absl::StatusOr<WordPieceTokenizer> t = WordPieceTokenizer::FromVocab(SmallVocab(), o);
  ASSERT_TRUE(t.ok());
  absl::StatusOr<Encoding> e = t->Encode("\xC4\xB0");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<std::string>{"[CLS]", "i", "##\xCC\x87", "[SEP]"}));
  EXPECT_EQ(e->char_start, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(e->char_end, (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(e->byte_end, (std::vector<int32_t>{0, 2, 2, 0}));
}

}  // namespace
}  // namespace attn
