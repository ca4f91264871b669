// Inference self-attention over every sequence of a packed batch, all heads, in ONE OpenMP
// parallel region: the work items are (sequence, head) pairs, longest sequences first, handed out
// dynamically. Each item runs on one thread, a block of query rows at a time, entirely in cache:
//   scores (rows, T) = Q_rows · K_h^T * (1 / sqrt(d))      (scale folded into the product)
//   probs  (rows, T) = softmax(scores)                       (in place)
//   context_h rows   = probs · V_h                           (written at column h*d)
// so the (T, T) matrices are never materialised unless the caller asks for them. Q, K and V are
// read from the fused (M, 3H) projection with strides: no transposes of the packed matrix.
//
// Replaces one oneDNN matmul/softmax per sequence (three primitives and three fork-joins per
// sequence per layer) on the inference path.
//
// The training pair below does the same for fine-tuning: one parallel region per layer for the
// forward (saving the probabilities the backward needs) and one for the backward, over the same
// (sequence, head) items, instead of 2 + 4 oneDNN matmuls and 2 softmax primitives per sequence.
// They compute what AttentionForwardTraining / AttentionBackward (engine/ops/attention.h) compute
// per sequence, with the same saved-activation layout and the same dropout masks.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/ops/relative_position_bias.h"

namespace attn {

struct PackedAttentionShape {
  int64_t heads = 0;
  int64_t head_dim = 0;  // d; hidden H = heads * d
  // The probabilities are rounded to bfloat16 before they multiply V (Precision::kBf16; the
  // caller rounds Q, K and V), so P V takes bfloat16 inputs with fp32 accumulation like the
  // linear layers. The returned probs/scores are the fp32 values before rounding.
  bool bf16_products = false;
  // Precision::kInt8: Q K^T and P V on 8-bit integers where the CPU has AVX-512 VNNI
  // (AttentionHeadInt8Vnni in engine/ops/attention_head.h: Q per row, K per head, V per
  // channel, P as 255 levels; softmax fp32). Elsewhere the attention stays fp32.
  bool int8_products = false;
  // MPNet: added to the scaled scores before the softmax (every sequence of the batch must be
  // at most relative_bias->max_tokens long); the returned scores include it. Null for BERT.
  const RelativePositionBias* relative_bias = nullptr;
  int64_t hidden() const { return heads * head_dim; }
};

// Optional per-sequence outputs: either empty, or one pointer per sequence (null = not wanted)
// to a (heads, T, T) row-major buffer.
struct PackedAttentionOutputs {
  std::vector<float*> probs;   // post-softmax weights
  std::vector<float*> scores;  // pre-softmax scores Q K^T / sqrt(d) (+ relative position bias)
};

// qkv: (M, 3H) rows [Q | K | V]; seq_offsets: B+1 row offsets; context: (M, H) output.
// outputs may be null.
void PackedAttentionForward(const PackedAttentionShape& shape, const float* qkv,
                            const std::vector<int64_t>& seq_offsets, float* context,
                            const PackedAttentionOutputs* outputs);

// Saved activations of the training forward, per sequence b of T_b tokens (one pointer per
// sequence, each a (heads, T_b, T_b) row-major buffer: head h, query i, key j at h*T*T + i*T + j):
//   probs         = softmax(Q_h K_h^T / sqrt(d))                  (undropped; always given)
//   probs_dropped = probs * mask / (1 - p)                         (what multiplied V)
//   masks         = 1 kept / 0 dropped                             (heads*T*T bytes)
// probs_dropped and masks are empty when the attention dropout is off (p == 0).
struct PackedAttentionSaved {
  std::vector<float*> probs;
  std::vector<float*> probs_dropped;
  std::vector<uint8_t*> masks;
};

// Training forward over the packed batch (bias_h: shape.relative_bias's (T, T) slice for head
// h, zero without one):
//   probs_b         (heads, T, T) = softmax(Q_h · K_h^T / sqrt(d) + bias_h)
//   probs_dropped_b (heads, T, T) = DropoutForward(probs_b, heads*T*T, p, seed, offset_b)
//   context         (M, H)        : context_h rows of b = probs_dropped_b,h · V_h
// with offset_b = dropout_offset + sum_{b' < b} heads * T_b'^2: each sequence gets the counter
// range the per-sequence AttentionForwardTraining calls were given, so masks are bit-identical
// to them (and to DropoutForward on the saved probs). dropout_p == 0: probs_dropped and masks
// must be empty, context = probs · V.
// qkv: (M, 3H) rows [Q | K | V]; seq_offsets: B+1 row offsets; saved: pointers to fill (above).
void PackedAttentionForwardTraining(const PackedAttentionShape& shape, const float* qkv,
                                    const std::vector<int64_t>& seq_offsets, float dropout_p,
                                    uint64_t seed, uint64_t dropout_offset,
                                    const PackedAttentionSaved& saved, float* context);

// Backward of PackedAttentionForwardTraining, per (sequence, head), P = probs, Pd = probs_dropped
// (Pd = P without dropout), dC = dcontext_h rows:
//   dV (T, d) = Pd^T · dC                    dP (T, T) = dC · V^T
//   dP        = dP * mask / (1 - p)          (dropout backward; skipped without dropout)
//   dS (T, T) = P * (dP - rowsum(dP * P))    (softmax backward)
//   dQ (T, d) = dS · K / sqrt(d)             dK (T, d) = dS^T · Q / sqrt(d)
//   d_relative_bias[h][r + L-1] += sum over sequences and i of dS[i][i + r]   (the bias is added
//                                  to the scores, so its gradient is dS, summed per j - i)
// qkv: the forward's (M, 3H); dcontext: (M, H); dqkv: (M, 3H) receiving dQ in columns [0, H),
// dK in [H, 2H), dV in [2H, 3H) (every element overwritten; must not alias qkv or dcontext).
// d_relative_bias: null, or (heads, 2L-1) accumulated into (L = shape.relative_bias->max_tokens,
// which shape.relative_bias must give).
void PackedAttentionBackward(const PackedAttentionShape& shape, const float* qkv,
                             const std::vector<int64_t>& seq_offsets,
                             const PackedAttentionSaved& saved, float dropout_p,
                             const float* dcontext, float* dqkv, float* d_relative_bias = nullptr);

}  // namespace attn
