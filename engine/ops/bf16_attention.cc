// The bf16 attention products of one (sequence, head) on AVX-512 BF16 (vdpbf16ps: pairs of
// bfloat16 products summed into fp32 lanes), for Precision::kBf16 (see attention_head.h). The
// caller has rounded Q, K and V to bfloat16 values (engine/encoder.cc), so they convert to
// bfloat16 exactly:
//   scores (T, T) = Q K^T * scale (+ bias)        Q pairs broadcast, K packed (d2, tp, 2)
//   e      (T, T) = exp(scores - row max), rounded to bfloat16
//   context (T, d) = (e V) / rowsum(e)             e pairs broadcast, V packed (t2, dp, 2)
// the formulas of the fp32 kernel with bf16 products (the row sum is of the fp32 e, as there):
// half the instructions of its fp32 FMAs on the same values.
#include <immintrin.h>

#include <cstring>

#include "engine/ops/attention_head.h"
#include "engine/ops/avx512_math.h"

#define ATTN_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,avx2")))

namespace attn {

namespace {

constexpr int kBlockRows = 8;  // query rows per block: 8 x 2 vectors = 16 fp32 accumulators

// The same 512 bits as 32 bfloat16 values.
ATTN_AVX512_BF16 inline __m512bh AsBf16(__m512i bits) { return (__m512bh)bits; }

// 16 floats from x + c (lanes past n zero) as bfloat16 bits in the low half of 32-bit lanes.
ATTN_AVX512_BF16 inline __m512i Bf16Lanes(const float* x, int64_t n, int64_t c) {
  const __m256bh bits = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(avx512::TailMask(n - c), x + c));
  return _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(bits));
}

// keys (d2, tp, 2): K[j, 2 c2 .. 2 c2 + 1] at (c2 tp + j) 2, zero past T and d.
ATTN_AVX512_BF16 void PackKeys(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                               int64_t tp, uint16_t* keys) {
  const int64_t T = t.tokens, d = g.head_dim, d2 = (d + 1) / 2;
  std::memset(keys, 0, sizeof(uint16_t) * d2 * tp * 2);
  for (int64_t j = 0; j < T; ++j) {
    for (int64_t c = 0; c < d; c += 16) {
      // 16 channels = 8 pairs, each to its own (c2, j) slot.
      alignas(32) uint32_t pairs[8];
      const __m256bh bits = _mm512_cvtneps_pbh(
          _mm512_maskz_loadu_ps(avx512::TailMask(d - c), t.k + j * g.ld_qkv + c));
      std::memcpy(pairs, &bits, sizeof(pairs));
      for (int64_t p = 0; p < 8 && c + 2 * p < d; ++p) {
        std::memcpy(keys + ((c / 2 + p) * tp + j) * 2, &pairs[p], 4);
      }
    }
  }
}

// values (t2, dp, 2): V[2 j2 .. 2 j2 + 1, c] at (j2 dp + c) 2, zero past T and d.
ATTN_AVX512_BF16 void PackValues(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                 int64_t dp, uint16_t* values) {
  const int64_t T = t.tokens, d = g.head_dim;
  for (int64_t j0 = 0; j0 < T; j0 += 2) {
    for (int64_t c = 0; c < dp; c += 16) {
      __m512i packed = Bf16Lanes(t.v + j0 * g.ld_qkv, d, c);  // lane c: V[j0, c] | V[j0+1, c] << 16
      if (j0 + 1 < T) {
        packed = _mm512_or_si512(packed,
                                 _mm512_slli_epi32(Bf16Lanes(t.v + (j0 + 1) * g.ld_qkv, d, c), 16));
      }
      _mm512_storeu_si512(values + ((j0 / 2) * dp + c) * 2, packed);
    }
  }
}

// s (R, tp) columns [j, j + 16 NV) = Q_rows · K^T * scale; queries (R, d2 2) bfloat16.
template <int R, int NV>
ATTN_AVX512_BF16 inline void ScoresTile(const uint16_t* queries, int64_t d2, const uint16_t* keys,
                                        int64_t tp, __m512 scale, int64_t j, float* s) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  for (int64_t c2 = 0; c2 < d2; ++c2) {
    __m512bh b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      b[n] = AsBf16(_mm512_loadu_si512(keys + (c2 * tp + j + 16 * n) * 2));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, queries + (r * d2 + c2) * 2, 4);
      const __m512bh a = AsBf16(_mm512_set1_epi32(pair));
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], a, b[n]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n)
      _mm512_storeu_ps(s + r * tp + j + 16 * n, _mm512_mul_ps(acc[r][n], scale));
  }
}

// c (R rows, stride ldc, columns [c0, c0 + 16 NV) below d) = e · V * row_scales[r];
// probs (R, t2 2) bfloat16.
template <int R, int NV>
ATTN_AVX512_BF16 inline void ContextTile(const uint16_t* probs, int64_t t2, const uint16_t* values,
                                         int64_t dp, const float* row_scales, int64_t d, int64_t c0,
                                         float* c, int64_t ldc) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  for (int64_t j2 = 0; j2 < t2; ++j2) {
    __m512bh b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      b[n] = AsBf16(_mm512_loadu_si512(values + (j2 * dp + c0 + 16 * n) * 2));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, probs + (r * t2 + j2) * 2, 4);
      const __m512bh a = AsBf16(_mm512_set1_epi32(pair));
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], a, b[n]);
    }
  }
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) {
    const __mmask16 mask = avx512::TailMask(d - c0 - 16 * n);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(c + r * ldc + c0 + 16 * n, mask,
                            _mm512_mul_ps(acc[r][n], _mm512_set1_ps(row_scales[r])));
    }
  }
}

// n floats -> bfloat16 bits, zero-padded to `padded` elements.
ATTN_AVX512_BF16 void ToBf16Row(const float* x, int64_t n, int64_t padded, uint16_t* out) {
  for (int64_t c = 0; c < padded; c += 16) {
    const __mmask16 k = avx512::TailMask(padded - c);
    const __m256bh bits = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(avx512::TailMask(n - c), x + c));
    _mm256_mask_storeu_epi16(out + c, k, reinterpret_cast<const __m256i&>(bits));
  }
}

template <int R>
ATTN_AVX512_BF16 void BlockBf16(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                Bf16AttentionScratch* scratch, int64_t i0) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), dp = RoundUpTo(d, 16), d2 = (d + 1) / 2, t2 = (T + 1) / 2;
  uint16_t* queries = scratch->queries.data();
  float* s = scratch->scores.data();
  uint16_t* probs = scratch->probs.data();
  for (int r = 0; r < R; ++r) ToBf16Row(t.q + (i0 + r) * g.ld_qkv, d, d2 * 2, queries + r * d2 * 2);
  const __m512 scale = _mm512_set1_ps(g.scale);
  int64_t j = 0;
  for (; j + 32 <= tp; j += 32)
    ScoresTile<R, 2>(queries, d2, scratch->keys.data(), tp, scale, j, s);
  if (j < tp) ScoresTile<R, 1>(queries, d2, scratch->keys.data(), tp, scale, j, s);
  if (t.bias != nullptr) {
    for (int r = 0; r < R; ++r) avx512::AddBiasRow(t.bias - (i0 + r), T, s + r * tp);
  }
  if (t.scores != nullptr) {
    for (int r = 0; r < R; ++r) std::memcpy(t.scores + (i0 + r) * T, s + r * tp, sizeof(float) * T);
  }
  float inv_sums[R];
  avx512::ExpRows(s, R, tp, T, inv_sums);
  for (int r = 0; r < R; ++r) {
    if (t.probs != nullptr) avx512::ScaleRow(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
    ToBf16Row(s + r * tp, T, t2 * 2, probs + r * t2 * 2);
  }
  float* c = t.context + i0 * g.ld_context;
  int64_t c0 = 0;
  for (; c0 + 32 <= dp; c0 += 32) {
    ContextTile<R, 2>(probs, t2, scratch->values.data(), dp, inv_sums, d, c0, c, g.ld_context);
  }
  if (c0 < dp)
    ContextTile<R, 1>(probs, t2, scratch->values.data(), dp, inv_sums, d, c0, c, g.ld_context);
}

}  // namespace

void AttentionHeadBf16(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                       Bf16AttentionScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), dp = RoundUpTo(d, 16), d2 = (d + 1) / 2, t2 = (T + 1) / 2;
  GrowScratch(scratch->keys, d2 * tp * 2);
  GrowScratch(scratch->values, t2 * dp * 2);
  GrowScratch(scratch->queries, kBlockRows * d2 * 2);
  GrowScratch(scratch->scores, kBlockRows * tp);
  GrowScratch(scratch->probs, kBlockRows * t2 * 2);
  PackKeys(g, t, tp, scratch->keys.data());
  PackValues(g, t, dp, scratch->values.data());
  ForRowBlocks<kBlockRows>(
      T, [&](auto rows, int64_t i0) { BlockBf16<decltype(rows)::value>(g, t, scratch, i0); });
}

}  // namespace attn
