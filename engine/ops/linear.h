// Linear layer on a packed token matrix, as Hugging Face's nn.Linear:
//   y (M, N) = x (M, K) · weight^T + bias,   weight (N, K), bias (N)
// One oneDNN matmul; the epilogue runs as post-ops in the same pass.
//
// Mixed precision (MatmulInputs::kBf16, fine-tuning's `precision: bf16`): every matmul of the
// forward and the backward takes its two inputs rounded to bfloat16 (round to nearest even) and
// accumulates in fp32; outputs, bias, weights and gradients stay fp32 (the fp32 master weights
// are rounded per call). Where the CPU multiplies bfloat16 (avx512_bf16 or AMX) the operands
// are bf16 in memory and oneDNN runs its bf16 kernels; elsewhere the rounded values are kept in
// fp32 and the fp32 matmul runs: a product of two bfloat16 values is exact in fp32, so both
// compute the same up to the order of the fp32 sums.
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"
#include "engine/tensor.h"

namespace attn {

enum class LinearEpilogue {
  kNone,
  kGelu,        // y = gelu_erf(x·W^T + b)            (FFN intermediate)
  kAccumulate,  // y = y_in + x·W^T + b               (residual add; y holds the residual)
};

enum class MatmulInputs {
  kFp32,  // fp32 x fp32 (the reference)
  kBf16,  // both inputs rounded to bfloat16, fp32 accumulation (see above)
};

// x: (rows, K) row-major with row stride K; y: (rows, N) row-major.
void LinearForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                   const Tensor& bias, LinearEpilogue epilogue, float* y,
                   MatmulInputs inputs = MatmulInputs::kFp32);

// Backward of y (M,N) = x (M,K) · W^T + b.  dx (M,K) = dy · W ; dW (N,K) (+)= dy^T · x ;
// db (N) (+)= sum_rows(dy)
// x: (rows, K) and dy: (rows, N) row-major, the forward's input and the gradient of its output
// (for an epilogue, dy is the gradient w.r.t. x·W^T + b: undo GELU/residual first).
// dx (rows, K) is always overwritten; dx, dweight, dbias may each be null to skip that output.
// accumulate = true adds into dweight (N, K) / dbias (N) (gradient accumulation across
// micro-batches or tied uses); false overwrites them. rows == 0 is allowed.
// inputs: as the forward's; kBf16 rounds dy, W and x where they enter a matmul.
void LinearBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                    const float* dy, float* dx, Tensor* dweight, Tensor* dbias, bool accumulate,
                    MatmulInputs inputs = MatmulInputs::kFp32);

}  // namespace attn
