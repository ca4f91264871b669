// The AVX2 + FMA kernel of one (sequence, head) attention item (engine/ops/attention_head.h),
// for CPUs without AVX-512 (AMD Zen 2/3, Intel before Skylake-SP). It has the AVX-512 kernel's
// shape at half the width: K^T and V packed once per item, then blocks of 6 query rows
//   scores (6, tp) = Q_rows K^T * scale          6 x 16-column tiles: 12 accumulators
//   e = exp(scores - row max), row sums          vectorised exp, unnormalised
//   context (6, d) = diag(1 / sums) · e V        6 x 16-column tiles
// so each K^T / V vector loaded feeds six FMAs (16 ymm registers: 12 accumulators, 2 operands,
// 1 broadcast). A row at a time, as before, fed one FMA per load and kept four dependent
// accumulators, half the FMA ports' rate; its exp was libm's, a scalar call per score.
#include <immintrin.h>

#include <cstring>

#include "engine/half.h"
#include "engine/ops/attention_head.h"
#include "engine/ops/avx2_math.h"

namespace attn {

namespace {

constexpr int kAvx2BlockRows = 6;

// s (R, tp) columns [j, j + 8 NV) = q (R rows, stride ldq) · kt (d, tp) * scale.
template <int R, int NV>
ATTN_AVX2 inline void ScoresTile(const float* q, int64_t ldq, const float* kt, int64_t tp,
                                 int64_t d, __m256 scale, int64_t j, float* s) {
  __m256 acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < d; ++c) {
    __m256 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm256_load_ps(kt + c * tp + j + 8 * n);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(q + r * ldq + c);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_fmadd_ps(a, b[n], acc[r][n]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      _mm256_store_ps(s + r * tp + j + 8 * n, _mm256_mul_ps(acc[r][n], scale));
    }
  }
}

// c (R rows, stride ldc, d columns) columns [c0, c0 + 8 NV) = diag(row_scales) · p (R, tp;
// first T columns) · v (T, dp).
template <int R, int NV>
ATTN_AVX2 inline void ContextTile(const float* p, int64_t tp, const float* row_scales,
                                  const float* v, int64_t dp, int64_t T, int64_t d, int64_t c0,
                                  float* c, int64_t ldc) {
  __m256 acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < T; ++k) {
    __m256 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm256_load_ps(v + k * dp + c0 + 8 * n);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(p + r * tp + k);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_fmadd_ps(a, b[n], acc[r][n]);
    }
  }
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) {
    const __m256i mask = avx2::TailMask(d - c0 - 8 * n);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      _mm256_maskstore_ps(c + r * ldc + c0 + 8 * n, mask,
                          _mm256_mul_ps(acc[r][n], _mm256_set1_ps(row_scales[r])));
    }
  }
}

// kt (d, tp) = K^T with zero columns [T, tp) (8 rows of K at a time, one gather per column, so
// each store fills 8 floats of a kt row); v (T, dp) = V with zero columns [d, dp).
ATTN_AVX2 void PackKeysAndValuesAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                     int64_t tp, int64_t dp, float* kt, float* v) {
  const int64_t T = t.tokens, d = g.head_dim, ld = g.ld_qkv;
  const __m256i row_offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                 _mm256_set1_epi32(static_cast<int32_t>(ld)));
  for (int64_t j = 0; j < tp; j += 8) {
    const __m256 mask = _mm256_castsi256_ps(avx2::TailMask(T - j));
    const float* base = t.k + j * ld;
    for (int64_t c = 0; c < d; ++c) {
      _mm256_store_ps(kt + c * tp + j, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base + c,
                                                                row_offsets, mask, sizeof(float)));
    }
  }
  for (int64_t j = 0; j < T; ++j) {
    const float* vj = t.v + j * ld;
    for (int64_t c = 0; c < dp; c += 8) {
      _mm256_store_ps(v + j * dp + c, _mm256_maskload_ps(vj + c, avx2::TailMask(d - c)));
    }
  }
}

// Query rows [i0, i0 + R) of the item.
template <int R>
ATTN_AVX2 void BlockAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                         Fp32AttentionScratch* scratch, int64_t tp, int64_t dp, int64_t i0) {
  const int64_t T = t.tokens, d = g.head_dim;
  float* s = scratch->scores.data();
  const float* q = t.q + i0 * g.ld_qkv;
  const __m256 scale = _mm256_set1_ps(g.scale);
  int64_t j = 0;
  for (; j + 16 <= tp; j += 16) {
    ScoresTile<R, 2>(q, g.ld_qkv, scratch->kt.data(), tp, d, scale, j, s);
  }
  if (j < tp) ScoresTile<R, 1>(q, g.ld_qkv, scratch->kt.data(), tp, d, scale, j, s);
  for (int r = 0; r < R; ++r) AddScoreBias(t, i0 + r, s + r * tp);
  if (t.scores != nullptr) {
    for (int r = 0; r < R; ++r) std::memcpy(t.scores + (i0 + r) * T, s + r * tp, sizeof(float) * T);
  }
  float inv_sums[R];
  avx2::ExpRows(s, R, tp, T, inv_sums);
  if (t.probs != nullptr) {
    for (int r = 0; r < R; ++r) avx2::ScaleRow(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
  }
  if (g.bf16_products) {
    // The unnormalised exp rows, as the AVX-512 kernel: the row scale after P V is fp32.
    for (int r = 0; r < R; ++r) RoundFloatsToBFloat16(s + r * tp, T, s + r * tp);
  }
  float* context = t.context + i0 * g.ld_context;
  int64_t c0 = 0;
  for (; c0 + 16 <= dp; c0 += 16) {
    ContextTile<R, 2>(s, tp, inv_sums, scratch->v.data(), dp, T, d, c0, context, g.ld_context);
  }
  if (c0 < dp) {
    ContextTile<R, 1>(s, tp, inv_sums, scratch->v.data(), dp, T, d, c0, context, g.ld_context);
  }
}

}  // namespace

ATTN_AVX2 void AttentionHeadAvx2(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                 Fp32AttentionScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 8), dp = RoundUpTo(d, 8);
  GrowScratch(scratch->kt, d * tp);
  GrowScratch(scratch->v, T * dp);
  GrowScratch(scratch->scores, kAvx2BlockRows * tp);
  PackKeysAndValuesAvx2(g, t, tp, dp, scratch->kt.data(), scratch->v.data());
  ForRowBlocks<kAvx2BlockRows>(T, [&](auto rows, int64_t i0) {
    BlockAvx2<decltype(rows)::value>(g, t, scratch, tp, dp, i0);
  });
}

}  // namespace attn
