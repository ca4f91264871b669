// Sentence pooling over each sequence of a packed batch, and L2 normalisation.
//   cls:  pooled[b] = hidden[start_b]
//   mean: pooled[b] = sum_{t in b} hidden[t] / T_b
//   max:  pooled[b] = max_{t in b} hidden[t]  (per feature)
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"

namespace attn {

// hidden: (M, H); seq_offsets: B+1 row offsets; pooled: (B, H).
void PoolForward(const float* hidden, int64_t hidden_size, const std::vector<int64_t>& seq_offsets,
                 PoolingMode mode, float* pooled);

// Each of `rows` rows of length `cols` divided by max(||row||_2, 1e-12) (as torch's normalize).
void L2NormalizeRows(float* data, int64_t rows, int64_t cols);

}  // namespace attn
