// Golden parity with Hugging Face: fixtures made by tests/golden/make_golden.py (transformers
// BertModel + sentence-transformers on the same weights; see tests/golden/README.md).
// Tolerances: token ids, type ids, tokens and char offsets identical; every layer's hidden
// state max abs error <= 5e-5; attention probabilities <= 1e-5; pooled normalised embedding max
// abs error <= 2e-6 (and cosine >= 0.99999, which the max abs error implies many times over).
// Each bound is <= 10x the worst error measured (AVX2 host, portable kernels): hidden states
// 6.2e-6 (was 1e-4), attention 3.1e-6, pooled 3.0e-7 (was: cosine only).
// The reduced precisions against the same Hugging Face outputs: pooled cosine >= 0.999 (bf16)
// and >= 0.995 (int8), min and mean printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/test_model.h"

namespace attn {
namespace {

constexpr double kHiddenTolerance = 5e-5;
constexpr double kAttentionTolerance = 1e-5;
constexpr double kPooledMinCosine = 0.99999;
constexpr double kPooledMaxAbs = 2e-6;

struct GoldenCase {
  nlohmann::json spec;
  Tensor hidden_states;  // (L+1, R, H) at rows `rows`
  Tensor attentions;     // (L, heads, R, T)
  Tensor pooled;         // (H)
  std::vector<int64_t> rows;
  std::string name() const { return spec["name"].get<std::string>(); }
};

// Cosine of our pooled row (H floats) to a golden pooled embedding.
double PooledCosine(const float* ours, const Tensor& golden) {
  double dot = 0, norm_a = 0, norm_b = 0;
  for (int64_t j = 0; j < golden.numel(); ++j) {
    const double a = ours[j], g = golden.data()[j];
    dot += a * g;
    norm_a += a * a;
    norm_b += g * g;
  }
  return dot / std::sqrt(norm_a * norm_b);
}

class GoldenParityTest : public ::testing::Test {
 protected:
  // Loads the model and the fixtures once; a failure is reported by every test's SetUp (a
  // failed assertion here would only mark the tests skipped).
  static void SetUpTestSuite() { setup_error_ = new std::string(Load()); }
  static std::string Load() {
    const auto& loaded = testing::TestModel();
    if (!loaded.ok()) return "the model did not load: " + loaded.status().ToString();
    model_ = new std::shared_ptr<const Model>(*loaded);

    std::ifstream cases_file(std::string(ATTN_GOLDEN_DIR) + "/minilm_cases.json");
    if (!cases_file.good()) return "missing tests/golden/minilm_cases.json";
    const nlohmann::json cases = nlohmann::json::parse(cases_file, nullptr, false);
    if (cases.is_discarded() || !cases.contains("cases")) {
      return "tests/golden/minilm_cases.json is not the fixture's JSON";
    }
    auto tensors =
        SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/minilm_golden.safetensors");
    if (!tensors.ok()) return "minilm_golden.safetensors: " + tensors.status().ToString();
    cases_ = new std::vector<GoldenCase>();
    for (const nlohmann::json& spec : cases["cases"]) {
      GoldenCase c;
      c.spec = spec;
      const std::string name = spec["name"];
      auto hidden = (*tensors)->ReadFloat32(name + ".hidden_states");
      auto attentions = (*tensors)->ReadFloat32(name + ".attentions");
      auto pooled = (*tensors)->ReadFloat32(name + ".pooled");
      if (!hidden.ok() || !attentions.ok() || !pooled.ok()) {
        return "minilm_golden.safetensors lacks a tensor of case " + name;
      }
      c.hidden_states = std::move(*hidden);
      c.attentions = std::move(*attentions);
      c.pooled = std::move(*pooled);
      c.rows = spec["rows"].get<std::vector<int64_t>>();
      cases_->push_back(std::move(c));
    }
    return "";
  }
  static void TearDownTestSuite() {
    delete model_;
    delete cases_;
    delete setup_error_;
    model_ = nullptr;
    cases_ = nullptr;
    setup_error_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(*setup_error_, "") << "fixture set-up failed"; }

  static const Model& model() { return **model_; }

  static Encoding Tokenize(const GoldenCase& c) {
    TruncationOptions truncation;
    truncation.max_length = c.spec["max_length"].get<int>();
    truncation.side =
        c.spec["truncation_side"] == "left" ? TruncationSide::kLeft : TruncationSide::kRight;
    absl::StatusOr<Encoding> encoding =
        c.spec["text_pair"].is_null()
            ? model().tokenizer().Encode(c.spec["text"].get<std::string>(), truncation)
            : model().tokenizer().EncodePair(c.spec["text"].get<std::string>(),
                                             c.spec["text_pair"].get<std::string>(), truncation);
    EXPECT_TRUE(encoding.ok()) << c.name() << ": " << encoding.status();
    return encoding.ok() ? *encoding : Encoding{};
  }

  static std::shared_ptr<const Model>* model_;
  static std::vector<GoldenCase>* cases_;
  static std::string* setup_error_;
};
std::shared_ptr<const Model>* GoldenParityTest::model_ = nullptr;
std::vector<GoldenCase>* GoldenParityTest::cases_ = nullptr;
std::string* GoldenParityTest::setup_error_ = nullptr;

TEST_F(GoldenParityTest, HasTheRequiredCases) {
  EXPECT_GE(cases_->size(), 12u);
  bool has_512 = false, has_pair = false;
  for (const GoldenCase& c : *cases_) {
    has_512 |= c.spec["seq_len"].get<int>() == 512;
    has_pair |= !c.spec["text_pair"].is_null();
  }
  EXPECT_TRUE(has_512) << "need a case of exactly 512 tokens after truncation";
  EXPECT_TRUE(has_pair);
}

TEST_F(GoldenParityTest, TokenizationIsIdentical) {
  for (const GoldenCase& c : *cases_) {
    SCOPED_TRACE(c.name());
    const Encoding e = Tokenize(c);
    EXPECT_EQ(e.ids, c.spec["input_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.type_ids, c.spec["token_type_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.tokens, c.spec["tokens"].get<std::vector<std::string>>());
    const auto offsets = c.spec["offsets"].get<std::vector<std::vector<int32_t>>>();
    ASSERT_EQ(offsets.size(), e.char_start.size());
    for (size_t i = 0; i < offsets.size(); ++i) {
      EXPECT_EQ(e.char_start[i], offsets[i][0]) << "token " << i;
      EXPECT_EQ(e.char_end[i], offsets[i][1]) << "token " << i;
    }
  }
}

// All cases in ONE packed forward: parity must hold for the packed batch, not just singly.
TEST_F(GoldenParityTest, HiddenStatesAttentionsAndPooledMatchHuggingFace) {
  const int L = model().config().num_hidden_layers;
  const int64_t H = model().config().hidden_size;
  std::vector<SequenceInput> batch;
  for (const GoldenCase& c : *cases_) {
    batch.push_back({c.spec["input_ids"].get<std::vector<int32_t>>(),
                     c.spec["token_type_ids"].get<std::vector<int32_t>>()});
  }
  ForwardOptions options = model().DefaultForwardOptions();
  for (int l = 0; l <= L; ++l) options.hidden_layers.push_back(l);
  for (int l = 0; l < L; ++l) options.attention_layers.push_back(l);
  auto result = model().Forward(batch, options);
  ASSERT_TRUE(result.ok()) << result.status();

  double worst_hidden = 0, worst_attention = 0, worst_cosine = 1, worst_pooled = 0;
  for (size_t b = 0; b < cases_->size(); ++b) {
    const GoldenCase& c = (*cases_)[b];
    SCOPED_TRACE(c.name());
    const int64_t T = batch[b].token_ids.size(), R = c.rows.size(), heads = 12;
    ASSERT_EQ(c.hidden_states.shape(), (std::vector<int64_t>{L + 1, R, H}));
    ASSERT_EQ(c.attentions.shape(), (std::vector<int64_t>{L, heads, R, T}));
    for (int l = 0; l <= L; ++l) {
      const float* ours = result->HiddenState(l)->data() + result->seq_offsets[b] * H;
      double err = 0;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t j = 0; j < H; ++j) {
          err = std::max(err, double{std::abs(ours[c.rows[r] * H + j] -
                                              c.hidden_states.data()[(l * R + r) * H + j])});
        }
      }
      EXPECT_LE(err, kHiddenTolerance) << "hidden state of layer " << l;
      worst_hidden = std::max(worst_hidden, err);
    }
    for (int l = 0; l < L; ++l) {
      const Tensor& probs = result->Attention(l)->sequences[b].probs;
      double err = 0;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t j = 0; j < T; ++j) {
            err = std::max(
                err, double{std::abs(probs.data()[(h * T + c.rows[r]) * T + j] -
                                     c.attentions.data()[((l * heads + h) * R + r) * T + j])});
          }
        }
      }
      EXPECT_LE(err, kAttentionTolerance) << "attention of layer " << l;
      worst_attention = std::max(worst_attention, err);
    }
    const double cosine = PooledCosine(result->pooled.data() + b * H, c.pooled);
    EXPECT_GE(cosine, kPooledMinCosine) << "pooled embedding";
    worst_cosine = std::min(worst_cosine, cosine);
    double pooled_err = 0;
    for (int64_t j = 0; j < H; ++j) {
      pooled_err = std::max(
          pooled_err, double{std::abs(result->pooled.data()[b * H + j] - c.pooled.data()[j])});
    }
    EXPECT_LE(pooled_err, kPooledMaxAbs) << "pooled embedding, max abs error";
    worst_pooled = std::max(worst_pooled, pooled_err);
  }
  std::printf(
      "worst hidden-state error %.3g, worst attention error %.3g, worst pooled error %.3g, min "
      "pooled cosine %.9f\n",
      worst_hidden, worst_attention, worst_pooled, worst_cosine);
}

// Pooled cosine of a bf16 / int8 model to Hugging Face's fp32 pooled embeddings, every case.
TEST_F(GoldenParityTest, ReducedPrecisionPooledStaysCloseToHuggingFace) {
  const int64_t H = model().config().hidden_size;
  std::vector<SequenceInput> batch;
  for (const GoldenCase& c : *cases_) {
    batch.push_back({c.spec["input_ids"].get<std::vector<int32_t>>(),
                     c.spec["token_type_ids"].get<std::vector<int32_t>>()});
  }
  for (const auto& [precision, bound] :
       {std::pair{Precision::kBf16, 0.999}, std::pair{Precision::kInt8, 0.995}}) {
    ModelOptions options;
    options.precision = precision;
    options.warm_up = false;
    auto reduced = Model::Load(ATTN_TEST_MODEL_DIR, options);
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    auto result = (*reduced)->Forward(batch, model().DefaultForwardOptions());
    ASSERT_TRUE(result.ok()) << result.status();
    double worst = 1, total = 0;
    for (size_t b = 0; b < cases_->size(); ++b) {
      const GoldenCase& c = (*cases_)[b];
      const double cosine = PooledCosine(result->pooled.data() + b * H, c.pooled);
      EXPECT_GE(cosine, bound) << PrecisionName(precision) << " " << c.name();
      worst = std::min(worst, cosine);
      total += cosine;
    }
    std::printf(
        "%s vs Hugging Face fp32 pooled cosine over %zu golden cases: min %.6f, mean %.6f\n",
        PrecisionName(precision), cases_->size(), worst, total / cases_->size());
  }
}

// The acceptance check for the engine CLI: `echo text | attn-embed` prints the
// sentence-transformers embedding of king_queen (cosine >= 0.99999).
TEST_F(GoldenParityTest, EngineCliMatchesSentenceTransformers) {
  const GoldenCase* king = nullptr;
  for (const GoldenCase& c : *cases_) {
    if (c.name() == "king_queen") king = &c;
  }
  ASSERT_NE(king, nullptr);
  ASSERT_EQ(king->spec["pooled_source"], "sentence_transformers");
  const std::string command = std::string("echo '") + king->spec["text"].get<std::string>() +
                              "' | " + ATTN_EMBED_BINARY +
                              " --model_dir=" + testing::TestModelDir();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe.get())) output.append(buffer, n);
  const nlohmann::json line = nlohmann::json::parse(output);
  const std::vector<float> embedding = line["embedding"].get<std::vector<float>>();
  ASSERT_EQ(embedding.size(), 384u);
  double dot = 0, norm = 0, max_err = 0;
  for (size_t j = 0; j < embedding.size(); ++j) {
    dot += double{embedding[j]} * king->pooled.data()[j];
    norm += double{embedding[j]} * embedding[j];
    max_err = std::max(max_err, double{std::abs(embedding[j] - king->pooled.data()[j])});
  }
  EXPECT_NEAR(norm, 1.0, 1e-5);
  EXPECT_GE(dot, kPooledMinCosine);  // both unit length: the dot product is the cosine
  EXPECT_LE(max_err, kPooledMaxAbs);
  std::printf("attn-embed vs sentence-transformers: max abs error %.3g\n", max_err);
}

}  // namespace
}  // namespace attn
