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

#include <algorithm>
#include <cstring>

#include "engine/ops/attention_head.h"
#include "engine/ops/avx512_math.h"

#define ATTN_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,avx2")))
#define ATTN_AMX_BF16                                                           \
  __attribute__((                                                               \
      target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,avx2,amx-tile," \
             "amx-bf16")))

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

// 16 x 16 32-bit elements transposed in place: rows[i] lane j <-> rows[j] lane i.
ATTN_AVX512_BF16 void Transpose16x16(__m512i rows[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    rows[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    rows[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    rows[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    rows[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Each row now holds 4 lanes from each of 4 groups of rows; gather the 128-bit blocks.
  for (int i = 0; i < 4; ++i) {
    for (int h = 0; h < 2; ++h) {
      t[8 * h + i] = _mm512_shuffle_i32x4(rows[8 * h + i], rows[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_i32x4(rows[8 * h + i], rows[8 * h + 4 + i], 0xDD);
    }
  }
  for (int i = 0; i < 8; ++i) {
    rows[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    rows[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xDD);
  }
}

// keys (d2, tp, 2): K[j, 2 c2 .. 2 c2 + 1] at (c2 tp + j) 2, zero past T and d. Blocks of 16
// keys x 32 channels: each key's channels as 16 bfloat16 pairs (32-bit lanes), transposed so
// that each row holds one pair of every key.
ATTN_AVX512_BF16 void PackKeys(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                               int64_t tp, uint16_t* keys) {
  const int64_t T = t.tokens, d = g.head_dim, d2 = (d + 1) / 2;
  for (int64_t j0 = 0; j0 < tp; j0 += 16) {
    for (int64_t c = 0; c < d; c += 32) {
      __m512i rows[16];
      for (int r = 0; r < 16; ++r) {
        if (j0 + r >= T) {
          rows[r] = _mm512_setzero_si512();
          continue;
        }
        const float* k = t.k + (j0 + r) * g.ld_qkv + c;
        const __m512 lo = _mm512_maskz_loadu_ps(avx512::TailMask(d - c), k);
        const __m512 hi =
            _mm512_maskz_loadu_ps(d - c > 16 ? avx512::TailMask(d - c - 16) : 0, k + 16);
        rows[r] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      }
      Transpose16x16(rows);
      for (int64_t p = 0; p < 16 && c / 2 + p < d2; ++p) {
        _mm512_storeu_si512(keys + ((c / 2 + p) * tp + j0) * 2, rows[p]);
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

// ---------------------------------------------------------------------------------------------
// AMX: the same products on the tile unit, for head_dim a multiple of 32 up to 64 (16 query rows
// at a time: scores 16 x 16 per tile from Q (16 x 32 bfloat16) and the packed K; context 16 x 16
// per tile from the bfloat16 exp rows (16 x 32 keys) and the packed V).

constexpr int kAmxRows = 16;

// ldtilecfg's 64-byte operand: palette 1, every tile 16 rows of 64 bytes (A: 16 x 32 bf16;
// B: 16 pairs x 16 x 2 bf16; C: 16 x 16 fp32).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

const TileConfig& AllTiles16x64() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int i = 0; i < 8; ++i) {
      c.colsb[i] = 64;
      c.rows[i] = 16;
    }
    return c;
  }();
  return config;
}

// s (16, tp) = the bfloat16 query rows q (16, 32 kChunks) · K^T: A tiles 0-1, B 2-3 and 6-7,
// C 4-5 (two key blocks in flight).
template <int kChunks>
ATTN_AMX_BF16 void ScoresAmx(const uint16_t* q, const uint16_t* keys, int64_t tp, float* s) {
  constexpr int64_t q_stride = 64 * kChunks;  // bytes per query row
  const int64_t b_stride = tp * 4;            // bytes per pair row of the packed keys
  const int64_t chunk = 16 * tp * 2;          // elements per 32 channels of the packed keys
  _tile_loadd(0, q, q_stride);
  if constexpr (kChunks == 2) _tile_loadd(1, q + 32, q_stride);
  int64_t j = 0;
  for (; j + 32 <= tp; j += 32) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_loadd(2, keys + j * 2, b_stride);
    _tile_loadd(6, keys + (j + 16) * 2, b_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 6);
    if constexpr (kChunks == 2) {
      _tile_loadd(3, keys + chunk + j * 2, b_stride);
      _tile_loadd(7, keys + chunk + (j + 16) * 2, b_stride);
      _tile_dpbf16ps(4, 1, 3);
      _tile_dpbf16ps(5, 1, 7);
    }
    _tile_stored(4, s + j, tp * 4);
    _tile_stored(5, s + j + 16, tp * 4);
  }
  if (j < tp) {
    _tile_zero(4);
    _tile_loadd(2, keys + j * 2, b_stride);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (kChunks == 2) {
      _tile_loadd(3, keys + chunk + j * 2, b_stride);
      _tile_dpbf16ps(4, 1, 3);
    }
    _tile_stored(4, s + j, tp * 4);
  }
}

// out (16, 16 kDimBlocks) = p (16, t32) bfloat16 · V packed (t32 / 2, dp, 2): A tile 0, B 2-3,
// C 4 .. 4 + kDimBlocks - 1.
template <int kDimBlocks>
ATTN_AMX_BF16 void ContextAmx(const uint16_t* p, int64_t t32, const uint16_t* values, int64_t dp,
                              float* out) {
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (kDimBlocks == 4) {
    _tile_zero(6);
    _tile_zero(7);
  }
  const int64_t b_stride = dp * 4;
  for (int64_t j = 0; j < t32; j += 32) {
    const uint16_t* v = values + (j / 2) * dp * 2;
    _tile_loadd(0, p + j, t32 * 2);
    _tile_loadd(2, v, b_stride);
    _tile_loadd(3, v + 32, b_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (kDimBlocks == 4) {
      _tile_loadd(2, v + 64, b_stride);
      _tile_loadd(3, v + 96, b_stride);
      _tile_dpbf16ps(6, 0, 2);
      _tile_dpbf16ps(7, 0, 3);
    }
  }
  _tile_stored(4, out, dp * 4);
  _tile_stored(5, out + 16, dp * 4);
  if constexpr (kDimBlocks == 4) {
    _tile_stored(6, out + 32, dp * 4);
    _tile_stored(7, out + 48, dp * 4);
  }
}

// Query rows [i0, i0 + rows) (rows <= 16; the tiles always run 16, the rows past T on zero
// queries): scores, softmax, context, as BlockBf16.
template <int kChunks>
ATTN_AMX_BF16 void BlockAmx(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                            Bf16AttentionScratch* scratch, int64_t i0, int64_t rows) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), t32 = RoundUpTo(T, 32), dp = d;
  uint16_t* queries = scratch->queries.data();
  float* s = scratch->scores.data();
  float* out = s + kAmxRows * tp;
  uint16_t* probs = scratch->probs.data();
  for (int r = 0; r < kAmxRows; ++r) {
    if (r < rows) {
      ToBf16Row(t.q + (i0 + r) * g.ld_qkv, d, d, queries + r * d);
    } else {
      std::memset(queries + r * d, 0, sizeof(uint16_t) * d);
    }
  }
  ScoresAmx<kChunks>(queries, scratch->keys.data(), tp, s);
  const __m512 scale = _mm512_set1_ps(g.scale);
  for (int r = 0; r < rows; ++r) {
    float* row = s + r * tp;
    for (int64_t j = 0; j < T; j += 16) {
      const __mmask16 k = avx512::TailMask(T - j);
      _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), scale));
    }
    if (t.bias != nullptr) avx512::AddBiasRow(t.bias - (i0 + r), T, row);
    if (t.scores != nullptr) std::memcpy(t.scores + (i0 + r) * T, row, sizeof(float) * T);
  }
  float inv_sums[kAmxRows];
  avx512::ExpRows(s, rows, tp, T, inv_sums);
  for (int r = 0; r < kAmxRows; ++r) {
    if (r >= rows) {
      std::memset(probs + r * t32, 0, sizeof(uint16_t) * t32);
      continue;
    }
    if (t.probs != nullptr) avx512::ScaleRow(s + r * tp, T, inv_sums[r], t.probs + (i0 + r) * T);
    ToBf16Row(s + r * tp, T, t32, probs + r * t32);
  }
  ContextAmx<2 * kChunks>(probs, t32, scratch->values.data(), dp, out);
  for (int r = 0; r < rows; ++r) {
    avx512::ScaleRow(out + r * dp, d, inv_sums[r], t.context + (i0 + r) * g.ld_context);
  }
}

}  // namespace

bool AmxBf16AttentionSupports(int64_t head_dim) { return head_dim == 32 || head_dim == 64; }

ATTN_AMX_BF16 void AttentionHeadBf16Amx(const AttentionHeadGeometry& g, const AttentionHeadTask& t,
                                        Bf16AttentionScratch* scratch) {
  const int64_t T = t.tokens, d = g.head_dim;
  const int64_t tp = RoundUpTo(T, 16), t32 = RoundUpTo(T, 32);
  GrowScratch(scratch->keys, d / 2 * tp * 2);
  uint16_t* values = GrowScratch(scratch->values, t32 / 2 * d * 2);
  GrowScratch(scratch->queries, kAmxRows * d);
  GrowScratch(scratch->scores, kAmxRows * (tp + d));
  GrowScratch(scratch->probs, kAmxRows * t32);
  PackKeys(g, t, tp, scratch->keys.data());
  PackValues(g, t, d, values);
  const int64_t packed_pairs = (T + 1) / 2;  // the key pairs PackValues wrote; zero the rest
  std::memset(values + packed_pairs * d * 2, 0,
              sizeof(uint16_t) * (t32 / 2 - packed_pairs) * d * 2);
  for (int64_t i0 = 0; i0 < T; i0 += kAmxRows) {
    const int64_t rows = std::min<int64_t>(kAmxRows, T - i0);
    if (d == 32) {
      BlockAmx<1>(g, t, scratch, i0, rows);
    } else {
      BlockAmx<2>(g, t, scratch, i0, rows);
    }
  }
}

namespace {
ATTN_AMX_BF16 void ConfigureTiles() { _tile_loadconfig(&AllTiles16x64()); }
ATTN_AMX_BF16 void ReleaseTiles() { _tile_release(); }
}  // namespace

AmxBf16Tiles::AmxBf16Tiles() { ConfigureTiles(); }

AmxBf16Tiles::~AmxBf16Tiles() { ReleaseTiles(); }

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
