#include "engine/ops/cpu_kernels.h"

#include <atomic>
#include <cmath>

#include "engine/half.h"
#include "engine/ops/avx2_math.h"
#include "engine/ops/avx512_math.h"
#include "engine/precision.h"

namespace attn {

namespace {

bool CpuSupportsAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

std::atomic<bool>& Avx512Enabled() {
  static std::atomic<bool> enabled(CpuSupportsAvx512());
  return enabled;
}

bool CpuSupportsAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

std::atomic<bool>& Avx2Enabled() {
  static std::atomic<bool> enabled(CpuSupportsAvx2Fma());
  return enabled;
}

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelElements = 1 << 14;

// ---------------------------------------------------------------------------------------------
// Portable row kernels: the reference formulas, plain loops.

void AddLayerNormRowPortable(const float* x, const float* residual, int64_t cols,
                             const float* gamma, const float* beta, float eps, float* y) {
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    y[j] = residual != nullptr ? x[j] + residual[j] : x[j];
    sum += y[j];
  }
  const float mean = sum / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sq += (y[j] - mean) * (y[j] - mean);
  const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(cols) + eps);
  for (int64_t j = 0; j < cols; ++j) y[j] = (y[j] - mean) * rstd * gamma[j] + beta[j];
}

// ---------------------------------------------------------------------------------------------
// AVX-512 row kernels: the same formulas, 16 lanes at a time, masked tails.

ATTN_AVX512 void AddLayerNormRowAvx512(const float* x, const float* residual, int64_t cols,
                                       const float* gamma, const float* beta, float eps, float* y) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 k = avx512::TailMask(cols - j);
    __m512 v = _mm512_maskz_loadu_ps(k, x + j);
    if (residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, residual + j));
    _mm512_mask_storeu_ps(y + j, k, v);
    sum = _mm512_add_ps(sum, v);
  }
  float mean;
  avx512::NormalizeRow(y, cols, sum, gamma, beta, eps, y, &mean);
}

// ---------------------------------------------------------------------------------------------
// AVX2 row kernels (CPUs without AVX-512): the same formulas, 8 lanes at a time.

ATTN_AVX2 void AddLayerNormRowAvx2(const float* x, const float* residual, int64_t cols,
                                   const float* gamma, const float* beta, float eps, float* y) {
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; j += 8) {
    const __m256i k = avx2::TailMask(cols - j);
    __m256 v = avx2::MaskLoad(x + j, k);
    if (residual != nullptr) v = _mm256_add_ps(v, avx2::MaskLoad(residual + j, k));
    _mm256_maskstore_ps(y + j, k, v);
    sum = _mm256_add_ps(sum, v);
  }
  avx2::NormalizeRow(y, cols, sum, gamma, beta, eps, y);
}

}  // namespace

bool UseAvx512Kernels() { return Avx512Enabled().load(std::memory_order_relaxed); }

void SetAvx512KernelsEnabledForTesting(bool enabled) {
  Avx512Enabled().store(enabled && CpuSupportsAvx512());
}

bool UseAvx2Kernels() { return Avx2Enabled().load(std::memory_order_relaxed); }

bool UseAvx512VnniKernels() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return vnni && UseAvx512Kernels();
}

bool UseAvx512Bf16Kernels() {
  static const bool bf16 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return bf16 && UseAvx512Kernels();
}

std::atomic<bool>& AmxEnabled() {
  static std::atomic<bool> enabled(true);
  return enabled;
}

bool UseAmxBf16Kernels() {
  return AmxEnabled().load(std::memory_order_relaxed) && CpuHasAmxBf16() && UseAvx512Bf16Kernels();
}

void SetAmxKernelsEnabledForTesting(bool enabled) { AmxEnabled().store(enabled); }

void SetAvx2KernelsEnabledForTesting(bool enabled) {
  Avx2Enabled().store(enabled && CpuSupportsAvx2Fma());
}

void AddLayerNormRows(const float* x, const float* residual, int64_t rows, int64_t cols,
                      const float* gamma, const float* beta, float eps, float* y,
                      uint16_t* y_bf16) {
  const bool avx512 = UseAvx512Kernels(), avx2 = !avx512 && UseAvx2Kernels();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t m = 0; m < rows; ++m) {
    const float* r = residual != nullptr ? residual + m * cols : nullptr;
    if (avx512) {
      AddLayerNormRowAvx512(x + m * cols, r, cols, gamma, beta, eps, y + m * cols);
    } else if (avx2) {
      AddLayerNormRowAvx2(x + m * cols, r, cols, gamma, beta, eps, y + m * cols);
    } else {
      AddLayerNormRowPortable(x + m * cols, r, cols, gamma, beta, eps, y + m * cols);
    }
    if (y_bf16 != nullptr) FloatsToBFloat16BitsSerial(y + m * cols, cols, y_bf16 + m * cols);
  }
}

}  // namespace attn
