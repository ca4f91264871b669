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

// The training pair below runs hand-written row kernels (engine/ops/cpu_kernels.h's AVX-512 /
// portable split; one OpenMP loop each), not oneDNN primitives: oneDNN 2.6's layer normalization
// (simple_layer_normalization) took several ms per (2048, 384) call.

// Training forward: also returns per-row mean (M) and variance (M) (biased) for backward.
// x, y: (rows, H) row-major, may alias; mean, variance: (rows). y matches LayerNormForward.
void LayerNormForwardTraining(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                              const Tensor& beta, float eps, float* y, float* mean,
                              float* variance);

// Backward: dx (M,H), dgamma (H) (+)=, dbeta (H) (+)=, from x, the saved mean/variance and dy.
// x is the forward's input (not its output), mean/variance what LayerNormForwardTraining
// returned for it, eps the same eps. dx (rows, H) is overwritten and must not alias x or dy.
// dgamma/dbeta may be null to skip them; accumulate = true adds into them, false overwrites.
// The dgamma/dbeta sums are independent of the thread count (fixed row chunks, summed in order).
void LayerNormBackward(ExecContext& ctx, const float* x, int64_t rows, const Tensor& gamma,
                       const float* mean, const float* variance, float eps, const float* dy,
                       float* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate);

}  // namespace attn
