// Row-wise CPU kernels of the inference fast path: LayerNorm (with the residual add fused),
// per-token int8 quantisation, and the epilogues that turn an int8 matmul's s32 accumulators
// back into fp32 (dequantise + bias, then GELU or residual + LayerNorm, then re-quantise for the
// next matmul) in one pass over each row while it is in cache.
//
// Each function runs one OpenMP parallel loop over rows. On CPUs with AVX-512 the inner loops are
// hand-vectorised; elsewhere portable loops compute the same formulas.
#pragma once

#include <cstdint>

namespace attn {

// True when the AVX-512 code paths run (the CPU has AVX-512 F/BW/DQ/VL and they are not disabled).
bool UseAvx512Kernels();
// Tests only: force the portable loops (false) or restore CPU detection (true).
void SetAvx512KernelsEnabledForTesting(bool enabled);

// y[m] = LayerNorm(x[m] + residual[m]) * gamma + beta for each of `rows` rows of `cols` floats.
// residual may be null (plain LayerNorm); y may alias x or residual. Biased variance, as torch.
void AddLayerNormRows(const float* x, const float* residual, int64_t rows, int64_t cols,
                      const float* gamma, const float* beta, float eps, float* y);

// Symmetric per-row (per-token) int8 quantisation:
//   scale[m] = max_j |x[m, j]| / 127,   q[m, j] = round(x[m, j] / scale[m])  in [-127, 127]
// An all-zero row gets scale 0 and q = 0.
void QuantizeRows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales);

// The dequantised matmul output v[m, n] = acc[m, n] * row_scale[m] * col_scale[n] + bias[n].
struct Int8Accumulators {
  const int32_t* acc = nullptr;       // (rows, cols)
  const float* row_scales = nullptr;  // (rows)  activation scales
  const float* col_scales = nullptr;  // (cols)  weight scales
  const float* bias = nullptr;        // (cols)
};

// y (rows, cols) = v
void DequantizeRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y);

// g = gelu_erf(v), written as fp32 y (if y is not null) and/or quantised as
// q, q_scales = QuantizeRows(g) (if q is not null): the FFN intermediate straight to int8.
void DequantizeGeluRows(const Int8Accumulators& in, int64_t rows, int64_t cols, float* y, int8_t* q,
                        float* q_scales);

// y = LayerNorm(v + residual) * gamma + beta; q, q_scales = QuantizeRows(y) unless q is null.
// y may alias residual.
void DequantizeAddLayerNormQuantizeRows(const Int8Accumulators& in, const float* residual,
                                        int64_t rows, int64_t cols, const float* gamma,
                                        const float* beta, float eps, float* y, int8_t* q,
                                        float* q_scales);

}  // namespace attn
