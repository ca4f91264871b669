// Gradient parity with PyTorch autograd on the real all-MiniLM-L6-v2 weights: fixtures made by
// tests/golden/make_grad_golden.py (see README_grad.md). For each case the engine runs the
// training forward (dropout off), mean pooling, L2 normalisation and the loss, then backward
// through all of them to every parameter. Checks: loss within 1e-5 relative; every stored
// gradient within 1e-3 relative (Frobenius over the stored entries); gradients that are exactly
// zero in theory (key biases) within an absolute bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/ops/pooling.h"
#include "engine/safetensors.h"
#include "engine/training/encoder_training.h"
#include "engine/training/losses.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

constexpr double kLossTolerance = 1e-5;
constexpr double kGradTolerance = 1e-3;

struct CaseResult {
  double loss = 0;
  BertWeights grads;
  std::vector<ParameterSlot> table;  // HF name -> tensor inside `grads`
};

class GradParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = Model::Load(ATTN_TEST_MODEL_DIR);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = new std::shared_ptr<const Model>(*loaded);
    std::ifstream json_file(std::string(ATTN_GOLDEN_DIR) + "/grad_cases.json");
    ASSERT_TRUE(json_file.good()) << "missing tests/golden/grad_cases.json";
    spec_ = new nlohmann::json(nlohmann::json::parse(json_file));
    auto tensors = SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/grad_golden.safetensors");
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    fixtures_ = tensors->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete spec_;
    delete fixtures_;
  }

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
    int checked = 0;
    for (const nlohmann::json& param : (*spec_)["params"]) {
      const std::string p = param["name"];
      if (!param["in_graph"].get<bool>() || !slots.count(p)) continue;
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
        EXPECT_LE(max_ours, 1e-5 * max_abs_grad) << name << ": " << p << " should be ~0";
        continue;
      }
      if (norm == 0) {  // e.g. sampled entries that all fall in unused embedding rows
        EXPECT_EQ(max_ours, 0.0) << name << ": " << p;
        continue;
      }
      const double relative = std::sqrt(diff / norm);
      EXPECT_LE(relative, kGradTolerance) << name << ": gradient of " << p;
      if (relative > worst) {
        worst = relative;
        worst_name = p;
      }
      ++checked;
    }
    EXPECT_GT(checked, 90) << "too few parameters compared";
    std::printf("%s: %d parameter gradients compared, worst relative error %.3g (%s)\n",
                name.c_str(), checked, worst, worst_name.c_str());
  }

  static std::shared_ptr<const Model>* model_;
  static nlohmann::json* spec_;
  static SafetensorsFile* fixtures_;
};
std::shared_ptr<const Model>* GradParityTest::model_ = nullptr;
nlohmann::json* GradParityTest::spec_ = nullptr;
SafetensorsFile* GradParityTest::fixtures_ = nullptr;

TEST_F(GradParityTest, MultipleNegativesRankingPairs) { CheckCase("mnrl_pairs"); }
TEST_F(GradParityTest, MultipleNegativesRankingHardNegatives) { CheckCase("mnrl_hard_negatives"); }
TEST_F(GradParityTest, CosineSimilarity) { CheckCase("cosine_similarity"); }

}  // namespace
}  // namespace attn
