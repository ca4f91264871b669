// engine/training/evaluate_encoder.h on the real model against naive references: every text
// encoded alone (one forward per text, no chunking), its pooled vector normalised here, ranks
// from a full sort, cosines and head logits from double loops, and the pair feature from
// SegmentProductForward on the text pair's own forward. The evaluation chunks (3 sequences per
// forward here), so this also checks that chunking changes nothing.
#include "engine/training/evaluate_encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "engine/ops/segment_product.h"
#include "engine/training/evaluation.h"
#include "tests/test_model.h"

namespace attn {
namespace {

class EvaluateEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status(); }
  const Model& model() const { return **testing::TestModel(); }

  SequenceInput Tokens(const std::string& text) const {
    TruncationOptions truncation;
    truncation.max_length = model().default_max_length();
    Encoding e = *model().tokenizer().Encode(text, truncation);
    return {e.ids, e.type_ids};
  }
  SequenceInput PairTokens(const std::string& a, const std::string& b) const {
    TruncationOptions truncation;
    truncation.max_length = model().default_max_length();
    Encoding e = *model().tokenizer().EncodePair(a, b, truncation);
    return {e.ids, e.type_ids};
  }
  // The unit-length pooled embedding of one sequence, from a forward of that sequence alone.
  std::vector<double> Embedding(const SequenceInput& sequence) const {
    ForwardOptions options;
    options.pooling = model().sentence_config().pooling;
    ForwardResult r = *model().Forward({sequence}, options);
    std::vector<double> v(r.pooled.data(), r.pooled.data() + r.pooled.numel());
    double norm = 0;
    for (double x : v) norm += x * x;
    for (double& x : v) x /= std::sqrt(norm);
    return v;
  }
  EvaluationOptions Options(const ClassificationHead* head = nullptr) const {
    EvaluationOptions options;
    options.pooling = model().sentence_config().pooling;
    options.num_layers = model().config().num_hidden_layers;
    options.head = head;
    options.chunk_sequences = 3;
    return options;
  }
  EvaluationForward Forward() const {
    return [this](const std::vector<SequenceInput>& batch, const ForwardOptions& options) {
      return model().Forward(batch, options);
    };
  }
  static double Dot(const std::vector<double>& a, const std::vector<double>& b) {
    return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
  }
  // The label with the largest logit of `head` on `feature` (first of equal ones).
  static int64_t Argmax(const ClassificationHead& head, const std::vector<double>& feature) {
    int64_t best = 0;
    double best_logit = -1e300;
    for (int64_t k = 0; k < head.num_labels(); ++k) {
      double logit = head.bias.data()[k];
      for (size_t d = 0; d < feature.size(); ++d) {
        logit += head.weight.data()[k * feature.size() + d] * feature[d];
      }
      if (logit > best_logit) {
        best_logit = logit;
        best = k;
      }
    }
    return best;
  }
};

TEST_F(EvaluateEncoderTest, RetrievalRanksEqualAFullSortOfSingleTextForwards) {
  const std::vector<std::string> queries = {"a red kettle for the kitchen", "a phone that folds",
                                            "shoes for running in the rain", "how do I bake bread",
                                            "the capital of France"};
  const std::vector<std::string> corpus = {
      "Paris is the capital of France.",         "A recipe for sourdough bread.",
      "Waterproof trail running shoes.",         "A stainless steel electric kettle, red.",
      "A foldable smartphone with two screens.", "The history of the Roman empire.",
      "Cast iron pans keep heat well.",          "A guide to marathon training."};
  const std::vector<int64_t> relevant = {3, 4, 2, 1, 0};
  EvaluationSet set;
  set.task = EvaluationTask::kRetrieval;
  for (const std::string& q : queries) set.queries.push_back(Tokens(q));
  for (const std::string& c : corpus) set.corpus.push_back(Tokens(c));
  set.relevant = relevant;
  absl::StatusOr<EvaluationResult> result = EvaluateEncoder(set, Options(), Forward());
  ASSERT_TRUE(result.ok()) << result.status();

  double mrr = 0, r1 = 0, r10 = 0, ndcg = 0;
  std::vector<double> ranks;
  for (size_t i = 0; i < queries.size(); ++i) {
    const std::vector<double> q = Embedding(set.queries[i]);
    std::vector<double> scores;
    for (const SequenceInput& c : set.corpus) scores.push_back(Dot(q, Embedding(c)));
    std::vector<size_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    const double rank = std::find(order.begin(), order.end(), relevant[i]) - order.begin() + 1;
    ranks.push_back(rank);
    if (rank <= 10) {
      mrr += 1 / rank;
      ndcg += 1 / std::log2(rank + 1);
      r10 += 1;
    }
    r1 += rank == 1;
  }
  const double n = queries.size();
  EXPECT_EQ(result->per_example, ranks);
  EXPECT_EQ(result->examples, 5);
  ASSERT_EQ(result->metrics.size(), 4u);
  EXPECT_NEAR(result->Metric("mrr@10"), mrr / n, 1e-12);
  EXPECT_NEAR(result->Metric("recall@1"), r1 / n, 1e-12);
  EXPECT_NEAR(result->Metric("recall@10"), r10 / n, 1e-12);
  EXPECT_NEAR(result->Metric("ndcg@10"), ndcg / n, 1e-12);
  EXPECT_TRUE(std::isnan(result->Metric("accuracy")));
  // all-MiniLM-L6-v2 gets these easy ones right.
  EXPECT_EQ(result->Metric("recall@1"), 1.0);
}

TEST_F(EvaluateEncoderTest, CosineSimilarityPerPairAndSpearman) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"A man is playing a guitar.", "Someone plays an instrument."},
      {"A cat sleeps on the sofa.", "The stock market fell today."},
      {"Kids are playing football.", "Children play soccer in a park."},
      {"I like tea.", "Tea is something I enjoy."},
      {"The train was late.", "Bananas are yellow."}};
  const std::vector<double> gold = {0.7, 0.0, 0.9, 0.8, 0.1};
  EvaluationSet set;
  set.task = EvaluationTask::kCosineSimilarity;
  for (const auto& [a, b] : pairs) {
    set.first.push_back(Tokens(a));
    set.second.push_back(Tokens(b));
  }
  set.scores = gold;
  absl::StatusOr<EvaluationResult> result = EvaluateEncoder(set, Options(), Forward());
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<double> cosines;
  for (size_t i = 0; i < pairs.size(); ++i) {
    cosines.push_back(Dot(Embedding(set.first[i]), Embedding(set.second[i])));
    EXPECT_NEAR(result->per_example[i], cosines[i], 1e-5) << i;
  }
  EXPECT_NEAR(result->Metric("spearman"), *SpearmanCorrelation(cosines, gold), 1e-12);
  EXPECT_GT(result->Metric("spearman"), 0.5);  // 0.7: the model roughly agrees
}

TEST_F(EvaluateEncoderTest, ClassificationAndPairClassificationThroughTheHead) {
  const int64_t H = model().config().hidden_size;
  const std::vector<std::string> texts = {"refund my order", "the app crashes", "hello there",
                                          "charged twice",   "error on save",   "nice weather"};
  const std::vector<int64_t> labels = {0, 1, 2, 0, 1, 2};
  // A head whose rows are three of the texts' embeddings: each text is nearest its own row.
  ClassificationHead head{Tensor({3, H}), Tensor({3})};
  for (int k = 0; k < 3; ++k) {
    const std::vector<double> e = Embedding(Tokens(texts[k]));
    for (int64_t d = 0; d < H; ++d) head.weight.data()[k * H + d] = static_cast<float>(e[d]);
  }
  EvaluationSet set;
  set.task = EvaluationTask::kClassification;
  for (const std::string& t : texts) set.inputs.push_back(Tokens(t));
  set.labels = labels;
  absl::StatusOr<EvaluationResult> result = EvaluateEncoder(set, Options(&head), Forward());
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<int64_t> predicted;
  for (size_t i = 0; i < texts.size(); ++i) {
    predicted.push_back(Argmax(head, Embedding(set.inputs[i])));
    EXPECT_EQ(result->per_example[i], predicted[i]) << i;
  }
  absl::StatusOr<ClassificationMetrics> m = ClassificationScores(predicted, labels);
  EXPECT_DOUBLE_EQ(result->Metric("accuracy"), m->accuracy);
  EXPECT_DOUBLE_EQ(result->Metric("macro_f1"), m->macro_f1);
  EXPECT_GE(result->Metric("accuracy"), 0.5);  // the three rows' own texts at least

  // Pairs: the segment-product feature of each pair's own forward through a pair head.
  const ClassificationHead pair_head = MakePairHead(2, H);
  EvaluationSet pairs;
  pairs.task = EvaluationTask::kPairClassification;
  pairs.inputs = {PairTokens("when do I get my money", "Refunds take 5 days."),
                  PairTokens("when do I get my money", "Our office is in Berlin."),
                  PairTokens("is it waterproof", "The jacket keeps rain out.")};
  pairs.labels = {1, 0, 1};
  result = EvaluateEncoder(pairs, Options(&pair_head), Forward());
  ASSERT_TRUE(result.ok()) << result.status();
  for (size_t i = 0; i < pairs.inputs.size(); ++i) {
    ForwardOptions options;
    options.pool = false;
    options.hidden_layers = {model().config().num_hidden_layers};
    ForwardResult r = *model().Forward({pairs.inputs[i]}, options);
    std::vector<float> feature(H);
    ASSERT_TRUE(SegmentProductForward(r.HiddenState(options.hidden_layers[0])->data(), H,
                                      r.seq_offsets, pairs.inputs[i].type_ids.data(),
                                      feature.data(), nullptr)
                    .ok());
    EXPECT_EQ(result->per_example[i],
              Argmax(pair_head, std::vector<double>(feature.begin(), feature.end())))
        << i;
  }
}

TEST_F(EvaluateEncoderTest, RefusalsAndCancellation) {
  EvaluationSet set;
  set.task = EvaluationTask::kClassification;
  set.inputs = {Tokens("a"), Tokens("b")};
  set.labels = {0, 1};
  absl::StatusOr<EvaluationResult> result = EvaluateEncoder(set, Options(), Forward());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(result.status().message().find("classification head"), std::string::npos);

  const ClassificationHead two =
      MakeClassificationHead(2, model().config().hidden_size, HeadInit::kNormal, 1);
  set.labels = {0, 2};
  result = EvaluateEncoder(set, Options(&two), Forward());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("examples[1].label is 2"), std::string::npos)
      << result.status();

  EvaluationSet empty;
  empty.task = EvaluationTask::kRetrieval;
  EXPECT_EQ(EvaluateEncoder(empty, Options(), Forward()).status().code(),
            absl::StatusCode::kInvalidArgument);

  EvaluationSet retrieval;
  retrieval.task = EvaluationTask::kRetrieval;
  for (int i = 0; i < 7; ++i) retrieval.queries.push_back(Tokens("a query"));
  retrieval.corpus = {Tokens("an item")};
  retrieval.relevant.assign(7, 0);
  int asked = 0;
  EvaluationOptions options = Options();
  options.yield = [&asked] { return ++asked == 2; };  // stop before the second chunk
  result = EvaluateEncoder(retrieval, options, Forward());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 2);
}

}  // namespace
}  // namespace attn
