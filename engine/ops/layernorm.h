// LayerNorm over the last axis of a packed token matrix:
//   y (M, H) = (x - mean) / sqrt(var + eps) * gamma + beta, mean/var over H (biased variance).
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"
#include "engine/tensor.h"

namespace attn {

// x, y: (rows, H) row-major; may alias (in-place).
void LayerNormForward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                      const Tensor& beta, float eps, float* y);

}  // namespace attn
