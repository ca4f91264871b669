// Attribution sanity on the real model (engine/explain/attribution.h): properties a correct
// implementation must have and a wrong one can fail. Parity with torch is in
// tests/golden/explain_parity_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "engine/explain/attribution.h"
#include "engine/model.h"
#include "tests/test_model.h"

namespace attn {
namespace {

class ExplainTest : public ::testing::Test {
 protected:
  // Model and fixture are checked by every test (a failure in SetUpTestSuite would only
  // mark the suite skipped).
  void SetUp() override {
    ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status();
    model_ = &*testing::TestModel();
  }

  static const Model& model() { return **model_; }
  static Encoding Encode(const std::string& text) {
    auto e = model().tokenizer().Encode(text);
    EXPECT_TRUE(e.ok()) << e.status();
    return *e;
  }
  static absl::StatusOr<AttributionResult> Explain(const std::string& a, const std::string& b,
                                                   const AttributionOptions& options) {
    return ExplainSimilarity(model().config(), model().weights(), model().sentence_config(),
                             model().tokenizer(), Encode(a), Encode(b), options);
  }

  static const std::shared_ptr<const Model>* model_;
};
const std::shared_ptr<const Model>* ExplainTest::model_ = nullptr;

// Two sentences that share exactly one rare word and nothing else: the cell pairing that word
// with itself carries the largest attribution of the word-level matrix.
TEST_F(ExplainTest, SharedRareWordCarriesTheLargestPairCell) {
  const struct {
    std::string a, b, word;
  } cases[] = {
      {"The axolotl slept quietly.", "Bond yields rose after the axolotl report.", "axolotl"},
      {"My grandmother knits with merino wool.", "Shipping costs for merino doubled in March.",
       "merino"},
      {"A pangolin crossed the road.", "Investors discussed pangolin smuggling penalties.",
       "pangolin"},
  };
  AttributionOptions options;
  options.steps = 16;
  options.word_level = true;
  for (const auto& c : cases) {
    auto r = Explain(c.a, c.b, options);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& wa = r->a.words;
    const auto& wb = r->b.words;
    const auto best = std::max_element(r->word_pair_matrix.begin(), r->word_pair_matrix.end()) -
                      r->word_pair_matrix.begin();
    EXPECT_EQ(wa[best / wb.size()].text, c.word) << c.a << " | " << c.b;
    EXPECT_EQ(wb[best % wb.size()].text, c.word) << c.a << " | " << c.b;
    EXPECT_LT(r->completeness_error, 0.02f) << c.a;
  }
}

TEST_F(ExplainTest, SwappingTheTextsTransposesThePairMatrix) {
  AttributionOptions options;
  options.steps = 8;
  auto ab = Explain("A man is playing a guitar.", "Someone plays music on stage.", options);
  auto ba = Explain("Someone plays music on stage.", "A man is playing a guitar.", options);
  ASSERT_TRUE(ab.ok() && ba.ok());
  ASSERT_EQ(ab->rows, ba->cols);
  ASSERT_EQ(ab->cols, ba->rows);
  float max_abs = 0;
  for (float v : ab->pair_matrix) max_abs = std::max(max_abs, std::fabs(v));
  for (int64_t i = 0; i < ab->rows; ++i) {
    for (int64_t j = 0; j < ab->cols; ++j) {
      EXPECT_NEAR(ab->pair_matrix[i * ab->cols + j], ba->pair_matrix[j * ba->cols + i],
                  1e-4f * max_abs);
    }
  }
  EXPECT_NEAR(ab->similarity, ba->similarity, 1e-6f);
}

// The per-token integrated gradients sum to s(a, b) - s(r_a, b) up to the Riemann sum's error,
// which shrinks as the steps grow.
TEST_F(ExplainTest, CompletenessErrorShrinksWithSteps) {
  AttributionOptions options;
  options.method = AttributionMethod::kIntegratedGradients;
  options.steps = 4;
  auto coarse = Explain("Cheap flights to Paris", "Low-cost airline tickets to France", options);
  options.steps = 64;
  auto fine = Explain("Cheap flights to Paris", "Low-cost airline tickets to France", options);
  ASSERT_TRUE(coarse.ok() && fine.ok());
  EXPECT_LT(fine->completeness_error, coarse->completeness_error);
  EXPECT_LT(fine->completeness_error, 0.01f);
}

TEST_F(ExplainTest, WordLevelSumsWordPieces) {
  AttributionOptions options;
  options.method = AttributionMethod::kIntegratedGradients;
  options.steps = 4;
  options.word_level = true;
  const std::string a = "Photosynthesis converts sunlight.";
  auto r = Explain(a, "Plants use light.", options);
  ASSERT_TRUE(r.ok()) << r.status();
  const Encoding e = Encode(a);
  ASSERT_GT(e.size(), static_cast<int>(r->a.words.size()));  // some word has several pieces
  float token_sum = 0, word_sum = 0;
  for (float v : r->a.integrated_gradients) token_sum += v;
  for (float v : r->a.word_integrated_gradients) word_sum += v;
  EXPECT_NEAR(token_sum, word_sum, 1e-5f);
  bool found = false;
  for (const WordSpan& w : r->a.words) {
    if (w.text != "photosynthesis") continue;
    found = true;
    EXPECT_EQ(a.substr(w.char_start, w.char_end - w.char_start), "Photosynthesis");
    EXPECT_GT(w.num_tokens, 1);
  }
  EXPECT_TRUE(found);
}

TEST_F(ExplainTest, LimitsAreInvalidArgumentNamingTheLimit) {
  const std::string a = "short text", b = "another one";
  AttributionOptions options;
  options.steps = 0;
  auto r = Explain(a, b, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("[1, 256]"), std::string::npos) << r.status();
  options.steps = 100000;
  EXPECT_EQ(Explain(a, b, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.steps = 4;
  options.layer = 7;
  r = Explain(a, b, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("[0, 6]"), std::string::npos) << r.status();
  options.layer = 0;
  r = Explain(a, "", options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("text b"), std::string::npos) << r.status();
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "word ";
  r = Explain(long_text, b, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("128"), std::string::npos) << r.status();
  options.method = AttributionMethod::kIntegratedGradients;
  options.max_tokens = 100;
  r = Explain(long_text, b, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("100"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace attn
