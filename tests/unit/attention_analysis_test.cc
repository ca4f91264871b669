// Mean over heads, attention rollout and per-row top-k against naive double-precision loops.
#include "engine/attention_analysis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

namespace attn {
namespace {

// (rows, cols) with positive entries, each row summing to 1 (like a softmax output).
Tensor RandomRowStochastic(int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor t({rows, cols});
  std::exponential_distribution<float> dist(1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = t.data() + i * cols;
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) sum += row[j] = dist(rng) + 1e-6f;
    for (int64_t j = 0; j < cols; ++j) row[j] = static_cast<float>(row[j] / sum);
  }
  return t;
}

// (heads, T, T) softmax-like probabilities.
Tensor RandomProbs(int64_t heads, int64_t t, std::mt19937& rng) {
  Tensor probs({heads, t, t});
  for (int64_t h = 0; h < heads; ++h) {
    const Tensor head = RandomRowStochastic(t, t, rng);
    std::copy(head.data(), head.data() + t * t, probs.data() + h * t * t);
  }
  return probs;
}

// ---------------------------------------------------------------------------------------------
// MeanOverHeads

TEST(MeanOverHeadsTest, MatchesNaiveLoop) {
  std::mt19937 rng(1);
  for (const auto& [heads, t] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 5}, {12, 7}, {12, 64}, {3, 129}}) {
    const Tensor probs = RandomProbs(heads, t, rng);
    const Tensor mean = MeanOverHeads(probs);
    ASSERT_EQ(mean.shape(), (std::vector<int64_t>{t, t}));
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) {
        double sum = 0.0;
        for (int64_t h = 0; h < heads; ++h) sum += probs.data()[(h * t + i) * t + j];
        ASSERT_NEAR(mean.data()[i * t + j], sum / heads, 1e-7) << heads << " " << t;
      }
    }
  }
}

TEST(MeanOverHeadsTest, NonSquareAndBadShapes) {
  Tensor probs({2, 1, 3}, FloatBuffer{1, 2, 3, 3, 4, 5});
  const Tensor mean = MeanOverHeads(probs);
  ASSERT_EQ(mean.shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_FLOAT_EQ(mean.data()[0], 2.0f);
  EXPECT_FLOAT_EQ(mean.data()[1], 3.0f);
  EXPECT_FLOAT_EQ(mean.data()[2], 4.0f);
  EXPECT_THROW(MeanOverHeads(Tensor({4, 4})), std::invalid_argument);
  EXPECT_THROW(MeanOverHeads(Tensor({0, 4, 4})), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// AttentionRollout

using Matrix = std::vector<std::vector<double>>;

Matrix ResidualNormalizedReference(const Tensor& a) {
  const int64_t t = a.dim(0);
  Matrix m(t, std::vector<double>(t));
  for (int64_t i = 0; i < t; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < t; ++j) {
      m[i][j] = 0.5 * a.data()[i * t + j] + (i == j ? 0.5 : 0.0);
      sum += m[i][j];
    }
    for (int64_t j = 0; j < t; ++j) m[i][j] /= sum;
  }
  return m;
}

Matrix Multiply(const Matrix& a, const Matrix& b) {
  const size_t t = a.size();
  Matrix c(t, std::vector<double>(t, 0.0));
  for (size_t i = 0; i < t; ++i) {
    for (size_t j = 0; j < t; ++j) {
      for (size_t k = 0; k < t; ++k) c[i][j] += a[i][k] * b[k][j];
    }
  }
  return c;
}

// R = A'_{L-1} · ... · A'_0, associated from the left (the engine goes from the right), so
// the two only agree if the product order is right.
Matrix RolloutReference(const std::vector<Tensor>& layers) {
  Matrix r = ResidualNormalizedReference(layers.back());
  for (int l = static_cast<int>(layers.size()) - 2; l >= 0; --l) {
    r = Multiply(r, ResidualNormalizedReference(layers[l]));
  }
  return r;
}

TEST(AttentionRolloutTest, MatchesNaiveProductAndRowsSumToOne) {
  std::mt19937 rng(2);
  for (const auto& [num_layers, t] :
       std::vector<std::pair<int, int64_t>>{{1, 4}, {2, 3}, {6, 17}, {6, 70}, {12, 33}}) {
    std::vector<Tensor> layers;
    for (int l = 0; l < num_layers; ++l) layers.push_back(MeanOverHeads(RandomProbs(4, t, rng)));
    const Tensor rollout = AttentionRollout(layers);
    ASSERT_EQ(rollout.shape(), (std::vector<int64_t>{t, t}));
    const Matrix expected = RolloutReference(layers);
    for (int64_t i = 0; i < t; ++i) {
      double row_sum = 0.0;
      for (int64_t j = 0; j < t; ++j) {
        const float got = rollout.data()[i * t + j];
        ASSERT_NEAR(got, expected[i][j], 1e-6 * std::max(1.0, std::fabs(expected[i][j])))
            << "L=" << num_layers << " T=" << t << " (" << i << ", " << j << ")";
        ASSERT_GE(got, 0.0f);
        row_sum += got;
      }
      ASSERT_NEAR(row_sum, 1.0, 1e-5) << "row " << i;
    }
  }
}

TEST(AttentionRolloutTest, OrderMattersForNonCommutingLayers) {
  // Guards against computing A'_0 · A'_1 instead of A'_1 · A'_0.
  std::mt19937 rng(3);
  const std::vector<Tensor> layers = {RandomRowStochastic(5, 5, rng),
                                      RandomRowStochastic(5, 5, rng)};
  const Tensor forward = AttentionRollout(layers);
  const Tensor reversed = AttentionRollout({layers[1], layers[0]});
  const Matrix expected =
      Multiply(ResidualNormalizedReference(layers[1]), ResidualNormalizedReference(layers[0]));
  double diff_reversed = 0.0;
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) {
      EXPECT_NEAR(forward.data()[i * 5 + j], expected[i][j], 1e-6);
      diff_reversed = std::max<double>(
          diff_reversed, std::fabs(reversed.data()[i * 5 + j] - forward.data()[i * 5 + j]));
    }
  }
  EXPECT_GT(diff_reversed, 1e-3);
}

TEST(AttentionRolloutTest, IdentityAttentionGivesIdentity) {
  for (int num_layers : {1, 3}) {
    const int64_t t = 6;
    Tensor identity({t, t});
    for (int64_t i = 0; i < t; ++i) identity.data()[i * t + i] = 1.0f;
    const Tensor rollout = AttentionRollout(std::vector<Tensor>(num_layers, identity));
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) {
        EXPECT_EQ(rollout.data()[i * t + j], i == j ? 1.0f : 0.0f) << i << " " << j;
      }
    }
  }
}

TEST(AttentionRolloutTest, HandComputedSingleLayer) {
  // A = [[0, 1], [1, 0]] -> A' = [[0.5, 0.5], [0.5, 0.5]].
  // A row summing to 0.5 (as if mass were lost) is renormalised:
  //   [[0.25, 0.25], ...] -> 0.5*A + 0.5*I = [[0.625, 0.125]] / 0.75 = [[5/6, 1/6]].
  Tensor swap({2, 2}, FloatBuffer{0, 1, 1, 0});
  Tensor r = AttentionRollout({swap});
  EXPECT_FLOAT_EQ(r.data()[0], 0.5f);
  EXPECT_FLOAT_EQ(r.data()[1], 0.5f);
  Tensor leaky({2, 2}, FloatBuffer{0.25f, 0.25f, 0.0f, 1.0f});
  r = AttentionRollout({leaky});
  EXPECT_FLOAT_EQ(r.data()[0], 5.0f / 6.0f);
  EXPECT_FLOAT_EQ(r.data()[1], 1.0f / 6.0f);
  EXPECT_FLOAT_EQ(r.data()[2], 0.0f);
  EXPECT_FLOAT_EQ(r.data()[3], 1.0f);
}

TEST(AttentionRolloutTest, BadShapes) {
  EXPECT_THROW(AttentionRollout({}), std::invalid_argument);
  EXPECT_THROW(AttentionRollout({Tensor({3, 4})}), std::invalid_argument);
  EXPECT_THROW(AttentionRollout({Tensor({3, 3}), Tensor({4, 4})}), std::invalid_argument);
  EXPECT_THROW(AttentionRollout({Tensor({2, 3, 3})}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// TopKRows

// The first k of a full stable sort by value descending (ties: lower column first).
void ExpectMatchesFullSort(const Tensor& matrix, int64_t k) {
  const int64_t cols = matrix.dim(-1);
  const int64_t rows = matrix.numel() / cols;
  const int64_t kk = std::clamp<int64_t>(k, 0, cols);
  const TopKRowsResult top = TopKRows(matrix, k);
  ASSERT_EQ(top.k, kk);
  std::vector<int64_t> shape = matrix.shape();
  shape.back() = kk;
  ASSERT_EQ(top.values.shape(), shape);
  ASSERT_EQ(static_cast<int64_t>(top.indices.size()), rows * kk);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = matrix.data() + r * cols;
    std::vector<int32_t> order(cols);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [row](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int64_t i = 0; i < kk; ++i) {
      ASSERT_EQ(top.indices[r * kk + i], order[i]) << "row " << r << " rank " << i;
      ASSERT_EQ(top.values.data()[r * kk + i], row[order[i]]);
    }
  }
}

TEST(TopKRowsTest, MatchesFullSortOnRandomRows) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist;
  for (int64_t cols : {1, 2, 7, 64, 513}) {
    Tensor m({9, cols});
    for (float& v : m.values()) v = dist(rng);
    for (int64_t k : {int64_t{1}, int64_t{3}, cols / 2, cols - 1, cols}) {
      ExpectMatchesFullSort(m, k);
    }
  }
}

TEST(TopKRowsTest, TiesGoToLowerColumn) {
  std::mt19937 rng(5);
  // Few distinct values: many ties, at every rank including across the k boundary.
  std::uniform_int_distribution<int> dist(0, 3);
  Tensor m({50, 40});
  for (float& v : m.values()) v = 0.25f * dist(rng);
  for (int64_t k : {1, 5, 13, 39, 40}) ExpectMatchesFullSort(m, k);

  Tensor flat({1, 6}, FloatBuffer{0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f});
  const TopKRowsResult top = TopKRows(flat, 3);
  EXPECT_EQ(top.indices, (std::vector<int32_t>{0, 1, 2}));
}

TEST(TopKRowsTest, KClampedToColumns) {
  Tensor m({2, 3}, FloatBuffer{0.1f, 0.7f, 0.2f, 0.3f, 0.3f, 0.4f});
  const TopKRowsResult top = TopKRows(m, 10);
  EXPECT_EQ(top.k, 3);
  EXPECT_EQ(top.values.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(top.indices, (std::vector<int32_t>{1, 2, 0, 2, 0, 1}));
  EXPECT_EQ(std::vector<float>(top.values.values().begin(), top.values.values().end()),
            (std::vector<float>{0.7f, 0.2f, 0.1f, 0.4f, 0.3f, 0.3f}));
  ExpectMatchesFullSort(m, 10);

  const TopKRowsResult none = TopKRows(m, 0);
  EXPECT_EQ(none.k, 0);
  EXPECT_EQ(none.values.shape(), (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(none.indices.empty());
  EXPECT_EQ(TopKRows(m, -4).k, 0);
}

TEST(TopKRowsTest, HeadsTimesRowsKeepLeadingShape) {
  // (heads, T, T) as the server has it: rows are every (head, query) pair.
  std::mt19937 rng(6);
  const Tensor probs = RandomProbs(3, 11, rng);
  const TopKRowsResult top = TopKRows(probs, 4);
  EXPECT_EQ(top.values.shape(), (std::vector<int64_t>{3, 11, 4}));
  ExpectMatchesFullSort(probs, 4);
}

TEST(TopKRowsTest, NaNRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor m({1, 5}, FloatBuffer{nan, 0.2f, nan, 0.9f, -1.0f});
  const TopKRowsResult top = TopKRows(m, 5);
  EXPECT_EQ(top.indices, (std::vector<int32_t>{3, 1, 4, 0, 2}));
}

}  // namespace
}  // namespace attn
