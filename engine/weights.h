// The encoder's parameters, and the one table that maps Hugging Face tensor names to them (one
// set of names per architecture family: BERT, MPNet).
//
// Q, K and V are stored fused as one (3H, H) matrix so the projection is a single matmul;
// the table maps BERT's `attention.self.{query,key,value}` and MPNet's `attention.attn.{q,k,v}`
// to row blocks of it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"

namespace attn {

struct LayerWeights {
  Tensor qkv_weight;          // (3H, H): rows [0,H) query, [H,2H) key, [2H,3H) value
  Tensor qkv_bias;            // (3H)
  Tensor attn_output_weight;  // (H, H)
  Tensor attn_output_bias;    // (H)
  Tensor attn_norm_gamma;     // (H)
  Tensor attn_norm_beta;      // (H)
  Tensor ffn_in_weight;       // (I, H)
  Tensor ffn_in_bias;         // (I)
  Tensor ffn_out_weight;      // (H, I)
  Tensor ffn_out_bias;        // (H)
  Tensor ffn_norm_gamma;      // (H)
  Tensor ffn_norm_beta;       // (H)
};

struct BertWeights {
  Tensor word_embeddings;        // (V, H)
  Tensor position_embeddings;    // (P, H)
  Tensor token_type_embeddings;  // (types, H); empty for MPNet (no token types)
  Tensor embedding_norm_gamma;   // (H)
  Tensor embedding_norm_beta;    // (H)
  std::vector<LayerWeights> layers;
  // MPNet: (buckets, heads), the bias per relative-position bucket and head that every layer
  // adds to its attention scores. Empty for BERT.
  Tensor relative_attention_bias;

  int64_t ParameterCount() const;
};

// Every engine tensor with a stable engine name ("layers.3.qkv_weight"), in a fixed order; the
// same order for any two BertWeights of one config, so parameters and gradients pair up.
std::vector<std::pair<std::string, Tensor*>> EngineTensors(BertWeights* weights);

// One row of the name table: a Hugging Face tensor and where it lives in BertWeights.
struct ParameterSlot {
  std::string hf_name;         // without the family's prefix ("bert.", "mpnet.")
  std::vector<int64_t> shape;  // expected shape in the file
  Tensor* target;              // the engine tensor it fills
  int64_t row_offset;          // first row of `target` it covers (fused QKV), else 0
};

// Allocates every tensor of `weights` for `config` (zero-filled) and returns the name table.
std::vector<ParameterSlot> BuildParameterTable(const BertConfig& config, BertWeights* weights);

// Tensors in a checkpoint of `config`'s family that the encoder knows and deliberately does not
// use.
bool IsIgnoredTensorName(const BertConfig& config, const std::string& hf_name);

// Loads all parameters. Accepts names with or without the family's prefix ("bert.", "mpnet.").
// Errors name the file, the tensor and the expected shape: missing tensor, unknown tensor,
// wrong shape, non-float dtype.
absl::StatusOr<BertWeights> LoadBertWeights(const SafetensorsFile& file, const BertConfig& config);

}  // namespace attn
