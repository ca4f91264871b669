// The encoder on the real all-MiniLM-L6-v2 weights: packing invariance, returned tensors'
// internal consistency, input validation and the primitive cache. Parity with Hugging Face
// lives in tests/golden.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/model.h"
#include "tests/test_model.h"
#include "tests/test_util.h"

namespace attn {
namespace {

class EncoderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status(); }
  static const Model& model() { return **testing::TestModel(); }

  static SequenceInput Tokenize(const std::string& text) {
    auto encoding = model().tokenizer().Encode(text);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    return {encoding->ids, encoding->type_ids};
  }
};

using testing::MaxAbsDiff;

TEST_F(EncoderTest, LoadsTheDefaultModel) {
  EXPECT_EQ(model().config().hidden_size, 384);
  EXPECT_EQ(model().config().num_hidden_layers, 6);
  EXPECT_EQ(model().config().num_attention_heads, 12);
  EXPECT_EQ(model().tokenizer().vocab_size(), 30522);
  EXPECT_EQ(model().sentence_config().pooling, PoolingMode::kMean);
  EXPECT_TRUE(model().sentence_config().normalize);
  EXPECT_EQ(model().default_max_length(), 256);
  // 22.7M parameters without the unused pooler.
  EXPECT_EQ(model().weights().ParameterCount(), 22565376);
}

TEST_F(EncoderTest, PackedBatchEqualsEachSequenceAlone) {
  const std::vector<std::string> texts = {"short", "A somewhat longer sentence about attention.",
                                          "日本語のテキスト", "x"};
  std::vector<SequenceInput> batch;
  for (const std::string& t : texts) batch.push_back(Tokenize(t));
  ForwardOptions options = model().DefaultForwardOptions();
  options.hidden_layers = {6};
  options.attention_layers = {2};
  auto packed = model().Forward(batch, options);
  ASSERT_TRUE(packed.ok()) << packed.status();
  for (size_t b = 0; b < batch.size(); ++b) {
    auto alone = model().Forward({batch[b]}, options);
    ASSERT_TRUE(alone.ok());
    const int64_t T = batch[b].token_ids.size(), H = 384;
    EXPECT_LT(MaxAbsDiff(packed->pooled.data() + b * H, alone->pooled.data(), H), 1e-5);
    EXPECT_LT(MaxAbsDiff(packed->HiddenState(6)->data() + packed->seq_offsets[b] * H,
                         alone->HiddenState(6)->data(), T * H),
              1e-4);
    EXPECT_LT(MaxAbsDiff(packed->Attention(2)->sequences[b].probs.data(),
                         alone->Attention(2)->sequences[0].probs.data(), 12 * T * T),
              1e-6);
  }
}

TEST_F(EncoderTest, AttentionOnlyForTheSequencesAsked) {
  const std::vector<SequenceInput> batch = {Tokenize("first sentence here"),
                                            Tokenize("the second one is longer than the first"),
                                            Tokenize("third")};
  ForwardOptions all;
  all.attention_layers = {1};
  all.attention_scores = true;
  auto everything = model().Forward(batch, all);
  ASSERT_TRUE(everything.ok()) << everything.status();

  ForwardOptions some = all;
  some.attention_sequences = {false, true, false};
  auto selected = model().Forward(batch, some);
  ASSERT_TRUE(selected.ok()) << selected.status();
  const LayerAttention& layer = *selected->Attention(1);
  ASSERT_EQ(layer.sequences.size(), 3u);
  EXPECT_EQ(layer.sequences[0].probs.numel(), 0);
  EXPECT_EQ(layer.sequences[0].scores.numel(), 0);
  EXPECT_EQ(layer.sequences[2].probs.numel(), 0);
  const Tensor& expected = everything->Attention(1)->sequences[1].probs;
  ASSERT_EQ(layer.sequences[1].probs.numel(), expected.numel());
  EXPECT_EQ(MaxAbsDiff(layer.sequences[1].probs.data(), expected.data(), expected.numel()), 0.0);
  EXPECT_EQ(MaxAbsDiff(selected->pooled.data(), everything->pooled.data(), 3 * 384), 0.0);

  some.attention_sequences = {true, false};
  auto mismatched = model().Forward(batch, some);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("2 flags for 3 input sequences"), std::string::npos)
      << mismatched.status();
}

TEST_F(EncoderTest, AttentionPartsAreConsistent) {
  ForwardOptions options;
  options.attention_layers = {0, 5};
  options.attention_scores = true;
  options.attention_qkv = true;
  options.static_embeddings = true;
  options.hidden_layers = {0};
  auto result = model().Forward({Tokenize("The animal didn't cross the street.")}, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->attentions.size(), 2u);
  for (const LayerAttention& layer : result->attentions) {
    const SequenceAttention& a = layer.sequences[0];
    const int64_t heads = a.probs.dim(0), T = a.probs.dim(1), d = a.query.dim(2);
    ASSERT_EQ(heads, 12);
    ASSERT_EQ(d, 32);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        double row_sum = 0, exp_sum = 0, max = -1e30;
        for (int64_t j = 0; j < T; ++j)
          max = std::max(max, double{a.scores.data()[(h * T + i) * T + j]});
        for (int64_t j = 0; j < T; ++j)
          exp_sum += std::exp(a.scores.data()[(h * T + i) * T + j] - max);
        for (int64_t j = 0; j < T; ++j) {
          const int64_t at = (h * T + i) * T + j;
          row_sum += a.probs.data()[at];
          // probs = softmax(scores)
          EXPECT_NEAR(a.probs.data()[at], std::exp(a.scores.data()[at] - max) / exp_sum, 1e-6);
          // scores = q . k / sqrt(d)
          double dot = 0;
          for (int64_t k = 0; k < d; ++k) {
            dot += double{a.query.data()[(h * T + i) * d + k]} * a.key.data()[(h * T + j) * d + k];
          }
          EXPECT_NEAR(a.scores.data()[at], dot / std::sqrt(32.0), 1e-4);
        }
        EXPECT_NEAR(row_sum, 1.0, 1e-5);
      }
    }
  }
  // The static embeddings differ from the LayerNorm'ed embedding output.
  EXPECT_EQ(result->static_embeddings.shape(), result->HiddenState(0)->shape());
  EXPECT_GT(MaxAbsDiff(result->static_embeddings.data(), result->HiddenState(0)->data(), 384), 0.1);
}

TEST_F(EncoderTest, NormalizedPooledEmbeddingsHaveUnitNorm) {
  auto result =
      model().Forward({Tokenize("hello"), Tokenize("world")}, model().DefaultForwardOptions());
  ASSERT_TRUE(result.ok());
  for (int b = 0; b < 2; ++b) {
    double norm = 0;
    for (int j = 0; j < 384; ++j)
      norm += result->pooled.data()[b * 384 + j] * result->pooled.data()[b * 384 + j];
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
}

TEST_F(EncoderTest, RejectsBadInputWithMessagesNamingTheInput) {
  const ForwardOptions options = model().DefaultForwardOptions();
  auto expect_error = [&](std::vector<SequenceInput> batch, ForwardOptions opts,
                          const std::string& fragment) {
    auto result = model().Forward(batch, opts);
    ASSERT_FALSE(result.ok()) << "expected an error containing: " << fragment;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find(fragment), std::string::npos)
        << result.status().message();
  };
  expect_error({}, options, "empty batch");
  expect_error({Tokenize("ok"), SequenceInput{}}, options, "input 1: no tokens");
  expect_error({SequenceInput{{101, 30522, 102}, {}}}, options, "id 30522 outside the vocabulary");
  expect_error({SequenceInput{{101, -1, 102}, {}}}, options, "id -1");
  expect_error({SequenceInput{{101, 102}, {0, 2}}}, options, "type id 2");
  expect_error({SequenceInput{{101, 102}, {0}}}, options, "1 type ids for 2 tokens");
  expect_error({SequenceInput{std::vector<int32_t>(513, 1000), {}}}, options, "513 tokens");
  ForwardOptions bad_layer = options;
  bad_layer.hidden_layers = {7};
  expect_error({Tokenize("ok")}, bad_layer, "hidden state layer 7");
  ForwardOptions bad_attention = options;
  bad_attention.attention_layers = {1, 1};
  expect_error({Tokenize("ok")}, bad_attention, "attention layer 1 repeated");
  // Still serving after errors.
  EXPECT_TRUE(model().Forward({Tokenize("ok")}, options).ok());
}

TEST_F(EncoderTest, RepeatedShapesBuildNoNewPrimitives) {
  const std::vector<SequenceInput> batch = {Tokenize("cache me if you can"), Tokenize("twice")};
  ASSERT_TRUE(model().Forward(batch, model().DefaultForwardOptions()).ok());
  const int64_t misses = DnnlRuntime::Get().cache_misses();
  ASSERT_TRUE(model().Forward(batch, model().DefaultForwardOptions()).ok());
  EXPECT_EQ(DnnlRuntime::Get().cache_misses(), misses);
}

}  // namespace
}  // namespace attn
