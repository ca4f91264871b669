// The int8 and bf16 encoders (ModelOptions::precision) against the fp32 one on the real
// all-MiniLM-L6-v2 weights: pooled-embedding cosine over a few hundred generated sentences and
// the benchmark's 256-sentence cosine set, attention maps and the fast path's primitive reuse
// (the int8 and bf16 linear layers alone: prepared_linear_precision_test.cc).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/dnnl_context.h"
#include "engine/model.h"
#include "tests/test_model.h"
#include "tests/test_policy.h"

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

// Mixed-length text as an embedding service sees it, built the way bench/sentences.py builds
// the benchmark's cosine set: every tenth a short reply (5-8 tokens, where [CLS] and [SEP] are
// a third of the mean-pooled rows and their outlier activations weigh most), the others a main
// clause with 0-12 subordinate clauses (up to ~130 tokens).
std::vector<std::string> MakeServiceSentences(int count) {
  const std::vector<std::string> replies = {
      "I agree.",        "Thanks a lot!",  "Not really.",    "Sounds good to me.", "Why not?",
      "It works now.",   "Please advise.", "See attached.",  "Great service!",     "Never again.",
      "Got it, thanks.", "Still broken.",  "Perfect fit.",   "Love it!",           "Any update?",
      "Same here.",      "Well said.",     "Too expensive.", "Fixed in 2.3.",      "Call me back."};
  const std::vector<std::string> subjects = {"the customer",
                                             "our support team",
                                             "the new firmware",
                                             "my landlord",
                                             "this laptop",
                                             "the delivery driver",
                                             "a spokesperson for the company",
                                             "the mobile app",
                                             "the hotel staff",
                                             "the central bank",
                                             "the quarterly report",
                                             "the training script",
                                             "the airline",
                                             "the payment service",
                                             "the senator",
                                             "the search engine"};
  const std::vector<std::string> verbs = {
      "announced",  "fixed",    "rejected", "recommended", "shipped",  "cancelled",  "improved",
      "questioned", "replaced", "approved", "delayed",     "refunded", "criticised", "installed"};
  const std::vector<std::string> objects = {
      "the broken charger",         "a new pricing plan",  "the noise complaint",
      "the annual budget",          "the missing package", "the warranty claim",
      "a detailed error report",    "the memory leak",     "the late train",
      "the interest rate decision", "the login problem",   "the battery life",
      "the privacy policy",         "the heating system",  "the user manual"};
  const std::vector<std::string> places = {
      "in the main office",  "at the airport", "in a short statement",  "during the live stream",
      "on the project wiki", "over the phone", "in the latest release", "near the old harbour"};
  const std::vector<std::string> times = {"yesterday",
                                          "last Tuesday",
                                          "after three weeks",
                                          "in March",
                                          "within two hours",
                                          "at the end of the quarter",
                                          "for the third time this year",
                                          "ten minutes later"};
  const std::vector<std::string> connectives = {"because",      "although", "and then",    "but",
                                                "so",           "while",    "even though", "after",
                                                "which is why", "since",    "until"};
  const std::vector<std::string> clauses = {"nobody had read the instructions",
                                            "the screen kept flickering at low brightness",
                                            "prices went up by four percent",
                                            "the first version crashed on start-up",
                                            "it rained all afternoon",
                                            "several users reported the same error",
                                            "the package arrived damaged",
                                            "the old server ran out of disk space",
                                            "the documentation was out of date",
                                            "the tests passed on the second try",
                                            "the agent could not find my order number",
                                            "the committee wanted a clearer plan"};
  const std::vector<std::string> opinions = {
      "helpful", "slow", "confusing", "reliable", "disappointing", "expensive", "hard to follow"};
  std::mt19937 rng(2024);
  auto pick = [&](const std::vector<std::string>& words) { return words[rng() % words.size()]; };
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  std::vector<std::string> sentences;
  for (int i = 0; i < count; ++i) {
    if (i % 10 == 0) {
      sentences.push_back(pick(replies));
      continue;
    }
    std::string s = pick(subjects);
    s += " " + pick(verbs);
    s += " " + pick(objects);
    if (chance(60)) s += " " + pick(places);
    if (chance(60)) s += " " + pick(times);
    const int subordinate = static_cast<int>(rng() % 13);
    for (int c = 0; c < subordinate; ++c) {
      s += chance(50) ? ", " : " ";
      s += pick(connectives);
      s += " " + pick(clauses);
    }
    if (chance(30)) s += ", and honestly it was really " + pick(opinions);
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    s += chance(20) ? "!" : ".";
    sentences.push_back(s);
  }
  return sentences;
}

// The 256 sentences of the benchmark's cosine rows (tests/data/make_harness_sentences.py).
std::vector<std::string> HarnessCosineSentences() {
  std::ifstream file(std::string(ATTN_TEST_DATA_DIR) + "/harness_cosine_sentences.txt");
  EXPECT_TRUE(file.good()) << "missing tests/data/harness_cosine_sentences.txt";
  std::vector<std::string> sentences;
  for (std::string line; std::getline(file, line);) sentences.push_back(line);
  EXPECT_EQ(sentences.size(), 256u);
  return sentences;
}

class Int8EncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (Precision precision : {Precision::kFp32, Precision::kInt8, Precision::kBf16}) {
      ASSERT_TRUE(testing::TestModel(precision).ok()) << testing::TestModel(precision).status();
    }
  }
  static const Model& fp32() { return **testing::TestModel(); }
  static const Model& int8() { return **testing::TestModel(Precision::kInt8); }
  static const Model& bf16() { return **testing::TestModel(Precision::kBf16); }

  static std::vector<SequenceInput> Tokenize(const std::vector<std::string>& texts) {
    std::vector<SequenceInput> batch;
    for (const std::string& text : texts) {
      auto encoding = fp32().tokenizer().Encode(text);
      EXPECT_TRUE(encoding.ok()) << encoding.status();
      batch.push_back({encoding->ids, encoding->type_ids});
    }
    return batch;
  }

  struct CosineStats {
    double min = 1.0, mean = 0.0;
    std::string worst;
    int64_t tokens = 0;
  };
  // Pooled-embedding cosine of `model` (int8 by default) to fp32 over `sentences` (at most
  // max_tokens tokens each; longer ones are skipped, as the benchmark's cosine set does), in
  // batches of 32.
  static CosineStats CompareToFp32(const std::vector<std::string>& sentences,
                                   size_t max_tokens = 512, const Model* model = nullptr) {
    if (model == nullptr) model = &int8();
    const ForwardOptions options = fp32().DefaultForwardOptions();  // mean pooling, normalised
    CosineStats stats;
    std::vector<std::string> kept;
    for (const std::string& s : sentences) {
      auto encoding = fp32().tokenizer().Encode(s);
      EXPECT_TRUE(encoding.ok()) << encoding.status();
      if (encoding.ok() && encoding->ids.size() <= max_tokens) kept.push_back(s);
    }
    double sum = 0.0;
    for (size_t begin = 0; begin < kept.size(); begin += 32) {
      const std::vector<std::string> chunk(kept.begin() + begin,
                                           kept.begin() + std::min(begin + 32, kept.size()));
      const std::vector<SequenceInput> batch = Tokenize(chunk);
      for (const SequenceInput& seq : batch) stats.tokens += seq.token_ids.size();
      auto reference = fp32().Forward(batch, options);
      auto quantised = model->Forward(batch, options);
      EXPECT_TRUE(reference.ok()) << reference.status();
      EXPECT_TRUE(quantised.ok()) << quantised.status();
      if (!reference.ok() || !quantised.ok()) return stats;
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
        if (cosine < stats.min) {
          stats.min = cosine;
          stats.worst = chunk[i];
        }
      }
    }
    stats.mean = kept.empty() ? 0.0 : sum / kept.size();
    std::printf("%s vs fp32 pooled cosine over %zu sentences (%lld tokens): min %.6f, mean %.6f\n",
                PrecisionName(model->precision()), kept.size(),
                static_cast<long long>(stats.tokens), stats.min, stats.mean);
    return stats;
  }
};

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
  EXPECT_EQ(bf16().precision(), Precision::kBf16);
  EXPECT_STREQ(PrecisionName(bf16().precision()), "bfloat16");
  EXPECT_TRUE(ParsePrecision("bf16", &parsed));
  EXPECT_EQ(parsed, Precision::kBf16);
  EXPECT_TRUE(ParsePrecision("bfloat16", &parsed));
  EXPECT_EQ(parsed, Precision::kBf16);
  EXPECT_TRUE(ParsePrecision("auto", &parsed));
  EXPECT_EQ(parsed, CpuHasNativeBf16() ? Precision::kBf16 : Precision::kFp32);
  EXPECT_EQ(SlowPrecisionReason(Precision::kBf16).empty(), CpuHasNativeBf16());
  EXPECT_TRUE(SlowPrecisionReason(Precision::kFp32).empty());
  EXPECT_FALSE(ParsePrecision("fp16", &parsed));
}

// A big batch runs the row-local part of every layer (output projection, FFN, LayerNorms, the
// next QKV projection) in blocks of rows, one thread per block (encoder.cc, LayerRowTails); a
// single short sequence in one pass whose every kernel is threaded. Each row depends on its own
// row only, so the two give the same embeddings: 13 sequences of 120 tokens (1560 rows: int8
// blocks of 128 and bf16 blocks of 256 rows, the last one partial) against each one alone.
TEST_F(Int8EncoderTest, RowBlockedForwardEqualsSingleSequenceForwards) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(1000, 29000);
  std::vector<SequenceInput> batch(13);
  for (SequenceInput& seq : batch) {
    seq.token_ids.push_back(fp32().tokenizer().cls_id());
    for (int t = 0; t < 118; ++t) seq.token_ids.push_back(token(rng));
    seq.token_ids.push_back(fp32().tokenizer().sep_id());
  }
  for (const Model* model : {&int8(), &bf16(), &fp32()}) {
    SCOPED_TRACE(PrecisionName(model->precision()));
    ForwardOptions options = model->DefaultForwardOptions();
    options.hidden_layers = {3};
    auto together = model->Forward(batch, options);
    ASSERT_TRUE(together.ok()) << together.status();
    const int64_t H = together->pooled.dim(1);
    for (size_t b = 0; b < batch.size(); ++b) {
      auto alone = model->Forward({batch[b]}, options);
      ASSERT_TRUE(alone.ok()) << alone.status();
      float worst = 0.0f;
      for (int64_t j = 0; j < H; ++j) {
        worst =
            std::max(worst, std::abs(alone->pooled.data()[j] - together->pooled.data()[b * H + j]));
      }
      EXPECT_LE(worst, 2e-6f) << "sequence " << b;
      const float* layer3 = together->HiddenState(3)->data() + b * 120 * H;
      worst = 0.0f;
      for (int64_t i = 0; i < 120 * H; ++i) {
        worst = std::max(worst, std::abs(alone->HiddenState(3)->data()[i] - layer3[i]));
      }
      EXPECT_LE(worst, 1e-4f) << "sequence " << b << ", layer 3";
    }
  }
}

// bf16 rounds every matmul input to 8 significant bits; on all-MiniLM-L6-v2 the pooled cosine
// to fp32 stays above 0.9995 (measured min on this set is printed).
TEST_F(Int8EncoderTest, Bf16PooledEmbeddingsStayWithinCosine0999OfFp32) {
  const CosineStats stats = CompareToFp32(MakeSentences(256), 512, &bf16());
  EXPECT_GE(stats.min, 0.999) << "worst sentence: " << stats.worst;
  EXPECT_GE(stats.mean, 0.9995);
}

TEST_F(Int8EncoderTest, Bf16OnTheBenchmarksCosineSentencesStaysWithinCosine0999OfFp32) {
  const CosineStats stats = CompareToFp32(HarnessCosineSentences(), 128, &bf16());
  EXPECT_GE(stats.min, 0.999) << "worst sentence: " << stats.worst;
  EXPECT_GE(stats.mean, 0.9995);
}

TEST_F(Int8EncoderTest, Int8OnTheBenchmarksCosineSentencesStaysWithinCosine0995OfFp32) {
  const CosineStats stats = CompareToFp32(HarnessCosineSentences(), 128);
  EXPECT_GE(stats.min, 0.995) << "worst sentence: " << stats.worst;
  EXPECT_GE(stats.mean, 0.997);
}

TEST_F(Int8EncoderTest, PooledEmbeddingsStayWithinCosine0995OfFp32) {
  const std::vector<std::string> sentences = MakeSentences(256);
  const CosineStats stats = CompareToFp32(sentences);
  EXPECT_GE(stats.min, 0.995) << "worst sentence: " << stats.worst;
  EXPECT_GE(stats.mean, 0.997);
}

// The benchmark's kind of cosine set (bench/harness.py): short replies, where int8 errors on
// [CLS] and [SEP] are not averaged away, and sentences up to 128 tokens.
TEST_F(Int8EncoderTest, MixedLengthPooledEmbeddingsStayWithinCosine0995OfFp32) {
  const CosineStats stats = CompareToFp32(MakeServiceSentences(256), /*max_tokens=*/128);
  EXPECT_GE(stats.min, 0.995) << "worst sentence: " << stats.worst;
  EXPECT_GE(stats.mean, 0.997);
}

// Attention probabilities of `model` vs fp32: max and mean |difference| over 6 sentences.
std::pair<double, double> AttentionDifference(const Model& fp32, const Model& model,
                                              const std::vector<SequenceInput>& batch) {
  ForwardOptions options = fp32.DefaultForwardOptions();
  options.attention_layers = {0, 1, 2, 3, 4, 5};
  auto reference = fp32.Forward(batch, options);
  auto quantised = model.Forward(batch, options);
  EXPECT_TRUE(reference.ok() && quantised.ok());
  if (!reference.ok() || !quantised.ok()) return {1e9, 1e9};
  double worst = 0, total = 0;
  int64_t count = 0;
  for (int layer = 0; layer < 6; ++layer) {
    for (size_t b = 0; b < batch.size(); ++b) {
      const Tensor& p = reference->Attention(layer)->sequences[b].probs;
      const Tensor& q = quantised->Attention(layer)->sequences[b].probs;
      EXPECT_EQ(p.shape(), q.shape());
      if (p.shape() != q.shape()) return {1e9, 1e9};
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double diff = std::abs(double{p.data()[i]} - q.data()[i]);
        worst = std::max(worst, diff);
        total += diff;
        ++count;
      }
    }
  }
  std::printf("%s vs fp32 attention probabilities: max |diff| %.4f, mean |diff| %.6f\n",
              PrecisionName(model.precision()), worst, total / count);
  return {worst, total / count};
}

TEST_F(Int8EncoderTest, AttentionProbabilitiesStayClose) {
  const auto [worst, mean] = AttentionDifference(fp32(), int8(), Tokenize(MakeSentences(6)));
  EXPECT_LT(worst, 0.2);
  EXPECT_LT(mean, 1.5e-3);
}

TEST_F(Int8EncoderTest, Bf16AttentionProbabilitiesStayClose) {
  const auto [worst, mean] = AttentionDifference(fp32(), bf16(), Tokenize(MakeSentences(6)));
  EXPECT_LT(worst, 0.1);
  EXPECT_LT(mean, 1e-3);
}

// Under bf16 the Q, K and V an AttentionMap returns are the bfloat16 values the products took
// (the native kernels round them while packing, the others before: either way the same values).
TEST_F(Int8EncoderTest, Bf16AttentionReturnsTheRoundedQueriesKeysAndValues) {
  ForwardOptions options = bf16().DefaultForwardOptions();
  options.attention_layers = {2};
  options.attention_qkv = true;
  auto result = bf16().Forward(Tokenize(MakeSentences(3)), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const LayerAttention* layer = result->Attention(2);
  ASSERT_NE(layer, nullptr);
  int64_t checked = 0;
  for (const SequenceAttention& seq : layer->sequences) {
    for (const Tensor* t : {&seq.query, &seq.key, &seq.value}) {
      ASSERT_GT(t->numel(), 0);
      for (int64_t i = 0; i < t->numel(); ++i, ++checked) {
        uint32_t bits;
        std::memcpy(&bits, t->data() + i, 4);
        ASSERT_EQ(bits & 0xFFFFu, 0u) << "element " << i << " = " << t->data()[i];
      }
    }
  }
  EXPECT_GT(checked, 0);
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
  for (const Model* model : {&fp32(), &int8(), &bf16()}) {
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
      auto model = Model::Load(testing::TestModelDir(), options);
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
