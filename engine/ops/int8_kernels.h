// Row kernels of the int8 linear layers (engine/ops/prepared_linear.h): the per-token input
// quantisation, and the epilogues that turn a u8 x s8 matmul's s32 accumulators back into fp32
// (zero-point and outlier corrections, scales, bias, then GELU or residual + LayerNorm) in one
// pass over each row while it is in cache, optionally quantising their output row on the spot
// as the next int8 layer's input (so that activation is never re-read, and the GELU output
// never exists in fp32 at all).
//
// Each function runs one OpenMP parallel loop over rows; AVX-512, else AVX2 + FMA, else portable
// loops compute the same formulas (engine/ops/cpu_kernels.h has the switches).
#pragma once

#include <cstdint>

namespace attn {

// Outliers of a quantised row: its elements above kInt8OutlierRatio x the row's RMS (at most
// kInt8MaxOutliers, the largest) are not quantised but kept in fp32 (see Int8Input).
constexpr float kInt8OutlierRatio = 6.0f;
constexpr int kInt8MaxOutliers = 8;

// Where quantised rows go: x[m, k] ~= (q[m, k] - zero_points[m]) * scales[m] with q in
// [0, level], except the outliers[m] (q = zero point there; cols/values hold
// kInt8MaxOutliers slots per row).
struct QuantizedRows {
  uint8_t* q = nullptr;               // (rows, K)
  float* scales = nullptr;            // (rows)
  int32_t* zero_points = nullptr;     // (rows)
  int32_t* outlier_counts = nullptr;  // (rows)
  int32_t* outlier_cols = nullptr;    // (rows, kInt8MaxOutliers)
  float* outlier_values = nullptr;    // (rows, kInt8MaxOutliers)
  float level = 255.0f;               // the largest level: 255 with AVX-512 VNNI/AMX, else 127
};

// out <- quantised x (rows, K).
void QuantizeRows(const float* x, int64_t rows, int64_t K, const QuantizedRows& out);

// The dequantised matmul output of `rows` x `cols`:
//   v[m, n] = (acc[m, n] - zero_points[m] * weight_sums[n]) * row_scales[m] * col_scales[n]
//             + bias[n] + sum_i outlier_values[m, i] * transposed_weights[outlier_cols[m, i], n]
// where acc = q · Wq^T came from the matmul on the quantised input q (its zero points not
// subtracted) and the outliers' products are the fp32 ones. Without zero_points (null) the
// corrections are left out: v = acc * row_scales * col_scales + bias.
struct Int8Accumulators {
  const int32_t* acc = nullptr;               // (rows, cols)
  const float* row_scales = nullptr;          // (rows)  activation scales
  const float* col_scales = nullptr;          // (cols)  weight scales
  const float* bias = nullptr;                // (cols)
  const int32_t* zero_points = nullptr;       // (rows)  input zero points, or null
  const int32_t* weight_sums = nullptr;       // (cols)  sum_k Wq[n, k]
  const int32_t* outlier_counts = nullptr;    // (rows)
  const int32_t* outlier_cols = nullptr;      // (rows, kInt8MaxOutliers)
  const float* outlier_values = nullptr;      // (rows, kInt8MaxOutliers)
  const float* transposed_weights = nullptr;  // (K, cols) fp32 W^T
};

// y (rows, cols) = v
void DequantizeRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y);

// y (rows, cols) = gelu_erf(v); with `next`, also quantised into *next (then y may be null: the
// rows exist only quantised).
void DequantizeGeluRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y,
                        const QuantizedRows* next = nullptr);

// y = LayerNorm(v + residual) * gamma + beta, y may alias residual; with `next`, y also
// quantised into *next.
void DequantizeAddLayerNormRows(const Int8Accumulators& in, const float* residual, int64_t rows,
                                int64_t cols, const float* gamma, const float* beta, float eps,
                                float* y, const QuantizedRows* next = nullptr);

}  // namespace attn
