// The whole encoder's backward on a tiny random BERT against central finite differences of
// L = sum(d_fixed * output), with and without dropout (masks are a pure function of the seed
// and step, so the perturbed forwards see the same masks). Parity with PyTorch autograd on the
// real weights lives in tests/golden.
#include "engine/training/encoder_training.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/weights.h"

namespace attn {
namespace {

BertConfig TinyConfig() {
  BertConfig config;
  config.vocab_size = 23;
  config.hidden_size = 8;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.intermediate_size = 12;
  config.max_position_embeddings = 16;
  config.type_vocab_size = 2;
  config.layer_norm_eps = 1e-5f;
  return config;
}

BertWeights RandomWeights(const BertConfig& config, std::mt19937& rng) {
  BertWeights weights;
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (const ParameterSlot& slot : BuildParameterTable(config, &weights)) {
    const int64_t row = slot.target->numel() / slot.target->dim(0);
    float* begin = slot.target->data() + slot.row_offset * row;
    const int64_t count = Tensor::NumElements(slot.shape);
    const bool is_gamma = slot.hf_name.find("LayerNorm.weight") != std::string::npos;
    for (int64_t i = 0; i < count; ++i) begin[i] = (is_gamma ? 1.0f : 0.0f) + normal(rng);
  }
  return weights;
}

double Loss(const BertConfig& config, const BertWeights& weights,
            const std::vector<SequenceInput>& batch, const TrainingForwardOptions& options,
            const Tensor& d_fixed) {
  auto forward = EncoderForwardTraining(config, weights, batch, options);
  EXPECT_TRUE(forward.ok()) << forward.status();
  double loss = 0;
  for (int64_t i = 0; i < d_fixed.numel(); ++i) {
    loss += double{d_fixed.data()[i]} * forward->output.data()[i];
  }
  return loss;
}

void CheckGradients(const TrainingForwardOptions& options) {
  const BertConfig config = TinyConfig();
  std::mt19937 rng(7);
  BertWeights weights = RandomWeights(config, rng);
  const std::vector<SequenceInput> batch = {
      {{1, 5, 9, 5, 2}, {0, 0, 0, 1, 1}}, {{1, 22, 2}, {}}, {{3, 4, 5, 6, 7, 8, 2}, {}}};
  auto forward = EncoderForwardTraining(config, weights, batch, options);
  ASSERT_TRUE(forward.ok()) << forward.status();
  Tensor d_fixed(forward->output.shape());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : d_fixed.values()) v = normal(rng);
  BertWeights grads = ZerosLike(weights);
  ASSERT_TRUE(EncoderBackward(config, weights, *forward, d_fixed.data(), &grads).ok());

  BertWeights probe = weights;
  const auto params = EngineTensors(&probe);
  const auto grad_tensors = EngineTensors(&grads);
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    Tensor* param = params[t].second;
    const Tensor* grad = grad_tensors[t].second;
    const int64_t count = param->numel();
    for (int k = 0; k < std::min<int64_t>(count, 8); ++k) {
      const int64_t index = count <= 8 ? k : pick(rng) % count;
      const float saved = param->data()[index];
      auto central_difference = [&](float step) {
        param->data()[index] = saved + step;
        const double plus = Loss(config, probe, batch, options, d_fixed);
        param->data()[index] = saved - step;
        const double minus = Loss(config, probe, batch, options, d_fixed);
        param->data()[index] = saved;
        return (plus - minus) / (2.0 * step);
      };
      // Richardson extrapolation of two central differences: fourth-order accurate, so the
      // curvature through two layers does not dominate the comparison.
      const double numeric = (4.0 * central_difference(5e-3f) - central_difference(1e-2f)) / 3.0;
      const double analytic = grad->data()[index];
      // fp32 forwards: allow 1% relative or 2e-3 absolute.
      EXPECT_NEAR(analytic, numeric, std::max(2e-3, 1e-2 * std::abs(numeric)))
          << params[t].first << " element " << index;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(EncoderBackwardTest, MatchesFiniteDifferencesWithoutDropout) {
  CheckGradients(TrainingForwardOptions{});
}

TEST(EncoderBackwardTest, MatchesFiniteDifferencesWithDropout) {
  TrainingForwardOptions options;
  options.hidden_dropout = 0.1f;
  options.attention_dropout = 0.1f;
  options.seed = 1234;
  options.step = 3;
  CheckGradients(options);
}

TEST(EncoderBackwardTest, WorkspaceReuseGivesTheSameGradientsAsFreshCalls) {
  // A trainer reuses one workspace and one set of gradient buffers: the second call clears
  // only the word rows the first one used, and the result must equal a fresh computation.
  const BertConfig config = TinyConfig();
  std::mt19937 rng(17);
  const BertWeights weights = RandomWeights(config, rng);
  const std::vector<std::vector<SequenceInput>> batches = {
      {{{1, 5, 9, 5, 2}, {}}, {{1, 22, 2}, {}}},
      {{{1, 7, 2}, {0, 1, 1}}, {{3, 4, 5, 6, 2}, {}}, {{1, 9, 9, 2}, {}}},
      {{{1, 2}, {}}}};
  BertWeights reused = ZerosLike(weights);
  BackwardWorkspace workspace;
  for (size_t i = 0; i < batches.size(); ++i) {
    auto forward = EncoderForwardTraining(config, weights, batches[i], {});
    ASSERT_TRUE(forward.ok()) << forward.status();
    Tensor d_output(forward->output.shape());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : d_output.values()) v = normal(rng);
    BertWeights fresh = ZerosLike(weights);
    ASSERT_TRUE(EncoderBackward(config, weights, *forward, d_output.data(), &fresh).ok());
    ASSERT_TRUE(
        EncoderBackward(config, weights, *forward, d_output.data(), &reused, true, &workspace)
            .ok());
    const auto expected = EngineTensors(&fresh), got = EngineTensors(&reused);
    for (size_t t = 0; t < expected.size(); ++t) {
      EXPECT_EQ(got[t].second->values(), expected[t].second->values())
          << "batch " << i << " " << expected[t].first;
    }
    // The recorded rows are the batch's token ids, and every other word row is zero.
    std::set<int32_t> ids(forward->token_ids.begin(), forward->token_ids.end());
    EXPECT_EQ(workspace.word_rows, std::vector<int32_t>(ids.begin(), ids.end()));
    for (int64_t row = 0; row < config.vocab_size; ++row) {
      if (ids.count(static_cast<int32_t>(row))) continue;
      for (int64_t c = 0; c < config.hidden_size; ++c) {
        ASSERT_EQ(reused.word_embeddings.data()[row * config.hidden_size + c], 0.0f) << row;
      }
    }
  }
}

TEST(EncoderBackwardTest, TrainingForwardWithoutDropoutEqualsInference) {
  const BertConfig config = TinyConfig();
  std::mt19937 rng(11);
  const BertWeights weights = RandomWeights(config, rng);
  const std::vector<SequenceInput> batch = {{{1, 5, 9, 2}, {}}, {{1, 7, 2}, {0, 1, 1}}};
  auto training = EncoderForwardTraining(config, weights, batch, {});
  ForwardOptions options;
  options.hidden_layers = {config.num_hidden_layers};
  options.pool = false;
  auto inference = EncoderForward(config, weights, batch, options);
  ASSERT_TRUE(training.ok() && inference.ok());
  const Tensor& expected = *inference->HiddenState(config.num_hidden_layers);
  for (int64_t i = 0; i < expected.numel(); ++i) {
    ASSERT_NEAR(training->output.data()[i], expected.data()[i], 1e-5) << i;
  }
}

TEST(EncoderBackwardTest, DropoutMasksDependOnSeedAndStep) {
  const BertConfig config = TinyConfig();
  std::mt19937 rng(13);
  const BertWeights weights = RandomWeights(config, rng);
  const std::vector<SequenceInput> batch = {{{1, 5, 9, 2}, {}}};
  TrainingForwardOptions options;
  options.hidden_dropout = 0.5f;
  options.seed = 1;
  auto a = EncoderForwardTraining(config, weights, batch, options);
  auto b = EncoderForwardTraining(config, weights, batch, options);
  options.step = 1;
  auto c = EncoderForwardTraining(config, weights, batch, options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->emb_mask, b->emb_mask);
  EXPECT_NE(a->emb_mask, c->emb_mask);
}

// A forward written into a reused TrainingForward (buffers from a differently shaped batch, with
// and without dropout) equals a fresh one bit for bit, masks included.
TEST(EncoderBackwardTest, ReusedForwardEqualsFreshForward) {
  const BertConfig config = TinyConfig();
  std::mt19937 rng(17);
  const BertWeights weights = RandomWeights(config, rng);
  const std::vector<SequenceInput> first = {{{1, 5, 9, 2}, {}}, {{1, 7, 2}, {0, 1, 1}}};
  const std::vector<SequenceInput> second = {
      {{1, 3, 2}, {}}, {{1, 4, 6, 8, 10, 2}, {}}, {{1, 2}, {}}};
  TrainingForwardOptions dropout;
  dropout.hidden_dropout = 0.3f;
  dropout.attention_dropout = 0.3f;
  dropout.seed = 5;
  for (const TrainingForwardOptions& options : {TrainingForwardOptions{}, dropout}) {
    TrainingForward reused;
    for (const TrainingForwardOptions& earlier : {dropout, TrainingForwardOptions{}}) {
      ASSERT_TRUE(EncoderForwardTraining(config, weights, first, earlier, &reused).ok());
    }
    ASSERT_TRUE(EncoderForwardTraining(config, weights, second, options, &reused).ok());
    auto fresh = EncoderForwardTraining(config, weights, second, options);
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ(reused.output.shape(), fresh->output.shape());
    EXPECT_EQ(reused.output.values(), fresh->output.values());
    EXPECT_EQ(reused.emb_mask, fresh->emb_mask);
    ASSERT_EQ(reused.layers.size(), fresh->layers.size());
    for (size_t l = 0; l < reused.layers.size(); ++l) {
      const LayerActivations& a = reused.layers[l];
      const LayerActivations& b = fresh->layers[l];
      EXPECT_EQ(a.qkv.values(), b.qkv.values()) << l;
      ASSERT_EQ(a.probs.size(), b.probs.size()) << l;
      for (size_t s = 0; s < a.probs.size(); ++s) {
        EXPECT_EQ(a.probs[s].shape(), b.probs[s].shape()) << l;
        EXPECT_EQ(a.probs[s].values(), b.probs[s].values()) << l;
      }
      EXPECT_EQ(a.probs_masks, b.probs_masks) << l;
      EXPECT_EQ(a.attn_dense_mask, b.attn_dense_mask) << l;
      EXPECT_EQ(a.ffn_dense_mask, b.ffn_dense_mask) << l;
      EXPECT_EQ(a.ffn_act.values(), b.ffn_act.values()) << l;
    }
  }
}

}  // namespace
}  // namespace attn
