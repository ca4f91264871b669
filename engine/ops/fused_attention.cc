#include "engine/ops/fused_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "engine/half.h"
#include "engine/ops/attention_head.h"
#include "engine/ops/avx2_math.h"
#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/ops/dropout.h"
#include "engine/tensor.h"

namespace attn {

namespace {

constexpr int kBlockRows = 8;  // query rows per block: 8 rows x 32 columns = 16 accumulators

int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

using HeadTask = AttentionHeadTask;
using Geometry = AttentionHeadGeometry;

using Scratch = Fp32AttentionScratch;

// ---------------------------------------------------------------------------------------------
// Portable path: the formulas as loops.

void HeadPortable(const Geometry& g, const HeadTask& t, FloatBuffer* row_buffer) {
  const int64_t T = t.tokens, d = g.head_dim;
  if (static_cast<int64_t>(row_buffer->size()) < T) row_buffer->resize(T);
  float* s = row_buffer->data();
  for (int64_t i = 0; i < T; ++i) {
    const float* qi = t.q + i * g.ld_qkv;
    for (int64_t j = 0; j < T; ++j) {
      const float* kj = t.k + j * g.ld_qkv;
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
      s[j] = dot * g.scale;
    }
    AddScoreBias(t, i, s);
    if (t.scores != nullptr) std::copy(s, s + T, t.scores + i * T);
    SoftmaxRowInPlace(s, T);
    if (t.probs != nullptr) std::copy(s, s + T, t.probs + i * T);
    if (g.bf16_products) RoundFloatsToBFloat16(s, T, s);
    float* ci = t.context + i * g.ld_context;
    for (int64_t c = 0; c < d; ++c) ci[c] = 0.0f;
    for (int64_t j = 0; j < T; ++j) {
      const float* vj = t.v + j * g.ld_qkv;
      for (int64_t c = 0; c < d; ++c) ci[c] += s[j] * vj[c];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AVX-512 path.

// s (R, tp) = q (R rows, stride ldq) · kt (d, tp) * scale.  NV = 16-column vectors per tile.
template <int R, int NV>
ATTN_AVX512 inline void ScoresTile(const float* q, int64_t ldq, const float* kt, int64_t tp,
                                   int64_t d, __m512 scale, int64_t j, float* s) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < d; ++c) {
    __m512 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm512_load_ps(kt + c * tp + j + 16 * n);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(q[r * ldq + c]);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_fmadd_ps(a, b[n], acc[r][n]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      _mm512_store_ps(s + r * tp + j + 16 * n, _mm512_mul_ps(acc[r][n], scale));
    }
  }
}

template <int R>
ATTN_AVX512 void ScoresRows(const float* q, int64_t ldq, const float* kt, int64_t tp, int64_t d,
                            float scale, float* s) {
  const __m512 scale_vec = _mm512_set1_ps(scale);
  int64_t j = 0;
  for (; j + 32 <= tp; j += 32) ScoresTile<R, 2>(q, ldq, kt, tp, d, scale_vec, j, s);
  if (j < tp) ScoresTile<R, 1>(q, ldq, kt, tp, d, scale_vec, j, s);
}

// c (R rows, stride ldc, d columns) = diag(row_scales) · p (R, tp; first T columns) · v (T, dp).
template <int R, int NV>
ATTN_AVX512 inline void ContextTile(const float* p, int64_t tp, const float* row_scales,
                                    const float* v, int64_t dp, int64_t T, int64_t d, int64_t c0,
                                    float* c, int64_t ldc) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < T; ++k) {
    __m512 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm512_load_ps(v + k * dp + c0 + 16 * n);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(p[r * tp + k]);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_fmadd_ps(a, b[n], acc[r][n]);
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

template <int R>
ATTN_AVX512 void ContextRows(const float* p, int64_t tp, const float* row_scales, const float* v,
                             int64_t dp, int64_t T, int64_t d, float* c, int64_t ldc) {
  int64_t c0 = 0;
  for (; c0 + 32 <= dp; c0 += 32) ContextTile<R, 2>(p, tp, row_scales, v, dp, T, d, c0, c, ldc);
  if (c0 < dp) ContextTile<R, 1>(p, tp, row_scales, v, dp, T, d, c0, c, ldc);
}

// row[j] = bfloat16(row[j]) kept as fp32 (round to nearest even; finite inputs), j < T.
ATTN_AVX512 void RoundRowToBf16Avx512(float* row, int64_t T) {
  const __m512i low_half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  const __m512i high_mask = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = avx512::TailMask(T - j);
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, row + j));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i rounded =
        _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(low_half, odd)), high_mask);
    _mm512_mask_storeu_ps(row + j, k, _mm512_castsi512_ps(rounded));
  }
}

template <int R>
ATTN_AVX512 void BlockAvx512(const Geometry& g, const HeadTask& t, Scratch* scratch, int64_t tp,
                             int64_t dp, int64_t i0) {
  const int64_t T = t.tokens, d = g.head_dim;
  float* s = scratch->scores.data();
  ScoresRows<R>(t.q + i0 * g.ld_qkv, g.ld_qkv, scratch->kt.data(), tp, d, g.scale, s);
  if (t.bias != nullptr) {
    for (int r = 0; r < R; ++r) avx512::AddBiasRow(t.bias - (i0 + r), T, s + r * tp);
  }
  if (t.scores != nullptr) {
    for (int r = 0; r < R; ++r) std::memcpy(t.scores + (i0 + r) * T, s + r * tp, sizeof(float) * T);
  }
  float inv_sums[R];
  avx512::ExpRows(s, R, tp, T, inv_sums);
  if (t.probs != nullptr) {
    for (int r = 0; r < R; ++r)
      avx512::ScaleRow(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
  }
  if (g.bf16_products) {
    // The unnormalised exp rows: the row scale applied after P V is fp32 either way.
    for (int r = 0; r < R; ++r) RoundRowToBf16Avx512(s + r * tp, T);
  }
  ContextRows<R>(s, tp, inv_sums, scratch->v.data(), dp, T, d, t.context + i0 * g.ld_context,
                 g.ld_context);
}

// kt (d, tp) = K^T with zero columns [T, tp); v (T, dp) = V with zero columns [d, dp).
// ld_qkv * 16 must fit in int32 (gather offsets).
// out (d, tp) = rows^T for T rows of d floats at stride ld (columns [T, tp) zero; tp a multiple
// of 16, out 64-byte aligned). ld * 16 must fit in int32 (gather offsets).
ATTN_AVX512 void TransposeRowsAvx512(const float* rows, int64_t ld, int64_t T, int64_t d,
                                     int64_t tp, float* out) {
  // 16 rows at a time: one gather per column writes a whole cache line of out (scalar
  // transposition stored one float per line and was a sixth of the attention time at T=512).
  const __m512i row_offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(ld)));
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = avx512::TailMask(T - j);
    const float* base = rows + j * ld;
    for (int64_t c = 0; c < d; ++c) {
      const __m512 column =
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, row_offsets, base + c, sizeof(float));
      _mm512_store_ps(out + c * tp + j, column);
    }
  }
}

ATTN_AVX512 void PackKeysAndValuesAvx512(const Geometry& g, const HeadTask& t, int64_t tp,
                                         int64_t dp, float* kt, float* v) {
  const int64_t T = t.tokens, d = g.head_dim;
  TransposeRowsAvx512(t.k, g.ld_qkv, T, d, tp, kt);
  for (int64_t j = 0; j < T; ++j) {
    const float* vj = t.v + j * g.ld_qkv;
    float* out = v + j * dp;
    for (int64_t c = 0; c < dp; c += 16) {
      // masked load: columns [d, dp) come out as zeros
      _mm512_store_ps(out + c, _mm512_maskz_loadu_ps(avx512::TailMask(d - c), vj + c));
    }
  }
}

ATTN_AVX512 void HeadAvx512(const Geometry& g, const HeadTask& t, Scratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUp16(T), dp = RoundUp16(d);
  if (static_cast<int64_t>(scratch->kt.size()) < d * tp) scratch->kt.resize(d * tp);
  if (static_cast<int64_t>(scratch->v.size()) < T * dp) scratch->v.resize(T * dp);
  if (static_cast<int64_t>(scratch->scores.size()) < kBlockRows * tp) {
    scratch->scores.resize(kBlockRows * tp);
  }
  PackKeysAndValuesAvx512(g, t, tp, dp, scratch->kt.data(), scratch->v.data());
  ForRowBlocks<kBlockRows>(T, [&](auto rows, int64_t i0) {
    BlockAvx512<decltype(rows)::value>(g, t, scratch, tp, dp, i0);
  });
}

// Each thread's scratch, kept across calls (it only grows to the longest sequence seen).
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

void PackedAttentionForward(const PackedAttentionShape& shape, const float* qkv,
                            const std::vector<int64_t>& seq_offsets, float* context,
                            const PackedAttentionOutputs* outputs) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  const int64_t heads = shape.heads, d = shape.head_dim, H = shape.hidden();
  const Geometry g{d, 3 * H, H, 1.0f / std::sqrt(static_cast<float>(d)), shape.bf16_products};
  const bool int8 = shape.int8_products && UseAvx512VnniKernels();
  const bool bf16 = shape.bf16_products && UseAvx512Bf16Kernels();
  const bool amx_bf16 = bf16 && UseAmxBf16Kernels() && AmxBf16AttentionSupports(d);

  // Longest sequences first so the last items handed out are the short ones.
  std::vector<int64_t> order(batch);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return seq_offsets[a + 1] - seq_offsets[a] > seq_offsets[b + 1] - seq_offsets[b];
  });
  double flops = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const double T = static_cast<double>(seq_offsets[b + 1] - seq_offsets[b]);
    flops += 4.0 * heads * T * T * d;
  }
  const int64_t items = batch * heads;
  const bool avx512 = UseAvx512Kernels();
  const bool avx2 = !avx512 && UseAvx2Kernels();

#pragma omp parallel if (flops > 2e6)
  {
    Scratch& scratch = ThreadScratch();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = order[item / heads], h = item % heads;
      const int64_t begin = seq_offsets[b], T = seq_offsets[b + 1] - begin;
      const float* rows = qkv + begin * 3 * H;
      HeadTask task{
          rows + h * d, rows + H + h * d, rows + 2 * H + h * d, T, context + begin * H + h * d,
          nullptr,      nullptr};
      if (shape.relative_bias != nullptr) task.bias = shape.relative_bias->center(h);
      if (outputs != nullptr) {
        if (!outputs->probs.empty() && outputs->probs[b] != nullptr) {
          task.probs = outputs->probs[b] + h * T * T;
        }
        if (!outputs->scores.empty() && outputs->scores[b] != nullptr) {
          task.scores = outputs->scores[b] + h * T * T;
        }
      }
      if (int8) {
        thread_local Int8AttentionScratch int8_scratch;
        AttentionHeadInt8Vnni(g, task, &int8_scratch);
      } else if (amx_bf16) {
        thread_local Bf16AttentionScratch bf16_scratch;
        const AmxBf16Tiles tiles;
        AttentionHeadBf16Amx(g, task, &bf16_scratch);
      } else if (bf16) {
        thread_local Bf16AttentionScratch bf16_scratch;
        AttentionHeadBf16(g, task, &bf16_scratch);
      } else if (avx512) {
        HeadAvx512(g, task, &scratch);
      } else if (avx2) {
        AttentionHeadAvx2(g, task, &scratch);
      } else {
        HeadPortable(g, task, &scratch.scores);
      }
    }
  }
}

// =============================================================================================
// Training forward and backward.

namespace {

// c[r, n] (rows, cols; row stride ldc) = alpha * sum_k a(r, k) * b[k * ldb + n], where
// a(r, k) = a[r * a_rs + k * a_ks] reads A row-major (a_rs = lda, a_ks = 1) or transposed
// (a_rs = 1, a_ks = lda), and each b row is `cols` contiguous floats read in place.
struct StridedProduct {
  const float* a;
  int64_t a_rs, a_ks;
  const float* b;
  int64_t ldb;
  int64_t rows, cols, depth;
  float alpha;
  float* c;
  int64_t ldc;
};

void ProductPortable(const StridedProduct& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float* c = p.c + r * p.ldc;
    std::fill(c, c + p.cols, 0.0f);
    for (int64_t k = 0; k < p.depth; ++k) {
      const float a = p.a[r * p.a_rs + k * p.a_ks];
      const float* b = p.b + k * p.ldb;
      for (int64_t n = 0; n < p.cols; ++n) c[n] += a * b[n];
    }
    for (int64_t n = 0; n < p.cols; ++n) c[n] *= p.alpha;
  }
}

// Rows [r0, r0 + R) x columns [n0, n0 + 16 NV) of the product (columns past p.cols masked).
template <int R, int NV>
ATTN_AVX512 inline void ProductTile(const StridedProduct& p, int64_t r0, int64_t n0) {
  __mmask16 masks[NV];
  __m512 acc[R][NV];
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) masks[n] = avx512::TailMask(p.cols - n0 - 16 * n);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  const float* a = p.a + r0 * p.a_rs;
  for (int64_t k = 0; k < p.depth; ++k) {
    const float* b_row = p.b + k * p.ldb + n0;
    __m512 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = _mm512_maskz_loadu_ps(masks[n], b_row + 16 * n);
    const float* a_k = a + k * p.a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a_rk = _mm512_set1_ps(a_k[r * p.a_rs]);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_fmadd_ps(a_rk, b[n], acc[r][n]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(p.alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      _mm512_mask_storeu_ps(p.c + (r0 + r) * p.ldc + n0 + 16 * n, masks[n],
                            _mm512_mul_ps(acc[r][n], alpha));
    }
  }
}

template <int R>
ATTN_AVX512 void ProductRowsAvx512(const StridedProduct& p, int64_t r0) {
  int64_t n0 = 0;
  for (; n0 + 16 < p.cols; n0 += 32) ProductTile<R, 2>(p, r0, n0);
  if (n0 < p.cols) ProductTile<R, 1>(p, r0, n0);
}

ATTN_AVX512 void ProductAvx512(const StridedProduct& p) {
  ForRowBlocks<kBlockRows>(
      p.rows, [&](auto rows, int64_t r0) { ProductRowsAvx512<decltype(rows)::value>(p, r0); });
}

// s (rows, T; row stride T) = softmax(s) over each row, in place.
void SoftmaxRowsPortable(float* s, int64_t rows, int64_t T) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * T;
    const float max = *std::max_element(row, row + T);
    float sum = 0.0f;
    for (int64_t j = 0; j < T; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < T; ++j) row[j] *= inv;
  }
}

ATTN_AVX512 void SoftmaxRowsAvx512(float* s, int64_t rows, int64_t T) {
  for (int64_t r = 0; r < rows; ++r) {
    float inv_sum;
    avx512::ExpRows(s + r * T, 1, T, T, &inv_sum);
    avx512::ScaleRow(s + r * T, T, inv_sum, s + r * T);
  }
}

// Per row of T: dp = dp * mask * keep_scale (when mask is not null), then the softmax backward
// ds = p * (dp - sum_j dp * p), written over dp. p, dp: (rows, T) row stride T; mask likewise.
void SoftmaxBackwardRowsPortable(const float* p, const uint8_t* mask, float keep_scale,
                                 int64_t rows, int64_t T, float* dp) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * T;
    float* dr = dp + r * T;
    if (mask != nullptr) {
      const uint8_t* mr = mask + r * T;
      for (int64_t j = 0; j < T; ++j) dr[j] = mr[j] != 0 ? dr[j] * keep_scale : 0.0f;
    }
    float dot = 0.0f;
    for (int64_t j = 0; j < T; ++j) dot += dr[j] * pr[j];
    for (int64_t j = 0; j < T; ++j) dr[j] = pr[j] * (dr[j] - dot);
  }
}

ATTN_AVX512 void SoftmaxBackwardRowsAvx512(const float* p, const uint8_t* mask, float keep_scale,
                                           int64_t rows, int64_t T, float* dp) {
  const __m512 keep_scale_vec = _mm512_set1_ps(keep_scale);
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * T;
    float* dr = dp + r * T;
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; j += 16) {
      const __mmask16 k = avx512::TailMask(T - j);
      __m512 d = _mm512_maskz_loadu_ps(k, dr + j);
      if (mask != nullptr) {
        const __m128i bytes = _mm_maskz_loadu_epi8(k, mask + r * T + j);
        d = _mm512_maskz_mul_ps(_mm_test_epi8_mask(bytes, bytes), d, keep_scale_vec);
        _mm512_mask_storeu_ps(dr + j, k, d);
      }
      dot = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(k, pr + j), dot);
    }
    const __m512 dot_vec = _mm512_set1_ps(_mm512_reduce_add_ps(dot));
    for (int64_t j = 0; j < T; j += 16) {
      const __mmask16 k = avx512::TailMask(T - j);
      const __m512 d = _mm512_maskz_loadu_ps(k, dr + j);
      _mm512_mask_storeu_ps(
          dr + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pr + j), _mm512_sub_ps(d, dot_vec)));
    }
  }
}

// out (d, tp) = rows^T for T rows of d floats at stride ld.
void TransposeRowsPortable(const float* rows, int64_t ld, int64_t T, int64_t d, int64_t tp,
                           float* out) {
  for (int64_t j = 0; j < T; ++j) {
    for (int64_t c = 0; c < d; ++c) out[c * tp + j] = rows[j * ld + c];
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 training kernels (CPUs without AVX-512): the AVX-512 ones at 8 lanes, 6-row blocks.

constexpr int kAvx2BlockRows = 6;  // 6 rows x 16 columns = 12 accumulators of 16 ymm registers

template <int R, int NV>
ATTN_AVX2 inline void ProductTileAvx2(const StridedProduct& p, int64_t r0, int64_t n0) {
  __m256i masks[NV];
  __m256 acc[R][NV];
#pragma GCC unroll 2
  for (int n = 0; n < NV; ++n) masks[n] = avx2::TailMask(p.cols - n0 - 8 * n);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_setzero_ps();
  }
  const float* a = p.a + r0 * p.a_rs;
  for (int64_t k = 0; k < p.depth; ++k) {
    const float* b_row = p.b + k * p.ldb + n0;
    __m256 b[NV];
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) b[n] = avx2::MaskLoad(b_row + 8 * n, masks[n]);
    const float* a_k = a + k * p.a_ks;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a_rk = _mm256_broadcast_ss(a_k + r * p.a_rs);
#pragma GCC unroll 2
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm256_fmadd_ps(a_rk, b[n], acc[r][n]);
    }
  }
  const __m256 alpha = _mm256_set1_ps(p.alpha);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int n = 0; n < NV; ++n) {
      _mm256_maskstore_ps(p.c + (r0 + r) * p.ldc + n0 + 8 * n, masks[n],
                          _mm256_mul_ps(acc[r][n], alpha));
    }
  }
}

template <int R>
ATTN_AVX2 void ProductRowsAvx2(const StridedProduct& p, int64_t r0) {
  int64_t n0 = 0;
  for (; n0 + 8 < p.cols; n0 += 16) ProductTileAvx2<R, 2>(p, r0, n0);
  if (n0 < p.cols) ProductTileAvx2<R, 1>(p, r0, n0);
}

ATTN_AVX2 void ProductAvx2(const StridedProduct& p) {
  ForRowBlocks<kAvx2BlockRows>(
      p.rows, [&](auto rows, int64_t r0) { ProductRowsAvx2<decltype(rows)::value>(p, r0); });
}

ATTN_AVX2 void SoftmaxRowsAvx2(float* s, int64_t rows, int64_t T) {
  for (int64_t r = 0; r < rows; ++r) {
    float inv_sum;
    avx2::ExpRows(s + r * T, 1, T, T, &inv_sum);
    avx2::ScaleRow(s + r * T, T, inv_sum, s + r * T);
  }
}

ATTN_AVX2 void SoftmaxBackwardRowsAvx2(const float* p, const uint8_t* mask, float keep_scale,
                                       int64_t rows, int64_t T, float* dp) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * T;
    float* dr = dp + r * T;
    if (mask != nullptr) {
      const uint8_t* mr = mask + r * T;
      for (int64_t j = 0; j < T; ++j) dr[j] = mr[j] != 0 ? dr[j] * keep_scale : 0.0f;
    }
    __m256 dot = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; j += 8) {
      const __m256i k = avx2::TailMask(T - j);
      dot = _mm256_fmadd_ps(avx2::MaskLoad(dr + j, k), avx2::MaskLoad(pr + j, k), dot);
    }
    const __m256 dot_vec = _mm256_set1_ps(avx2::ReduceAdd(dot));
    for (int64_t j = 0; j < T; j += 8) {
      const __m256i k = avx2::TailMask(T - j);
      _mm256_maskstore_ps(dr + j, k,
                          _mm256_mul_ps(avx2::MaskLoad(pr + j, k),
                                        _mm256_sub_ps(avx2::MaskLoad(dr + j, k), dot_vec)));
    }
  }
}

// out (d, tp) = rows^T: 8 rows at a time, one gather per column (a whole 8-float store).
ATTN_AVX2 void TransposeRowsAvx2(const float* rows, int64_t ld, int64_t T, int64_t d, int64_t tp,
                                 float* out) {
  const __m256i row_offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                 _mm256_set1_epi32(static_cast<int32_t>(ld)));
  for (int64_t j = 0; j < T; j += 8) {
    const __m256i k = avx2::TailMask(T - j);
    const float* base = rows + j * ld;
    for (int64_t c = 0; c < d; ++c) {
      _mm256_maskstore_ps(out + c * tp + j, k,
                          _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base + c, row_offsets,
                                                   _mm256_castsi256_ps(k), sizeof(float)));
    }
  }
}

// The kernels of one path (AVX-512, AVX2 or portable), picked once per call.
struct TrainingKernels {
  void (*product)(const StridedProduct&);
  void (*softmax_rows)(float*, int64_t, int64_t);
  void (*softmax_backward_rows)(const float*, const uint8_t*, float, int64_t, int64_t, float*);
  void (*transpose_rows)(const float*, int64_t, int64_t, int64_t, int64_t, float*);
};

TrainingKernels SelectTrainingKernels() {
  if (UseAvx512Kernels()) {
    return {ProductAvx512, SoftmaxRowsAvx512, SoftmaxBackwardRowsAvx512, TransposeRowsAvx512};
  }
  if (UseAvx2Kernels()) {
    return {ProductAvx2, SoftmaxRowsAvx2, SoftmaxBackwardRowsAvx2, TransposeRowsAvx2};
  }
  return {ProductPortable, SoftmaxRowsPortable, SoftmaxBackwardRowsPortable, TransposeRowsPortable};
}

// Query rows per pass: a pass's (rows, T) probabilities stay in L2 between the product that
// writes them and the ones that read them.
constexpr int64_t kPassRows = 64;

struct TrainingGeometry {
  int64_t heads, head_dim, hidden;  // hidden H = heads * d; qkv rows have 3H floats
  float scale;                      // 1 / sqrt(d)
  float dropout_p;
  float keep_scale;  // 1 / (1 - p), as DropoutBackward
  uint64_t seed;
};

// One (sequence, head) of the packed batch; matrices as in the header's formulas.
struct TrainingItem {
  const float* q;               // (T, d) at row stride 3H; k = q + H, v = q + 2H
  int64_t tokens;               // T
  float* probs;                 // (T, T)
  float* dropped;               // (T, T) or null without dropout
  uint8_t* mask;                // (T, T) or null
  uint64_t dropout_offset;      // counter of element (0, 0)
  const float* bias = nullptr;  // relative position bias center of head h (bias[j - i]), or null
  float* d_bias = nullptr;      // this item's own (2L-1) gradient slice, at its center, or null
};

struct TrainingScratch {
  FloatBuffer transposed;  // (d, tp): K^T (forward) or V^T (backward)
  FloatBuffer dscores;     // (T, T): dP, then dS
};

TrainingScratch& ThreadTrainingScratch() {
  thread_local TrainingScratch scratch;
  return scratch;
}

// Sequences longest first, so the last items handed out are the short ones.
std::vector<int64_t> LongestFirst(const std::vector<int64_t>& seq_offsets) {
  std::vector<int64_t> order(seq_offsets.size() - 1);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return seq_offsets[a + 1] - seq_offsets[a] > seq_offsets[b + 1] - seq_offsets[b];
  });
  return order;
}

// 4 T^2 d per head and product, times `products` products.
double AttentionFlops(const std::vector<int64_t>& seq_offsets, int64_t heads, int64_t d,
                      double products) {
  double flops = 0.0;
  for (size_t b = 0; b + 1 < seq_offsets.size(); ++b) {
    const double T = static_cast<double>(seq_offsets[b + 1] - seq_offsets[b]);
    flops += products * 2.0 * heads * T * T * d;
  }
  return flops;
}

// The item for head h of sequence b.
TrainingItem MakeItem(const TrainingGeometry& g, const float* qkv,
                      const std::vector<int64_t>& seq_offsets,
                      const std::vector<uint64_t>& seq_dropout_offsets,
                      const PackedAttentionSaved& saved, int64_t b, int64_t h) {
  const int64_t begin = seq_offsets[b], T = seq_offsets[b + 1] - begin;
  const int64_t head_elements = T * T;
  TrainingItem item{qkv + begin * 3 * g.hidden + h * g.head_dim,
                    T,
                    saved.probs[b] + h * head_elements,
                    nullptr,
                    nullptr,
                    0};
  if (!saved.probs_dropped.empty()) {
    item.dropped = saved.probs_dropped[b] + h * head_elements;
    item.mask = saved.masks[b] + h * head_elements;
    item.dropout_offset = seq_dropout_offsets[b] + static_cast<uint64_t>(h * head_elements);
  }
  return item;
}

void ForwardItem(const TrainingKernels& kernels, const TrainingGeometry& g, const TrainingItem& t,
                 float* context, TrainingScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim, H = g.hidden, ld = 3 * H;
  const int64_t tp = RoundUp16(T);
  if (static_cast<int64_t>(scratch->transposed.size()) < d * tp) {
    scratch->transposed.resize(d * tp);
  }
  float* kt = scratch->transposed.data();
  kernels.transpose_rows(t.q + H, ld, T, d, tp, kt);
  for (int64_t i0 = 0; i0 < T; i0 += kPassRows) {
    const int64_t rows = std::min(kPassRows, T - i0);
    float* probs = t.probs + i0 * T;
    // scores (rows, T) = Q_rows · K^T * scale, then probs = softmax(scores) in place
    kernels.product({t.q + i0 * ld, ld, 1, kt, tp, rows, T, d, g.scale, probs, T});
    if (t.bias != nullptr) {  // scores (rows, T) += bias[j - i]
      for (int64_t r = 0; r < rows; ++r) {
        const float* bias_row = t.bias - (i0 + r);
        float* row = probs + r * T;
        for (int64_t j = 0; j < T; ++j) row[j] += bias_row[j];
      }
    }
    kernels.softmax_rows(probs, rows, T);
    // probs_dropped = probs * mask / (1 - p): element (i, j) draws counter offset + i*T + j
    const float* used = probs;
    if (t.dropped != nullptr) {
      DropoutForwardSerial(probs, rows * T, g.dropout_p, g.seed, t.dropout_offset + i0 * T,
                           t.dropped + i0 * T, t.mask + i0 * T);
      used = t.dropped + i0 * T;
    }
    // context rows (rows, d) = probs_dropped rows (rows, T) · V (T, d)
    kernels.product({used, T, 1, t.q + 2 * H, ld, rows, d, T, 1.0f, context + i0 * H, H});
  }
}

void BackwardItem(const TrainingKernels& kernels, const TrainingGeometry& g, const TrainingItem& t,
                  const float* dcontext, float* dqkv, TrainingScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim, H = g.hidden, ld = 3 * H;
  const int64_t tp = RoundUp16(T);
  if (static_cast<int64_t>(scratch->transposed.size()) < d * tp) {
    scratch->transposed.resize(d * tp);
  }
  if (static_cast<int64_t>(scratch->dscores.size()) < T * T) scratch->dscores.resize(T * T);
  float* vt = scratch->transposed.data();
  float* ds = scratch->dscores.data();
  const float* q = t.q;
  const float* k = t.q + H;
  kernels.transpose_rows(t.q + 2 * H, ld, T, d, tp, vt);
  for (int64_t i0 = 0; i0 < T; i0 += kPassRows) {
    const int64_t rows = std::min(kPassRows, T - i0);
    // dP rows (rows, T) = dC rows (rows, d) · V^T (d, T)
    kernels.product({dcontext + i0 * H, H, 1, vt, tp, rows, T, d, 1.0f, ds + i0 * T, T});
    // dP = dP * mask / (1 - p); dS = P * (dP - rowsum(dP * P))
    kernels.softmax_backward_rows(t.probs + i0 * T, t.mask != nullptr ? t.mask + i0 * T : nullptr,
                                  g.keep_scale, rows, T, ds + i0 * T);
  }
  if (t.d_bias != nullptr) {  // d_bias[j - i] += dS[i][j]
    for (int64_t i = 0; i < T; ++i) {
      float* d_row = t.d_bias - i;
      const float* ds_row = ds + i * T;
      for (int64_t j = 0; j < T; ++j) d_row[j] += ds_row[j];
    }
  }
  const float* used = t.dropped != nullptr ? t.dropped : t.probs;
  // dV (T, d) = Pd^T (T, T) · dC (T, d)
  kernels.product({used, 1, T, dcontext, H, T, d, T, 1.0f, dqkv + 2 * H, ld});
  // dQ (T, d) = dS (T, T) · K (T, d) * scale
  kernels.product({ds, T, 1, k, ld, T, d, T, g.scale, dqkv, ld});
  // dK (T, d) = dS^T (T, T) · Q (T, d) * scale
  kernels.product({ds, 1, T, q, ld, T, d, T, g.scale, dqkv + H, ld});
}

TrainingGeometry MakeTrainingGeometry(const PackedAttentionShape& shape, float dropout_p,
                                      uint64_t seed) {
  const float d = static_cast<float>(shape.head_dim);
  return {shape.heads,
          shape.head_dim,
          shape.hidden(),
          1.0f / std::sqrt(d),
          dropout_p,
          dropout_p < 1.0f ? 1.0f / (1.0f - dropout_p) : 0.0f,
          seed};
}

}  // namespace

void PackedAttentionForwardTraining(const PackedAttentionShape& shape, const float* qkv,
                                    const std::vector<int64_t>& seq_offsets, float dropout_p,
                                    uint64_t seed, uint64_t dropout_offset,
                                    const PackedAttentionSaved& saved, float* context) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  const int64_t heads = shape.heads, H = shape.hidden();
  const TrainingGeometry g = MakeTrainingGeometry(shape, dropout_p, seed);
  // Sequence b's counters start where the per-sequence calls' did: after every earlier
  // sequence's heads*T*T.
  std::vector<uint64_t> seq_dropout_offsets(batch);
  uint64_t next_offset = dropout_offset;
  for (int64_t b = 0; b < batch; ++b) {
    seq_dropout_offsets[b] = next_offset;
    const int64_t T = seq_offsets[b + 1] - seq_offsets[b];
    next_offset += static_cast<uint64_t>(heads * T * T);
  }
  const std::vector<int64_t> order = LongestFirst(seq_offsets);
  const TrainingKernels kernels = SelectTrainingKernels();
  const int64_t items = batch * heads;

#pragma omp parallel if (AttentionFlops(seq_offsets, heads, shape.head_dim, 2) > 2e6)
  {
    TrainingScratch& scratch = ThreadTrainingScratch();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = order[item / heads], h = item % heads;
      TrainingItem t = MakeItem(g, qkv, seq_offsets, seq_dropout_offsets, saved, b, h);
      if (shape.relative_bias != nullptr) t.bias = shape.relative_bias->center(h);
      ForwardItem(kernels, g, t, context + seq_offsets[b] * H + h * shape.head_dim, &scratch);
    }
  }
}

void PackedAttentionBackward(const PackedAttentionShape& shape, const float* qkv,
                             const std::vector<int64_t>& seq_offsets,
                             const PackedAttentionSaved& saved, float dropout_p,
                             const float* dcontext, float* dqkv, float* d_relative_bias) {
  const int64_t batch = static_cast<int64_t>(seq_offsets.size()) - 1;
  const int64_t heads = shape.heads, H = shape.hidden(), d = shape.head_dim;
  const TrainingGeometry g = MakeTrainingGeometry(shape, dropout_p, 0);
  const std::vector<uint64_t> unused_offsets(batch, 0);  // the backward draws nothing
  const std::vector<int64_t> order = LongestFirst(seq_offsets);
  const TrainingKernels kernels = SelectTrainingKernels();
  const int64_t items = batch * heads;
  // The relative position bias gradient: each item sums into its own (2L-1) slice (no races),
  // reduced over the sequences afterwards in a fixed order.
  const int64_t span =
      d_relative_bias != nullptr ? 2 * shape.relative_bias->max_tokens - 1 : int64_t{0};
  std::vector<float> item_d_bias(static_cast<size_t>(items * span), 0.0f);

#pragma omp parallel if (AttentionFlops(seq_offsets, heads, d, 4) > 2e6)
  {
    TrainingScratch& scratch = ThreadTrainingScratch();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = order[item / heads], h = item % heads;
      TrainingItem t = MakeItem(g, qkv, seq_offsets, unused_offsets, saved, b, h);
      if (!item_d_bias.empty()) t.d_bias = item_d_bias.data() + item * span + (span - 1) / 2;
      const int64_t begin = seq_offsets[b];
      BackwardItem(kernels, g, t, dcontext + begin * H + h * d, dqkv + begin * 3 * H + h * d,
                   &scratch);
    }
  }
  // item = (position in `order`) * heads + h: sum each head's slices over the sequences.
  for (int64_t item = 0; span > 0 && item < items; ++item) {
    float* out = d_relative_bias + (item % heads) * span;
    const float* slice = item_d_bias.data() + item * span;
    for (int64_t k = 0; k < span; ++k) out[k] += slice[k];
  }
}

}  // namespace attn
