// The BERT encoder forward pass on a packed variable-length batch.
//
// All sequences are concatenated into one (M, H) token matrix, M = sum of lengths; every
// linear layer and LayerNorm runs once on the whole matrix (no padding between sequences), and
// attention runs per (sequence, head) inside one parallel region (engine/ops/fused_attention.h).
// Per layer (HF BertLayer):
//   qkv      (M, 3H) = hidden · W_qkv^T + b_qkv
//   context  (M, H)  = per sequence, per head: softmax(Q K^T / sqrt(d)) V
//   attn_out (M, H)  = LayerNorm(hidden + context · W_o^T + b_o)
//   inter    (M, I)  = gelu(attn_out · W_i^T + b_i)
//   hidden'  (M, H)  = LayerNorm(attn_out + inter · W_f^T + b_f)
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dnnl_context.h"
#include "engine/inference_weights.h"
#include "engine/model_config.h"
#include "engine/tensor.h"
#include "engine/weights.h"

namespace attn {

struct SequenceInput {
  std::vector<int32_t> token_ids;
  std::vector<int32_t> type_ids;  // empty = all 0
};

// Tokens of all `sequences` together.
int64_t CountTokens(const std::vector<SequenceInput>& sequences);

// What to keep from a forward; everything off except the pooled embedding by default.
struct ForwardOptions {
  // Hidden states to return: 0 = embedding output (after LayerNorm), i = output of layer i
  // (1..num_layers). Must be in range and distinct.
  std::vector<int> hidden_layers;
  // The static input embeddings word + position + type, before LayerNorm.
  bool static_embeddings = false;
  // Encoder layers (0-based) whose attention to return, and which parts.
  std::vector<int> attention_layers;
  bool attention_probs = true;    // post-softmax weights
  bool attention_scores = false;  // pre-softmax scaled scores Q K^T / sqrt(d)
  bool attention_qkv = false;     // per-head Q, K, V
  // Which input sequences' attention to return: empty = all, else one flag per sequence (the
  // others get empty tensors). A (heads, T, T) map per sequence and layer is large, and the
  // server batches requests that want attention with requests that do not.
  std::vector<bool> attention_sequences;
  // Pooled sentence embedding.
  bool pool = true;
  PoolingMode pooling = PoolingMode::kMean;
  bool normalize = false;
  // Cooperative cancellation: asked before each encoder layer; when it returns true the
  // forward stops and returns CANCELLED (nobody waits for the result any more). May be empty.
  std::function<bool()> stop_requested;
};

// One sequence's attention in one layer. Empty tensors for parts not requested.
struct SequenceAttention {
  Tensor probs;   // (heads, T, T)
  Tensor scores;  // (heads, T, T)
  Tensor query;   // (heads, T, d)
  Tensor key;     // (heads, T, d)
  Tensor value;   // (heads, T, d)
};

struct LayerAttention {
  int layer = 0;                             // 0-based
  std::vector<SequenceAttention> sequences;  // one per input sequence
};

struct ForwardResult {
  std::vector<int64_t> seq_offsets;                   // B+1 row offsets into the packed matrix
  std::vector<std::pair<int, Tensor>> hidden_states;  // (layer, (M, H)), in requested order
  Tensor static_embeddings;                           // (M, H) if requested
  std::vector<LayerAttention> attentions;             // in requested order
  Tensor pooled;                                      // (B, H) if requested

  int64_t total_tokens() const { return seq_offsets.empty() ? 0 : seq_offsets.back(); }
  // nullptr if that layer was not requested.
  const Tensor* HiddenState(int layer) const;
  const LayerAttention* Attention(int layer) const;
};

// Checks ids, type ids, lengths and layer indices; errors name the input index and the limit.
absl::Status ValidateEncoderInput(const BertConfig& config, const std::vector<SequenceInput>& batch,
                                  const ForwardOptions& options);

// Validates inputs (ids, type ids, lengths, layer indices) with errors naming the input index
// and limit, then runs the forward on weights prepared once (packed fp32 or int8; see
// engine/inference_weights.h). oneDNN failures come back as InternalError.
absl::StatusOr<ForwardResult> EncoderForward(const BertConfig& config,
                                             const InferenceWeights& weights,
                                             const std::vector<SequenceInput>& batch,
                                             const ForwardOptions& options);

// The same on raw weights, read in place as fp32 (nothing packed): for one-off forwards.
absl::StatusOr<ForwardResult> EncoderForward(const BertConfig& config, const BertWeights& weights,
                                             const std::vector<SequenceInput>& batch,
                                             const ForwardOptions& options);

}  // namespace attn
