// The int8 encoder (ModelOptions::precision = kInt8) against the fp32 one on the real
// all-MiniLM-L6-v2 weights: pooled-embedding cosine over a few hundred generated sentences,
// attention maps, and the fast path's primitive reuse.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/model.h"

namespace attn {
namespace {

// Deterministic English-looking sentences of 3 to ~70 words: a few clause templates over word
// lists, joined with conjunctions, plus numbers, punctuation and the odd rare word.
std::vector<std::string> MakeSentences(int count) {
  const std::vector<std::string> subjects = {
      "the old fisherman", "my sister",         "a small company", "the committee",
      "our neighbours",    "the new teacher",   "every student",   "the city council",
      "a tired traveller", "the research team", "her grandfather", "the orchestra",
      "this algorithm",    "the quiet child",   "several doctors", "the river"};
  const std::vector<std::string> verbs = {
      "painted", "discovered", "argued about", "carefully repaired", "quickly sold",
      "ignored", "described",  "celebrated",   "measured",           "translated",
      "forgot",  "borrowed",   "explained",    "photographed",       "rebuilt"};
  const std::vector<std::string> objects = {"the wooden fence",
                                            "a strange letter",
                                            "the budget for next year",
                                            "their favourite recipe",
                                            "an ancient map",
                                            "the broken bicycle",
                                            "the results of the experiment",
                                            "a long poem about winter",
                                            "the train timetable",
                                            "the football match",
                                            "a cup of green tea",
                                            "the missing keys",
                                            "the neural network",
                                            "the mountain village",
                                            "a pair of red shoes"};
  const std::vector<std::string> tails = {
      "before sunrise",         "in the crowded market",  "after the storm had passed",
      "without telling anyone", "for nearly three hours", "with remarkable patience",
      "on a rainy Tuesday",     "despite the noise",      "in 1987",
      "at 42 degrees",          "because it was cheap",   "while everyone watched"};
  const std::vector<std::string> joins = {"and", "but", "so", "although", "while", "because"};
  std::mt19937 rng(20261122);
  auto pick = [&](const std::vector<std::string>& words) { return words[rng() % words.size()]; };
  std::vector<std::string> sentences;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const int clauses = 1 + static_cast<int>(rng() % 5);
    for (int c = 0; c < clauses; ++c) {
      if (c > 0) s += (rng() % 3 == 0 ? ", " : " ") + pick(joins) + " ";
      s += pick(subjects) + " " + pick(verbs) + " " + pick(objects);
      if (rng() % 2 == 0) s += " " + pick(tails);
    }
    if (i % 7 == 0)
      s = "Why " + s + "?";  // questions, and a rare-word prefix now and then
    else if (i % 11 == 0)
      s = "Unbelievably, " + s + "!";
    else
      s += ".";
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    sentences.push_back(s);
  }
  return sentences;
}

class Int8EncoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto fp32 = Model::Load(ATTN_TEST_MODEL_DIR);
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    ModelOptions options;
    options.precision = Precision::kInt8;
    auto int8 = Model::Load(ATTN_TEST_MODEL_DIR, options);
    ASSERT_TRUE(int8.ok()) << int8.status();
    fp32_ = new std::shared_ptr<const Model>(*fp32);
    int8_ = new std::shared_ptr<const Model>(*int8);
  }
  static void TearDownTestSuite() {
    delete fp32_;
    delete int8_;
  }
  static const Model& fp32() { return **fp32_; }
  static const Model& int8() { return **int8_; }

  static std::vector<SequenceInput> Tokenize(const std::vector<std::string>& texts) {
    std::vector<SequenceInput> batch;
    for (const std::string& text : texts) {
      auto encoding = fp32().tokenizer().Encode(text);
      EXPECT_TRUE(encoding.ok()) << encoding.status();
      batch.push_back({encoding->ids, encoding->type_ids});
    }
    return batch;
  }

  static std::shared_ptr<const Model>* fp32_;
  static std::shared_ptr<const Model>* int8_;
};
std::shared_ptr<const Model>* Int8EncoderTest::fp32_ = nullptr;
std::shared_ptr<const Model>* Int8EncoderTest::int8_ = nullptr;

TEST_F(Int8EncoderTest, ReportsItsPrecision) {
  EXPECT_EQ(fp32().precision(), Precision::kFp32);
  EXPECT_EQ(int8().precision(), Precision::kInt8);
  EXPECT_STREQ(PrecisionName(int8().precision()), "int8");
  EXPECT_STREQ(PrecisionName(fp32().precision()), "float32");
  Precision parsed;
  EXPECT_TRUE(ParsePrecision("int8", &parsed));
  EXPECT_EQ(parsed, Precision::kInt8);
  EXPECT_TRUE(ParsePrecision("fp32", &parsed));
  EXPECT_EQ(parsed, Precision::kFp32);
  EXPECT_FALSE(ParsePrecision("bf16", &parsed));
}

TEST_F(Int8EncoderTest, PooledEmbeddingsStayWithinCosine0995OfFp32) {
  const std::vector<std::string> sentences = MakeSentences(256);
  const ForwardOptions options = fp32().DefaultForwardOptions();  // mean pooling, normalised
  double worst = 1.0, sum = 0.0;
  size_t worst_index = 0;
  int64_t tokens = 0;
  for (size_t begin = 0; begin < sentences.size(); begin += 32) {
    const std::vector<std::string> chunk(
        sentences.begin() + begin, sentences.begin() + std::min(begin + 32, sentences.size()));
    const std::vector<SequenceInput> batch = Tokenize(chunk);
    for (const SequenceInput& seq : batch) tokens += seq.token_ids.size();
    auto reference = fp32().Forward(batch, options);
    auto quantised = int8().Forward(batch, options);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ASSERT_TRUE(quantised.ok()) << quantised.status();
    const int64_t H = reference->pooled.dim(1);
    for (size_t i = 0; i < chunk.size(); ++i) {
      const float* a = reference->pooled.data() + i * H;
      const float* b = quantised->pooled.data() + i * H;
      double dot = 0, na = 0, nb = 0;
      for (int64_t j = 0; j < H; ++j) {
        dot += double{a[j]} * b[j];
        na += double{a[j]} * a[j];
        nb += double{b[j]} * b[j];
      }
      const double cosine = dot / std::sqrt(na * nb);
      sum += cosine;
      if (cosine < worst) {
        worst = cosine;
        worst_index = begin + i;
      }
    }
  }
  const double mean = sum / sentences.size();
  std::printf("int8 vs fp32 pooled cosine over %zu sentences (%lld tokens): min %.5f, mean %.5f\n",
              sentences.size(), static_cast<long long>(tokens), worst, mean);
  EXPECT_GE(worst, 0.995) << "worst sentence: " << sentences[worst_index];
  EXPECT_GE(mean, 0.997);
}

TEST_F(Int8EncoderTest, AttentionProbabilitiesStayClose) {
  const std::vector<SequenceInput> batch = Tokenize(MakeSentences(6));
  ForwardOptions options = fp32().DefaultForwardOptions();
  options.attention_layers = {0, 1, 2, 3, 4, 5};
  auto reference = fp32().Forward(batch, options);
  auto quantised = int8().Forward(batch, options);
  ASSERT_TRUE(reference.ok() && quantised.ok());
  double worst = 0, total = 0;
  int64_t count = 0;
  for (int layer = 0; layer < 6; ++layer) {
    for (size_t b = 0; b < batch.size(); ++b) {
      const Tensor& p = reference->Attention(layer)->sequences[b].probs;
      const Tensor& q = quantised->Attention(layer)->sequences[b].probs;
      ASSERT_EQ(p.shape(), q.shape());
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double diff = std::abs(double{p.data()[i]} - q.data()[i]);
        worst = std::max(worst, diff);
        total += diff;
        ++count;
      }
    }
  }
  std::printf("int8 vs fp32 attention probabilities: max |diff| %.4f, mean |diff| %.6f\n", worst,
              total / count);
  EXPECT_LT(worst, 0.2);
  EXPECT_LT(total / count, 1.5e-3);
}

TEST_F(Int8EncoderTest, PackedFp32EqualsTheUnpackedReferencePath) {
  // Model::Forward runs on packed weights; EncoderForward on BertWeights reads them in place.
  const std::vector<SequenceInput> batch = Tokenize(MakeSentences(5));
  ForwardOptions options = fp32().DefaultForwardOptions();
  options.hidden_layers = {6};
  auto packed = fp32().Forward(batch, options);
  auto plain = EncoderForward(fp32().config(), fp32().weights(), batch, options);
  ASSERT_TRUE(packed.ok() && plain.ok());
  const Tensor& a = *packed->HiddenState(6);
  const Tensor& b = *plain->HiddenState(6);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(double{a.data()[i]} - b.data()[i]));
  }
  EXPECT_LT(worst, 1e-4);
}

TEST_F(Int8EncoderTest, SecondForwardOfTheSameShapesBuildsNoPrimitive) {
  for (const Model* model : {&fp32(), &int8()}) {
    // 3 x 40 tokens = 120 rows; a second batch of 5 x 23 = 115 rows shares its MatmulRows
    // bucket (120), so it must not build anything either.
    std::vector<SequenceInput> batch(3), other(5);
    for (SequenceInput& seq : batch) seq.token_ids.assign(40, 2000);
    for (SequenceInput& seq : other) seq.token_ids.assign(23, 3000);
    const ForwardOptions options = model->DefaultForwardOptions();
    ASSERT_TRUE(model->Forward(batch, options).ok());
    const int64_t misses = DnnlRuntime::Get().cache_misses();
    ASSERT_TRUE(model->Forward(batch, options).ok());
    ASSERT_TRUE(model->Forward(other, options).ok());
    EXPECT_EQ(DnnlRuntime::Get().cache_misses(), misses) << PrecisionName(model->precision());
  }
}

// Primitives are cached per OpenMP thread count, so a thread count no other test uses gives
// a clean slate: with warm-up the first 1 x 16 request builds nothing, without it it does.
TEST_F(Int8EncoderTest, WarmUpBuildsTheShortRequestPrimitivesAtLoad) {
  for (const bool warm_up : {true, false}) {
    std::thread worker([&] {
      omp_set_num_threads(warm_up ? 3 : 5);
      ModelOptions options;
      options.precision = Precision::kInt8;
      options.warm_up = warm_up;
      auto model = Model::Load(ATTN_TEST_MODEL_DIR, options);
      ASSERT_TRUE(model.ok()) << model.status();
      std::vector<SequenceInput> batch(1);
      batch[0].token_ids.assign(16, 1234);
      const int64_t misses = DnnlRuntime::Get().cache_misses();
      ASSERT_TRUE((*model)->Forward(batch, (*model)->DefaultForwardOptions()).ok());
      if (warm_up) {
        EXPECT_EQ(DnnlRuntime::Get().cache_misses(), misses);
      } else {
        EXPECT_GT(DnnlRuntime::Get().cache_misses(), misses);
      }
    });
    worker.join();
  }
}

}  // namespace
}  // namespace attn
