// Training forward and backward of the BERT encoder on a packed batch.
//
// The training forward is the inference forward (engine/encoder.h) with HF BertModel's dropout
// sites, and it keeps what the backward needs (llm.c style: every saved buffer has its shape):
//   static   (M, H)  = word[id] + position[pos] + type[type]
//   emb      (M, H)  = dropout(LayerNorm(static))                                 -> layer input
//   per layer, x (M, H) the layer input:
//     qkv      (M, 3H) = x · W_qkv^T + b_qkv
//     probs    (heads, T, T) per sequence = softmax(Q K^T / sqrt(d)); dropped = dropout(probs)
//     context  (M, H)  = dropped · V
//     attn_sum (M, H)  = x + dropout(context · W_o^T + b_o);     attn_out = LayerNorm(attn_sum)
//     ffn_pre  (M, I)  = attn_out · W_i^T + b_i;                  ffn_act = gelu(ffn_pre)
//     ffn_sum  (M, H)  = attn_out + dropout(ffn_act · W_f^T + b_f); output = LayerNorm(ffn_sum)
// Gradients use the parameters' own struct type (BertWeights), as DESIGN.md asks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dnnl_context.h"
#include "engine/encoder.h"
#include "engine/model_config.h"
#include "engine/ops/linear.h"
#include "engine/tensor.h"
#include "engine/weights.h"

namespace attn {

struct TrainingForwardOptions {
  // Dropout probabilities; HF's config.json values are 0.1. Zero turns a site off.
  float hidden_dropout = 0.0f;
  float attention_dropout = 0.0f;
  // Dropout masks are a pure function of (seed, step, site, element), so a step can be
  // replayed exactly.
  uint64_t seed = 0;
  uint64_t step = 0;
  // kBf16: mixed precision, the linear layers' matmuls forward and backward on bfloat16 inputs
  // with fp32 accumulation (engine/ops/linear.h); weights, activations, gradients stay fp32.
  // The attention products stay fp32 (about 3% of the matmul FLOPs at 64 tokens).
  MatmulInputs matmul_inputs = MatmulInputs::kFp32;
};

struct LayerActivations {
  Tensor input;                       // (M, H)   x
  Tensor qkv;                         // (M, 3H)
  std::vector<Tensor> probs;          // per sequence (heads, T, T), before dropout
  std::vector<Tensor> probs_dropped;  // per sequence (heads, T, T); empty without dropout
  std::vector<std::vector<uint8_t>> probs_masks;  // per sequence heads*T*T; empty without dropout
  Tensor context;                                 // (M, H)
  std::vector<uint8_t> attn_dense_mask;  // (M*H) dropout mask after W_o; empty without dropout
  Tensor attn_sum;                       // (M, H)   LayerNorm input
  FloatBuffer attn_mean, attn_variance;  // (M)
  Tensor attn_out;                       // (M, H)
  Tensor ffn_pre;                        // (M, I)   before GELU
  Tensor ffn_act;                        // (M, I)   after GELU
  std::vector<uint8_t> ffn_dense_mask;   // (M*H)
  Tensor ffn_sum;                        // (M, H)
  FloatBuffer ffn_mean, ffn_variance;    // (M)
};

struct TrainingForward {
  TrainingForwardOptions options;
  // First encoder layer run: 0 from token ids; > 0 (or a forward from given hidden states) leaves
  // the embeddings and layers [0, first_layer) empty. layers[first_layer].input (or output when
  // first_layer == L) holds the hidden states the layers started from.
  int first_layer = 0;
  std::vector<int64_t> seq_offsets;                     // B+1
  std::vector<int32_t> token_ids, type_ids, positions;  // (M) packed
  Tensor static_embeddings;                             // (M, H)
  FloatBuffer emb_mean, emb_variance;                   // (M)
  std::vector<uint8_t> emb_mask;                        // (M*H)
  std::vector<LayerActivations> layers;
  Tensor output;  // (M, H) last layer output

  int64_t total_tokens() const { return seq_offsets.back(); }
};

// Validates like EncoderForward, then runs the training forward.
absl::StatusOr<TrainingForward> EncoderForwardTraining(const BertConfig& config,
                                                       const BertWeights& weights,
                                                       const std::vector<SequenceInput>& batch,
                                                       const TrainingForwardOptions& options);

// As above into *forward, reusing its buffers where the shapes allow: a trainer passing its
// previous step's forward allocates (and page-faults) nothing at a fixed batch shape. On error
// *forward is left in an unspecified state.
absl::Status EncoderForwardTraining(const BertConfig& config, const BertWeights& weights,
                                    const std::vector<SequenceInput>& batch,
                                    const TrainingForwardOptions& options,
                                    TrainingForward* forward);

// The training forward of layers [first_layer, L) from given hidden states (M, H): the input of
// encoder layer first_layer (0 = the embedding output, L = the last output, no layer runs), as
// HF's hidden_states[first_layer]. seq_offsets: B+1 row offsets into `hidden`. For attributions
// at a layer (engine/explain/attribution.h): forward.first_layer is set, embeddings stay empty.
absl::Status EncoderForwardTrainingFromHidden(const BertConfig& config, const BertWeights& weights,
                                              const std::vector<int64_t>& seq_offsets,
                                              int first_layer, const float* hidden,
                                              const TrainingForwardOptions& options,
                                              TrainingForward* forward);

// Zero-filled tensors shaped like `weights` (gradient buffers).
BertWeights ZerosLike(const BertWeights& weights);

// What the backward reuses from one call to the next; a trainer keeps one per job.
struct BackwardWorkspace {
  // oneDNN stream, scratchpad and operand buffer, kept so no step allocates them again.
  std::unique_ptr<ExecContext> context;
  // Gradient buffers, reallocated only when the batch's token count changes.
  Tensor d_hidden, d_sum, d_attn_out, d_context, d_input;  // (M, H)
  Tensor d_ffn_act, d_ffn_pre;                             // (M, I)
  Tensor d_qkv;                                            // (M, 3H)
  // After a call with embedding gradients into the same `grads`: the rows of
  // grads->word_embeddings that may be non-zero (the batch's token ids, ascending, unique);
  // every other row is zero. The next call then clears only these rows (a batch uses a few
  // hundred of 30,522), and the optimizer can skip the rest (ParamEntry::nonzero_rows).
  std::vector<int32_t> word_rows;
  bool word_rows_valid = false;  // false: the next call clears the whole table
};

// Backward from d_output (M, H) (the gradient of the loss w.r.t. the last layer's output) to
// every parameter. `grads` must be shaped like `weights` (ZerosLike); it is overwritten.
// compute_embedding_grads = false skips the embedding tables (their gradient stays zero).
absl::Status EncoderBackward(const BertConfig& config, const BertWeights& weights,
                             const TrainingForward& forward, const float* d_output,
                             BertWeights* grads, bool compute_embedding_grads = true);

// As above with buffers kept in *workspace. Between calls with the same workspace, `grads`
// must only be changed where workspace->word_rows allows (e.g. scaled by clipping).
absl::Status EncoderBackward(const BertConfig& config, const BertWeights& weights,
                             const TrainingForward& forward, const float* d_output,
                             BertWeights* grads, bool compute_embedding_grads,
                             BackwardWorkspace* workspace);

// Gradient w.r.t. the hidden states the forward started from (the input of layer
// forward.first_layer; the embedding output when it is 0), from d_output (M, H); no parameter
// gradients are computed. d_input: (M, H), overwritten.
absl::Status EncoderInputBackward(const BertConfig& config, const BertWeights& weights,
                                  const TrainingForward& forward, const float* d_output,
                                  float* d_input, BackwardWorkspace* workspace);

}  // namespace attn
