// Evaluation metrics of a fine-tuning job's evaluation set (issue 16), on numbers only: the
// caller encodes the texts and passes the embeddings, scores or logits. No transport, no model.
//
//   retrieval       each query has one relevant item among a corpus; items are ranked by cosine
//                   to the query. rank = 1 + the number of *other* items scoring strictly
//                   higher than the relevant one (ties resolved in the relevant item's favour).
//                   MRR@10 = mean(1/rank if rank <= 10 else 0); recall@k = mean(rank <= k);
//                   nDCG@10 with one relevant item = mean(1/log2(rank + 1) if rank <= 10 else 0)
//                   (the ideal DCG is 1).
//   cosine          Spearman's rho between predicted cosines and gold scores: Pearson's r of
//                   their ranks, tied values getting the mean of their ranks (as scipy does).
//   classification  accuracy, and macro-F1: the mean over the classes that occur in the gold
//                   labels or the predictions of 2PR / (P + R) (0 when P + R = 0).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace attn {

struct RetrievalMetrics {
  double mrr_at_10 = 0;
  double recall_at_1 = 0;
  double recall_at_10 = 0;
  double ndcg_at_10 = 0;
  std::vector<int64_t> ranks;  // per query, 1-based
};

// `queries` (Q, dim) and `corpus` (N, dim), row-major, any norm (cosine normalises);
// relevant[q] in [0, N). InvalidArgument for mismatched sizes or an index out of range.
absl::StatusOr<RetrievalMetrics> RetrievalScores(const std::vector<float>& queries,
                                                 const std::vector<float>& corpus, int64_t dim,
                                                 const std::vector<int64_t>& relevant);

// Spearman's rho of `predicted` against `gold` (same length >= 2). NaN when either is constant.
absl::StatusOr<double> SpearmanCorrelation(const std::vector<double>& predicted,
                                           const std::vector<double>& gold);

struct ClassificationMetrics {
  double accuracy = 0;
  double macro_f1 = 0;
};

// `predicted` and `gold` labels, same length >= 1, each >= 0.
absl::StatusOr<ClassificationMetrics> ClassificationScores(const std::vector<int64_t>& predicted,
                                                           const std::vector<int64_t>& gold);

}  // namespace attn
