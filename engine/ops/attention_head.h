// One (sequence, head) work item of the packed inference attention
// (engine/ops/fused_attention.h), and the per-ISA kernels outside fused_attention.cc that
// compute it:
//   scores (T, T) = Q K^T * scale;  probs = softmax(scores);  context (T, d) = probs V
// (probs rounded to bfloat16 before P V when bf16_products is set).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace attn {

struct AttentionHeadTask {
  const float* q;  // (T, d), row stride ld_qkv
  const float* k;  // (T, d)
  const float* v;  // (T, d)
  int64_t tokens;  // T
  float* context;  // (T, d), row stride ld_context
  float* probs;    // (T, T) or null
  float* scores;   // (T, T) or null
};

struct AttentionHeadGeometry {
  int64_t head_dim;    // d
  int64_t ld_qkv;      // 3H
  int64_t ld_context;  // H
  float scale;         // 1 / sqrt(d)
  bool bf16_products;  // round P to bfloat16 before P V
};

// AVX2 + FMA (engine/ops/avx2_attention.cc): the portable formulas with K transposed into
// `keys_t` so the score and context products run 8 lanes wide; only when UseAvx2Kernels().
// keys_t and row are per-thread scratch (grown as needed).
void AttentionHeadAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                       FloatBuffer* keys_t, FloatBuffer* row);

}  // namespace attn
