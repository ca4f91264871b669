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

// Copies head-major Q, K or V (heads, T, d) out of the qkv block. which: 0 = Q, 1 = K, 2 = V.
void ExtractHeads(const AttentionShape& shape, const float* qkv, int which, float* out);

}  // namespace attn
