// Golden parity with Hugging Face on all-mpnet-base-v2 (MPNet): fixtures made by
// tests/golden/make_mpnet_golden.py (transformers MPNetModel + sentence-transformers on the same
// weights). Tolerances: token ids, tokens, type ids and char offsets identical; the relative
// position buckets identical for every distance of a 512-token input; hidden states (layers 0,
// 1, 6, 12) max abs <= 1e-4; attention probabilities (layers 0 and 11) <= 1e-5; pre-softmax
// scores including the relative position bias <= 1e-4; pooled normalised embedding max abs
// <= 1e-5 and cosine >= 0.99999. The measured maxima are printed.
//
// The model is $ATTN_TEST_MPNET_MODEL_DIR or the configured ATTN_MPNET_MODEL_DIR
// (scripts/setup.sh --model all-mpnet-base-v2); when it is absent every test fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/ops/relative_position_bias.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/golden/golden_json.h"
#include "tests/test_util.h"

namespace attn {
namespace {

constexpr double kHiddenTolerance = 1e-4;
constexpr double kAttentionTolerance = 1e-5;
constexpr double kScoresTolerance = 1e-4;
constexpr double kPooledMaxAbs = 1e-5;
constexpr double kPooledMinCosine = 0.99999;

using testing::MpnetModelDir;

// Cosine of a pooled row (golden.numel() floats) to a golden embedding.
double Cosine(const float* ours, const Tensor& golden) {
  double dot = 0, norm_a = 0, norm_b = 0;
  for (int64_t j = 0; j < golden.numel(); ++j) {
    const double a = ours[j], g = golden.data()[j];
    dot += a * g;
    norm_a += a * a;
    norm_b += g * g;
  }
  return dot / std::sqrt(norm_a * norm_b);
}

class MpnetParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setup_error_ = new std::string(Load()); }
  static std::string Load() {
    absl::StatusOr<std::shared_ptr<const Model>> loaded = Model::Load(MpnetModelDir());
    if (!loaded.ok()) {
      return "all-mpnet-base-v2 did not load (scripts/setup.sh --model all-mpnet-base-v2 "
             "installs it): " +
             loaded.status().ToString();
    }
    model_ = new std::shared_ptr<const Model>(*loaded);
    const testing::GoldenJsonFile& cases = testing::GoldenJson("mpnet_cases.json");
    if (!cases.error.empty()) return cases.error;
    cases_ = &cases.json;
    auto tensors =
        SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/mpnet_golden.safetensors");
    if (!tensors.ok()) return tensors.status().ToString();
    tensors_ = tensors->release();
    return "";
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tensors_;
    delete setup_error_;
    model_ = nullptr;
    tensors_ = nullptr;
    setup_error_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(*setup_error_, "") << "fixture set-up failed"; }

  static const Model& model() { return **model_; }

  static Encoding Tokenize(const nlohmann::json& c) {
    TruncationOptions truncation;
    truncation.max_length = c["max_length"].get<int>();
    truncation.side =
        c["truncation_side"] == "left" ? TruncationSide::kLeft : TruncationSide::kRight;
    absl::StatusOr<Encoding> encoding =
        c["text_pair"].is_null()
            ? model().tokenizer().Encode(c["text"].get<std::string>(), truncation)
            : model().tokenizer().EncodePair(c["text"].get<std::string>(),
                                             c["text_pair"].get<std::string>(), truncation);
    EXPECT_TRUE(encoding.ok()) << c["name"] << ": " << encoding.status();
    return encoding.ok() ? *encoding : Encoding{};
  }

  static Tensor Golden(const std::string& name) {
    absl::StatusOr<Tensor> t = tensors_->ReadFloat32(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : Tensor();
  }

  // The cases with a forward: their token ids, and HF's pooled embeddings.
  static void ForwardCases(std::vector<SequenceInput>* batch, std::vector<Tensor>* pooled) {
    for (const nlohmann::json& c : (*cases_)["cases"]) {
      if (!c["forward"].get<bool>()) continue;
      SequenceInput input;
      input.token_ids = c["input_ids"].get<std::vector<int32_t>>();
      batch->push_back(std::move(input));
      pooled->push_back(Golden(c["name"].get<std::string>() + ".pooled"));
    }
  }

  static std::shared_ptr<const Model>* model_;
  static const nlohmann::json* cases_;
  static SafetensorsFile* tensors_;
  static std::string* setup_error_;
};
std::shared_ptr<const Model>* MpnetParityTest::model_ = nullptr;
const nlohmann::json* MpnetParityTest::cases_ = nullptr;
SafetensorsFile* MpnetParityTest::tensors_ = nullptr;
std::string* MpnetParityTest::setup_error_ = nullptr;

TEST_F(MpnetParityTest, LoadsAsMpnet) {
  EXPECT_EQ(model().config().architecture, Architecture::kMpnet);
  EXPECT_EQ(model().config().hidden_size, 768);
  EXPECT_FLOAT_EQ(model().config().layer_norm_eps, 1e-5f);
  EXPECT_EQ(model().max_positions(), 512);  // 514 positions, counted from padding_idx + 1 = 2
  EXPECT_EQ(model().weights().token_type_embeddings.numel(), 0);
  EXPECT_EQ(model().weights().relative_attention_bias.shape(), (std::vector<int64_t>{32, 12}));
}

TEST_F(MpnetParityTest, RelativePositionBucketsAreHfs) {
  const nlohmann::json& buckets = (*cases_)["relative_buckets"];
  const int64_t first = buckets["min_relative"].get<int64_t>();
  const std::vector<int> expected = buckets["buckets"].get<std::vector<int>>();
  ASSERT_GE(expected.size(), 1023u);
  int mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const int64_t relative = first + static_cast<int64_t>(i);
    if (RelativePositionBucket(relative) != expected[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "relative position " << relative << ": bucket "
                    << RelativePositionBucket(relative) << ", HF " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(MpnetParityTest, TokenizationIsIdentical) {
  int cases = 0;
  for (const nlohmann::json& c : (*cases_)["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ++cases;
    const Encoding e = Tokenize(c);
    EXPECT_EQ(e.ids, c["input_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.type_ids, c["token_type_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(e.tokens, c["tokens"].get<std::vector<std::string>>());
    std::vector<std::vector<int32_t>> offsets;
    for (int i = 0; i < e.size(); ++i) offsets.push_back({e.char_start[i], e.char_end[i]});
    EXPECT_EQ(offsets, c["offsets"].get<std::vector<std::vector<int32_t>>>());
    EXPECT_EQ(e.untruncated_length, c["untruncated_len"].get<int>());
  }
  EXPECT_GE(cases, 12);
}

TEST_F(MpnetParityTest, ForwardMatchesHf) {
  const std::vector<int> hidden_layers = (*cases_)["hidden_layers"].get<std::vector<int>>();
  const std::vector<int> attention_layers = (*cases_)["attention_layers"].get<std::vector<int>>();
  const int64_t H = model().config().hidden_size, heads = model().config().num_attention_heads;
  double worst_hidden = 0, worst_probs = 0, worst_scores = 0, worst_pooled = 0, min_cosine = 1;
  int forwards = 0;
  for (const nlohmann::json& c : (*cases_)["cases"]) {
    if (!c["forward"].get<bool>()) continue;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    ++forwards;
    ForwardOptions options = model().DefaultForwardOptions();
    options.hidden_layers = hidden_layers;
    options.attention_layers = attention_layers;
    options.attention_probs = true;
    options.attention_scores = true;
    SequenceInput input;
    input.token_ids = c["input_ids"].get<std::vector<int32_t>>();
    absl::StatusOr<ForwardResult> result = model().Forward({input}, options);
    ASSERT_TRUE(result.ok()) << result.status();
    const int64_t T = static_cast<int64_t>(input.token_ids.size());
    const std::vector<int64_t> rows = c["rows"].get<std::vector<int64_t>>();
    const int64_t R = static_cast<int64_t>(rows.size());

    const Tensor hidden = Golden(name + ".hidden_states");  // (layers, R, H)
    ASSERT_EQ(hidden.numel(), static_cast<int64_t>(hidden_layers.size()) * R * H);
    double case_hidden = 0;
    for (size_t l = 0; l < hidden_layers.size(); ++l) {
      const Tensor* ours = result->HiddenState(hidden_layers[l]);
      ASSERT_NE(ours, nullptr);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t j = 0; j < H; ++j) {
          const double diff =
              std::abs(ours->data()[rows[r] * H + j] - hidden.data()[(l * R + r) * H + j]);
          case_hidden = std::max(case_hidden, diff);
        }
      }
    }
    EXPECT_LE(case_hidden, kHiddenTolerance);
    worst_hidden = std::max(worst_hidden, case_hidden);

    const Tensor probs = Golden(name + ".attentions");  // (layers, heads, R, T)
    const Tensor scores = Golden(name + ".scores");
    double case_probs = 0, case_scores = 0;
    for (size_t l = 0; l < attention_layers.size(); ++l) {
      const LayerAttention* ours = result->Attention(attention_layers[l]);
      ASSERT_NE(ours, nullptr);
      const SequenceAttention& seq = ours->sequences[0];
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t j = 0; j < T; ++j) {
            const int64_t golden_at = ((l * heads + h) * R + r) * T + j;
            const int64_t ours_at = (h * T + rows[r]) * T + j;
            case_probs = std::max<double>(
                case_probs, std::abs(seq.probs.data()[ours_at] - probs.data()[golden_at]));
            case_scores = std::max<double>(
                case_scores, std::abs(seq.scores.data()[ours_at] - scores.data()[golden_at]));
          }
        }
      }
    }
    EXPECT_LE(case_probs, kAttentionTolerance);
    EXPECT_LE(case_scores, kScoresTolerance);
    worst_probs = std::max(worst_probs, case_probs);
    worst_scores = std::max(worst_scores, case_scores);

    const Tensor pooled = Golden(name + ".pooled");
    ASSERT_EQ(pooled.numel(), H);
    double case_pooled = 0;
    for (int64_t j = 0; j < H; ++j) {
      case_pooled =
          std::max<double>(case_pooled, std::abs(result->pooled.data()[j] - pooled.data()[j]));
    }
    const double cosine = Cosine(result->pooled.data(), pooled);
    EXPECT_LE(case_pooled, kPooledMaxAbs);
    EXPECT_GE(cosine, kPooledMinCosine);
    worst_pooled = std::max(worst_pooled, case_pooled);
    min_cosine = std::min(min_cosine, cosine);
    std::printf("  %-16s T=%3lld hidden %.2e  probs %.2e  scores %.2e  pooled %.2e  cos %.9f\n",
                name.c_str(), static_cast<long long>(T), case_hidden, case_probs, case_scores,
                case_pooled, cosine);
  }
  EXPECT_GE(forwards, 6);
  std::printf(
      "MPNet vs HF, max abs over %d inputs: hidden states %.2e, attention %.2e, "
      "pre-softmax scores %.2e, pooled %.2e (min cosine %.9f)\n",
      forwards, worst_hidden, worst_probs, worst_scores, worst_pooled, min_cosine);
}

// The same inputs in one packed batch (different lengths, so the shared bias is built for the
// longest and sliced for the others) give the pooled embeddings of the one-by-one forwards.
TEST_F(MpnetParityTest, BatchedForwardMatchesHf) {
  std::vector<SequenceInput> batch;
  std::vector<Tensor> expected;
  ForwardCases(&batch, &expected);
  absl::StatusOr<ForwardResult> result = model().Forward(batch, model().DefaultForwardOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  const int64_t H = model().config().hidden_size;
  for (size_t b = 0; b < batch.size(); ++b) {
    double worst = 0;
    for (int64_t j = 0; j < H; ++j) {
      worst = std::max<double>(worst,
                               std::abs(result->pooled.data()[b * H + j] - expected[b].data()[j]));
    }
    EXPECT_LE(worst, kPooledMaxAbs) << "input " << b;
  }
}

// The reduced precisions on MPNet (the bias goes through the same attention kernels): pooled
// cosine to Hugging Face's fp32 embeddings >= 0.999 (bf16) and >= 0.995 (int8), as for MiniLM.
TEST_F(MpnetParityTest, ReducedPrecisionPooledStaysCloseToHf) {
  std::vector<SequenceInput> batch;
  std::vector<Tensor> expected;
  ForwardCases(&batch, &expected);
  const int64_t H = model().config().hidden_size;
  for (const auto& [precision, bound] :
       {std::pair{Precision::kBf16, 0.999}, std::pair{Precision::kInt8, 0.995}}) {
    ModelOptions options;
    options.precision = precision;
    options.warm_up = false;
    auto reduced = Model::Load(MpnetModelDir(), options);
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    auto result = (*reduced)->Forward(batch, model().DefaultForwardOptions());
    ASSERT_TRUE(result.ok()) << result.status();
    double worst = 1;
    for (size_t b = 0; b < batch.size(); ++b) {
      const double cosine = Cosine(result->pooled.data() + b * H, expected[b]);
      EXPECT_GE(cosine, bound) << PrecisionName(precision) << " input " << b;
      worst = std::min(worst, cosine);
    }
    std::printf("MPNet %s vs HF fp32 pooled cosine over %zu inputs: min %.6f\n",
                PrecisionName(precision), batch.size(), worst);
  }
}

}  // namespace
}  // namespace attn
