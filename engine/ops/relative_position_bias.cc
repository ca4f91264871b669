#include "engine/ops/relative_position_bias.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "engine/model_config.h"

namespace attn {

int RelativePositionBucket(int64_t relative) {
  constexpr int kHalf = kRelativeBuckets / 2;  // 16 per direction
  constexpr int kExact = kHalf / 2;            // 8 distances get a bucket each
  // HF: n = -relative; keys after the query (n < 0) use the upper half.
  const int64_t n = -relative;
  const int base = n < 0 ? kHalf : 0;
  const int64_t distance = std::llabs(n);
  if (distance < kExact) return base + static_cast<int>(distance);
  // float32 as torch computes it: log(n / 8) / log(128 / 8) * (16 - 8), truncated toward zero.
  // The divisor is a Python double that torch rounds to float.
  const float log_ratio = std::log(static_cast<float>(distance) / static_cast<float>(kExact));
  const float scaled =
      log_ratio / static_cast<float>(std::log(static_cast<double>(kRelativeMaxDistance) / kExact)) *
      static_cast<float>(kHalf - kExact);
  const int large = kExact + static_cast<int>(scaled);
  return base + std::min(large, kHalf - 1);
}

RelativePositionBias RelativePositionBiasForward(const Tensor& table, int64_t max_tokens) {
  RelativePositionBias bias;
  bias.heads = table.dim(1);
  bias.max_tokens = max_tokens;
  const int64_t span = 2 * max_tokens - 1;
  bias.values.resize(bias.heads * span);
  for (int64_t r = -(max_tokens - 1); r <= max_tokens - 1; ++r) {
    const float* row = table.data() + int64_t{RelativePositionBucket(r)} * bias.heads;  // (heads)
    for (int64_t h = 0; h < bias.heads; ++h) bias.values[h * span + r + max_tokens - 1] = row[h];
  }
  return bias;
}

void RelativePositionBiasBackward(const float* d_bias, int64_t heads, int64_t max_tokens,
                                  Tensor* d_table) {
  const int64_t span = 2 * max_tokens - 1;
  for (int64_t r = -(max_tokens - 1); r <= max_tokens - 1; ++r) {
    float* row = d_table->data() + int64_t{RelativePositionBucket(r)} * heads;  // (heads)
    for (int64_t h = 0; h < heads; ++h) row[h] += d_bias[h * span + r + max_tokens - 1];
  }
}

}  // namespace attn
