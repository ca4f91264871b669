// BM42 sparse vectors and attention-weighted pooling (engine/explain/sparse_bm42.h) vs a
// reference from Hugging Face attentions by fastembed's recipe with fastembed's own libraries
// (mmh3, py_rust_stemmers): bm42_cases.json, made by make_bm42_golden.py.
// Same indices exactly; values within 1e-5; the [CLS] weights within 1e-5; pooled within 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/explain/sparse_bm42.h"
#include "engine/model.h"
#include "nlohmann/json.hpp"
#include "tests/golden/golden_json.h"
#include "tests/test_model.h"

namespace attn {
namespace {

class Bm42ParityTest : public ::testing::Test {
 protected:
  // Model and fixture are checked by every test (a failure in SetUpTestSuite would only
  // mark the suite skipped).
  void SetUp() override {
    ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status();
    model_ = &*testing::TestModel();
    const testing::GoldenJsonFile& fixture = testing::GoldenJson("bm42_cases.json");
    ASSERT_TRUE(fixture.error.empty()) << fixture.error;
    spec_ = &fixture.json;
  }
  static const std::shared_ptr<const Model>* model_;
  static const nlohmann::json* spec_;
};
const std::shared_ptr<const Model>* Bm42ParityTest::model_ = nullptr;
const nlohmann::json* Bm42ParityTest::spec_ = nullptr;

TEST_F(Bm42ParityTest, Murmur3MatchesMmh3) {
  for (const auto& [text, hash] : (*spec_)["mmh3_hash"].items()) {
    EXPECT_EQ(Murmur3Hash32(text), hash.get<int32_t>()) << text;
  }
}

TEST_F(Bm42ParityTest, SparseVectorsMatchTheReference) {
  const Model& model = **model_;
  auto bm42 = Bm42Encoder::Create(model.tokenizer(), "/nonexistent");  // built-in stop words
  ASSERT_TRUE(bm42.ok()) << bm42.status();
  const int L = model.config().num_hidden_layers;
  int checked = 0, nonempty = 0, entries = 0;
  double worst_value = 0, worst_weight = 0;
  for (const nlohmann::json& c : (*spec_)["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(text);
    TruncationOptions truncation;
    truncation.max_length = 512;  // fastembed truncates at the tokenizer's 512
    auto e = model.tokenizer().Encode(text, truncation);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_EQ(e->ids, c["ids"].get<std::vector<int32_t>>());
    ForwardOptions options;
    options.attention_layers = {L - 1};
    options.hidden_layers = {L};
    options.pool = false;
    auto forward = model.Forward({SequenceInput{e->ids, e->type_ids}}, options);
    ASSERT_TRUE(forward.ok()) << forward.status();
    const std::vector<float> w =
        ClsAttentionOverHeads(forward->Attention(L - 1)->sequences[0].probs);
    const std::vector<float> ref_w = c["cls_attention"];
    ASSERT_EQ(w.size(), ref_w.size());
    for (size_t t = 0; t < w.size(); ++t) {
      EXPECT_NEAR(w[t], ref_w[t], 1e-5f) << t;
      worst_weight = std::max(worst_weight, std::fabs(static_cast<double>(w[t]) - ref_w[t]));
    }
    std::vector<std::string> stems;
    for (const auto& [stem, value] : (*bm42)->StemmedWords(*e, w)) stems.push_back(stem);
    // Stems in order (the reference lists each once, at its first occurrence).
    std::vector<std::string> unique_stems;
    for (const std::string& s : stems) {
      if (std::find(unique_stems.begin(), unique_stems.end(), s) == unique_stems.end()) {
        unique_stems.push_back(s);
      }
    }
    EXPECT_EQ(unique_stems, c["stems"].get<std::vector<std::string>>());
    auto sparse = (*bm42)->Encode(*e, w);
    ASSERT_TRUE(sparse.ok()) << sparse.status();
    ASSERT_EQ(sparse->indices, c["indices"].get<std::vector<uint32_t>>());
    const std::vector<float> values = c["values"];
    for (size_t k = 0; k < values.size(); ++k) {
      EXPECT_NEAR(sparse->values[k], values[k], 1e-5f);
      worst_value =
          std::max(worst_value, std::fabs(static_cast<double>(sparse->values[k]) - values[k]));
    }
    entries += static_cast<int>(values.size());
    if (c.contains("attention_pooled")) {
      const Tensor& hidden = *forward->HiddenState(L);
      std::vector<float> pooled(hidden.dim(1));
      AttentionWeightedPool(hidden.data(), hidden.dim(0), hidden.dim(1), w, pooled.data());
      const std::vector<float> ref = c["attention_pooled"];
      for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(pooled[k], ref[k], 1e-4f) << k;
    }
    ++checked;
    nonempty += !values.empty();
  }
  std::printf(
      "%d sentences (%d non-empty), %d entries: indices identical, worst |value diff| "
      "%.2e, worst |[CLS] weight diff| %.2e\n",
      checked, nonempty, entries, worst_value, worst_weight);
  EXPECT_GE(checked, 50);
  EXPECT_GE(nonempty, 50);
}

}  // namespace
}  // namespace attn
