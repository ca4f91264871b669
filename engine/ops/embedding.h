// BERT input embeddings for a packed batch (the "static" embeddings, before any attention):
//   out (M, H) = word_embeddings[token_id] + position_embeddings[position] + type_embeddings[type]
// Positions restart at 0 for every sequence. LayerNorm is applied by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace attn {

// token_ids, type_ids, positions: M entries each, already validated against the tables.
void EmbeddingForward(const Tensor& word_embeddings, const Tensor& position_embeddings,
                      const Tensor& type_embeddings, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                      float* out);

}  // namespace attn
