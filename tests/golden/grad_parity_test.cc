// Gradient parity with PyTorch autograd on the real all-MiniLM-L6-v2 weights: fixtures made by
// tests/golden/make_grad_golden.py (see README_grad.md). For each case the engine runs the
// training forward (dropout off), mean pooling, L2 normalisation and the loss, then backward
// through all of them to every parameter. Checks, for every one of the 101 parameters on the
// loss's path: loss within 1e-5 relative; every stored gradient within 5e-5 relative (Frobenius
// over the stored entries); gradients that are exactly zero in theory (key biases) below 1e-7 of
// the largest gradient.
//
// Tolerances from the errors measured on the AVX2 host (portable kernels; the AVX-512 host of
// issue 21 measured 2.6e-6 for gradients), each bound <= 10x the worst measured:
//   loss      1.0e-6 relative (mnrl_hard_negatives)      -> 1e-5
//   gradient  8.0e-6 relative (layer 2 key.weight)        -> 5e-5  (was 1e-3)
//   zero grad 1.6e-8 x max |grad| (layer 5 key.bias)     -> 1e-7  (was 1e-5)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/ops/pooling.h"
#include "engine/safetensors.h"
#include "engine/training/encoder_training.h"
#include "engine/training/losses.h"
#include "engine/training/trainer.h"
#include "nlohmann/json.hpp"
#include "tests/test_model.h"

namespace attn {
namespace {

constexpr double kLossTolerance = 1e-5;
constexpr double kGradTolerance = 5e-5;
constexpr double kZeroGradTolerance = 1e-7;  // x the case's largest gradient

struct CaseResult {
  double loss = 0;
  BertWeights grads;
  std::vector<ParameterSlot> table;  // HF name -> tensor inside `grads`
};

class GradParityTest : public ::testing::Test {
 protected:
  // Loads the model and the fixtures once; a failure is reported by every test's SetUp (a
  // failed assertion here would only mark the tests skipped).
  static void SetUpTestSuite() { setup_error_ = new std::string(Load()); }
  static std::string Load() {
    const auto& loaded = testing::TestModel();
    if (!loaded.ok()) return "the model did not load: " + loaded.status().ToString();
    model_ = new std::shared_ptr<const Model>(*loaded);
    std::ifstream json_file(std::string(ATTN_GOLDEN_DIR) + "/grad_cases.json");
    if (!json_file.good()) return "missing tests/golden/grad_cases.json";
    spec_ = new nlohmann::json(nlohmann::json::parse(json_file, nullptr, false));
    if (spec_->is_discarded()) return "tests/golden/grad_cases.json is not valid JSON";
    auto tensors = SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/grad_golden.safetensors");
    if (!tensors.ok()) return "grad_golden.safetensors: " + tensors.status().ToString();
    fixtures_ = tensors->release();
    return "";
  }
  static void TearDownTestSuite() {
    delete model_;
    delete spec_;
    delete fixtures_;
    delete setup_error_;
    model_ = nullptr;
    spec_ = nullptr;
    fixtures_ = nullptr;
    setup_error_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(*setup_error_, "") << "fixture set-up failed"; }

  static const nlohmann::json& Case(const std::string& name) {
    for (const nlohmann::json& c : (*spec_)["cases"]) {
      if (c["name"] == name) return c;
    }
    throw std::runtime_error("no case " + name);
  }

  // Forward, pooling, normalisation, loss and the whole backward for one fixture case.
  static CaseResult Run(const nlohmann::json& spec) {
    const Model& model = **model_;
    const BertConfig& config = model.config();
    const int64_t H = config.hidden_size;
    std::vector<SequenceInput> batch;
    std::vector<int64_t> group_sizes;
    for (const nlohmann::json& group : spec["groups"]) {
      group_sizes.push_back(group["input_ids"].size());
      for (const nlohmann::json& ids : group["input_ids"]) {
        batch.push_back({ids.get<std::vector<int32_t>>(), {}});
      }
    }
    auto forward = EncoderForwardTraining(config, model.weights(), batch, {});
    EXPECT_TRUE(forward.ok()) << forward.status();
    const int64_t B = static_cast<int64_t>(batch.size());
    // pooled (B, H) = mean over tokens; embedding (B, H) = pooled / |pooled|
    Tensor pooled({B, H});
    PoolForward(forward->output.data(), H, forward->seq_offsets, PoolingMode::kMean, pooled.data());
    Tensor embedding = pooled;
    L2NormalizeRows(embedding.data(), B, H);

    CaseResult result;
    Tensor d_embedding({B, H});
    if (spec["objective"] == "cosine_similarity") {
      const int64_t pairs = group_sizes[0];
      const std::vector<float> labels = spec["labels"].get<std::vector<float>>();
      auto loss = CosineSimilarityLoss(embedding.data(), embedding.data() + pairs * H, H, labels,
                                       d_embedding.data(), d_embedding.data() + pairs * H);
      EXPECT_TRUE(loss.ok()) << loss.status();
      result.loss = loss.value_or(0);
    } else {
      const int64_t anchors = group_sizes[0];
      auto loss =
          MultipleNegativesRankingLoss(embedding.data(), anchors, embedding.data() + anchors * H,
                                       B - anchors, H, MnrlOptions{spec["scale"].get<double>()},
                                       d_embedding.data(), d_embedding.data() + anchors * H);
      EXPECT_TRUE(loss.ok()) << loss.status();
      result.loss = loss.value_or(0);
    }
    // Backward: normalisation -> mean pooling -> encoder.
    Tensor d_pooled({B, H});
    L2NormalizeBackward(pooled.data(), d_embedding.data(), B, H, d_pooled.data());
    Tensor d_output(forward->output.shape());
    PoolBackward(forward->output.data(), H, forward->seq_offsets, PoolingMode::kMean,
                 d_pooled.data(), d_output.data());
    result.table = BuildParameterTable(config, &result.grads);  // allocates the gradients
    const absl::Status status =
        EncoderBackward(config, model.weights(), *forward, d_output.data(), &result.grads);
    EXPECT_TRUE(status.ok()) << status;
    return result;
  }

  // Our gradient of `slot` at flat index `i` of the HF tensor.
  static float At(const ParameterSlot& slot, int64_t i) {
    const int64_t row = slot.target->numel() / slot.target->dim(0);
    return slot.target->data()[slot.row_offset * row + i];
  }

  static void CheckCase(const std::string& name) {
    const nlohmann::json& spec = Case(name);
    const CaseResult result = Run(spec);
    const double expected_loss = spec["loss"].get<double>();
    EXPECT_NEAR(result.loss, expected_loss, kLossTolerance * std::abs(expected_loss)) << name;
    std::printf("%s: loss %.9f (torch %.9f)\n", name.c_str(), result.loss, expected_loss);

    std::map<std::string, const ParameterSlot*> slots;
    for (const ParameterSlot& slot : result.table) slots[slot.hf_name] = &slot;
    const double max_abs_grad = spec["max_abs_grad"].get<double>();
    double worst = 0;
    std::string worst_name;
    int checked = 0, in_graph = 0;
    for (const nlohmann::json& param : (*spec_)["params"]) {
      const std::string p = param["name"];
      if (!param["in_graph"].get<bool>()) continue;  // the pooler: not on the loss's path
      ++in_graph;
      if (!slots.count(p)) {
        ADD_FAILURE() << name << ": the engine has no parameter " << p;
        continue;
      }
      const ParameterSlot& slot = *slots[p];
      const int64_t cols = slot.shape.size() == 2 ? slot.shape[1] : 1;
      std::vector<std::pair<float, float>> pairs;  // (ours, torch)
      const std::string prefix = name + ".";
      if (const TensorInfo* rows_info = fixtures_->Find(prefix + "grad_rows." + p)) {
        // Row subset: I64 row ids + [R, cols] values.
        const std::string_view raw = fixtures_->RawBytes(*rows_info);
        std::vector<int64_t> rows(raw.size() / 8);
        std::memcpy(rows.data(), raw.data(), raw.size());
        const Tensor values = *fixtures_->ReadFloat32(prefix + "grad." + p);
        for (size_t r = 0; r < rows.size(); ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            pairs.emplace_back(At(slot, rows[r] * cols + c), values.data()[r * cols + c]);
          }
        }
      } else if (fixtures_->Find(prefix + "grad." + p) != nullptr) {
        const Tensor values = *fixtures_->ReadFloat32(prefix + "grad." + p);
        for (int64_t i = 0; i < values.numel(); ++i)
          pairs.emplace_back(At(slot, i), values.data()[i]);
      }
      if (const TensorInfo* idx_info = fixtures_->Find(prefix + "grad_idx." + p)) {
        const std::string_view raw = fixtures_->RawBytes(*idx_info);
        std::vector<int64_t> indices(raw.size() / 8);
        std::memcpy(indices.data(), raw.data(), raw.size());
        const Tensor values = *fixtures_->ReadFloat32(prefix + "grad_val." + p);
        for (size_t k = 0; k < indices.size(); ++k) {
          pairs.emplace_back(At(slot, indices[k]), values.data()[k]);
        }
      }
      ASSERT_FALSE(pairs.empty()) << "no stored gradient for " << p;
      double diff = 0, norm = 0, max_ours = 0;
      for (const auto& [ours, torch] : pairs) {
        diff += (double{ours} - torch) * (double{ours} - torch);
        norm += double{torch} * torch;
        max_ours = std::max(max_ours, double{std::abs(ours)});
      }
      if (param["exact_grad_is_zero"].get<bool>()) {
        EXPECT_LE(max_ours, kZeroGradTolerance * max_abs_grad)
            << name << ": " << p << " should be ~0";
        std::printf("%s: %s (exactly zero in theory): max |ours| %.3g = %.3g x max |grad|\n",
                    name.c_str(), p.c_str(), max_ours, max_ours / max_abs_grad);
        ++checked;
        continue;
      }
      ASSERT_GT(norm, 0) << name << ": the stored gradient of " << p
                         << " is all zeros, so it checks nothing";
      const double relative = std::sqrt(diff / norm);
      EXPECT_LE(relative, kGradTolerance) << name << ": gradient of " << p;
      if (relative > worst) {
        worst = relative;
        worst_name = p;
      }
      ++checked;
    }
    // Every parameter on the loss's path (101 of MiniLM's 103 tensors), none left out.
    EXPECT_EQ(checked, in_graph) << "parameters compared";
    EXPECT_EQ(in_graph, static_cast<int>(result.table.size())) << "engine parameters";
    std::printf("%s: %d parameter gradients compared, worst relative error %.3g (%s)\n",
                name.c_str(), checked, worst, worst_name.c_str());
  }

  static std::shared_ptr<const Model>* model_;
  static nlohmann::json* spec_;
  static SafetensorsFile* fixtures_;
  static std::string* setup_error_;
};
std::shared_ptr<const Model>* GradParityTest::model_ = nullptr;
nlohmann::json* GradParityTest::spec_ = nullptr;
SafetensorsFile* GradParityTest::fixtures_ = nullptr;
std::string* GradParityTest::setup_error_ = nullptr;

// Training telemetry's per-group gradient norms (a matrix with its bias) against torch's
// per-parameter norms (grad_norms, float64) combined as sqrt(sum of squares); its update norm and
// relative change against naive loops over the trainer's weights before and after the step.
TEST_F(GradParityTest, TelemetryGroupGradientNormsMatchTorch) {
  const nlohmann::json& spec = Case("mnrl_pairs");
  TrainerOptions options;
  options.objective = Objective::kContrastive;
  options.dropout = false;
  options.telemetry_every = 1;
  options.adamw.lr = 1e-3;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*model_, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  TrainingBatch batch;
  for (const nlohmann::json& group : spec["groups"]) {
    std::vector<SequenceInput>* into =
        group["name"] == "anchors" ? &batch.anchors : &batch.positives;
    for (const nlohmann::json& ids : group["input_ids"]) {
      into->push_back({ids.get<std::vector<int32_t>>(), {}});
    }
  }
  absl::StatusOr<StepResult> step = (*trainer)->Step(batch);
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(step->telemetry.has_value());

  auto torch_group = [&](const std::string& group) -> std::vector<std::string> {
    static const std::map<std::string, std::string> kLayerParts = {
        {"query", "attention.self.query"},
        {"key", "attention.self.key"},
        {"value", "attention.self.value"},
        {"attention_output", "attention.output.dense"},
        {"attention_norm", "attention.output.LayerNorm"},
        {"ffn_in", "intermediate.dense"},
        {"ffn_out", "output.dense"},
        {"ffn_norm", "output.LayerNorm"}};
    if (group == "embeddings.word") return {"embeddings.word_embeddings.weight"};
    if (group == "embeddings.position") return {"embeddings.position_embeddings.weight"};
    if (group == "embeddings.token_type") return {"embeddings.token_type_embeddings.weight"};
    if (group == "embeddings.norm")
      return {"embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"};
    const size_t dot = group.find('.', 7);  // "layers.<i>.<part>"
    const std::string layer = group.substr(7, dot - 7),
                      part = kLayerParts.at(group.substr(dot + 1));
    const std::string prefix = "encoder.layer." + layer + "." + part;
    return {prefix + ".weight", prefix + ".bias"};
  };
  const nlohmann::json& norms = spec["grad_norms"];
  double worst = 0;
  const std::vector<GroupTelemetry>& groups = step->telemetry->groups;
  ASSERT_EQ(groups.size(), 4u + 6u * 8u) << "3 embedding tables, their LayerNorm, 8 per layer";
  const BertWeights& initial = (*model_)->weights();
  const BertWeights& now = (*trainer)->weights();
  for (const GroupTelemetry& group : groups) {
    double expected = 0;
    for (const std::string& name : torch_group(group.name)) {
      ASSERT_TRUE(norms.contains(name)) << name;
      expected += std::pow(norms[name].get<double>(), 2);
    }
    expected = std::sqrt(expected);
    const double relative = std::abs(group.grad_norm - expected) / expected;
    EXPECT_LE(relative, 1e-4) << group.name << ": ours " << group.grad_norm << ", torch "
                              << expected;
    worst = std::max(worst, relative);
    EXPECT_TRUE(group.trainable) << group.name;
  }
  // Naive: layer 2's W_K rows [H, 2H) of the fused qkv weight and bias, before (the base) and
  // after the step.
  const int64_t H = initial.layers[2].qkv_weight.dim(1);
  double moved = 0, base = 0;
  for (int64_t k = H * H; k < 2 * H * H; ++k) {
    const double a = now.layers[2].qkv_weight.data()[k], b = initial.layers[2].qkv_weight.data()[k];
    moved += (a - b) * (a - b);
    base += b * b;
  }
  for (int64_t k = H; k < 2 * H; ++k) {
    const double a = now.layers[2].qkv_bias.data()[k], b = initial.layers[2].qkv_bias.data()[k];
    moved += (a - b) * (a - b);
    base += b * b;
  }
  const auto key = std::find_if(groups.begin(), groups.end(),
                                [](const GroupTelemetry& g) { return g.name == "layers.2.key"; });
  ASSERT_NE(key, groups.end());
  EXPECT_EQ(key->kind, "W_K");
  EXPECT_EQ(key->layer, 2);
  EXPECT_GT(key->update_norm, 0);
  EXPECT_NEAR(key->update_norm, std::sqrt(moved), 1e-6 * std::sqrt(moved));  // the first step
  EXPECT_NEAR(key->relative_change, std::sqrt(moved / base), 1e-6 * std::sqrt(moved / base));
  // The batch's tokens, and nothing else, were touched.
  std::set<int32_t> tokens;
  for (const SequenceInput& s : batch.anchors)
    tokens.insert(s.token_ids.begin(), s.token_ids.end());
  for (const SequenceInput& s : batch.positives)
    tokens.insert(s.token_ids.begin(), s.token_ids.end());
  EXPECT_EQ(step->telemetry->embedding_rows_touched, static_cast<int64_t>(tokens.size()));
  ASSERT_FALSE(step->telemetry->most_changed_tokens.empty());
  for (const TokenChange& t : step->telemetry->most_changed_tokens) {
    EXPECT_TRUE(tokens.count(t.id)) << t.token;
    EXPECT_EQ(t.token, (*model_)->tokenizer().IdToToken(t.id));
  }
  std::printf("telemetry: %zu group gradient norms against torch, worst relative error %.3g\n",
              groups.size(), worst);
}

TEST_F(GradParityTest, MultipleNegativesRankingPairs) { CheckCase("mnrl_pairs"); }
TEST_F(GradParityTest, MultipleNegativesRankingHardNegatives) { CheckCase("mnrl_hard_negatives"); }
TEST_F(GradParityTest, CosineSimilarity) { CheckCase("cosine_similarity"); }

}  // namespace
}  // namespace attn
