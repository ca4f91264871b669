// The encoder's linear layers prepared for the inference forward: packed fp32 copies, int8
// quantisations or bfloat16 conversions made once per model version (at load, or when a fine-tuned
// version is published), or zero-copy fp32 views for one-off forwards on raw BertWeights.
// Embeddings, LayerNorm parameters and biases are read from the BertWeights in place, so the
// BertWeights must outlive this and stay at the same address.
#pragma once

#include <vector>

#include "engine/ops/prepared_linear.h"
#include "engine/precision.h"
#include "engine/weights.h"

namespace attn {

// Which linear layers of each encoder layer run in int8 under Precision::kInt8 (the others
// stay fp32).
struct Int8Linears {
  bool qkv = true;
  bool attn_output = true;
  bool ffn_in = true;
  bool ffn_out = true;
};

struct InferenceLayer {
  PreparedLinear qkv;          // (3H, H)
  PreparedLinear attn_output;  // (H, H)
  PreparedLinear ffn_in;       // (I, H)
  PreparedLinear ffn_out;      // (H, I)
};

class InferenceWeights {
 public:
  // fp32 views of `weights`: nothing copied, nothing packed.
  static InferenceWeights View(const BertWeights& weights);
  // Packed fp32 (Precision::kFp32), quantised int8 (Precision::kInt8) or bfloat16
  // (Precision::kBf16) linear layers.
  static InferenceWeights Prepare(const BertWeights& weights, Precision precision,
                                  const Int8Linears& int8_linears = {});

  InferenceWeights(InferenceWeights&&) = default;
  InferenceWeights& operator=(InferenceWeights&&) = default;

  Precision precision() const { return precision_; }
  const BertWeights& weights() const { return *weights_; }
  const InferenceLayer& layer(int index) const { return layers_[index]; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

 private:
  InferenceWeights() = default;

  const BertWeights* weights_ = nullptr;
  Precision precision_ = Precision::kFp32;
  std::vector<InferenceLayer> layers_;
};

}  // namespace attn
