// One (sequence, head) work item of the packed inference attention
// (engine/ops/fused_attention.h), and the per-ISA kernels outside fused_attention.cc that
// compute it:
//   scores (T, T) = Q K^T * scale (+ bias);  probs = softmax(scores);  context (T, d) = probs V
// (probs rounded to bfloat16 before P V when bf16_products is set; Q K^T and P V on int8 when
// the int8 kernel runs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

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
  // Additive score bias (MPNet's relative position bias) or null: query i, key j gets
  // bias[j - i] (j - i may be negative; engine/ops/relative_position_bias.h).
  const float* bias = nullptr;
};

// n rounded up to a multiple of `multiple` (the kernels' padded row and column counts).
inline int64_t RoundUpTo(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// The data of a per-thread scratch buffer holding at least `size` elements (grown, never
// shrunk).
template <typename Buffer>
auto* GrowScratch(Buffer& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
  return buffer.data();
}

template <int R, typename Block>
void RemainderRowBlock(int64_t count, int64_t i0, const Block& block) {
  if constexpr (R > 0) {
    if (count == R) {
      block(std::integral_constant<int, R>(), i0);
    } else {
      RemainderRowBlock<R - 1>(count, i0, block);
    }
  }
}

// block(std::integral_constant<int, R>(), i0) over rows [0, rows): blocks of kRows rows, then
// one block of the R < kRows rows left, so each kernel gets its row count at compile time.
template <int kRows, typename Block>
void ForRowBlocks(int64_t rows, const Block& block) {
  int64_t i0 = 0;
  for (; i0 + kRows <= rows; i0 += kRows) block(std::integral_constant<int, kRows>(), i0);
  RemainderRowBlock<kRows - 1>(rows - i0, i0, block);
}

// s[0, T) += bias[j - i] for query row i, when there is a bias.
inline void AddScoreBias(const AttentionHeadTask& t, int64_t i, float* s) {
  if (t.bias == nullptr) return;
  const float* row = t.bias - i;
  for (int64_t j = 0; j < t.tokens; ++j) s[j] += row[j];
}

struct AttentionHeadGeometry {
  int64_t head_dim;    // d
  int64_t ld_qkv;      // 3H
  int64_t ld_context;  // H
  float scale;         // 1 / sqrt(d)
  bool bf16_products;  // round P to bfloat16 before P V
};

// s[0, T) = softmax(s[0, T)) in place: exp(s - max) / sum, in fp32 (the portable and AVX2
// kernels' softmax).
inline void SoftmaxRowInPlace(float* s, int64_t T) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < T; ++j) max = std::max(max, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < T; ++j) {
    s[j] = std::exp(s[j] - max);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < T; ++j) s[j] *= inv;
}

// Per-thread scratch of the fp32 kernels (AVX-512 in fused_attention.cc, AVX2), grown as
// needed: K^T and V packed with zero-padded columns, and a block of score rows.
struct Fp32AttentionScratch {
  FloatBuffer kt;      // (d, tp)
  FloatBuffer v;       // (T, dp)
  FloatBuffer scores;  // (block rows, tp)
};

// AVX2 + FMA (engine/ops/avx2_attention.cc): blocks of query rows against K^T and V packed once,
// a vectorised exp; only when UseAvx2Kernels().
void AttentionHeadAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                       Fp32AttentionScratch* scratch);

// Per-thread scratch of AttentionHeadInt8Vnni (grown as needed).
struct Int8AttentionScratch {
  std::vector<int8_t, AlignedAllocator<int8_t>> keys, values;      // packed Kq, Vq
  std::vector<int32_t, AlignedAllocator<int32_t>> key_sums;        // (tp) row sums of Kq
  FloatBuffer value_scales;                                        // (dp) per channel
  std::vector<uint8_t, AlignedAllocator<uint8_t>> queries, probs;  // a block of Qu, Pu rows
  FloatBuffer scores;                                              // a block of score rows
};

// Per-thread scratch of AttentionHeadBf16 (grown as needed): packed K and V, a block of Q
// rows and of probability rows as bfloat16 bits, a block of score rows.
struct Bf16AttentionScratch {
  std::vector<uint16_t, AlignedAllocator<uint16_t>> keys, values, queries, probs;
  FloatBuffer scores;
};

// AVX-512 BF16 (engine/ops/bf16_attention.cc): Q K^T and P V on bfloat16 pairs with fp32
// accumulation for Precision::kBf16 (Q, K, V already rounded to bfloat16 by the caller); only
// when UseAvx512Bf16Kernels().
void AttentionHeadBf16(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                       Bf16AttentionScratch* scratch);

// AMX (engine/ops/bf16_attention.cc): the same products as AttentionHeadBf16 on the tile unit,
// 16 query rows at a time; only when UseAmxBf16Kernels() and AmxBf16AttentionSupports(d)
// (head_dim 32 or 64), while an AmxBf16Tiles configures the thread's tiles (one per item:
// keeping them configured across all of a thread's items made the bf16 forward at 32 x 128
// 5% slower on the AMX host).
bool AmxBf16AttentionSupports(int64_t head_dim);
class AmxBf16Tiles {
 public:
  AmxBf16Tiles();   // loads the kernel's tile configuration on this thread
  ~AmxBf16Tiles();  // releases the tiles
  AmxBf16Tiles(const AmxBf16Tiles&) = delete;
  AmxBf16Tiles& operator=(const AmxBf16Tiles&) = delete;
};
void AttentionHeadBf16Amx(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                          Bf16AttentionScratch* scratch);

// AVX-512 VNNI (engine/ops/vnni_attention.cc): Q K^T and P V on 8-bit integers for
// Precision::kInt8 (Q per row, K per head, V per channel, P as 255 levels), softmax in fp32;
// only when UseAvx512VnniKernels().
void AttentionHeadInt8Vnni(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                           Int8AttentionScratch* scratch);

}  // namespace attn
