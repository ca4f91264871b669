#include "engine/ops/fused_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"
#include "engine/tensor.h"

namespace attn {

namespace {

constexpr int kBlockRows = 8;  // query rows per block: 8 rows x 32 columns = 16 accumulators

int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// One (sequence, head) work item.
struct HeadTask {
  const float* q;  // (T, d), row stride ld_qkv
  const float* k;  // (T, d)
  const float* v;  // (T, d)
  int64_t tokens;  // T
  float* context;  // (T, d), row stride H
  float* probs;    // (T, T) or null
  float* scores;   // (T, T) or null
};

struct Geometry {
  int64_t head_dim;    // d
  int64_t ld_qkv;      // 3H
  int64_t ld_context;  // H
  float scale;         // 1 / sqrt(d)
};

// Per-thread scratch, sized for the longest sequence.
struct Scratch {
  FloatBuffer kt;      // (d, tp): K^T, zero-padded columns
  FloatBuffer v;       // (T, dp): V, zero-padded columns
  FloatBuffer scores;  // (kBlockRows, tp)
};

// ---------------------------------------------------------------------------------------------
// Portable path: the formulas as loops.

void HeadPortable(const Geometry& g, const HeadTask& t, FloatBuffer* row_buffer) {
  const int64_t T = t.tokens, d = g.head_dim;
  if (static_cast<int64_t>(row_buffer->size()) < T) row_buffer->resize(T);
  float* s = row_buffer->data();
  for (int64_t i = 0; i < T; ++i) {
    const float* qi = t.q + i * g.ld_qkv;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < T; ++j) {
      const float* kj = t.k + j * g.ld_qkv;
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
      s[j] = dot * g.scale;
      max = std::max(max, s[j]);
    }
    if (t.scores != nullptr) std::copy(s, s + T, t.scores + i * T);
    float sum = 0.0f;
    for (int64_t j = 0; j < T; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < T; ++j) s[j] *= inv;
    if (t.probs != nullptr) std::copy(s, s + T, t.probs + i * T);
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

// Unnormalised softmax over the first T columns of `rows` rows of s (row stride tp), in place:
// s = exp(s - row max), inv_sums[r] = 1 / row sum. The normalisation is left to whoever reads
// the row (the context product scales its output rows; the probs copy scales on the way out),
// which saves a pass over the (rows, T) block.
ATTN_AVX512 void ExpRowsAvx512(float* s, int64_t rows, int64_t tp, int64_t T, float* inv_sums) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * tp;
    __m512 max = neg_inf;
    for (int64_t j = 0; j < T; j += 16) {
      max = _mm512_max_ps(max, _mm512_mask_loadu_ps(neg_inf, avx512::TailMask(T - j), row + j));
    }
    const __m512 max_vec = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; j += 16) {
      const __mmask16 k = avx512::TailMask(T - j);
      const __m512 e = avx512::Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), max_vec));
      _mm512_mask_storeu_ps(row + j, k, e);
      sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    inv_sums[r] = 1.0f / _mm512_reduce_add_ps(sum);
  }
}

// out (T floats) = row * scale
ATTN_AVX512 void ScaleRowAvx512(const float* row, int64_t T, float scale, float* out) {
  const __m512 scale_vec = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = avx512::TailMask(T - j);
    _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), scale_vec));
  }
}

template <int R>
ATTN_AVX512 void BlockAvx512(const Geometry& g, const HeadTask& t, Scratch* scratch, int64_t tp,
                             int64_t dp, int64_t i0) {
  const int64_t T = t.tokens, d = g.head_dim;
  float* s = scratch->scores.data();
  ScoresRows<R>(t.q + i0 * g.ld_qkv, g.ld_qkv, scratch->kt.data(), tp, d, g.scale, s);
  if (t.scores != nullptr) {
    for (int r = 0; r < R; ++r) std::memcpy(t.scores + (i0 + r) * T, s + r * tp, sizeof(float) * T);
  }
  float inv_sums[R];
  ExpRowsAvx512(s, R, tp, T, inv_sums);
  if (t.probs != nullptr) {
    for (int r = 0; r < R; ++r) ScaleRowAvx512(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
  }
  ContextRows<R>(s, tp, inv_sums, scratch->v.data(), dp, T, d, t.context + i0 * g.ld_context,
                 g.ld_context);
}

// kt (d, tp) = K^T with zero columns [T, tp); v (T, dp) = V with zero columns [d, dp).
// ld_qkv * 16 must fit in int32 (gather offsets).
ATTN_AVX512 void PackKeysAndValuesAvx512(const Geometry& g, const HeadTask& t, int64_t tp,
                                         int64_t dp, float* kt, float* v) {
  const int64_t T = t.tokens, d = g.head_dim;
  // K^T 16 keys at a time: one gather per column writes a whole cache line of kt (scalar
  // transposition stored one float per line and was a sixth of the attention time at T=512).
  const __m512i key_rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(g.ld_qkv)));
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = avx512::TailMask(T - j);
    const float* base = t.k + j * g.ld_qkv;
    for (int64_t c = 0; c < d; ++c) {
      const __m512 column =
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, key_rows, base + c, sizeof(float));
      _mm512_store_ps(kt + c * tp + j, column);
    }
  }
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
  int64_t i0 = 0;
  for (; i0 + kBlockRows <= T; i0 += kBlockRows) BlockAvx512<kBlockRows>(g, t, scratch, tp, dp, i0);
  switch (T - i0) {
    case 7:
      BlockAvx512<7>(g, t, scratch, tp, dp, i0);
      break;
    case 6:
      BlockAvx512<6>(g, t, scratch, tp, dp, i0);
      break;
    case 5:
      BlockAvx512<5>(g, t, scratch, tp, dp, i0);
      break;
    case 4:
      BlockAvx512<4>(g, t, scratch, tp, dp, i0);
      break;
    case 3:
      BlockAvx512<3>(g, t, scratch, tp, dp, i0);
      break;
    case 2:
      BlockAvx512<2>(g, t, scratch, tp, dp, i0);
      break;
    case 1:
      BlockAvx512<1>(g, t, scratch, tp, dp, i0);
      break;
    default:
      break;
  }
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
  const Geometry g{d, 3 * H, H, 1.0f / std::sqrt(static_cast<float>(d))};

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
      if (outputs != nullptr) {
        if (!outputs->probs.empty() && outputs->probs[b] != nullptr) {
          task.probs = outputs->probs[b] + h * T * T;
        }
        if (!outputs->scores.empty() && outputs->scores[b] != nullptr) {
          task.scores = outputs->scores[b] + h * T * T;
        }
      }
      if (avx512) {
        HeadAvx512(g, task, &scratch);
      } else {
        HeadPortable(g, task, &scratch.scores);
      }
    }
  }
}

}  // namespace attn
