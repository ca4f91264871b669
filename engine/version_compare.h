// What changed between two versions of one model: exact per-tensor weight changes, per-head
// attention change on probe texts (Jensen-Shannon divergence), embedding drift on the probes
// (cosine, Spearman of pairwise similarities, top-10 neighbour overlap) and the re-index
// verdict. Transport-free; the serving core (server/core/version_compare.h) runs it off the
// gRPC threads.
//
//   relative change   ||W_B - W_A||_F / ||W_A||_F               (double, per tensor / head slice)
//   JS(p, q)          1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2, natural log (<= ln 2),
//                     per attention row (one query position over its keys), averaged per
//                     (layer, head) over every query position of every probe
//   drift             cos(e_A(t), e_B(t)) of the model's default pooling, L2-normalised
//   Spearman          rank correlation of the upper triangles of A's and B's probe x probe
//                     cosine matrices (average ranks for ties)
//   top-k overlap     |topk_A(i) & topk_B(i)| / k, i's neighbours among the other probes
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "engine/model.h"
#include "engine/training/losses.h"

namespace attn {

// One weight tensor (or one of W_Q / W_K / W_V and their biases, split out of the fused QKV).
struct TensorChange {
  int layer = -1;        // encoder layer (0-based); -1 for the embeddings
  std::string matrix;    // word_embeddings, position_embeddings, token_type_embeddings,
                         // embedding_norm, relative_attention_bias, query, key, value,
                         // attention_output, attention_norm, ffn_in, ffn_out, ffn_norm
  std::string part;      // "weight" or "bias" (a LayerNorm's gamma is its weight, beta its bias)
  double norm_a = 0;     // ||W_A||_F
  double norm_diff = 0;  // ||W_B - W_A||_F
  double relative_change = 0;  // norm_diff / norm_a (norm_diff itself when norm_a is 0)
};

// The rows of one head in W_Q, W_K and W_V (weights only): head h owns rows [h d, (h+1) d).
struct HeadWeightChange {
  int layer = 0;
  int head = 0;
  double query = 0, key = 0, value = 0;  // relative changes
};

struct WeightComparison {
  std::vector<TensorChange> tensors;    // embeddings first, then layer by layer
  std::vector<HeadWeightChange> heads;  // layer-major
};

// OK when versions of `a` and `b` can be compared tensor by tensor and on the same token ids:
// same architecture, sizes and vocabulary. Otherwise FAILED_PRECONDITION naming what differs.
absl::Status CheckComparable(const Model& a, const Model& b);

// Exact weight changes B vs A, computed in double from the fp32 weights. The models must be
// comparable (CheckComparable).
WeightComparison CompareWeights(const BertConfig& config, const BertWeights& a,
                                const BertWeights& b);

// Appends the classification heads' change (layer -1, matrix "head", weight and bias) when both
// versions have a head of the same shape; returns whether it did (a head on one side only, or
// heads of different label counts, have no meaningful difference).
bool AddHeadChange(const ClassificationHead& a, const ClassificationHead& b,
                   WeightComparison* comparison);

struct ProbeComparison {
  int num_layers = 0, num_heads = 0;
  int probes = 0;
  int64_t attention_rows = 0;        // query positions averaged over, per (layer, head)
  std::vector<double> attention_js;  // (layers, heads): mean JS divergence
  std::vector<double> cosines;       // per probe: cos(e_A, e_B)
  double mean_cosine = 0, min_cosine = 0;
  int min_cosine_probe = 0;      // index of the probe with the lowest cosine
  double spearman = 0;           // of the pairwise-similarity upper triangles
  int neighbours_k = 0;          // min(10, probes - 1)
  double neighbour_overlap = 0;  // mean top-k overlap
};

// The probes (token ids, special tokens included) through both models in chunks of at most
// `chunk_sequences` (fewer when long: the chunk's attention maps are bounded); `yield` is asked
// between chunks (true = stop: CANCELLED). At least 2 probes. Embeddings use `a`'s default pooling,
// L2-normalised.
absl::StatusOr<ProbeComparison> CompareOnProbes(const Model& a, const Model& b,
                                                const std::vector<SequenceInput>& probes,
                                                const std::function<bool()>& yield,
                                                int chunk_sequences = 8);

// Vectors from A can be mixed with B's (one index holding both) only when every probe keeps its
// direction and its neighbourhood: min cosine >= kMixMinCosine and mean top-10 overlap >=
// kMixMinOverlap. Why these: at cosine 0.99 a vector is within ~8 degrees of where the new
// model puts it, below the typical gap between a query's first and tenth hit among unrelated
// texts; and 9 of 10 neighbours kept means a search over a mixed index returns nearly what a
// re-indexed one would. A fine-tune that taught the model anything (the product catalogue of
// tests/integration) lands far below both.
inline constexpr double kMixMinCosine = 0.99;
inline constexpr double kMixMinOverlap = 0.9;

struct ReindexVerdict {
  bool can_mix = false;
  // "vectors from A can be mixed with B" or "re-index: <reason with the numbers>".
  std::string text;
};
ReindexVerdict DecideReindex(const ProbeComparison& probes);

}  // namespace attn
