// engine/version_compare.h and engine/neighbors.h against naive references: per-tensor and
// per-head relative changes on a tiny synthetic encoder, Spearman against the textbook formula,
// the verdict's thresholds, static neighbours against a brute-force loop.
#include "engine/version_compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/neighbors.h"
#include "engine/training/evaluation.h"

namespace attn {
namespace {

BertConfig TinyConfig() {
  BertConfig config;
  config.vocab_size = 10;
  config.hidden_size = 4;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.intermediate_size = 8;
  config.max_position_embeddings = 8;
  return config;
}

BertWeights RandomWeights(const BertConfig& config, uint32_t seed) {
  BertWeights weights;
  BuildParameterTable(config, &weights);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (auto& [name, tensor] : EngineTensors(&weights)) {
    for (int64_t i = 0; i < tensor->numel(); ++i) tensor->data()[i] = uniform(rng);
  }
  return weights;
}

const TensorChange* Find(const WeightComparison& c, int layer, const std::string& matrix,
                         const std::string& part) {
  for (const TensorChange& t : c.tensors) {
    if (t.layer == layer && t.matrix == matrix && t.part == part) return &t;
  }
  return nullptr;
}

TEST(CompareWeightsTest, OneChangedElementMovesOnlyItsTensorAndHead) {
  const BertConfig config = TinyConfig();
  const BertWeights a = RandomWeights(config, 1);
  BertWeights b = RandomWeights(config, 1);
  // Layer 1, key rows [H, 2H), head 1 owns key rows [H + d, H + 2d): row H + 3, column 2.
  const int64_t H = 4, d = 2;
  const int64_t index = (H + 3) * H + 2;
  b.layers[1].qkv_weight.data()[index] += 0.5f;
  const WeightComparison c = CompareWeights(config, a, b);
  // 5 embedding tensors + 2 layers x (3 x 2 QKV + 10 others).
  ASSERT_EQ(c.tensors.size(), 5u + 2 * 16u);
  for (const TensorChange& t : c.tensors) {
    if (t.layer == 1 && t.matrix == "key" && t.part == "weight") continue;
    EXPECT_EQ(t.relative_change, 0.0) << t.layer << " " << t.matrix << " " << t.part;
  }
  // Naive: the key block's norm over its H x H floats.
  double key_norm = 0, head_norm = 0;
  for (int64_t r = H; r < 2 * H; ++r) {
    for (int64_t col = 0; col < H; ++col) {
      const double v = a.layers[1].qkv_weight.data()[r * H + col];
      key_norm += v * v;
      if (r >= H + d) head_norm += v * v;
    }
  }
  const TensorChange* key = Find(c, 1, "key", "weight");
  ASSERT_NE(key, nullptr);
  EXPECT_NEAR(key->relative_change, 0.5 / std::sqrt(key_norm), 1e-7);
  ASSERT_EQ(c.heads.size(), 4u);
  for (const HeadWeightChange& head : c.heads) {
    EXPECT_EQ(head.query, 0.0);
    EXPECT_EQ(head.value, 0.0);
    if (head.layer == 1 && head.head == 1) {
      EXPECT_NEAR(head.key, 0.5 / std::sqrt(head_norm), 1e-7);
    } else {
      EXPECT_EQ(head.key, 0.0) << head.layer << " " << head.head;
    }
  }
}

TEST(SpearmanTest, EqualsTheTextbookFormulaWithoutTies) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> uniform(0, 1);
  const int n = 50;
  std::vector<double> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = uniform(rng);
    y[i] = x[i] + uniform(rng);
  }
  auto ranks = [](const std::vector<double>& v) {
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      r[i] = static_cast<double>(
          std::count_if(v.begin(), v.end(), [&](double w) { return w < v[i]; }));
    }
    return r;
  };
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  double d2 = 0;
  for (int i = 0; i < n; ++i) d2 += (rx[i] - ry[i]) * (rx[i] - ry[i]);
  const double textbook = 1 - 6 * d2 / (static_cast<double>(n) * (n * n - 1));
  EXPECT_NEAR(*SpearmanCorrelation(x, y), textbook, 1e-12);
  std::vector<double> negated(n);
  for (int i = 0; i < n; ++i) negated[i] = -x[i];
  EXPECT_NEAR(*SpearmanCorrelation(x, negated), -1.0, 1e-12);
  EXPECT_TRUE(std::isnan(*SpearmanCorrelation(x, std::vector<double>(n, 1.0))));
  // Ties: [1, 2, 2, 3] vs itself is 1; vs [1, 2, 3, 4] is the Pearson of the average ranks
  // (0, 1.5, 1.5, 3) and (0, 1, 2, 3): 4.5 / sqrt(4.5 * 5).
  EXPECT_NEAR(*SpearmanCorrelation({1, 2, 2, 3}, {1, 2, 3, 4}), 4.5 / std::sqrt(4.5 * 5), 1e-12);
}

TEST(ReindexVerdictTest, ThresholdsAreInclusive) {
  ProbeComparison probes;
  probes.neighbours_k = 10;
  probes.min_cosine = kMixMinCosine;
  probes.neighbour_overlap = kMixMinOverlap;
  EXPECT_TRUE(DecideReindex(probes).can_mix);
  probes.min_cosine = 0.9899;
  const ReindexVerdict cosine = DecideReindex(probes);
  EXPECT_FALSE(cosine.can_mix);
  EXPECT_EQ(cosine.text.rfind("re-index: min cosine 0.9899 < 0.99", 0), 0u) << cosine.text;
  probes.min_cosine = 1;
  probes.neighbour_overlap = 0.85;
  const ReindexVerdict overlap = DecideReindex(probes);
  EXPECT_FALSE(overlap.can_mix);
  EXPECT_NE(overlap.text.find("top-10 neighbour overlap 0.850 < 0.90"), std::string::npos);
}

TEST(StaticNeighboursTest, EqualBruteForceAndLeaveTheQueryOut) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  Tensor table({200, 16});
  for (int64_t i = 0; i < table.numel(); ++i) table.data()[i] = normal(rng);
  const std::vector<int32_t> query = {7, 42};
  const std::vector<TokenNeighbour> got = StaticNeighbours(table, query, 10);
  std::vector<double> mean(16);
  for (int32_t id : query) {
    for (int j = 0; j < 16; ++j) mean[j] += table.data()[id * 16 + j] / 2.0;
  }
  std::vector<std::pair<double, int>> all;
  for (int v = 0; v < 200; ++v) {
    if (v == 7 || v == 42) continue;
    double dot = 0, nv = 0, nq = 0;
    for (int j = 0; j < 16; ++j) {
      dot += mean[j] * table.data()[v * 16 + j];
      nv += static_cast<double>(table.data()[v * 16 + j]) * table.data()[v * 16 + j];
      nq += mean[j] * mean[j];
    }
    all.push_back({-dot / std::sqrt(nv * nq), v});
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(got.size(), 10u);
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(got[k].id, all[k].second);
    EXPECT_NEAR(got[k].cosine, -all[k].first, 1e-12);
  }
}

TEST(FindSubsequenceTest, FirstOccurrence) {
  EXPECT_EQ(FindSubsequence({101, 5, 6, 7, 5, 6, 102}, {5, 6}), 1);
  EXPECT_EQ(FindSubsequence({101, 5, 7, 102}, {5, 6}), -1);
  EXPECT_EQ(FindSubsequence({101}, {}), -1);
}

}  // namespace
}  // namespace attn
