// AttentionMap of the real server: golden attention probabilities (<= 1e-5), row sums, layer and
// head selection, top-k, rollout, mean over heads, scores and Q/K/V consistency.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "tests/integration/harness.h"

namespace attn::integration {
namespace {

constexpr double kAttentionTolerance = 1e-5;
constexpr double kRowSumTolerance = 1e-5;

class AttentionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { stub_ = SharedServer().NewStub().release(); }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
  }

  static grpc::Status Attention(const pb::AttentionMapRequest& request,
                                pb::AttentionMapResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    return stub_->AttentionMap(&context, request, response);
  }

  // A request for one golden case (its tokenization) with `configure` applied.
  static pb::AttentionMapResponse AttentionOf(
      const GoldenCase& c, const std::function<void(pb::AttentionMapRequest*)>& configure = {}) {
    pb::AttentionMapRequest request;
    *request.add_inputs() = GoldenInput(c);
    *request.mutable_tokenization() = GoldenTokenization(c);
    if (configure) configure(&request);
    pb::AttentionMapResponse response;
    const grpc::Status status = Attention(request, &response);
    EXPECT_TRUE(status.ok()) << c.name << ": " << StatusString(status);
    EXPECT_EQ(response.results_size(), status.ok() ? 1 : 0);
    return response;
  }

  static pb::Encoder::Stub* stub_;
};
pb::Encoder::Stub* AttentionTest::stub_ = nullptr;

// Every row of a [..., T, T] (or [T, T]) map sums to 1; returns the worst deviation.
double WorstRowSumError(const std::vector<float>& values, int row_length) {
  double worst = 0;
  for (size_t start = 0; start + row_length <= values.size(); start += row_length) {
    double sum = 0;
    for (int j = 0; j < row_length; ++j) sum += values[start + j];
    worst = std::max(worst, std::fabs(sum - 1.0));
  }
  return worst;
}

// Compares dense weights [heads.size(), T, T] of `layer` with the fixture at its stored rows.
void ExpectWeightsMatchGolden(const GoldenCase& c, int layer, const std::vector<int>& heads,
                              const std::vector<float>& weights) {
  const size_t t = static_cast<size_t>(c.seq_len);
  ASSERT_EQ(weights.size(), heads.size() * t * t) << c.name;
  double worst = 0;
  for (size_t h = 0; h < heads.size(); ++h) {
    for (size_t r = 0; r < c.rows.size(); ++r) {
      for (size_t col = 0; col < t; ++col) {
        const double error =
            std::fabs(weights[(h * t + c.rows[r]) * t + col] -
                      c.Attention(layer, heads[h], static_cast<int>(r), static_cast<int>(col)));
        worst = std::max(worst, error);
      }
    }
  }
  EXPECT_LE(worst, kAttentionTolerance) << c.name << " layer " << layer;
}

void CheckAllLayersAgainstGolden(const GoldenCase& c, const pb::AttentionResult& result,
                                 const std::vector<int>& expected_layers) {
  SCOPED_TRACE(c.name);
  ExpectTokensMatchGolden(c, result.tokens());
  ASSERT_EQ(result.layers_size(), static_cast<int>(expected_layers.size()));
  std::vector<int> all_heads(kNumHeads);
  for (int h = 0; h < kNumHeads; ++h) all_heads[h] = h;
  for (int i = 0; i < result.layers_size(); ++i) {
    const pb::LayerAttention& layer = result.layers(i);
    EXPECT_EQ(layer.layer(), expected_layers[i]);
    EXPECT_EQ(std::vector<int>(layer.heads().begin(), layer.heads().end()), all_heads);
    EXPECT_EQ(Shape(layer.weights()), (std::vector<int64_t>{kNumHeads, c.seq_len, c.seq_len}));
    const std::vector<float> weights = DecodeOrFail(layer.weights());
    EXPECT_LE(WorstRowSumError(weights, c.seq_len), kRowSumTolerance) << "layer " << layer.layer();
    ExpectWeightsMatchGolden(c, layer.layer(), all_heads, weights);
  }
}

// All golden cases, all layers and heads. The short cases go in one request; the 512-token case
// one layer per request (all of it would be 75 MB).
TEST_F(AttentionTest, WeightsMatchGoldenAndRowsSumToOne) {
  pb::AttentionMapRequest request;
  std::vector<const GoldenCase*> batched;
  for (const GoldenCase& c : GoldenCases()) {
    if (c.seq_len > 64 || c.spec["max_length"] != 512) continue;
    batched.push_back(&c);
    *request.add_inputs() = GoldenInput(c);
  }
  *request.mutable_tokenization() = GoldenTokenization(*batched[0]);
  pb::AttentionMapResponse response;
  const grpc::Status status = Attention(request, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  ASSERT_EQ(response.results_size(), static_cast<int>(batched.size()));
  EXPECT_EQ(response.model_version(), "base");
  for (size_t i = 0; i < batched.size(); ++i) {
    CheckAllLayersAgainstGolden(*batched[i], response.results(static_cast<int>(i)),
                                {0, 1, 2, 3, 4, 5});
  }

  const GoldenCase& left = Golden("left_truncated_32");
  CheckAllLayersAgainstGolden(left, AttentionOf(left).results(0), {0, 1, 2, 3, 4, 5});

  const GoldenCase& long_case = Golden("truncated_512");
  for (int layer = 0; layer < kNumLayers; ++layer) {
    const pb::AttentionMapResponse one =
        AttentionOf(long_case, [&](pb::AttentionMapRequest* r) { r->add_layers(layer); });
    ASSERT_EQ(one.results_size(), 1);
    EXPECT_TRUE(one.results(0).truncated());
    EXPECT_EQ(one.results(0).untruncated_length(), 762);
    CheckAllLayersAgainstGolden(long_case, one.results(0), {layer});
  }
}

TEST_F(AttentionTest, LayerAndHeadSelectionReturnsExactlyThose) {
  const GoldenCase& c = Golden("long_english");
  const std::vector<int> heads = {3, 0, 7};
  const pb::AttentionMapResponse response = AttentionOf(c, [&](pb::AttentionMapRequest* r) {
    r->add_layers(-1);
    r->add_layers(2);
    for (int h : heads) r->add_heads(h);
  });
  ASSERT_EQ(response.results_size(), 1);
  const pb::AttentionResult& result = response.results(0);
  ASSERT_EQ(result.layers_size(), 2);
  EXPECT_EQ(result.layers(0).layer(), 5) << "-1 resolves to the last layer, request order kept";
  EXPECT_EQ(result.layers(1).layer(), 2);
  for (const pb::LayerAttention& layer : result.layers()) {
    const std::vector<int> returned(layer.heads().begin(), layer.heads().end());
    EXPECT_EQ(std::multiset<int>(returned.begin(), returned.end()),
              std::multiset<int>(heads.begin(), heads.end()));
    EXPECT_EQ(Shape(layer.weights()), (std::vector<int64_t>{3, c.seq_len, c.seq_len}));
    // Whatever the order, the tensor's head i is layer.heads(i).
    ExpectWeightsMatchGolden(c, layer.layer(), returned, DecodeOrFail(layer.weights()));
    EXPECT_EQ(layer.scores().data().size(), 0u) << "scores only on request";
    EXPECT_EQ(layer.query().data().size(), 0u) << "Q/K/V only on request";
  }
}

TEST_F(AttentionTest, TopKMatchesLargestDenseValues) {
  const GoldenCase& c = Golden("long_english");
  const int t = c.seq_len;
  constexpr int kTopK = 5;
  const pb::AttentionMapResponse dense = AttentionOf(c);
  const pb::AttentionMapResponse sparse =
      AttentionOf(c, [](pb::AttentionMapRequest* r) { r->set_top_k(kTopK); });
  ASSERT_EQ(dense.results_size(), 1);
  ASSERT_EQ(sparse.results_size(), 1);
  ASSERT_EQ(sparse.results(0).layers_size(), kNumLayers);
  for (int l = 0; l < kNumLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const pb::LayerAttention& layer = sparse.results(0).layers(l);
    EXPECT_EQ(layer.weights().data().size(), 0u) << "dense weights are absent when top_k > 0";
    const pb::SparseRows& top = layer.weights_top_k();
    ASSERT_EQ(top.k(), kTopK);
    EXPECT_EQ(Shape(top.values()), (std::vector<int64_t>{kNumHeads, t, kTopK}));
    const std::vector<float> values = DecodeOrFail(top.values());
    ASSERT_EQ(values.size(), static_cast<size_t>(kNumHeads) * t * kTopK);
    ASSERT_EQ(top.indices_size(), kNumHeads * t * kTopK);
    const std::vector<float> full = DecodeOrFail(dense.results(0).layers(l).weights());
    ASSERT_EQ(full.size(), static_cast<size_t>(kNumHeads) * t * t);
    int problems = 0;
    for (int h = 0; h < kNumHeads; ++h) {
      for (int row = 0; row < t; ++row) {
        const float* dense_row = &full[(static_cast<size_t>(h) * t + row) * t];
        std::vector<float> sorted(dense_row, dense_row + t);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        std::set<int> seen;
        for (int j = 0; j < kTopK; ++j) {
          const size_t at = (static_cast<size_t>(h) * t + row) * kTopK + j;
          const float value = values[at];
          const int index = top.indices(static_cast<int>(at));
          const bool ok = index >= 0 && index < t && seen.insert(index).second &&
                          (j == 0 || values[at - 1] >= value) &&
                          std::fabs(dense_row[index] - value) <= 1e-6 &&
                          std::fabs(sorted[j] - value) <= 1e-6;
          if (!ok && ++problems <= 5) {
            ADD_FAILURE() << "head " << h << " row " << row << " entry " << j << ": value " << value
                          << " index " << index << ", dense value there "
                          << (index >= 0 && index < t ? dense_row[index] : NAN) << ", expected the "
                          << j << "-th largest " << sorted[j];
          }
        }
      }
    }
    EXPECT_EQ(problems, 0);
  }

  // top_k is clamped to T.
  const GoldenCase& short_case = Golden("king_queen");
  const pb::AttentionMapResponse clamped = AttentionOf(short_case, [](pb::AttentionMapRequest* r) {
    r->set_top_k(100);
    r->add_layers(0);
  });
  ASSERT_EQ(clamped.results_size(), 1);
  ASSERT_EQ(clamped.results(0).layers_size(), 1);
  const pb::SparseRows& all = clamped.results(0).layers(0).weights_top_k();
  EXPECT_EQ(all.k(), short_case.seq_len);
  EXPECT_EQ(Shape(all.values()),
            (std::vector<int64_t>{kNumHeads, short_case.seq_len, short_case.seq_len}));
  EXPECT_LE(WorstRowSumError(DecodeOrFail(all.values()), short_case.seq_len), kRowSumTolerance);
}

// Rollout R = A'_5 ... A'_0, A'_l = 0.5 * mean_heads(A_l) + 0.5 * I (rows renormalised), from
// all layers whatever `layers` selects.
TEST_F(AttentionTest, RolloutRowsSumToOneAndMatchDefinition) {
  const GoldenCase& c = Golden("long_english");
  const int t = c.seq_len;
  const pb::AttentionMapResponse dense = AttentionOf(c);
  const pb::AttentionMapResponse rolled = AttentionOf(c, [](pb::AttentionMapRequest* r) {
    r->set_rollout(true);
    r->add_layers(0);  // rollout still spans every layer
  });
  ASSERT_EQ(dense.results_size(), 1);
  ASSERT_EQ(rolled.results_size(), 1);
  ASSERT_EQ(dense.results(0).layers_size(), kNumLayers);
  EXPECT_EQ(Shape(rolled.results(0).rollout()), (std::vector<int64_t>{t, t}));
  const std::vector<float> rollout = DecodeOrFail(rolled.results(0).rollout());
  ASSERT_EQ(rollout.size(), static_cast<size_t>(t) * t);
  EXPECT_LE(WorstRowSumError(rollout, t), kRowSumTolerance);

  std::vector<double> product(static_cast<size_t>(t) * t, 0);
  for (int i = 0; i < t; ++i) product[static_cast<size_t>(i) * t + i] = 1;
  for (int l = 0; l < kNumLayers; ++l) {
    const std::vector<float> weights = DecodeOrFail(dense.results(0).layers(l).weights());
    std::vector<double> a(static_cast<size_t>(t) * t, 0);
    for (int h = 0; h < kNumHeads; ++h) {
      for (size_t k = 0; k < a.size(); ++k) a[k] += 0.5 * weights[h * a.size() + k] / kNumHeads;
    }
    for (int i = 0; i < t; ++i) {
      a[static_cast<size_t>(i) * t + i] += 0.5;
      double sum = 0;
      for (int j = 0; j < t; ++j) sum += a[static_cast<size_t>(i) * t + j];
      for (int j = 0; j < t; ++j) a[static_cast<size_t>(i) * t + j] /= sum;
    }
    std::vector<double> next(a.size(), 0);  // A'_l * product
    for (int i = 0; i < t; ++i) {
      for (int k = 0; k < t; ++k) {
        const double aik = a[static_cast<size_t>(i) * t + k];
        for (int j = 0; j < t; ++j) {
          next[static_cast<size_t>(i) * t + j] += aik * product[static_cast<size_t>(k) * t + j];
        }
      }
    }
    product = std::move(next);
  }
  double worst = 0;
  for (size_t k = 0; k < product.size(); ++k) {
    worst = std::max(worst, std::fabs(product[k] - rollout[k]));
  }
  EXPECT_LE(worst, 1e-4);
}

// mean_over_heads averages all heads of the layer, also when `heads` selects a few.
TEST_F(AttentionTest, MeanOverHeadsEqualsMeanOfDenseHeads) {
  const GoldenCase& c = Golden("numbers");
  const int t = c.seq_len;
  const pb::AttentionMapResponse all = AttentionOf(c, [](pb::AttentionMapRequest* r) {
    r->add_layers(1);
    r->add_layers(4);
    r->set_mean_over_heads(true);
  });
  const pb::AttentionMapResponse some = AttentionOf(c, [](pb::AttentionMapRequest* r) {
    r->add_layers(1);
    r->add_layers(4);
    r->add_heads(2);
    r->add_heads(5);
    r->set_mean_over_heads(true);
  });
  ASSERT_EQ(all.results_size(), 1);
  ASSERT_EQ(some.results_size(), 1);
  ASSERT_EQ(all.results(0).layers_size(), 2);
  ASSERT_EQ(some.results(0).layers_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const pb::LayerAttention& layer = all.results(0).layers(i);
    EXPECT_EQ(Shape(layer.mean_weights()), (std::vector<int64_t>{t, t}));
    const std::vector<float> weights = DecodeOrFail(layer.weights());
    ASSERT_EQ(weights.size(), static_cast<size_t>(kNumHeads) * t * t);
    std::vector<float> mean(static_cast<size_t>(t) * t, 0);
    for (int h = 0; h < kNumHeads; ++h) {
      for (size_t k = 0; k < mean.size(); ++k) mean[k] += weights[h * mean.size() + k] / kNumHeads;
    }
    const std::vector<float> returned = DecodeOrFail(layer.mean_weights());
    EXPECT_LE(MaxAbsDiff(returned, mean), 1e-6) << "layer " << layer.layer();
    EXPECT_LE(WorstRowSumError(returned, t), kRowSumTolerance);
    EXPECT_LE(MaxAbsDiff(DecodeOrFail(some.results(0).layers(i).mean_weights()), mean), 1e-6)
        << "mean over ALL heads even when heads {2, 5} are selected, layer " << layer.layer();
  }
}

// softmax(scores) = weights and Q K^T / sqrt(head_dim) = scores, for every head of a layer.
TEST_F(AttentionTest, ScoresAndQkvAreConsistentWithWeights) {
  const GoldenCase& c = Golden("king_queen");
  const int t = c.seq_len;
  const pb::AttentionMapResponse response = AttentionOf(c, [](pb::AttentionMapRequest* r) {
    r->add_layers(3);
    r->set_include_scores(true);
    r->set_include_qkv(true);
  });
  ASSERT_EQ(response.results_size(), 1);
  ASSERT_EQ(response.results(0).layers_size(), 1);
  const pb::LayerAttention& layer = response.results(0).layers(0);
  EXPECT_EQ(Shape(layer.scores()), (std::vector<int64_t>{kNumHeads, t, t}));
  for (const pb::Tensor* qkv : {&layer.query(), &layer.key(), &layer.value()}) {
    EXPECT_EQ(Shape(*qkv), (std::vector<int64_t>{kNumHeads, t, kHeadDim}));
  }
  const std::vector<float> weights = DecodeOrFail(layer.weights());
  const std::vector<float> scores = DecodeOrFail(layer.scores());
  const std::vector<float> q = DecodeOrFail(layer.query());
  const std::vector<float> k = DecodeOrFail(layer.key());
  ASSERT_EQ(scores.size(), weights.size());
  ASSERT_EQ(q.size(), static_cast<size_t>(kNumHeads) * t * kHeadDim);
  ASSERT_EQ(k.size(), q.size());
  double softmax_error = 0, score_error = 0;
  for (int h = 0; h < kNumHeads; ++h) {
    for (int i = 0; i < t; ++i) {
      const size_t row = (static_cast<size_t>(h) * t + i) * t;
      double max = -INFINITY, sum = 0;
      for (int j = 0; j < t; ++j) max = std::max(max, static_cast<double>(scores[row + j]));
      for (int j = 0; j < t; ++j) sum += std::exp(scores[row + j] - max);
      for (int j = 0; j < t; ++j) {
        softmax_error = std::max(
            softmax_error, std::fabs(std::exp(scores[row + j] - max) / sum - weights[row + j]));
        double dot = 0;
        for (int d = 0; d < kHeadDim; ++d) {
          dot += static_cast<double>(q[(static_cast<size_t>(h) * t + i) * kHeadDim + d]) *
                 k[(static_cast<size_t>(h) * t + j) * kHeadDim + d];
        }
        score_error = std::max(score_error, std::fabs(dot / std::sqrt(kHeadDim) - scores[row + j]));
      }
    }
  }
  EXPECT_LE(softmax_error, 1e-5);
  EXPECT_LE(score_error, 1e-4);
  ExpectWeightsMatchGolden(c, 3, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, weights);
}

TEST_F(AttentionTest, HalfPrecisionWeightsMatchFloat32) {
  const GoldenCase& c = Golden("text_pair");
  const pb::AttentionMapResponse f32 = AttentionOf(c);
  for (pb::DType dtype : {pb::FLOAT16, pb::BFLOAT16}) {
    SCOPED_TRACE(pb::DType_Name(dtype));
    const double relative = dtype == pb::FLOAT16 ? 1e-3 : 8e-3;
    const double absolute = dtype == pb::FLOAT16 ? 1e-7 : 0;
    const pb::AttentionMapResponse low =
        AttentionOf(c, [&](pb::AttentionMapRequest* r) { r->set_output_dtype(dtype); });
    ASSERT_EQ(low.results_size(), 1);
    ASSERT_EQ(low.results(0).layers_size(), kNumLayers);
    for (int l = 0; l < kNumLayers; ++l) {
      const pb::Tensor& tensor = low.results(0).layers(l).weights();
      EXPECT_EQ(tensor.dtype(), dtype);
      const std::vector<float> values = DecodeOrFail(tensor);
      const std::vector<float> reference = DecodeOrFail(f32.results(0).layers(l).weights());
      ASSERT_EQ(values.size(), reference.size());
      int bad = 0;
      for (size_t k = 0; k < values.size(); ++k) {
        if (!(std::fabs(values[k] - reference[k]) <=
              relative * std::fabs(reference[k]) + absolute)) {
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0) << "layer " << l;
    }
  }
}

}  // namespace
}  // namespace attn::integration
