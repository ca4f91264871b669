// Scaled dot-product self-attention for ONE sequence of a packed batch, all heads at once.
// The fused QKV projection gives a (T, 3H) block per sequence: columns [0, H) are Q, [H, 2H) K,
// [2H, 3H) V, and head h owns columns [h*d, (h+1)*d) of each (d = H / heads). Heads are read
// in place with strides (no transposes):
//   scores  (heads, T, T) = Q_h · K_h^T / sqrt(d)          (pre-softmax, "scaled scores")
//   probs   (heads, T, T) = softmax(scores) over the last axis
//   context (T, H)        : context[:, h*d:(h+1)*d] = probs_h · V_h
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"

namespace attn {

struct AttentionShape {
  int64_t tokens = 0;  // T
  int64_t heads = 0;
  int64_t head_dim = 0;        // d
  int64_t qkv_stride = 0;      // row stride of the qkv block, normally 3H
  int64_t context_stride = 0;  // row stride of the context output, normally H
  int64_t hidden() const { return heads * head_dim; }
};

// qkv: the sequence's first row of the (M, 3H) buffer. probs: (heads, T, T) output.
// scores: optional (heads, T, T) output of the pre-softmax scaled scores (nullptr = skip).
// context: the sequence's first row of the (M, H) output.
void AttentionForward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                      float* scores, float* probs, float* context);

// Training forward: as AttentionForward (no scores output), plus HF BertSelfAttention's
// dropout on the attention probabilities before they multiply V:
//   probs         (heads, T, T) = softmax(Q_h · K_h^T / sqrt(d))            (saved, undropped)
//   probs_dropped (heads, T, T) = probs * mask / (1 - p),  mask[i] = keep ? 1 : 0
//   context       (T, H)        : context_h = probs_dropped_h · V_h
// The mask is DropoutForward(probs, heads*T*T, p, seed, offset, ...) (engine/ops/dropout.h):
// element i is a pure function of (seed, offset + i), reproducible for any thread count, so
// callers give each sequence/layer a disjoint offset range of heads*T*T counters (or distinct
// seeds). With dropout_p == 0, probs_dropped and dropout_mask may be null (if given they
// receive a copy of probs and all ones).
void AttentionForwardTraining(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                              float* probs, float* probs_dropped, uint8_t* dropout_mask,
                              float dropout_p, uint64_t seed, uint64_t offset, float* context);

// Backward of the forward's: scores = Q K^T * scale; probs = softmax(scores); context_h = probs_h
// V_h. qkv: the sequence's (T, qkv_stride) block; probs: saved (heads, T, T); dcontext: (T, H) rows
// with stride context_stride. dqkv: (T, qkv_stride) block receiving dQ in columns [0, H),
// dK in [H, 2H), dV in [2H, 3H) (overwritten; padding columns untouched; must not alias qkv).
// scratch: >= 2 * heads * T * T floats.
void AttentionBackward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                       const float* probs, const float* dcontext, float* dqkv, float* scratch);

// As above, with probability dropout: the context was computed from probs_dropped (=
// probs * mask / (1 - p)). dV uses probs_dropped, dP is masked and rescaled like dropout's
// backward, and the softmax backward uses the undropped probs. probs_dropped == nullptr
// means no dropout (dropout_mask and dropout_p are then ignored).
void AttentionBackward(ExecContext& ctx, const AttentionShape& shape, const float* qkv,
                       const float* probs, const float* probs_dropped, const uint8_t* dropout_mask,
                       float dropout_p, const float* dcontext, float* dqkv, float* scratch);

// Copies head-major Q, K or V (heads, T, d) out of the qkv block. which: 0 = Q, 1 = K, 2 = V.
void ExtractHeads(const AttentionShape& shape, const float* qkv, int which, float* out);

}  // namespace attn
