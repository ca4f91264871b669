// Linear layer on a packed token matrix, as Hugging Face's nn.Linear:
//   y (M, N) = x (M, K) · weight^T + bias,   weight (N, K), bias (N)
// One oneDNN matmul; the epilogue runs as post-ops in the same pass.
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

// x: (rows, K) row-major with row stride K; y: (rows, N) row-major.
void LinearForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                   const Tensor& bias, LinearEpilogue epilogue, float* y);

// Backward of y (M,N) = x (M,K) · W^T + b.  dx (M,K) = dy · W ; dW (N,K) (+)= dy^T · x ;
// db (N) (+)= sum_rows(dy)
// x: (rows, K) and dy: (rows, N) row-major, the forward's input and the gradient of its output
// (for an epilogue, dy is the gradient w.r.t. x·W^T + b: undo GELU/residual first).
// dx (rows, K) is always overwritten; dx, dweight, dbias may each be null to skip that output.
// accumulate = true adds into dweight (N, K) / dbias (N) (gradient accumulation across
// micro-batches or tied uses); false overwrites them. rows == 0 is allowed.
void LinearBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& weight,
                    const float* dy, float* dx, Tensor* dweight, Tensor* dbias, bool accumulate);

}  // namespace attn
