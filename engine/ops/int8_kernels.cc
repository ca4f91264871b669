#include "engine/ops/int8_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/ops/avx2_math.h"
#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"

namespace attn {

namespace {

// Row-elements below which an OpenMP region costs more than it saves.
constexpr int64_t kParallelElements = 1 << 14;

// ---------------------------------------------------------------------------------------------
// Input quantisation, one row (QuantizeRows and the epilogues' `next`).

// One row of QuantizeInput's output.
struct InputRowOut {
  uint8_t* q;
  float* scale;
  int32_t* zero_point;
  int32_t* count;
  int32_t* cols;
  float* values;
};

// Running minimum and maximum of the quantised part of a row.
struct Range {
  float low = 0.0f, high = 0.0f;  // always contains 0, so 0 is a level (q = zero point)
  void Add(float v) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
};

// Keeps the kMaxOutliers largest |x| of the `found` candidates (indices into x) as the row's
// outliers; the others go back into `range`.
void ChooseOutliers(const float* x, int32_t* candidates, int found, Range* range,
                    const InputRowOut& out) {
  if (found > kInt8MaxOutliers) {
    std::partial_sort(candidates, candidates + kInt8MaxOutliers, candidates + found,
                      [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    for (int i = kInt8MaxOutliers; i < found; ++i) range->Add(x[candidates[i]]);
    found = kInt8MaxOutliers;
  }
  *out.count = found;
  for (int i = 0; i < found; ++i) {
    out.cols[i] = candidates[i];
    out.values[i] = x[candidates[i]];
  }
}

// Scale and zero point of the levels [0, level] over `range`. A row whose every non-zero is an
// outlier still gets a positive scale: it sets the units of the outliers' products.
float InputScale(Range range, float level, const InputRowOut& out) {
  for (int i = 0; i < *out.count; ++i) {
    if (range.high == range.low) range.Add(out.values[i]);
  }
  const float scale = (range.high - range.low) / level;
  *out.scale = scale;
  *out.zero_point =
      scale > 0.0f
          ? static_cast<int32_t>(std::clamp(std::nearbyint(-range.low / scale), 0.0f, level))
          : 0;
  return scale > 0.0f ? 1.0f / scale : 0.0f;
}

void QuantizeInputRowPortable(const float* x, int64_t K, float level, const InputRowOut& out) {
  float sum_sq = 0.0f;
  for (int64_t k = 0; k < K; ++k) sum_sq += x[k] * x[k];
  const float threshold = kInt8OutlierRatio * std::sqrt(sum_sq / static_cast<float>(K));
  int32_t candidates[64];
  int found = 0;
  Range range;
  for (int64_t k = 0; k < K; ++k) {
    if (std::fabs(x[k]) > threshold && found < 64) {
      candidates[found++] = static_cast<int32_t>(k);
    } else {
      range.Add(x[k]);
    }
  }
  ChooseOutliers(x, candidates, found, &range, out);
  const float inv = InputScale(range, level, out);
  const float zero = static_cast<float>(*out.zero_point);
  for (int64_t k = 0; k < K; ++k) {
    out.q[k] = static_cast<uint8_t>(std::clamp(std::nearbyint(x[k] * inv) + zero, 0.0f, level));
  }
  for (int i = 0; i < *out.count; ++i) out.q[out.cols[i]] = static_cast<uint8_t>(*out.zero_point);
}

// 64 floats x[k] * inv + zero -> 64 bytes saturated to [0, top] (top <= 255): two saturating
// packs (32 -> 16 -> 8 bits, interleaving the four vectors by 128-bit lanes) and one permute.
ATTN_AVX512 void Quantize64Avx512(const float* x, __m512 inv, __m512i zero, __m512i top,
                                  uint8_t* q) {
  __m512i v[4];
  for (int i = 0; i < 4; ++i) {
    // cvtps2dq rounds half to even, as nearbyint (outliers saturate; they are reset later).
    v[i] =
        _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), inv)), zero);
  }
  const __m512i bytes =
      _mm512_packus_epi16(_mm512_packs_epi32(v[0], v[1]), _mm512_packs_epi32(v[2], v[3]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(q, _mm512_min_epu8(_mm512_permutexvar_epi32(order, bytes), top));
}

ATTN_AVX512 void QuantizeInputRowAvx512(const float* x, int64_t K, float level,
                                        const InputRowOut& out) {
  // One pass for the sum of squares (the outlier threshold) and the range of every element
  // (lanes past the row's end load 0, which the range holds anyway); a second one, to set the
  // outliers apart, only when some element is beyond the threshold.
  __m512 sum_sq = _mm512_setzero_ps(), low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(avx512::TailMask(K - k), x + k);
    sum_sq = _mm512_fmadd_ps(v, v, sum_sq);
    low = _mm512_min_ps(low, v);
    high = _mm512_max_ps(high, v);
  }
  const float threshold =
      kInt8OutlierRatio * std::sqrt(_mm512_reduce_add_ps(sum_sq) / static_cast<float>(K));
  Range range{_mm512_reduce_min_ps(low), _mm512_reduce_max_ps(high)};
  int32_t candidates[64];
  int found = 0;
  if (std::max(-range.low, range.high) > threshold) {
    const __m512 threshold_v = _mm512_set1_ps(threshold);
    low = _mm512_setzero_ps();
    high = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 tail = avx512::TailMask(K - k);
      const __m512 v = _mm512_maskz_loadu_ps(tail, x + k);
      const __mmask16 above =
          _mm512_mask_cmp_ps_mask(tail, _mm512_abs_ps(v), threshold_v, _CMP_GT_OQ);
      __mmask16 collected = 0;  // candidates past 64 (impossible below K = 64 * 36) stay in q
      for (__mmask16 rest = above; rest != 0 && found < 64; rest &= rest - 1) {
        candidates[found++] = static_cast<int32_t>(k + __builtin_ctz(rest));
        collected |= rest & static_cast<__mmask16>(-rest);
      }
      const __mmask16 kept = tail & static_cast<__mmask16>(~collected);
      low = _mm512_mask_min_ps(low, kept, low, v);
      high = _mm512_mask_max_ps(high, kept, high, v);
    }
    range = Range{_mm512_reduce_min_ps(low), _mm512_reduce_max_ps(high)};
  }
  ChooseOutliers(x, candidates, found, &range, out);
  const float inv_scale = InputScale(range, level, out);
  const __m512 inv = _mm512_set1_ps(inv_scale);
  const __m512i zero = _mm512_set1_epi32(*out.zero_point);
  int64_t k = 0;
  const __m512i top_bytes = _mm512_set1_epi8(static_cast<char>(static_cast<int>(level)));
  for (; k + 64 <= K; k += 64) Quantize64Avx512(x + k, inv, zero, top_bytes, out.q + k);
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(level));
  for (; k < K; k += 16) {
    const __mmask16 tail = avx512::TailMask(K - k);
    // cvtps2dq rounds half to even, as nearbyint; outliers are clamped here and reset below.
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + k), inv));
    v = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(v, zero), _mm512_setzero_si512()), top);
    _mm512_mask_cvtepi32_storeu_epi8(out.q + k, tail, v);
  }
  for (int i = 0; i < *out.count; ++i) out.q[out.cols[i]] = static_cast<uint8_t>(*out.zero_point);
}

// QuantizeInputRowAvx512 at 8 lanes (CPUs without AVX-512).
ATTN_AVX2 void QuantizeInputRowAvx2(const float* x, int64_t K, float level,
                                    const InputRowOut& out) {
  __m256 sum_sq = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 v = avx2::MaskLoad(x + k, avx2::TailMask(K - k));
    sum_sq = _mm256_fmadd_ps(v, v, sum_sq);
  }
  const float threshold =
      kInt8OutlierRatio * std::sqrt(avx2::ReduceAdd(sum_sq) / static_cast<float>(K));
  const __m256 threshold_v = _mm256_set1_ps(threshold);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  int32_t candidates[64];
  int found = 0;
  // Lanes past the row's end load 0, which the range holds anyway.
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 v = avx2::MaskLoad(x + k, avx2::TailMask(K - k));
    const int above =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign_bit, v), threshold_v, _CMP_GT_OQ));
    int collected = 0;  // candidates past 64 (impossible below K = 64 * 36) stay in q
    for (int rest = above; rest != 0 && found < 64; rest &= rest - 1) {
      candidates[found++] = static_cast<int32_t>(k + __builtin_ctz(rest));
      collected |= rest & -rest;
    }
    const __m256i collected_lanes =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(collected), lane_bits), lane_bits);
    const __m256 kept = _mm256_andnot_ps(_mm256_castsi256_ps(collected_lanes), v);  // 0 there
    low = _mm256_min_ps(low, kept);
    high = _mm256_max_ps(high, kept);
  }
  Range range{avx2::ReduceMin(low), avx2::ReduceMax(high)};
  ChooseOutliers(x, candidates, found, &range, out);
  const __m256 inv = _mm256_set1_ps(InputScale(range, level, out));
  const __m256i zero = _mm256_set1_epi32(*out.zero_point);
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>(level));
  for (int64_t k = 0; k < K; k += 8) {
    // cvtps2dq rounds half to even, as nearbyint; outliers are clamped here and reset below.
    __m256i v =
        _mm256_cvtps_epi32(_mm256_mul_ps(avx2::MaskLoad(x + k, avx2::TailMask(K - k)), inv));
    v = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(v, zero), _mm256_setzero_si256()), top);
    // 8 values in [0, 255] -> 8 bytes (the packs saturate nothing here)
    const __m128i words =
        _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i bytes = _mm_packus_epi16(words, words);
    if (K - k >= 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out.q + k), bytes);
    } else {
      alignas(16) uint8_t tail[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tail), bytes);
      std::memcpy(out.q + k, tail, static_cast<size_t>(K - k));
    }
  }
  for (int i = 0; i < *out.count; ++i) out.q[out.cols[i]] = static_cast<uint8_t>(*out.zero_point);
}

// Row m of `out`.
InputRowOut RowOf(const QuantizedRows& out, int64_t m, int64_t K) {
  return {out.q + m * K,
          out.scales + m,
          out.zero_points + m,
          out.outlier_counts + m,
          out.outlier_cols + m * kInt8MaxOutliers,
          out.outlier_values + m * kInt8MaxOutliers};
}

void QuantizeRow(const float* x, int64_t K, const QuantizedRows& out, int64_t m, bool avx512,
                 bool avx2) {
  if (avx512) {
    QuantizeInputRowAvx512(x, K, out.level, RowOf(out, m, K));
  } else if (avx2) {
    QuantizeInputRowAvx2(x, K, out.level, RowOf(out, m, K));
  } else {
    QuantizeInputRowPortable(x, K, out.level, RowOf(out, m, K));
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantisation of one accumulator row (see Int8Accumulators).

// What row m contributes to every column: its scale, zero point and outliers.
struct RowTerms {
  const int32_t* acc;
  float scale;
  int32_t zero_point = 0;
  int count = 0;
  const int32_t* cols = nullptr;
  const float* values = nullptr;
};

RowTerms TermsOf(const Int8Accumulators& in, int64_t m, int64_t cols) {
  RowTerms t{in.acc + m * cols, in.row_scales[m]};
  if (in.zero_points != nullptr) {
    t.zero_point = in.zero_points[m];
    t.count = in.outlier_counts[m];
    t.cols = in.outlier_cols + m * kInt8MaxOutliers;
    t.values = in.outlier_values + m * kInt8MaxOutliers;
  }
  return t;
}

float DequantizePortable(const Int8Accumulators& in, const RowTerms& t, int64_t cols, int64_t j) {
  int32_t a = t.acc[j];
  if (in.zero_points != nullptr) a -= t.zero_point * in.weight_sums[j];
  float v = static_cast<float>(a) * t.scale * in.col_scales[j] + in.bias[j];
  for (int i = 0; i < t.count; ++i) v += t.values[i] * in.transposed_weights[t.cols[i] * cols + j];
  return v;
}

ATTN_AVX512 __m512 DequantizeAvx512(const Int8Accumulators& in, const RowTerms& t, int64_t cols,
                                    int64_t j, __mmask16 k) {
  __m512i a = _mm512_maskz_loadu_epi32(k, t.acc + j);
  if (in.zero_points != nullptr) {
    a = _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(t.zero_point),
                                               _mm512_maskz_loadu_epi32(k, in.weight_sums + j)));
  }
  const __m512 scale =
      _mm512_mul_ps(_mm512_set1_ps(t.scale), _mm512_maskz_loadu_ps(k, in.col_scales + j));
  __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), scale, _mm512_maskz_loadu_ps(k, in.bias + j));
  for (int i = 0; i < t.count; ++i) {
    v = _mm512_fmadd_ps(_mm512_set1_ps(t.values[i]),
                        _mm512_maskz_loadu_ps(k, in.transposed_weights + t.cols[i] * cols + j), v);
  }
  return v;
}

ATTN_AVX2 __m256 DequantizeAvx2(const Int8Accumulators& in, const RowTerms& t, int64_t cols,
                                int64_t j, __m256i k) {
  __m256i a = _mm256_maskload_epi32(t.acc + j, k);
  if (in.zero_points != nullptr) {
    a = _mm256_sub_epi32(a, _mm256_mullo_epi32(_mm256_set1_epi32(t.zero_point),
                                               _mm256_maskload_epi32(in.weight_sums + j, k)));
  }
  const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(t.scale), avx2::MaskLoad(in.col_scales + j, k));
  __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), scale, avx2::MaskLoad(in.bias + j, k));
  for (int i = 0; i < t.count; ++i) {
    v = _mm256_fmadd_ps(_mm256_set1_ps(t.values[i]),
                        avx2::MaskLoad(in.transposed_weights + t.cols[i] * cols + j, k), v);
  }
  return v;
}

// y = epilogue(v) for one row, per ISA. Epilogue: kPlain, kGelu, or kAddLayerNorm (residual,
// gamma, beta, eps; y may alias residual).
enum class Epilogue { kPlain, kGelu, kAddLayerNorm };

struct LayerNormTerms {
  const float* residual;  // this row's
  const float* gamma;
  const float* beta;
  float eps;
};

float GeluErfPortable(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

void LayerNormRowPortable(float* y, int64_t cols, const LayerNormTerms& ln) {
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sum += y[j];
  const float mean = sum / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sq += (y[j] - mean) * (y[j] - mean);
  const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(cols) + ln.eps);
  for (int64_t j = 0; j < cols; ++j) y[j] = (y[j] - mean) * rstd * ln.gamma[j] + ln.beta[j];
}

void EpilogueRowPortable(const Int8Accumulators& in, const RowTerms& t, int64_t cols,
                         Epilogue epilogue, const LayerNormTerms& ln, float* y) {
  for (int64_t j = 0; j < cols; ++j) {
    const float v = DequantizePortable(in, t, cols, j);
    y[j] = epilogue == Epilogue::kGelu           ? GeluErfPortable(v)
           : epilogue == Epilogue::kAddLayerNorm ? v + ln.residual[j]  // read before the write
                                                 : v;
  }
  if (epilogue == Epilogue::kAddLayerNorm) LayerNormRowPortable(y, cols, ln);
}

ATTN_AVX512 void EpilogueRowAvx512(const Int8Accumulators& in, const RowTerms& t, int64_t cols,
                                   Epilogue epilogue, const LayerNormTerms& ln, float* y) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = avx512::TailMask(cols - j);
    __m512 v = DequantizeAvx512(in, t, cols, j, k);
    if (epilogue == Epilogue::kGelu) v = avx512::GeluErf(v);
    if (epilogue == Epilogue::kAddLayerNorm) {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, ln.residual + j));
      sum = _mm512_add_ps(sum, v);
    }
    _mm512_mask_storeu_ps(y + j, k, v);
  }
  if (epilogue == Epilogue::kAddLayerNorm) {
    float mean;
    avx512::NormalizeRow(y, cols, sum, ln.gamma, ln.beta, ln.eps, y, &mean);
  }
}

ATTN_AVX2 void EpilogueRowAvx2(const Int8Accumulators& in, const RowTerms& t, int64_t cols,
                               Epilogue epilogue, const LayerNormTerms& ln, float* y) {
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; j += 8) {
    const __m256i k = avx2::TailMask(cols - j);
    __m256 v = DequantizeAvx2(in, t, cols, j, k);
    if (epilogue == Epilogue::kGelu) v = avx2::GeluErf(v);
    if (epilogue == Epilogue::kAddLayerNorm) {
      v = _mm256_add_ps(v, avx2::MaskLoad(ln.residual + j, k));
      sum = _mm256_add_ps(sum, v);
    }
    _mm256_maskstore_ps(y + j, k, v);
  }
  if (epilogue == Epilogue::kAddLayerNorm)
    avx2::NormalizeRow(y, cols, sum, ln.gamma, ln.beta, ln.eps, y);
}

// The epilogue over all rows, then (with next) each output row quantised while in cache. y may
// be null with next: the row goes through a per-thread buffer.
void EpilogueRows(const Int8Accumulators& in, int64_t rows, int64_t cols, Epilogue epilogue,
                  const float* residual, const float* gamma, const float* beta, float eps, float* y,
                  const QuantizedRows* next) {
  const bool avx512 = UseAvx512Kernels(), avx2 = !avx512 && UseAvx2Kernels();
#pragma omp parallel if (rows * cols >= kParallelElements)
  {
    thread_local std::vector<float> row_buffer;
    if (y == nullptr && static_cast<int64_t>(row_buffer.size()) < cols) row_buffer.resize(cols);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < rows; ++m) {
      float* out = y != nullptr ? y + m * cols : row_buffer.data();
      const RowTerms t = TermsOf(in, m, cols);
      const LayerNormTerms ln{residual != nullptr ? residual + m * cols : nullptr, gamma, beta,
                              eps};
      if (avx512) {
        EpilogueRowAvx512(in, t, cols, epilogue, ln, out);
      } else if (avx2) {
        EpilogueRowAvx2(in, t, cols, epilogue, ln, out);
      } else {
        EpilogueRowPortable(in, t, cols, epilogue, ln, out);
      }
      if (next != nullptr) QuantizeRow(out, cols, *next, m, avx512, avx2);
    }
  }
}

}  // namespace

void QuantizeRows(const float* x, int64_t rows, int64_t K, const QuantizedRows& out) {
  const bool avx512 = UseAvx512Kernels(), avx2 = !avx512 && UseAvx2Kernels();
#pragma omp parallel for schedule(static) if (rows * K >= kParallelElements)
  for (int64_t m = 0; m < rows; ++m) QuantizeRow(x + m * K, K, out, m, avx512, avx2);
}

void DequantizeRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y) {
  EpilogueRows(in, rows, cols, Epilogue::kPlain, nullptr, nullptr, nullptr, 0.0f, y, nullptr);
}

void DequantizeGeluRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y,
                        const QuantizedRows* next) {
  EpilogueRows(in, rows, cols, Epilogue::kGelu, nullptr, nullptr, nullptr, 0.0f, y, next);
}

void DequantizeAddLayerNormRows(const Int8Accumulators& in, const float* residual, int64_t rows,
                                int64_t cols, const float* gamma, const float* beta, float eps,
                                float* y, const QuantizedRows* next) {
  EpilogueRows(in, rows, cols, Epilogue::kAddLayerNorm, residual, gamma, beta, eps, y, next);
}

}  // namespace attn
