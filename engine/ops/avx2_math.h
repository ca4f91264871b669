// Internal to engine/ops: AVX2 + FMA helpers shared by the hand-vectorised kernels for CPUs
// without AVX-512 (engine/ops/avx512_math.h at half the width, tails masked by lane vectors).
// Every function here carries ATTN_AVX2 and may only be called after UseAvx2Kernels() returned
// true.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#define ATTN_AVX2 __attribute__((target("avx2,fma")))

namespace attn {
namespace avx2 {

// Lanes [0, n) all ones (n clamped to [0, 8]): the tail of a row whose length is not a multiple
// of 8, for maskload / maskstore / blendv.
ATTN_AVX2 inline __m256i TailMask(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t count = static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lanes);
}

ATTN_AVX2 inline __m256 MaskLoad(const float* p, __m256i mask) {
  return _mm256_maskload_ps(p, mask);
}

ATTN_AVX2 inline float ReduceAdd(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ATTN_AVX2 inline float ReduceMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

ATTN_AVX2 inline float ReduceMin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// e^x as avx512::Exp (Cephes: x = n ln2 + r, a degree-6 polynomial for e^r, times 2^n), with
// 2^n built in the exponent field; x is clamped to [-87.34, 88.38] so n stays in [-126, 127].
ATTN_AVX2 inline __m256 Exp(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

// Unnormalised softmax over the first T columns of `rows` rows of s (row stride ld), in place,
// as avx512::ExpRows: s = exp(s - row max), inv_sums[r] = 1 / row sum.
ATTN_AVX2 inline void ExpRows(float* s, int64_t rows, int64_t ld, int64_t T, float* inv_sums) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    __m256 max = neg_inf;
    for (int64_t j = 0; j < T; j += 8) {
      const __m256i k = TailMask(T - j);
      max = _mm256_max_ps(max,
                          _mm256_blendv_ps(neg_inf, MaskLoad(row + j, k), _mm256_castsi256_ps(k)));
    }
    const __m256 max_vec = _mm256_set1_ps(ReduceMax(max));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; j += 8) {
      const __m256i k = TailMask(T - j);
      const __m256 e =
          _mm256_and_ps(Exp(_mm256_sub_ps(MaskLoad(row + j, k), max_vec)), _mm256_castsi256_ps(k));
      _mm256_maskstore_ps(row + j, k, e);
      sum = _mm256_add_ps(sum, e);
    }
    inv_sums[r] = 1.0f / ReduceAdd(sum);
  }
}

// out (T floats) = row * scale
ATTN_AVX2 inline void ScaleRow(const float* row, int64_t T, float scale, float* out) {
  const __m256 scale_vec = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < T; j += 8) {
    const __m256i k = TailMask(T - j);
    _mm256_maskstore_ps(out + j, k, _mm256_mul_ps(MaskLoad(row + j, k), scale_vec));
  }
}

// gelu_erf as avx512::GeluErf (erf by Abramowitz & Stegun 7.1.26, absolute error below
// 1.5e-7); the int8 path only.
ATTN_AVX2 inline __m256 GeluErf(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  const __m256 az = _mm256_andnot_ps(sign_bit, z);
  const __m256 t = _mm256_div_ps(
      _mm256_set1_ps(1.0f), _mm256_fmadd_ps(az, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f)));
  __m256 poly = _mm256_set1_ps(1.061405429f);
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
  poly = _mm256_mul_ps(poly, t);
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(az, az)));
  const __m256 erf_abs = _mm256_fnmadd_ps(poly, e, _mm256_set1_ps(1.0f));
  const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(z, sign_bit));  // z's sign
  return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)),
                       _mm256_add_ps(erf, _mm256_set1_ps(1.0f)));
}

// LayerNorm of one row given the lane-wise sums of its elements, as avx512::NormalizeRow:
// mean, then the variance by a second pass, y = (x - mean) / sqrt(variance + eps) * gamma + beta.
// y may alias x.
ATTN_AVX2 inline void NormalizeRow(const float* x, int64_t cols, __m256 sum, const float* gamma,
                                   const float* beta, float eps, float* y) {
  const float mean = ReduceAdd(sum) / static_cast<float>(cols);
  const __m256 mean_vec = _mm256_set1_ps(mean);
  __m256 sq = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; j += 8) {
    const __m256i k = TailMask(cols - j);
    // masked-off lanes load 0 and would add mean^2: zero them after the subtraction
    const __m256 d =
        _mm256_and_ps(_mm256_sub_ps(MaskLoad(x + j, k), mean_vec), _mm256_castsi256_ps(k));
    sq = _mm256_fmadd_ps(d, d, sq);
  }
  const float variance = ReduceAdd(sq) / static_cast<float>(cols);
  const __m256 rstd = _mm256_set1_ps(1.0f / std::sqrt(variance + eps));
  for (int64_t j = 0; j < cols; j += 8) {
    const __m256i k = TailMask(cols - j);
    const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(MaskLoad(x + j, k), mean_vec), rstd);
    _mm256_maskstore_ps(y + j, k,
                        _mm256_fmadd_ps(xhat, MaskLoad(gamma + j, k), MaskLoad(beta + j, k)));
  }
}

}  // namespace avx2
}  // namespace attn
