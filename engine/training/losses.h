// Training losses over pooled sentence embeddings, each forward followed by its backward.
//
// Embeddings arrive as row-major fp32 buffers (rows, H), usually the pooled (and
// L2-normalised) output of the encoder. Every loss returns the scalar loss and *overwrites* the
// gradient buffers of its embedding inputs (same shape as the inputs), so the encoder backward
// can start from them. Internally everything is accumulated in double; batch sizes here are
// small (N * C * H multiply-adds), so plain loops beat a primitive launch.
//
// Cosine similarity is the true cosine, computed as in torch (F.normalize / cosine_similarity):
//   cos(a, c) = (a / max(|a|, eps)) . (c / max(|c|, eps)),   eps = kCosineEps = 1e-8
// so un-normalised inputs give the same loss as their normalised copies, and the gradient
// carries the normalisation's Jacobian (for already-normalised inputs it projects out the
// radial component). A row with |a| < eps is treated as a / eps (gradient 1/eps, as torch).
//
// Non-finite embeddings are not rejected: they give a non-finite loss, which the trainer must
// treat as "abort the job". Bad *labels* and shapes are caller errors (InvalidArgument).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tensor.h"

namespace attn {

inline constexpr double kCosineEps = 1e-8;

// ---------------------------------------------------------------------------------------------
// MultipleNegativesRankingLoss (sentence-transformers MNRL; how all-MiniLM-L6-v2 was trained).
//
//   anchors    (N, H)
//   candidates (C, H), C = k * N, k >= 1: rows [0, N) are the positives (candidate i is the
//              positive of anchor i), rows [N, C) optional hard negatives (k - 1 blocks of N).
//   scores     (N, C) = scale * cos(anchor_i, candidate_j)
//   loss             = mean_i CE(scores_i, target = i) = mean_i (logsumexp_j scores_ij - scores_ii)
// Every other row's positive and every hard negative is a negative for anchor i (in-batch
// negatives). Backward:
//   dscores_ij = (softmax(scores_i)_j - [i == j]) / N
//   danchors_i    += scale * sum_j dscores_ij * ĉ_j     (through ĉ = c / |c|, â likewise)
//   dcandidates_j += scale * sum_i dscores_ij * â_i
struct MnrlOptions {
  double scale = 20.0;  // sentence-transformers' default (inverse temperature 0.05)
};

// d_anchors (N, H) and d_candidates (C, H) are overwritten with dLoss/d(input).
absl::StatusOr<double> MultipleNegativesRankingLoss(const float* anchors, int64_t num_anchors,
                                                    const float* candidates, int64_t num_candidates,
                                                    int64_t hidden, const MnrlOptions& options,
                                                    float* d_anchors, float* d_candidates);

// ---------------------------------------------------------------------------------------------
// CosineSimilarityLoss (sentence-transformers; MSE between the cosine and a gold score).
//
//   u, v   (N, H), labels (N) finite (typically in [0, 1] or [-1, 1])
//   cos_i  = cos(u_i, v_i)
//   loss   = mean_i (cos_i - label_i)^2
// Backward:
//   dcos_i = 2 (cos_i - label_i) / N
//   du_i   = dcos_i * d cos_i / d u_i,   dv_i likewise
// d_u, d_v (N, H) are overwritten.
absl::StatusOr<double> CosineSimilarityLoss(const float* u, const float* v, int64_t hidden,
                                            absl::Span<const float> labels, float* d_u, float* d_v);

// ---------------------------------------------------------------------------------------------
// Classification head on the pooled embedding, as HF's `classifier` nn.Linear + CrossEntropy.
//
//   logits (N, K) = pooled (N, H) . weight^T + bias,   weight (K, H), bias (K)
//   loss          = mean_i (logsumexp_k logits_ik - logits_i,label_i)
// Backward:
//   dlogits_ik = (softmax(logits_i)_k - [k == label_i]) / N
//   dpooled    = dlogits . weight          (N, H)
//   dweight    = dlogits^T . pooled        (K, H)
//   dbias      = sum_i dlogits_i           (K)
// The parameters and their gradients share this struct (weight and bias).
struct ClassificationHead {
  Tensor weight;  // (K, H)
  Tensor bias;    // (K)

  int64_t num_labels() const { return weight.rank() == 2 ? weight.dim(0) : 0; }
  int64_t hidden_size() const { return weight.rank() == 2 ? weight.dim(1) : 0; }
};

enum class HeadInit {
  kXavierUniform,  // weight ~ U(-a, a), a = sqrt(6 / (H + K)); bias 0
  kNormal,         // weight ~ N(0, std^2) (HF BertForSequenceClassification: std 0.02); bias 0
};

// A freshly initialised head; the same seed gives the same weights on every platform that
// uses libstdc++'s distributions (mt19937_64 engine).
ClassificationHead MakeClassificationHead(int64_t num_labels, int64_t hidden, HeadInit init,
                                          uint64_t seed, float normal_std = 0.02f);

// The initial head of a pair classifier (engine/ops/segment_product.h): every row constant,
// weight[k][.] = scale * (k / (K - 1) - 1/2), bias 0, so logit(K-1) - logit(0) = scale * the
// cosine of the two texts' segments: label K-1 ("relevant" for K = 2) starts as the more
// similar pair. `scale` as the contrastive objective's cosine scale (20): the cosines of
// jointly encoded texts lie close together, and a unit scale would start every pair at the
// label prior.
ClassificationHead MakePairHead(int64_t num_labels, int64_t hidden, float scale = 20.0f);

// A zero head shaped like `head` (for gradients).
ClassificationHead ZerosLike(const ClassificationHead& head);

// Inference: logits (N, K) for pooled (N, H).
void ClassificationHeadForward(const ClassificationHead& head, const float* pooled, int64_t rows,
                               float* logits);

// Forward + cross-entropy + backward. labels (N) are class indices, validated 0 <= l < K
// (InvalidArgument naming the index otherwise). d_pooled (N, H) is overwritten; d_head is
// (re)shaped like `head` and overwritten with dW, db.
absl::StatusOr<double> ClassificationHeadLoss(const ClassificationHead& head, const float* pooled,
                                              absl::Span<const int64_t> labels, float* d_pooled,
                                              ClassificationHead* d_head);

}  // namespace attn
