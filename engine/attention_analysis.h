// Aggregates over attention maps, for the AttentionMap RPC: mean over heads, attention rollout
// (Abnar & Zuidema, 2020) and per-row top-k. Pure functions on fp32 tensors; no oneDNN.
//
//   mean     M[i, j] = 1/H sum_h P[h, i, j]
//   rollout  A'_l    = rownorm(0.5 * A_l + 0.5 * I)
//            R       = A'_{L-1} · ... · A'_1 · A'_0
//   top-k    per row: the k largest entries, largest first, ties to the lower column index
//
// Shape mismatches are programming errors (the server validates requests first): they throw
// std::invalid_argument, like Tensor itself.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/tensor.h"

namespace attn {

// probs: (heads, T, S) -> (T, S). heads >= 1. Sums in double.
Tensor MeanOverHeads(const Tensor& probs);

// layer_means: L >= 1 matrices, each (T, T), layer 0 first (typically MeanOverHeads of each
// layer's probs) -> R (T, T). Row i of R says how much each input token flows into token i's
// final representation; every row sums to 1 (up to fp32 rounding). Products accumulate in
// double. O(L T^3): about 0.15 s for 6 layers at T = 512 on 2 cores (OpenMP over rows).
Tensor AttentionRollout(absl::Span<const Tensor> layer_means);

struct TopKRowsResult {
  int64_t k = 0;                 // k after clamping to [0, cols]
  Tensor values;                 // (..., k): the input shape with the last axis replaced by k
  std::vector<int32_t> indices;  // (..., k): column index of each value
};

// matrix: (..., cols), rank >= 1, treated as rows of length cols -> the k largest entries of
// each row in descending order. k is clamped to [0, cols]. Ties go to the lower column index,
// so the result equals the first k of a stable descending sort; NaNs rank below everything.
// O(cols + k log k) per row (nth_element, then a sort of the k survivors).
TopKRowsResult TopKRows(const Tensor& matrix, int64_t k);

}  // namespace attn
