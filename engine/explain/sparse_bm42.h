// BM42 sparse vectors from the encoder's own attention, compatible with Qdrant's fastembed
// (model "Qdrant/bm42-all-minilm-l6-v2-attentions", which is all-MiniLM-L6-v2 exporting its
// last attention layer), so vectors from fastembed and from this engine can share one Qdrant
// sparse collection (configured with modifier=idf, as fastembed asks).
//
// The recipe, step by step (fastembed's Bm42 document path):
//  1. Attention: the LAST encoder layer's post-softmax probabilities, the [CLS] row (query 0,
//     every key), averaged over the heads: w[t] = mean_h P[h, 0, t]. Unpadded, so no mask.
//  2. Words: walk the tokens in order; special tokens ([CLS] [SEP] [PAD] [UNK] [MASK]) are
//     skipped WITHOUT ending the current word; a token starting with "##" appends (prefix
//     removed) to the current word; any other token ends the current word and starts a new one.
//     A word's weight is the SUM of its pieces' w.
//  3. Filter: drop a word that is a stop word (the model directory's stopwords.txt, one word a
//     line, as fastembed loads it; else the built-in English list, NLTK's 179 words, below) or
//     a single punctuation character (Python's string.punctuation:
//     !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~). The check is on the unstemmed word.
//  4. Stem: Snowball English (Porter2) via libstemmer (fastembed: py_rust_stemmers' "english").
//  5. Duplicates: words with the same stem keep the MAX of their weights.
//  6. Index: |murmur3_x86_32(UTF-8 bytes of the stem, seed 0) as a signed int32| (mmh3.hash,
//     then Python's abs: 2^31 for INT32_MIN), an unsigned 32-bit index. Two stems hashing to one
//     index: the later stem (first-occurrence order) wins, as fastembed's dict assignment.
//  7. Value: log(1 + weight) ^ alpha, alpha = 0.5 (fastembed's default; alpha = 1 gives the
//     plain log(1 + w) of the BM42 article).
// The output is sorted by index (fastembed keeps insertion order; Qdrant does not care).
//
// Attention-weighted pooling uses the same w: pooled = sum_t w[t] h[t] over the last hidden
// states (w sums to 1: every softmax row does, and so does their mean over heads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/tensor.h"
#include "engine/tokenizer.h"

struct sb_stemmer;

namespace attn {

struct SparseVector {
  std::vector<uint32_t> indices;  // ascending
  std::vector<float> values;
};

struct Bm42Options {
  float alpha = 0.5f;  // value = log(1 + w) ^ alpha
};

// murmur3 x86 32-bit (Appleby's MurmurHash3_x86_32), as Python's mmh3.hash returns it (signed).
int32_t Murmur3Hash32(std::string_view bytes, uint32_t seed = 0);
// The BM42 index of a stemmed word: |Murmur3Hash32(word)| as unsigned.
uint32_t Bm42Index(std::string_view word);

// w[t] = mean over heads of probs[h, 0, t]; probs: (heads, T, T) of the last layer.
std::vector<float> ClsAttentionOverHeads(const Tensor& probs);

// pooled (H) = sum_t weights[t] * hidden[t]; hidden: (T, H) one sequence's last hidden states.
void AttentionWeightedPool(const float* hidden, int64_t tokens, int64_t hidden_size,
                           absl::Span<const float> weights, float* pooled);

class Bm42Encoder {
 public:
  // Stop words from `model_dir`/stopwords.txt when that file exists, else the built-in list.
  static absl::StatusOr<std::unique_ptr<Bm42Encoder>> Create(const WordPieceTokenizer& tokenizer,
                                                             const std::string& model_dir);
  ~Bm42Encoder();
  Bm42Encoder(const Bm42Encoder&) = delete;
  Bm42Encoder& operator=(const Bm42Encoder&) = delete;

  // encoding: the tokens the attention was computed on; cls_attention: (T) from
  // ClsAttentionOverHeads. InvalidArgument if the lengths differ.
  absl::StatusOr<SparseVector> Encode(const Encoding& encoding,
                                      absl::Span<const float> cls_attention,
                                      const Bm42Options& options = {}) const;

  // Steps 2-4 for one text (exposed for tests): (stem, summed weight) per kept word, in order.
  std::vector<std::pair<std::string, float>> StemmedWords(
      const Encoding& encoding, absl::Span<const float> cls_attention) const;

  std::string Stem(std::string_view word) const;
  bool IsStopWord(std::string_view word) const { return stop_words_.count(std::string(word)); }
  size_t num_stop_words() const { return stop_words_.size(); }

 private:
  Bm42Encoder() = default;
  std::unordered_set<std::string> special_tokens_;
  std::unordered_set<std::string> stop_words_;
  mutable absl::Mutex mutex_;  // libstemmer's stemmer keeps per-call state
  sb_stemmer* stemmer_ ABSL_GUARDED_BY(mutex_) = nullptr;
};

}  // namespace attn
