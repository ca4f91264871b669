// Gradient parity with PyTorch autograd on the real all-mpnet-base-v2 weights: fixtures made by
// tests/golden/make_mpnet_grad_golden.py. Two sequences (12 and 140 tokens: relative distances
// past 128) in one packed training forward (dropout off), loss = sum(output * R), backward to
// every parameter on the loss's path, the relative position bias table included. Checks: loss
// within 1e-5 relative; every parameter's stored gradient entries within 1e-3 relative
// (Frobenius; the bound); the key biases, whose exact gradient is 0, below 1e-6 of the
// largest gradient. The worst errors are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/training/encoder_training.h"
#include "tests/golden/golden_json.h"
#include "tests/test_util.h"

namespace attn {
namespace {

constexpr double kLossTolerance = 1e-5;
constexpr double kGradTolerance = 1e-3;
constexpr double kZeroGradTolerance = 1e-6;  // x the largest stored gradient

using testing::MpnetModelDir;

TEST(MpnetGradParityTest, GradientsMatchTorchAutograd) {
  ModelOptions options;
  options.warm_up = false;
  absl::StatusOr<std::shared_ptr<const Model>> model = Model::Load(MpnetModelDir(), options);
  ASSERT_TRUE(model.ok()) << "all-mpnet-base-v2 did not load (scripts/setup.sh --model "
                             "all-mpnet-base-v2 installs it): "
                          << model.status();
  const testing::GoldenJsonFile& spec = testing::GoldenJson("mpnet_grad_cases.json");
  ASSERT_TRUE(spec.error.empty()) << spec.error;
  auto fixtures =
      SafetensorsFile::Open(std::string(ATTN_GOLDEN_DIR) + "/mpnet_grad_golden.safetensors");
  ASSERT_TRUE(fixtures.ok()) << fixtures.status();
  const BertConfig& config = (*model)->config();
  const BertWeights& weights = (*model)->weights();
  const int64_t H = config.hidden_size;

  std::vector<SequenceInput> batch;
  std::vector<float> r;  // (M, H): the sequences' R stacked, as the batch is packed
  for (size_t i = 0; i < spec.json["sequences"].size(); ++i) {
    SequenceInput input;
    input.token_ids = spec.json["sequences"][i]["input_ids"].get<std::vector<int32_t>>();
    absl::StatusOr<Tensor> ri = (*fixtures)->ReadFloat32("r." + std::to_string(i));
    ASSERT_TRUE(ri.ok()) << ri.status();
    ASSERT_EQ(ri->numel(), static_cast<int64_t>(input.token_ids.size()) * H);
    r.insert(r.end(), ri->data(), ri->data() + ri->numel());
    batch.push_back(std::move(input));
  }
  absl::StatusOr<TrainingForward> forward = EncoderForwardTraining(config, weights, batch, {});
  ASSERT_TRUE(forward.ok()) << forward.status();
  double loss = 0;
  for (size_t i = 0; i < r.size(); ++i) loss += double{forward->output.data()[i]} * r[i];
  const double torch_loss = spec.json["loss"].get<double>();
  EXPECT_LE(std::abs(loss - torch_loss), kLossTolerance * std::abs(torch_loss))
      << "loss " << loss << " vs torch " << torch_loss;

  BertWeights grads;
  const std::vector<ParameterSlot> table = BuildParameterTable(config, &grads);  // zeroed
  ASSERT_TRUE(EncoderBackward(config, weights, *forward, r.data(), &grads,
                              /*compute_embedding_grads=*/true)
                  .ok());
  std::map<std::string, const ParameterSlot*> slots;
  for (const ParameterSlot& slot : table) slots[slot.hf_name] = &slot;

  double worst = 0, worst_zero = 0, largest = 0;
  std::string worst_name;
  int compared = 0;
  for (const nlohmann::json& p : spec.json["parameters"]) {
    const std::string name = p["name"];
    SCOPED_TRACE(name);
    ASSERT_TRUE(slots.count(name)) << "no engine tensor for " << name;
    const ParameterSlot& slot = *slots[name];
    const int64_t row_size = slot.target->numel() / slot.target->dim(0);
    const float* ours = slot.target->data() + slot.row_offset * row_size;
    std::vector<int64_t> idx;
    std::vector<float> expected;
    if (p["storage"] == "full") {
      absl::StatusOr<Tensor> g = (*fixtures)->ReadFloat32("grad." + name);
      ASSERT_TRUE(g.ok()) << g.status();
      expected.assign(g->data(), g->data() + g->numel());
      for (int64_t k = 0; k < g->numel(); ++k) idx.push_back(k);
    } else {
      auto values = (*fixtures)->ReadFloat32("grad_val." + name);
      ASSERT_TRUE(values.ok()) << values.status();
      expected.assign(values->data(), values->data() + values->numel());
      const TensorInfo* info = nullptr;
      for (const TensorInfo& t : (*fixtures)->tensors()) {
        if (t.name == "grad_idx." + name) info = &t;
      }
      ASSERT_NE(info, nullptr);
      const std::string_view bytes = (*fixtures)->RawBytes(*info);
      idx.resize(bytes.size() / sizeof(int64_t));
      std::memcpy(idx.data(), bytes.data(), bytes.size());
    }
    ASSERT_EQ(idx.size(), expected.size());
    double diff2 = 0, ref2 = 0, max_ref = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
      const double d = double{ours[idx[k]]} - expected[k];
      diff2 += d * d;
      ref2 += double{expected[k]} * expected[k];
      max_ref = std::max(max_ref, std::abs(double{expected[k]}));
    }
    ++compared;
    largest = std::max(largest, max_ref);
    if (absl::StrContains(name, "attention.attn.k.bias")) {
      // Exactly 0 in theory (a constant added to a whole score row): absolute, both sides.
      double max_ours = 0;
      for (int64_t k : idx) max_ours = std::max(max_ours, std::abs(double{ours[k]}));
      worst_zero = std::max(worst_zero, max_ours);
      continue;
    }
    const double relative = std::sqrt(diff2 / std::max(ref2, 1e-30));
    EXPECT_LE(relative, kGradTolerance);
    if (name == "encoder.relative_attention_bias.weight") {
      std::printf("relative_attention_bias gradient: relative error %.2e (norm %.4g)\n", relative,
                  std::sqrt(ref2));
    }
    if (relative > worst) {
      worst = relative;
      worst_name = name;
    }
  }
  EXPECT_GE(compared, 190);
  EXPECT_LE(worst_zero, kZeroGradTolerance * largest);
  std::printf(
      "MPNet gradients vs torch autograd, %d parameters: loss %.6f vs %.6f; worst "
      "relative %.2e (%s); key-bias |grad| max %.2e\n",
      compared, loss, torch_loss, worst, worst_name.c_str(), worst_zero);
}

}  // namespace
}  // namespace attn
