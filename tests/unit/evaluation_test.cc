// engine/training/evaluation.h against naive references: retrieval ranks from a full sort of
// the corpus, Spearman from O(n^2) rank counting, F1 from a confusion matrix, and hand-worked
// or published values (scipy.stats.spearmanr's documented example).
#include "engine/training/evaluation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace attn {
namespace {

TEST(EvaluationTest, RetrievalByHand) {
  // dim 2. Query 0 -> item 0 at rank 1; query 1 -> item 2 at rank 2 (item 1 is closer);
  // query 2 -> item 1 tied with item 0 at the top: a tie counts in the relevant item's favour.
  const std::vector<float> corpus = {1, 0, 0, 1, 1, 1};
  const std::vector<float> queries = {2, 0.1f, 0.1f, 3, 1, 1};
  absl::StatusOr<RetrievalMetrics> m = RetrievalScores(queries, corpus, 2, {0, 2, 2});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ranks, (std::vector<int64_t>{1, 2, 1}));
  EXPECT_DOUBLE_EQ(m->recall_at_1, 2.0 / 3);
  EXPECT_DOUBLE_EQ(m->recall_at_10, 1);
  EXPECT_DOUBLE_EQ(m->mrr_at_10, (1 + 0.5 + 1) / 3);
  EXPECT_DOUBLE_EQ(m->ndcg_at_10, (1 + 1 / std::log2(3.0) + 1) / 3);
}

TEST(EvaluationTest, RetrievalMatchesAFullSortOnRandomData) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t dim = 8, n = 40, q = 25;
  std::vector<float> corpus(n * dim), queries(q * dim);
  for (float& x : corpus) x = normal(rng);
  for (float& x : queries) x = normal(rng);
  std::vector<int64_t> relevant(q);
  for (int64_t i = 0; i < q; ++i) relevant[i] = (i * 7) % n;
  absl::StatusOr<RetrievalMetrics> m = RetrievalScores(queries, corpus, dim, relevant);
  ASSERT_TRUE(m.ok()) << m.status();
  double mrr = 0, r1 = 0, r10 = 0, ndcg = 0;
  for (int64_t i = 0; i < q; ++i) {
    std::vector<std::pair<double, int64_t>> scored;
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, nq = 0, nc = 0;
      for (int64_t d = 0; d < dim; ++d) {
        dot += double(queries[i * dim + d]) * corpus[j * dim + d];
        nq += double(queries[i * dim + d]) * queries[i * dim + d];
        nc += double(corpus[j * dim + d]) * corpus[j * dim + d];
      }
      scored.push_back({dot / std::sqrt(nq * nc), j});
    }
    std::sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first > b.first;
      return a.second == relevant[i] && b.second != relevant[i];
    });
    int64_t rank = 0;
    while (scored[rank].second != relevant[i]) ++rank;
    ++rank;
    EXPECT_EQ(m->ranks[i], rank) << "query " << i;
    if (rank <= 10) {
      mrr += 1.0 / rank;
      ndcg += 1.0 / std::log2(rank + 1.0);
      r10 += 1;
    }
    r1 += rank == 1;
  }
  EXPECT_NEAR(m->mrr_at_10, mrr / q, 1e-12);
  EXPECT_NEAR(m->ndcg_at_10, ndcg / q, 1e-12);
  EXPECT_NEAR(m->recall_at_1, r1 / q, 1e-12);
  EXPECT_NEAR(m->recall_at_10, r10 / q, 1e-12);
}

TEST(EvaluationTest, SpearmanAgainstScipyAndANaiveRankCount) {
  // scipy.stats.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) in SciPy's documentation.
  absl::StatusOr<double> rho = SpearmanCorrelation({1, 2, 3, 4, 5}, {5, 6, 7, 8, 7});
  ASSERT_TRUE(rho.ok());
  EXPECT_NEAR(*rho, 0.8207826816681233, 1e-12);
  EXPECT_NEAR(*SpearmanCorrelation({1, 2, 3}, {30, 20, 10}), -1, 1e-12);
  EXPECT_TRUE(std::isnan(*SpearmanCorrelation({1, 1, 1}, {1, 2, 3})));
  EXPECT_FALSE(SpearmanCorrelation({1}, {1}).ok());

  std::mt19937 rng(9);
  std::uniform_int_distribution<int> coarse(0, 6);  // many ties
  std::vector<double> a(60), b(60);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = coarse(rng);
    b[i] = a[i] + coarse(rng);
  }
  auto naive_ranks = [](const std::vector<double>& v) {
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      double less = 0, equal = 0;
      for (double x : v) {
        less += x < v[i];
        equal += x == v[i];
      }
      r[i] = less + (equal + 1) / 2;
    }
    return r;
  };
  const std::vector<double> ra = naive_ranks(a), rb = naive_ranks(b);
  const double n = a.size();
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  EXPECT_NEAR(*SpearmanCorrelation(a, b), cov / std::sqrt(va * vb), 1e-12);
}

TEST(EvaluationTest, ClassificationFromAConfusionMatrix) {
  const std::vector<int64_t> gold = {0, 0, 0, 1, 1, 2, 2, 2, 2, 0};
  const std::vector<int64_t> predicted = {0, 1, 0, 1, 2, 2, 2, 0, 2, 0};
  absl::StatusOr<ClassificationMetrics> m = ClassificationScores(predicted, gold);
  ASSERT_TRUE(m.ok()) << m.status();
  int confusion[3][3] = {};
  for (size_t i = 0; i < gold.size(); ++i) ++confusion[gold[i]][predicted[i]];
  double f1_sum = 0, correct = 0;
  for (int c = 0; c < 3; ++c) {
    double tp = confusion[c][c], predicted_c = 0, gold_c = 0;
    for (int k = 0; k < 3; ++k) {
      predicted_c += confusion[k][c];
      gold_c += confusion[c][k];
    }
    const double p = tp / predicted_c, r = tp / gold_c;
    f1_sum += 2 * p * r / (p + r);
    correct += tp;
  }
  EXPECT_DOUBLE_EQ(m->accuracy, 0.7);
  EXPECT_NEAR(m->accuracy, correct / gold.size(), 1e-15);
  EXPECT_NEAR(m->macro_f1, f1_sum / 3, 1e-12);
  // A class predicted but never right counts with F1 0.
  m = ClassificationScores({1, 1}, {0, 0});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->accuracy, 0);
  EXPECT_EQ(m->macro_f1, 0);
  EXPECT_FALSE(ClassificationScores({0}, {0, 1}).ok());
  EXPECT_FALSE(ClassificationScores({-1}, {0}).ok());
}

TEST(EvaluationTest, RetrievalRefusesMismatchedInput) {
  EXPECT_FALSE(RetrievalScores({1, 0}, {1, 0}, 2, {1}).ok());     // index outside the corpus
  EXPECT_FALSE(RetrievalScores({1, 0, 1}, {1, 0}, 2, {0}).ok());  // 3 floats for 1 query
  EXPECT_FALSE(RetrievalScores({}, {1, 0}, 2, {}).ok());          // no queries
  EXPECT_FALSE(RetrievalScores({1, 0}, {}, 2, {0}).ok());         // empty corpus
}

}  // namespace
}  // namespace attn
