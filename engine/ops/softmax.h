// Softmax over the last axis: y[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max)).
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"

namespace attn {

// x, y: (rows, cols) row-major; may alias (in-place).
void SoftmaxForward(ExecContext& ctx, const float* x, int64_t rows, int64_t cols, float* y);

// Backward of y = SoftmaxForward(x):
//   dx (rows, cols) = y * (dy - sum_j(dy * y)) per row, y = softmax output (rows, cols).
// dy, dx: (rows, cols); dx may alias dy.
void SoftmaxBackward(ExecContext& ctx, const float* y, const float* dy, int64_t rows, int64_t cols,
                     float* dx);

}  // namespace attn
