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

}  // namespace attn
