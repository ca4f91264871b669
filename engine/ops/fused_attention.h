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
// sequence per layer) on the inference path; the training forward keeps AttentionForward.
#pragma once

#include <cstdint>
#include <vector>

namespace attn {

struct PackedAttentionShape {
  int64_t heads = 0;
  int64_t head_dim = 0;  // d; hidden H = heads * d
  int64_t hidden() const { return heads * head_dim; }
};

// Optional per-sequence outputs: either empty, or one pointer per sequence (null = not wanted)
// to a (heads, T, T) row-major buffer.
struct PackedAttentionOutputs {
  std::vector<float*> probs;   // post-softmax weights
  std::vector<float*> scores;  // pre-softmax scaled scores Q K^T / sqrt(d)
};

// qkv: (M, 3H) rows [Q | K | V]; seq_offsets: B+1 row offsets; context: (M, H) output.
// outputs may be null.
void PackedAttentionForward(const PackedAttentionShape& shape, const float* qkv,
                            const std::vector<int64_t>& seq_offsets, float* context,
                            const PackedAttentionOutputs* outputs);

}  // namespace attn
