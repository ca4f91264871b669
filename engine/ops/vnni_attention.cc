// The int8 attention products of one (sequence, head) on AVX-512 VNNI (vpdpbusd: u8 x s8 summed
// four at a time into int32 without saturation), for Precision::kInt8 (see attention_head.h):
//
//   K  (T, d) s8 per head:       Kq = round(K / sk),  sk = max|K| / 127
//   V  (T, d) s8 per channel c:  Vq = round(V / sv[c]),  sv[c] = max_j |V[j, c]| / 127
//   Q  row i, u8 with zero 128:  Qu = round(Q / sq[i]) + 128,  sq[i] = max_c |Q[i, c]| / 127
//   scores (T, T) = (Qu · Kq^T - 128 * rowsum(Kq)) * sq[i] * sk * scale (+ bias)      (exact ints)
//   e      (T, T) = exp(scores - row max) in fp32, in (0, 1] with 1 at the max
//   Pu     (T, T) u8 = round(255 e)      (the row max is 255: no row is all zeros)
//   context (T, d) = (Pu · Vq) * sv[c] / rowsum(Pu)                                  (exact ints)
//
// Dividing by the sum of the quantised weights keeps every row of the rounded attention summing
// to 1. The probabilities and scores returned to the caller are the fp32 ones (before rounding).
// The accuracy this costs is bounded by the int8 cosine tests (tests/unit/
// precision_encoder_test.cc); per-head K and per-channel V scales cost nothing at run time.
#include <immintrin.h>

#include <cstring>

#include "engine/ops/attention_head.h"
#include "engine/ops/avx512_math.h"

#define ATTN_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,avx2")))

namespace attn {

namespace {

constexpr int kBlockRows = 8;  // query rows per block: 8 x 2 vectors = 16 int32 accumulators

// max |x[r * ld + c]| over `rows` rows of d floats.
ATTN_AVX512_VNNI float MaxAbs(const float* x, int64_t ld, int64_t rows, int64_t d) {
  __m512 max = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; c += 16) {
      max = _mm512_max_ps(
          max, _mm512_abs_ps(_mm512_maskz_loadu_ps(avx512::TailMask(d - c), x + r * ld + c)));
    }
  }
  return _mm512_reduce_max_ps(max);
}

// round(x[c] * inv) for 16 channels from c (lanes past d zero): cvtps2dq rounds half to even.
ATTN_AVX512_VNNI inline __m512i Levels(const float* x, int64_t d, int64_t c, __m512 inv) {
  return _mm512_cvtps_epi32(
      _mm512_mul_ps(_mm512_maskz_loadu_ps(avx512::TailMask(d - c), x + c), inv));
}

// keys (d4, tp, 4): Kq[j, 4 c4 .. 4 c4 + 3] at (c4 tp + j) 4, zero past T and d; key_sums (tp).
// Returns sk.
ATTN_AVX512_VNNI float PackKeys(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                int64_t tp, int8_t* keys, int32_t* key_sums) {
  const int64_t T = t.tokens, d = g.head_dim, d4 = (d + 3) / 4;
  const float max_abs = MaxAbs(t.k, g.ld_qkv, T, d);
  const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
  std::memset(keys, 0, static_cast<size_t>(d4 * tp * 4));
  std::memset(key_sums, 0, sizeof(int32_t) * tp);
  for (int64_t j = 0; j < T; ++j) {
    __m512i sum = _mm512_setzero_si512();
    for (int64_t c = 0; c < d; c += 16) {
      const __m512i q = Levels(t.k + j * g.ld_qkv, d, c, inv);
      sum = _mm512_add_epi32(sum, q);
      // 16 channels = 4 groups of 4 bytes, each to its own (c4, j) slot.
      alignas(16) int32_t groups[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(groups), _mm512_cvtepi32_epi8(q));
      for (int64_t g4 = 0; g4 < 4 && c + 4 * g4 < d; ++g4) {
        std::memcpy(keys + ((c / 4 + g4) * tp + j) * 4, &groups[g4], 4);
      }
    }
    key_sums[j] = _mm512_reduce_add_epi32(sum);
  }
  return max_abs / 127.0f;
}

// values (t4, dp, 4): Vq[4 j4 .. 4 j4 + 3, c] at (j4 dp + c) 4, zero past T and d;
// value_scales (dp): sv[c], zero past d.
ATTN_AVX512_VNNI void PackValues(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                 int64_t dp, int8_t* values, float* value_scales) {
  const int64_t T = t.tokens, d = g.head_dim;
  for (int64_t c = 0; c < dp; c += 16) {
    __m512 max = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; ++j) {
      max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_maskz_loadu_ps(avx512::TailMask(d - c),
                                                                   t.v + j * g.ld_qkv + c)));
    }
    _mm512_storeu_ps(value_scales + c, _mm512_mul_ps(max, _mm512_set1_ps(1.0f / 127.0f)));
  }
  for (int64_t c = 0; c < dp; c += 16) {
    const __m512 scales = _mm512_loadu_ps(value_scales + c);
    // 1 / sv, 0 where the channel is all zero (or past d)
    const __m512 inv = _mm512_maskz_div_ps(
        _mm512_cmp_ps_mask(scales, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), scales);
    for (int64_t j0 = 0; j0 < T; j0 += 4) {
      // Four rows' bytes interleaved per channel: lane c = Vq[j0, c] | Vq[j0 + 1, c] << 8 | ...
      __m512i packed = _mm512_setzero_si512();
      for (int64_t r = 0; r < 4 && j0 + r < T; ++r) {
        const __m512i q =
            _mm512_and_si512(Levels(t.v + (j0 + r) * g.ld_qkv, d, c, inv), _mm512_set1_epi32(0xFF));
        packed = _mm512_or_si512(packed, _mm512_sllv_epi32(q, _mm512_set1_epi32(8 * r)));
      }
      _mm512_storeu_si512(values + ((j0 / 4) * dp + c) * 4, packed);
    }
  }
}

// queries (R, d4 4): rows i0.. of Q as u8 with zero point 128 (padding channels 128, which meet
// zero keys); query_scales (R): sq[i].
template <int R>
ATTN_AVX512_VNNI void QuantizeQueries(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                      int64_t i0, int64_t d4, uint8_t* queries,
                                      float* query_scales) {
  const int64_t d = g.head_dim;
  const __m512i zero_point = _mm512_set1_epi32(128);
  for (int r = 0; r < R; ++r) {
    const float* q = t.q + (i0 + r) * g.ld_qkv;
    const float max_abs = MaxAbs(q, 0, 1, d);
    query_scales[r] = max_abs / 127.0f;
    const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    uint8_t* out = queries + r * d4 * 4;
    for (int64_t c = 0; c < d; c += 16) {
      _mm512_mask_cvtepi32_storeu_epi8(out + c, avx512::TailMask(d - c),
                                       _mm512_add_epi32(Levels(q, d, c, inv), zero_point));
    }
    for (int64_t c = d; c < d4 * 4; ++c) out[c] = 128;
  }
}

// s (R, tp) columns [j, j + 16 NV) = scores of the block's rows (before any bias).
template <int R, int NV>
ATTN_AVX512_VNNI inline void ScoresTile(const uint8_t* queries, int64_t d4, const int8_t* keys,
                                        const int32_t* key_sums, int64_t tp, const float* row_units,
                                        int64_t j, float* s) {
  __m512i acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_si512();
  }
  for (int64_t c4 = 0; c4 < d4; ++c4) {
    __m512i b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm512_loadu_si512(keys + (c4 * tp + j + 16 * n) * 4);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, queries + (r * d4 + c4) * 4, 4);
      const __m512i a = _mm512_set1_epi32(four);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbusd_epi32(acc[r][n], a, b[n]);
    }
  }
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) {
    // The zero point: sum_c (Qu - 128) Kq = sum_c Qu Kq - 128 rowsum(Kq).
    const __m512i zero_fix = _mm512_slli_epi32(_mm512_loadu_si512(key_sums + j + 16 * n), 7);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][n], zero_fix));
      _mm512_storeu_ps(s + r * tp + j + 16 * n, _mm512_mul_ps(exact, _mm512_set1_ps(row_units[r])));
    }
  }
}

// c (R rows, stride ldc, columns [c0, c0 + 16 NV) below d) = Pu · Vq * sv[c] * row_scales[r].
template <int R, int NV>
ATTN_AVX512_VNNI inline void ContextTile(const uint8_t* probs, int64_t t4, const int8_t* values,
                                         int64_t dp, const float* value_scales,
                                         const float* row_scales, int64_t d, int64_t c0, float* c,
                                         int64_t ldc) {
  __m512i acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_si512();
  }
  for (int64_t j4 = 0; j4 < t4; ++j4) {
    __m512i b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm512_loadu_si512(values + (j4 * dp + c0 + 16 * n) * 4);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, probs + (r * t4 + j4) * 4, 4);
      const __m512i a = _mm512_set1_epi32(four);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbusd_epi32(acc[r][n], a, b[n]);
    }
  }
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) {
    const __mmask16 mask = avx512::TailMask(d - c0 - 16 * n);
    const __m512 scales = _mm512_loadu_ps(value_scales + c0 + 16 * n);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 out = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][n]), scales),
                                       _mm512_set1_ps(row_scales[r]));
      _mm512_mask_storeu_ps(c + r * ldc + c0 + 16 * n, mask, out);
    }
  }
}

// Row r of e (T floats in (0, 1]) -> probs (t4 4 bytes) = round(255 e), zero past T; returns
// 1 / sum of the levels.
ATTN_AVX512_VNNI float QuantizeProbabilities(const float* e, int64_t T, int64_t t4,
                                             uint8_t* probs) {
  const __m512 levels = _mm512_set1_ps(255.0f);
  __m512i sum = _mm512_setzero_si512();
  std::memset(probs, 0, static_cast<size_t>(t4 * 4));
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = avx512::TailMask(T - j);
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, e + j), levels));
    _mm512_mask_cvtepi32_storeu_epi8(probs + j, k, q);
    sum = _mm512_mask_add_epi32(sum, k, sum, q);
  }
  return 1.0f / static_cast<float>(_mm512_reduce_add_epi32(sum));
}

template <int R>
ATTN_AVX512_VNNI void BlockVnni(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                Int8AttentionScratch* scratch, float key_scale, int64_t i0) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), dp = RoundUpTo(d, 16), d4 = (d + 3) / 4, t4 = (T + 3) / 4;
  uint8_t* queries = scratch->queries.data();
  float* s = scratch->scores.data();
  uint8_t* probs = scratch->probs.data();
  float query_scales[R], row_units[R], inv_sums[R], level_scales[R];
  QuantizeQueries<R>(g, t, i0, d4, queries, query_scales);
  for (int r = 0; r < R; ++r) row_units[r] = query_scales[r] * key_scale * g.scale;
  // scores (R, tp) = Q_rows · K^T * scale
  int64_t j = 0;
  for (; j + 32 <= tp; j += 32) {
    ScoresTile<R, 2>(queries, d4, scratch->keys.data(), scratch->key_sums.data(), tp, row_units, j,
                     s);
  }
  if (j < tp) {
    ScoresTile<R, 1>(queries, d4, scratch->keys.data(), scratch->key_sums.data(), tp, row_units, j,
                     s);
  }
  if (t.bias != nullptr) {
    for (int r = 0; r < R; ++r) avx512::AddBiasRow(t.bias - (i0 + r), T, s + r * tp);
  }
  if (t.scores != nullptr) {
    for (int r = 0; r < R; ++r) std::memcpy(t.scores + (i0 + r) * T, s + r * tp, sizeof(float) * T);
  }
  // e = exp(scores - row max); probs (R, t4 4) = round(255 e)
  avx512::ExpRows(s, R, tp, T, inv_sums);
  for (int r = 0; r < R; ++r) {
    if (t.probs != nullptr) avx512::ScaleRow(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
    level_scales[r] = QuantizeProbabilities(s + r * tp, T, t4, probs + r * t4 * 4);
  }
  // context rows (R, d) = Pu · Vq * sv / rowsum(Pu)
  float* c = t.context + i0 * g.ld_context;
  int64_t c0 = 0;
  for (; c0 + 32 <= dp; c0 += 32) {
    ContextTile<R, 2>(probs, t4, scratch->values.data(), dp, scratch->value_scales.data(),
                      level_scales, d, c0, c, g.ld_context);
  }
  if (c0 < dp) {
    ContextTile<R, 1>(probs, t4, scratch->values.data(), dp, scratch->value_scales.data(),
                      level_scales, d, c0, c, g.ld_context);
  }
}

}  // namespace

void AttentionHeadInt8Vnni(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                           Int8AttentionScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), dp = RoundUpTo(d, 16), d4 = (d + 3) / 4, t4 = (T + 3) / 4;
  GrowScratch(scratch->keys, d4 * tp * 4);
  GrowScratch(scratch->key_sums, tp);
  GrowScratch(scratch->values, t4 * dp * 4);
  GrowScratch(scratch->value_scales, dp);
  GrowScratch(scratch->queries, kBlockRows * d4 * 4);
  GrowScratch(scratch->scores, kBlockRows * tp);
  GrowScratch(scratch->probs, kBlockRows * t4 * 4);
  const float key_scale = PackKeys(g, t, tp, scratch->keys.data(), scratch->key_sums.data());
  PackValues(g, t, dp, scratch->values.data(), scratch->value_scales.data());
  ForRowBlocks<kBlockRows>(T, [&](auto rows, int64_t i0) {
    BlockVnni<decltype(rows)::value>(g, t, scratch, key_scale, i0);
  });
}

}  // namespace attn
