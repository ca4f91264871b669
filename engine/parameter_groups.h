// The encoder's parameters as the groups people ask about: each embedding table, W_Q, W_K, W_V
// (row blocks of the fused qkv matrix), W_O, FFN in, FFN out and each LayerNorm per layer. A
// group is its matrix with its bias (a LayerNorm: gamma with beta). Training telemetry and
// version comparison report per group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/weights.h"

namespace attn {

// Rows [row_begin, row_end) of one tensor (elements, for a 1-D tensor).
struct TensorRows {
  const Tensor* tensor = nullptr;
  int64_t row_begin = 0, row_end = 0;

  int64_t row_length() const;
  const float* begin() const;
  int64_t size() const { return (row_end - row_begin) * row_length(); }
};

struct ParameterGroup {
  std::string name;  // "embeddings.word", "layers.3.query", "layers.3.ffn_norm", ...
  std::string kind;  // "word_embeddings", "W_Q", "W_K", "W_V", "W_O", "FFN_in", "FFN_out",
                     // "LayerNorm", "position_embeddings", "token_type_embeddings",
                     // "relative_attention_bias"
  int layer = -1;    // 0-based encoder layer; -1 outside the layers
  std::vector<TensorRows> parts;
};

// The groups of `weights`, in a fixed order: the same names and order for any two weights of
// one config, so groups of weights, gradients and another version pair up by index.
std::vector<ParameterGroup> ParameterGroups(const BertWeights& weights);

// Σ x² over the group, and Σ (a - b)² over two groups of the same shapes, in double.
double SquaredNorm(const ParameterGroup& group);
double SquaredDistance(const ParameterGroup& a, const ParameterGroup& b);

}  // namespace attn
