#include "engine/training/evaluation.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace attn {

namespace {

// Rows of `matrix` (rows, dim) scaled to unit L2 norm, in double (a zero row stays zero).
std::vector<double> UnitRows(const std::vector<float>& matrix, int64_t rows, int64_t dim) {
  std::vector<double> out(matrix.begin(), matrix.end());
  for (int64_t r = 0; r < rows; ++r) {
    double* row = out.data() + r * dim;
    double norm = 0;
    for (int64_t d = 0; d < dim; ++d) norm += row[d] * row[d];
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (int64_t d = 0; d < dim; ++d) row[d] /= norm;
    }
  }
  return out;
}

// 1-based ranks, ties getting the mean of the ranks they span.
std::vector<double> AverageRanks(const std::vector<double>& values) {
  const size_t n = values.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(n);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && values[order[j + 1]] == values[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = mean_rank;
    i = j + 1;
  }
  return ranks;
}

}  // namespace

absl::StatusOr<RetrievalMetrics> RetrievalScores(const std::vector<float>& queries,
                                                 const std::vector<float>& corpus, int64_t dim,
                                                 const std::vector<int64_t>& relevant) {
  if (dim <= 0) return absl::InvalidArgumentError("embedding dimension must be > 0");
  const int64_t q = static_cast<int64_t>(relevant.size());
  if (q == 0) return absl::InvalidArgumentError("no queries to evaluate");
  if (static_cast<int64_t>(queries.size()) != q * dim || corpus.size() % dim != 0 ||
      corpus.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("retrieval: ", queries.size(),
                                                   " query floats for ", q, " queries and ",
                                                   corpus.size(), " corpus floats of dim ", dim));
  }
  const int64_t n = static_cast<int64_t>(corpus.size()) / dim;
  const std::vector<double> unit_queries = UnitRows(queries, q, dim);
  const std::vector<double> unit_corpus = UnitRows(corpus, n, dim);
  RetrievalMetrics m;
  m.ranks.reserve(q);
  std::vector<double> scores(n);
  for (int64_t i = 0; i < q; ++i) {
    if (relevant[i] < 0 || relevant[i] >= n) {
      return absl::InvalidArgumentError(absl::StrCat("query ", i, ": relevant item ", relevant[i],
                                                     " is outside the corpus of ", n));
    }
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += unit_queries[i * dim + d] * unit_corpus[j * dim + d];
      scores[j] = dot;
    }
    const double target = scores[relevant[i]];
    int64_t rank = 1;
    for (int64_t j = 0; j < n; ++j) rank += (j != relevant[i] && scores[j] > target);
    m.ranks.push_back(rank);
    if (rank <= 10) {
      m.mrr_at_10 += 1.0 / static_cast<double>(rank);
      m.ndcg_at_10 += 1.0 / std::log2(static_cast<double>(rank) + 1);
      m.recall_at_10 += 1;
    }
    m.recall_at_1 += rank == 1;
  }
  m.mrr_at_10 /= static_cast<double>(q);
  m.ndcg_at_10 /= static_cast<double>(q);
  m.recall_at_10 /= static_cast<double>(q);
  m.recall_at_1 /= static_cast<double>(q);
  return m;
}

absl::StatusOr<double> SpearmanCorrelation(const std::vector<double>& predicted,
                                           const std::vector<double>& gold) {
  if (predicted.size() != gold.size() || predicted.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Spearman needs two lists of the same length "
                     ">= 2, not ",
                     predicted.size(), " and ", gold.size()));
  }
  const std::vector<double> a = AverageRanks(predicted), b = AverageRanks(gold);
  const double n = static_cast<double>(a.size());
  const double mean_a = std::accumulate(a.begin(), a.end(), 0.0) / n;
  const double mean_b = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double cov = 0, var_a = 0, var_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (a[i] - mean_a) * (b[i] - mean_b);
    var_a += (a[i] - mean_a) * (a[i] - mean_a);
    var_b += (b[i] - mean_b) * (b[i] - mean_b);
  }
  if (var_a == 0 || var_b == 0) return std::nan("");
  return cov / std::sqrt(var_a * var_b);
}

absl::StatusOr<ClassificationMetrics> ClassificationScores(const std::vector<int64_t>& predicted,
                                                           const std::vector<int64_t>& gold) {
  if (predicted.size() != gold.size() || gold.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("classification needs as many predictions as "
                     "labels (>= 1), not ",
                     predicted.size(), " and ", gold.size()));
  }
  struct Counts {
    int64_t tp = 0, fp = 0, fn = 0;
  };
  std::map<int64_t, Counts> classes;
  int64_t correct = 0;
  for (size_t i = 0; i < gold.size(); ++i) {
    if (predicted[i] < 0 || gold[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("example ", i, ": negative label"));
    }
    if (predicted[i] == gold[i]) {
      ++correct;
      ++classes[gold[i]].tp;
    } else {
      ++classes[predicted[i]].fp;
      ++classes[gold[i]].fn;
    }
  }
  ClassificationMetrics m;
  m.accuracy = static_cast<double>(correct) / static_cast<double>(gold.size());
  for (const auto& [label, c] : classes) {
    const double precision = c.tp + c.fp > 0 ? static_cast<double>(c.tp) / (c.tp + c.fp) : 0;
    const double recall = c.tp + c.fn > 0 ? static_cast<double>(c.tp) / (c.tp + c.fn) : 0;
    m.macro_f1 += precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
  }
  m.macro_f1 /= static_cast<double>(classes.size());
  return m;
}

}  // namespace attn
