// Internal to engine/ops: AVX-512 helpers shared by the hand-vectorised kernels. Every function
// here carries ATTN_AVX512 and may only be called after UseAvx512Kernels() returned true.
#pragma once

#include <immintrin.h>

// GCC 12 reports the "undefined" source operands inside its own AVX-512 intrinsics as
// uninitialised (GCC bug 105593); the warnings are about the compiler's header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2")))

namespace attn {
namespace avx512 {

// Lanes [0, n) set, for the tail of a row whose length is not a multiple of 16: none for n <= 0
// (a zero-padded stretch past the row's end, as ToBf16Row's), all for n >= 16.
ATTN_AVX512 inline __mmask16 TailMask(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// e^x, Cephes' single-precision scheme: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two parts
// so n ln2 is exact), e^r by a degree-6 polynomial, times 2^n. About 1 ulp on [-87, 88]; inputs
// are clamped to that range (below it the result is the smallest normal float, which is 0 next
// to any softmax sum).
ATTN_AVX512 inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// gelu_erf(x) = x/2 (1 + erf(x / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (absolute error
// below 1.5e-7): erf(z) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^{-z^2},
// t = 1 / (1 + p z) for z >= 0, odd in z. Used only on the int8 path, whose quantisation error
// is four orders of magnitude larger.
ATTN_AVX512 inline __m512 GeluErf(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
  const __m512 az = _mm512_abs_ps(z);
  const __m512 t = _mm512_div_ps(
      _mm512_set1_ps(1.0f), _mm512_fmadd_ps(az, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f)));
  __m512 poly = _mm512_set1_ps(1.061405429f);
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(-1.453152027f));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(1.421413741f));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(-0.284496736f));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(0.254829592f));
  poly = _mm512_mul_ps(poly, t);
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(az, az)));
  const __m512 erf_abs = _mm512_fnmadd_ps(poly, e, _mm512_set1_ps(1.0f));
  // copy z's sign onto erf(|z|)
  const __m512 sign = _mm512_and_ps(z, _mm512_set1_ps(-0.0f));
  const __m512 erf = _mm512_or_ps(erf_abs, sign);
  return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)),
                       _mm512_add_ps(erf, _mm512_set1_ps(1.0f)));
}

// LayerNorm of one row, given the lane-wise sums of its elements (the caller's first pass):
//   mean = sum / cols; variance = mean of (x - mean)^2 (a second pass, not E[x^2] - mean^2);
//   y = (x - mean) * (1 / sqrt(variance + eps)) * gamma + beta.
// y may alias x. Training and inference share it, so both round alike. Returns the variance
// and stores the mean in *mean.
ATTN_AVX512 inline float NormalizeRow(const float* x, int64_t cols, __m512 sum, const float* gamma,
                                      const float* beta, float eps, float* y, float* mean) {
  *mean = _mm512_reduce_add_ps(sum) / static_cast<float>(cols);
  const __m512 mean_vec = _mm512_set1_ps(*mean);
  __m512 sq = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = TailMask(cols - j);
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + j), mean_vec);
    sq = _mm512_fmadd_ps(d, d, sq);
  }
  const float variance = _mm512_reduce_add_ps(sq) / static_cast<float>(cols);
  const __m512 rstd = _mm512_set1_ps(1.0f / std::sqrt(variance + eps));
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = TailMask(cols - j);
    const __m512 xhat =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mean_vec), rstd);
    _mm512_mask_storeu_ps(y + j, k,
                          _mm512_fmadd_ps(xhat, _mm512_maskz_loadu_ps(k, gamma + j),
                                          _mm512_maskz_loadu_ps(k, beta + j)));
  }
  return variance;
}

// Unnormalised softmax over the first T columns of `rows` rows of s (row stride tp), in place:
// s = exp(s - row max), inv_sums[r] = 1 / row sum. The normalisation is left to whoever reads
// the row (the context product scales its output rows; the probs copy scales on the way out),
// which saves a pass over the (rows, T) block.
ATTN_AVX512 inline void ExpRows(float* s, int64_t rows, int64_t tp, int64_t T, float* inv_sums) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * tp;
    __m512 max = neg_inf;
    for (int64_t j = 0; j < T; j += 16) {
      max = _mm512_max_ps(max, _mm512_mask_loadu_ps(neg_inf, TailMask(T - j), row + j));
    }
    const __m512 max_vec = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; j += 16) {
      const __mmask16 k = TailMask(T - j);
      const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), max_vec));
      _mm512_mask_storeu_ps(row + j, k, e);
      sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    inv_sums[r] = 1.0f / _mm512_reduce_add_ps(sum);
  }
}

// out (T floats) = row * scale
ATTN_AVX512 inline void ScaleRow(const float* row, int64_t T, float scale, float* out) {
  const __m512 scale_vec = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = TailMask(T - j);
    _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), scale_vec));
  }
}

// row[0, T) += bias[0, T)
ATTN_AVX512 inline void AddBiasRow(const float* bias, int64_t T, float* row) {
  for (int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = TailMask(T - j);
    _mm512_mask_storeu_ps(
        row + j, k,
        _mm512_add_ps(_mm512_maskz_loadu_ps(k, row + j), _mm512_maskz_loadu_ps(k, bias + j)));
  }
}

}  // namespace avx512
}  // namespace attn
