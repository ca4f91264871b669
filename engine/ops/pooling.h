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

// Backward of PoolForward. dpooled: (B, H); dhidden: (M, H), overwritten.
//   cls  -> dpooled[b] to the first row of sequence b (other rows 0)
//   mean -> dpooled[b] / T_b to every row of sequence b
//   max  -> dpooled[b][j] to the argmax row of feature j (first max on ties, as the forward)
// hidden (the forward's input) is only read for max.
void PoolBackward(const float* hidden, int64_t hidden_size, const std::vector<int64_t>& seq_offsets,
                  PoolingMode mode, const float* dpooled, float* dhidden);

// Backward of y = x / max(||x||, 1e-12) per row: dx = (dy - y * (y·dy)) / max(||x||, 1e-12).
// (Below the clamp the norm is a constant, so there dx = dy / 1e-12, as torch's clamp_min.)
// x, dy, dx: (rows, cols); dx may alias dy.
void L2NormalizeBackward(const float* x, const float* dy, int64_t rows, int64_t cols, float* dx);

}  // namespace attn
