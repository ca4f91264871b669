// Static vs contextual neighbours of a word, for the Neighbors call. Transport-free.
//
//   static      the word's vector in the word-embedding table (the mean of its sub-tokens' rows
//               when it has several) against every row: cosine, top k, the word's own ids left
//               out (each is trivially its own nearest row)
//   contextual  for each sentence, the mean of the hidden-state rows of the word's sub-tokens at
//               a layer (0 = the embedding output, L = the last layer), then the pairwise cosine
//               between sentences: the "bank" of a river vs a bank that lends
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace attn {

struct TokenNeighbour {
  int32_t id = 0;
  double cosine = 0;
};

// table: (V, H); query_ids: 1+ valid row ids. The k most similar other rows (ties to the lower
// id), cosine computed in double.
std::vector<TokenNeighbour> StaticNeighbours(const Tensor& table,
                                             const std::vector<int32_t>& query_ids, int k);

// Where the word's sub-tokens `word_ids` first occur, as a contiguous run, in `sentence_ids`:
// the index of the first one, or -1.
int64_t FindSubsequence(const std::vector<int32_t>& sentence_ids,
                        const std::vector<int32_t>& word_ids);

struct ContextualSimilarity {
  std::vector<std::vector<float>> vectors;  // per sentence, (H): the word's mean hidden state
  std::vector<double> cosine;               // (S, S) row-major
};

// `sentences`: token ids with special tokens, and where the word's `word_length` sub-tokens
// start in each. One forward over all sentences on `model`.
absl::StatusOr<ContextualSimilarity> ContextualNeighbours(
    const Model& model, const std::vector<SequenceInput>& sentences,
    const std::vector<int64_t>& word_starts, int64_t word_length, int layer);

}  // namespace attn
