// The Hugging Face name table: a tiny BERT checkpoint written with the safetensors writer,
// then loaded with and without the "bert." prefix, and broken in each way the loader rejects.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace attn {
namespace {

BertConfig TinyConfig() {
  BertConfig config;
  config.vocab_size = 10;
  config.hidden_size = 4;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.intermediate_size = 8;
  config.max_position_embeddings = 6;
  config.type_vocab_size = 2;
  return config;
}

// Every tensor of the tiny model, each filled with a distinct ramp so placement is checkable.
std::map<std::string, Tensor> TinyCheckpoint(const BertConfig& config) {
  BertWeights scratch;
  std::map<std::string, Tensor> tensors;
  float next = 0.0f;
  for (const ParameterSlot& slot : BuildParameterTable(config, &scratch)) {
    Tensor t(slot.shape);
    for (float& v : t.values()) v = next++;
    tensors.emplace(slot.hf_name, std::move(t));
  }
  return tensors;
}

absl::StatusOr<BertWeights> LoadFrom(const std::map<std::string, Tensor>& tensors,
                                     const BertConfig& config, const std::string& prefix = "") {
  std::vector<NamedTensor> named;
  for (const auto& [name, tensor] : tensors) named.push_back({prefix + name, &tensor});
  auto file = SafetensorsFile::FromBytes(SerializeSafetensors(named), "tiny.safetensors");
  if (!file.ok()) return file.status();
  return LoadBertWeights(**file, config);
}

void ExpectError(const absl::StatusOr<BertWeights>& result, const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << fragment;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find(fragment), std::string::npos)
      << result.status().message();
}

TEST(WeightsTest, LoadsAndFusesQkvWithOrWithoutBertPrefix) {
  const BertConfig config = TinyConfig();
  const auto tensors = TinyCheckpoint(config);
  for (const std::string prefix : {"", "bert."}) {
    auto weights = LoadFrom(tensors, config, prefix);
    ASSERT_TRUE(weights.ok()) << weights.status();
    const LayerWeights& layer = weights->layers[1];
    // Rows [H, 2H) of the fused matrix are the key projection.
    const Tensor& key = tensors.at("encoder.layer.1.attention.self.key.weight");
    for (int64_t i = 0; i < key.numel(); ++i) {
      ASSERT_EQ(layer.qkv_weight.data()[4 * 4 + i], key.data()[i]);
    }
    const Tensor& value_bias = tensors.at("encoder.layer.1.attention.self.value.bias");
    for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(layer.qkv_bias.data()[8 + i], value_bias.data()[i]);
    EXPECT_EQ(weights->word_embeddings.data()[0],
              tensors.at("embeddings.word_embeddings.weight").data()[0]);
  }
}

TEST(WeightsTest, IgnoresPositionIdsAndPooler) {
  const BertConfig config = TinyConfig();
  auto tensors = TinyCheckpoint(config);
  tensors.emplace("pooler.dense.weight", Tensor({4, 4}));
  tensors.emplace("pooler.dense.bias", Tensor({4}));
  EXPECT_TRUE(LoadFrom(tensors, config).ok());
}

TEST(WeightsTest, MissingTensorIsNamedWithItsShape) {
  const BertConfig config = TinyConfig();
  auto tensors = TinyCheckpoint(config);
  tensors.erase("encoder.layer.1.intermediate.dense.weight");
  ExpectError(LoadFrom(tensors, config),
              "missing 1 tensor(s): 'encoder.layer.1.intermediate.dense.weight' [8, 4]");
}

TEST(WeightsTest, UnknownTensorIsRejected) {
  const BertConfig config = TinyConfig();
  auto tensors = TinyCheckpoint(config);
  tensors.emplace("encoder.layer.2.output.dense.bias", Tensor({4}));
  ExpectError(LoadFrom(tensors, config), "unknown tensor 'encoder.layer.2.output.dense.bias'");
}

TEST(WeightsTest, WrongShapeNamesExpectedShape) {
  const BertConfig config = TinyConfig();
  auto tensors = TinyCheckpoint(config);
  tensors["embeddings.position_embeddings.weight"] = Tensor({7, 4});
  ExpectError(LoadFrom(tensors, config),
              "'embeddings.position_embeddings.weight' has shape [7, 4], expected [6, 4]");
}

TEST(WeightsTest, DuplicateWithAndWithoutPrefixIsRejected) {
  const BertConfig config = TinyConfig();
  auto tensors = TinyCheckpoint(config);
  tensors.emplace("bert.embeddings.LayerNorm.bias", Tensor({4}));
  ExpectError(LoadFrom(tensors, config), "appears twice");
}

}  // namespace
}  // namespace attn
