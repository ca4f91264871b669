// The feature a pair-classification (cross-encoder) head reads: a text pair is encoded together
// ([CLS] first [SEP] second [SEP], every token attending to both texts), then each segment is
// mean-pooled and L2-normalised, and the feature is their element-wise product:
//   a[b]       = mean_{t in b, type_t = 0} hidden[t]      (B, H)   first text, [CLS] and [SEP]
//   c[b]       = mean_{t in b, type_t = 1} hidden[t]      (B, H)   second text and its [SEP]
//   feature[b] = a[b]/|a[b]| ⊙ c[b]/|c[b]|               (B, H)
// Its sum is the cosine of the two segments, so a head whose rows are constant starts as a
// cosine reranker of the jointly encoded texts (engine/training/losses.h MakePairHead), and
// training moves both the head and the attention that mixes the texts. A linear head on the
// whole pair's pooled embedding instead (tried first) had to learn the query-document
// interaction from scratch and did not learn the catalogue example in 150 steps.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace attn {

// What the backward needs from the forward.
struct SegmentProductContext {
  std::vector<float> first_unit, second_unit;      // (B, H) a/|a| and c/|c|
  std::vector<double> first_norm, second_norm;     // (B) max(|a|, 1e-12), max(|c|, 1e-12)
  std::vector<int64_t> first_count, second_count;  // (B) tokens of each segment
};

// hidden: (M, H) packed rows; seq_offsets: B+1 row offsets; type_ids: (M) 0 or 1 per row;
// feature: (B, H). InvalidArgument when a sequence has no token of one of the segments (it is
// not a pair) or a type id is not 0 or 1. `context` may be null (inference).
absl::Status SegmentProductForward(const float* hidden, int64_t hidden_size,
                                   const std::vector<int64_t>& seq_offsets, const int32_t* type_ids,
                                   float* feature, SegmentProductContext* context);

// dfeature: (B, H); dhidden: (M, H), overwritten.
//   d(a/|a|) = dfeature ⊙ c/|c|,  d(c/|c|) = dfeature ⊙ a/|a|
//   da = (d(a/|a|) - â (â·d(a/|a|))) / |a|, then da / count_a to every row of segment 0 (and the
//   same for c and segment 1).
void SegmentProductBackward(const SegmentProductContext& context, int64_t hidden_size,
                            const std::vector<int64_t>& seq_offsets, const int32_t* type_ids,
                            const float* dfeature, float* dhidden);

}  // namespace attn
