// Softmax over the last axis: y[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max)).
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"

namespace attn {

// x, y: (rows, cols) row-major; may alias (in-place).
void SoftmaxForward(ExecContext& ctx, const float* x, int64_t rows, int64_t cols, float* y);

}  // namespace attn
