// Input embeddings for a packed batch (the "static" embeddings, before any attention):
//   out (M, H) = word_embeddings[token_id] + position_embeddings[position] + type_embeddings[type]
// (MPNet: no type table, out = word + position). Positions restart for every sequence
// (AppendPositionIds). LayerNorm is applied by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"
#include "engine/tensor.h"

namespace attn {

// Appends one sequence's position ids: BERT 0, 1, 2, ...; MPNet as HF
// create_position_ids_from_input_ids: pad + (number of non-pad tokens up to and including this
// one), and pad itself for pad tokens (pad = config.pad_token_id).
void AppendPositionIds(const BertConfig& config, const std::vector<int32_t>& token_ids,
                       std::vector<int32_t>* positions);

// token_ids, type_ids, positions: M entries each, already validated against the tables;
// type_embeddings may be empty (no type table; type_ids unused).
void EmbeddingForward(const Tensor& word_embeddings, const Tensor& position_embeddings,
                      const Tensor& type_embeddings, const std::vector<int32_t>& token_ids,
                      const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                      float* out);

// Backward of out = word[id] + position[pos] + type[type]: scatter-add dout rows into the
// tables' gradients (rows of repeated ids accumulate).
// dout: (M, hidden); dword (vocab, hidden), dposition (max_pos, hidden), dtype (types, hidden)
// are ACCUMULATED into (+=), so zero them once per step; each may be null (skipped).
// Deterministic: every gradient element sums its rows in ascending m, whatever the threads.
void EmbeddingBackward(const float* dout, int64_t hidden, const std::vector<int32_t>& token_ids,
                       const std::vector<int32_t>& type_ids, const std::vector<int32_t>& positions,
                       Tensor* dword, Tensor* dposition, Tensor* dtype);

}  // namespace attn
