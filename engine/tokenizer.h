// WordPiece tokenizer equal to Hugging Face's BertTokenizerFast on the same files:
// BertNormalizer (clean text, CJK spacing, lower-case, strip accents) -> BertPreTokenizer
// (whitespace + punctuation split) -> WordPiece (greedy longest-match-first, "##" prefix,
// [UNK] for words longer than max_input_chars_per_word) -> template [CLS] A [SEP] (B [SEP]);
// and equal to MPNetTokenizerFast on MPNet's files (the same pipeline with <s>/</s> and the
// RobertaProcessing template <s> A </s> (</s> B </s>), all type ids 0).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace attn {

struct TokenizerOptions {
  bool clean_text = true;
  bool tokenize_chinese_chars = true;
  bool lowercase = true;
  // Hugging Face: strip_accents null means "follow lowercase".
  bool strip_accents = true;
  int max_input_chars_per_word = 100;
  std::string continuing_subword_prefix = "##";
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
  // tokenizer_config.json model_max_length (capped by the caller at the model's positions).
  int model_max_length = 512;
  // The pair template: separators between the two texts (1: [SEP]; 2: </s></s>) and the type
  // id of the second text's tokens (BERT 1; RobertaProcessing 0).
  int pair_separators = 1;
  int second_type_id = 1;
  // tokenizer.json's post_processor type; empty without tokenizer.json or post-processor.
  std::string post_processor;
};

enum class TruncationSide { kRight, kLeft };

struct TruncationOptions {
  bool enabled = true;
  // Total length including special tokens.
  int max_length = 512;
  TruncationSide side = TruncationSide::kRight;
  // With truncation, how many tokens past the kept ones a text is counted before tokenizing
  // stops: Encoding::untruncated_length is then a lower bound (and says so). Negative = count
  // to the end. Either way a text is tokenized block by block and only the kept tokens are
  // stored, so memory does not grow with the text (tokenizer_bounded.cc).
  int look_ahead = -1;
};

// One encoded sequence (single text or pair), special tokens included.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;
  std::vector<std::string> tokens;
  // Offsets into the original text, [start, end). Special tokens have (0, 0), as in Hugging
  // Face. char_* count Unicode code points (what Python's str indices are); byte_* are UTF-8
  // byte offsets. For a pair, offsets of the second text's tokens refer to the second text.
  std::vector<int32_t> char_start, char_end;
  std::vector<int32_t> byte_start, byte_end;
  std::vector<uint8_t> special_tokens_mask;  // 1 for [CLS]/[SEP]
  // Which text each token came from: 0 = first, 1 = second, -1 = special token.
  std::vector<int8_t> sequence_index;
  bool truncated = false;
  // Length before truncation (special tokens included).
  int untruncated_length = 0;
  // untruncated_length is a lower bound: counting stopped at TruncationOptions::look_ahead.
  bool untruncated_length_is_lower_bound = false;

  int size() const { return static_cast<int>(ids.size()); }
};

class WordPieceTokenizer {
 public:
  // Reads vocab.txt (or, if absent, the WordPiece vocab in tokenizer.json) and the options in
  // tokenizer_config.json / tokenizer.json's normalizer. Errors name the file and the problem.
  // With `family`, the pair template is the family's, and a tokenizer.json whose
  // post_processor belongs to another family (a BERT tokenizer next to an MPNet config) is
  // refused naming the file and the field.
  static absl::StatusOr<WordPieceTokenizer> FromModelDir(const std::string& model_dir,
                                                         const ArchitectureSpec* family = nullptr);
  // vocab: token per id. Fails if the special tokens are missing from the vocab.
  static absl::StatusOr<WordPieceTokenizer> FromVocab(std::vector<std::string> vocab,
                                                      TokenizerOptions options);

  // Invalid UTF-8 -> InvalidArgument naming the byte offset; so is a truncation max_length below
  // the number of special tokens (Hugging Face silently skips truncation then). Special tokens
  // written in the text ("[SEP]") become their ids, as in Hugging Face. With truncation the text
  // is tokenized only up to what is kept plus `look_ahead` tokens (from the end for left
  // truncation), block by block; the result equals Hugging Face's except inside a "word" (a run
  // without whitespace, punctuation or CJK) over 64 KiB, which becomes one [UNK] unless at most
  // max_input_chars_per_word of its characters survive normalisation (as Hugging Face gives it
  // whenever the word normalises to more characters than that; added tokens inside such a
  // word are not matched).
  absl::StatusOr<Encoding> Encode(std::string_view text,
                                  const TruncationOptions& truncation = {}) const;
  // Longest-first truncation across the two texts, as the tokenizers crate does it. An empty
  // text_b still makes a pair ([CLS] a [SEP] [SEP]), like the crate and transformers' batch API.
  absl::StatusOr<Encoding> EncodePair(std::string_view text_a, std::string_view text_b,
                                      const TruncationOptions& truncation = {}) const;
  // Token ids given directly: validates ids against the vocab; adds no special tokens.
  // Type ids default to 0 when empty.
  absl::StatusOr<Encoding> FromIds(const std::vector<int32_t>& ids,
                                   const std::vector<int32_t>& type_ids = {}) const;

  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  // -1 if not in the vocab.
  int32_t TokenToId(std::string_view token) const;
  const std::string& IdToToken(int32_t id) const { return vocab_.at(id); }
  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  const TokenizerOptions& options() const { return options_; }

  // Tests only: the block size of bounded tokenization (16 KiB) and the run without a place to
  // cut that counts as one long word (64 KiB); tiny blocks check that cutting changes nothing.
  void SetBlockSizesForTesting(size_t block_bytes, size_t max_block_bytes) {
    block_bytes_ = block_bytes;
    max_block_bytes_ = max_block_bytes;
  }

 private:
  struct Piece;  // one token of one text, before [CLS]/[SEP] are added (defined in the .cc)
  // The pieces of one text kept for an encoding, and how many it has (tokenizer_bounded.cc).
  struct TextPieces {
    std::vector<Piece> pieces;  // the first `keep` (right) or the last `keep` (left) pieces
    int64_t count = 0;          // the text's pieces, or a lower bound when !complete
    bool complete = true;
  };
  class BlockScanner;  // where a text may be cut into independently tokenized blocks

  WordPieceTokenizer() = default;

  // Added/special tokens found verbatim in the raw text, then BertNormalizer ->
  // BertPreTokenizer -> WordPiece on the text between them. `what` names the text in errors.
  absl::Status TokenizeText(std::string_view text, std::string_view what,
                            std::vector<Piece>* pieces) const;
  // Validates `text` as UTF-8, then keeps `keep` pieces from the `side` end of it and counts
  // pieces until `count_limit` (or the end), tokenizing block by block (tokenizer_bounded.cc).
  absl::Status TokenizeBounded(std::string_view text, std::string_view what, TruncationSide side,
                               int64_t keep, int64_t count_limit, TextPieces* out) const;
  // The pieces of text[begin, end) (a block between two cuts), offsets into the whole text.
  absl::Status TokenizeBlock(std::string_view text, size_t begin, size_t end, int64_t char_base,
                             std::vector<Piece>* pieces) const;
  // Forward over text[begin, n), block by block: `visit` gets each block's pieces and returns
  // false to stop. *end_reached: whether the whole rest of the text was visited.
  template <typename Visit>
  absl::Status ForEachBlock(const BlockScanner& scanner, size_t begin, int64_t char_base,
                            Visit visit, bool* end_reached) const;
  // A run without a place to cut for 64 KiB: one "word" (see Encode), text[begin, end).
  absl::Status TokenizeLongWord(std::string_view text, size_t begin, size_t end, int64_t char_base,
                                std::vector<Piece>* pieces) const;
  absl::Status TokenizeForEncoding(std::string_view text, std::string_view what,
                                   const TruncationOptions& truncation, int num_special,
                                   TextPieces* out) const;
  absl::StatusOr<Encoding> Assemble(const TextPieces& a, const TextPieces* b,
                                    const TruncationOptions& truncation) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  TokenizerOptions options_;
  int32_t cls_id_ = -1, sep_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  // Tokens matched in the raw text before normalization (Hugging Face's added vocabulary with
  // normalized=false: the special tokens, plus tokenizer.json's added_tokens), longest first.
  std::vector<std::pair<std::string, int32_t>> added_tokens_;
  // tokenizer.json added tokens with normalized=true (MPNet's "<unk>"): matched in the
  // normalized text, between the raw-text matches above, as code points.
  std::vector<std::pair<std::u32string, int32_t>> normalized_added_tokens_;
  // Longest vocab entry in bytes: longer WordPiece candidates cannot match, so are not looked up.
  int max_token_bytes_ = 0;
  size_t block_bytes_ = 16 << 10;      // a block ends at the first cut after this many bytes
  size_t max_block_bytes_ = 64 << 10;  // no cut within this many: a long word
};

}  // namespace attn
