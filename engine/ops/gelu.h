// GELU, the exact (erf) form BERT uses: y = x * 0.5 * (1 + erf(x / sqrt(2))).
// The encoder fuses it into the FFN matmul (LinearEpilogue::kGelu); this standalone op is the
// same oneDNN algorithm for unfused use.
#pragma once

#include <cstdint>

#include "engine/dnnl_context.h"

namespace attn {

// x, y: n contiguous floats; may alias.
void GeluForward(ExecContext& ctx, const float* x, int64_t n, float* y);

// dx = dy * gelu'(x), x the pre-activation (erf GELU).
//   gelu'(x) = Phi(x) + x * phi(x)   (standard normal CDF and density)
// x, dy, dx: n contiguous floats. The fused kGelu linear saves no pre-activation, so a training
// forward must keep x (e.g. run kNone then GeluForward). dx may alias dy.
void GeluBackward(ExecContext& ctx, const float* x, const float* dy, int64_t n, float* dx);

}  // namespace attn
