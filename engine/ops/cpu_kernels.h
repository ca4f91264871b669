// Row-wise CPU kernels of the inference fast path: LayerNorm (with the residual add fused), and
// the switches that pick every hand-vectorised kernel's ISA (the int8 row kernels are in
// engine/ops/int8_kernels.h).
//
// Each function runs one OpenMP parallel loop over rows. On CPUs with AVX-512, or else AVX2 + FMA,
// the inner loops are hand-vectorised; elsewhere portable loops compute the same formulas.
#pragma once

#include <cstdint>

namespace attn {

// True when the AVX-512 code paths run (the CPU has AVX-512 F/BW/DQ/VL and they are not disabled).
bool UseAvx512Kernels();
// Tests only: force the portable loops (false) or restore CPU detection (true).
void SetAvx512KernelsEnabledForTesting(bool enabled);
// True when the AVX2 + FMA kernels run where there is no AVX-512 (attention, the row kernels
// here, the int8 input quantisation; engine/ops/avx2_math.h); the same switch for tests.
bool UseAvx2Kernels();
void SetAvx2KernelsEnabledForTesting(bool enabled);
// True when the AVX-512 kernels run and the CPU also has AVX-512 VNNI (the int8 attention
// products, engine/ops/vnni_attention.cc); follows SetAvx512KernelsEnabledForTesting.
bool UseAvx512VnniKernels();
// The same for AVX-512 BF16 (the bf16 attention products, engine/ops/bf16_attention.cc).
bool UseAvx512Bf16Kernels();
// The same for AMX BF16 (the bf16 attention products on tiles; engine/precision.h's
// CpuHasAmxBf16()); tests switch the AMX kernels off (and back on) with the setter.
bool UseAmxBf16Kernels();
void SetAmxKernelsEnabledForTesting(bool enabled);

// y[m] = LayerNorm(x[m] + residual[m]) * gamma + beta for each of `rows` rows of `cols` floats.
// residual may be null (plain LayerNorm); y may alias x or residual. Biased variance, as torch.
// With y_bf16, each row of y is also written there as bfloat16 bits (rows x cols), while it is
// in cache: the input of a bf16 matmul that follows.
void AddLayerNormRows(const float* x, const float* residual, int64_t rows, int64_t cols,
                      const float* gamma, const float* beta, float eps, float* y,
                      uint16_t* y_bf16 = nullptr);

}  // namespace attn
