// MPNet's relative position bias (T5-style buckets): a learned table (buckets, heads) whose
// entry for bucket(key - query) and head h is added to head h's scaled attention scores before
// the softmax, in every layer.
//
// The bias of query i and key j depends on j - i only, so instead of a (heads, T, T) tensor the
// forward builds, once per forward pass and for the longest sequence L of the batch, one row per
// head over the relative positions -(L-1) .. L-1:
//   bias (heads, 2L-1):  bias[h][r + L-1] = table[bucket(r)][h]
// Every layer and every sequence (T <= L) reads it; query row i's biases over keys j = 0..T-1
// are the contiguous slice starting at bias[h] + (L-1) - i.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace attn {

// Hugging Face MPNetEncoder.relative_position_bucket(key - query, 32 buckets, max distance 128)
// in the same float32 arithmetic: keys before the query in buckets [0, 16), after in [16, 32);
// |r| < 8 exact, then logarithmic, clamped at 15 within each half.
int RelativePositionBucket(int64_t relative);

struct RelativePositionBias {
  int64_t heads = 0;
  int64_t max_tokens = 0;     // L
  std::vector<float> values;  // (heads, 2L-1)

  // Head h's bias of relative position 0: center(h)[j - i] is the bias of query i, key j.
  const float* center(int64_t h) const {
    return values.data() + h * (2 * max_tokens - 1) + max_tokens - 1;
  }
};

// table: (buckets, heads); max_tokens: L >= 1.
RelativePositionBias RelativePositionBiasForward(const Tensor& table, int64_t max_tokens);

// Backward of the forward's gather: d_table[bucket(r)][h] += d_bias[h][r + L-1] for every
// relative position r (several r share a bucket beyond distance 8).
// d_bias: (heads, 2L-1); d_table: (buckets, heads), accumulated into.
void RelativePositionBiasBackward(const float* d_bias, int64_t heads, int64_t max_tokens,
                                  Tensor* d_table);

}  // namespace attn
