// A tiny MPNet model directory (config.json with model_type mpnet, model.safetensors with
// HF's MPNet tensor names, an MPNet tokenizer), loaded, then broken in each way Model::Load
// must refuse naming the file and the field: a missing or wrong-shaped relative_attention_bias,
// a truncated model.safetensors, a tokenizer.json of another family, an unknown model_type.
// Training: the backward through the relative position bias against finite differences.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/training/encoder_training.h"

namespace attn {
namespace {

namespace fs = std::filesystem;

constexpr char kVocab[] =
    "<s>\n<pad>\n</s>\n<unk>\n[PAD]\n[UNK]\nthe\nking\nqueen\nspoke\nto\n.\n<mask>\n";
constexpr int kVocabSize = 13;

std::string TinyConfigJson(const std::string& model_type = "mpnet") {
  return "{\"model_type\": \"" + model_type +
         "\", \"vocab_size\": 13, \"hidden_size\": 8, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 16, \"max_position_embeddings\": "
         "20, \"pad_token_id\": 1, \"layer_norm_eps\": 1e-05, "
         "\"relative_attention_num_buckets\": 32, \"hidden_act\": \"gelu\"}";
}

constexpr char kMpnetTokenizerJson[] = R"({
  "added_tokens": [
    {"id": 0, "content": "<s>", "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 1, "content": "<pad>", "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 2, "content": "</s>", "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 3, "content": "<unk>", "normalized": true, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 5, "content": "[UNK]", "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 12, "content": "<mask>", "normalized": false, "lstrip": true, "rstrip": false, "single_word": false}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                 "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100}
})";

constexpr char kTokenizerConfig[] =
    R"({"do_lower_case": true, "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
        "cls_token": "<s>", "unk_token": "[UNK]", "pad_token": "<pad>", "mask_token": "<mask>",
        "model_max_length": 512, "tokenizer_class": "MPNetTokenizer"})";

// HF MPNet tensor names of the tiny config, random values.
std::map<std::string, Tensor> TinyMpnetTensors() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](std::vector<int64_t> shape) {
    Tensor t(std::move(shape));
    for (float& v : t.values()) v = normal(rng);
    return t;
  };
  std::map<std::string, Tensor> tensors;
  tensors["embeddings.word_embeddings.weight"] = random({kVocabSize, 8});
  tensors["embeddings.position_embeddings.weight"] = random({20, 8});
  tensors["embeddings.LayerNorm.weight"] = random({8});
  tensors["embeddings.LayerNorm.bias"] = random({8});
  tensors["encoder.relative_attention_bias.weight"] = random({32, 2});
  tensors["pooler.dense.weight"] = random({8, 8});
  tensors["pooler.dense.bias"] = random({8});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m :
         {"attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o"}) {
      tensors[p + m + ".weight"] = random({8, 8});
      tensors[p + m + ".bias"] = random({8});
    }
    for (const char* norm : {"attention.LayerNorm", "output.LayerNorm"}) {
      tensors[p + norm + ".weight"] = random({8});
      tensors[p + norm + ".bias"] = random({8});
    }
    tensors[p + "intermediate.dense.weight"] = random({16, 8});
    tensors[p + "intermediate.dense.bias"] = random({16});
    tensors[p + "output.dense.weight"] = random({8, 16});
    tensors[p + "output.dense.bias"] = random({8});
  }
  return tensors;
}

class MpnetModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attn_mpnet_dir_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    Write("config.json", TinyConfigJson());
    Write("vocab.txt", kVocab);
    Write("tokenizer.json", kMpnetTokenizerJson);
    Write("tokenizer_config.json", kTokenizerConfig);
    tensors_ = TinyMpnetTensors();
    WriteWeights();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
  }
  void WriteWeights() {
    std::vector<NamedTensor> named;
    for (const auto& [name, tensor] : tensors_) named.push_back({name, &tensor});
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", named).ok());
  }
  absl::StatusOr<std::shared_ptr<const Model>> Load() {
    ModelOptions options;
    options.warm_up = false;
    return Model::Load(dir_, options);
  }
  // Load fails with every one of `parts` in the message.
  void ExpectRefused(const std::vector<std::string>& parts) {
    absl::StatusOr<std::shared_ptr<const Model>> model = Load();
    ASSERT_FALSE(model.ok()) << "loaded a broken model dir";
    std::printf("refused: %s\n", model.status().ToString().c_str());
    for (const std::string& part : parts) {
      EXPECT_TRUE(absl::StrContains(model.status().message(), part))
          << "message lacks '" << part << "': " << model.status();
    }
  }

  std::string dir_;
  std::map<std::string, Tensor> tensors_;
};

TEST_F(MpnetModelDirTest, LoadsAndEncodesAsMpnet) {
  absl::StatusOr<std::shared_ptr<const Model>> model = Load();
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().architecture, Architecture::kMpnet);
  EXPECT_EQ((*model)->max_positions(), 18);  // 20 positions from padding_idx + 1 = 2
  absl::StatusOr<Encoding> pair = (*model)->tokenizer().EncodePair("the king", "the queen");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->tokens, (std::vector<std::string>{"<s>", "the", "king", "</s>", "</s>", "the",
                                                    "queen", "</s>"}));
  EXPECT_EQ(pair->type_ids, std::vector<int32_t>(8, 0));
  SequenceInput input;
  input.token_ids = pair->ids;
  absl::StatusOr<ForwardResult> result =
      (*model)->Forward({input}, (*model)->DefaultForwardOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->pooled.shape(), (std::vector<int64_t>{1, 8}));

  // 18 tokens fit, 19 do not (position 20 would be past the table).
  input.token_ids.assign(18, 6);
  EXPECT_TRUE((*model)->Forward({input}, (*model)->DefaultForwardOptions()).ok());
  input.token_ids.assign(19, 6);
  EXPECT_FALSE((*model)->Forward({input}, (*model)->DefaultForwardOptions()).ok());
}

TEST_F(MpnetModelDirTest, MissingRelativeAttentionBiasIsRefused) {
  tensors_.erase("encoder.relative_attention_bias.weight");
  WriteWeights();
  ExpectRefused(
      {"model.safetensors", "missing", "encoder.relative_attention_bias.weight", "[32, 2]"});
}

TEST_F(MpnetModelDirTest, WrongShapedRelativeAttentionBiasIsRefused) {
  tensors_["encoder.relative_attention_bias.weight"] = Tensor({16, 2});
  WriteWeights();
  ExpectRefused({"model.safetensors", "encoder.relative_attention_bias.weight", "[16, 2]",
                 "expected [32, 2]"});
}

TEST_F(MpnetModelDirTest, TruncatedSafetensorsIsRefused) {
  const std::string path = dir_ + "/model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 100);
  ExpectRefused({"model.safetensors"});
}

TEST_F(MpnetModelDirTest, TokenizerJsonOfAnotherFamilyIsRefused) {
  std::string bert = kMpnetTokenizerJson;
  bert.replace(bert.find("RobertaProcessing"), 17, "BertProcessing");
  Write("tokenizer.json", bert);
  ExpectRefused({"tokenizer.json", "post_processor.type", "BertProcessing", "mpnet"});

  std::string bpe = kMpnetTokenizerJson;
  bpe.replace(bpe.find("\"WordPiece\""), 11, "\"BPE\"");
  Write("tokenizer.json", bpe);
  ExpectRefused({"tokenizer.json", "field 'model.type' is BPE"});
}

TEST_F(MpnetModelDirTest, UnknownModelTypeIsRefused) {
  Write("config.json", TinyConfigJson("deberta-v2"));
  ExpectRefused({"config.json", "model_type 'deberta-v2' is not supported", "'mpnet'"});
}

TEST_F(MpnetModelDirTest, BucketCountOtherThan32IsRefused) {
  std::string config = TinyConfigJson();
  config.replace(config.find("\"relative_attention_num_buckets\": 32"), 36,
                 "\"relative_attention_num_buckets\": 64");
  Write("config.json", config);
  ExpectRefused({"config.json", "relative_attention_num_buckets"});
}

// Backward through the relative position bias: the table's gradient (and a layer's query
// weights, upstream of the biased scores) against central finite differences of
// loss = sum(output * R) in double, on two packed sequences of different lengths (18 tokens
// reach distance 17: buckets shared by several relative positions).
TEST_F(MpnetModelDirTest, RelativeBiasGradientMatchesFiniteDifferences) {
  absl::StatusOr<std::shared_ptr<const Model>> model = Load();
  ASSERT_TRUE(model.ok()) << model.status();
  const BertConfig& config = (*model)->config();
  BertWeights weights = (*model)->weights();
  std::vector<SequenceInput> batch(2);
  batch[0].token_ids = {0, 6, 7, 9, 10, 6, 8, 11, 2};
  batch[1].token_ids = {0, 6, 7, 8, 9, 10, 11, 6, 7, 8, 9, 10, 11, 6, 7, 8, 11, 2};
  const int64_t M = 27, H = config.hidden_size;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> r(M * H);
  for (float& v : r) v = normal(rng);
  auto loss = [&](const BertWeights& w) {
    absl::StatusOr<TrainingForward> f = EncoderForwardTraining(config, w, batch, {});
    EXPECT_TRUE(f.ok()) << f.status();
    double total = 0;
    for (int64_t i = 0; i < M * H; ++i) total += double{f->output.data()[i]} * r[i];
    return total;
  };
  absl::StatusOr<TrainingForward> forward = EncoderForwardTraining(config, weights, batch, {});
  ASSERT_TRUE(forward.ok()) << forward.status();
  BertWeights grads = ZerosLike(weights);
  ASSERT_TRUE(EncoderBackward(config, weights, *forward, r.data(), &grads, true).ok());
  // Parameters and gradients pair up by position (no token-type table on either side).
  const auto params = EngineTensors(&weights);
  const auto grad_tensors = EngineTensors(&grads);
  ASSERT_EQ(params.size(), grad_tensors.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, grad_tensors[i].first);
    EXPECT_EQ(params[i].second->shape(), grad_tensors[i].second->shape()) << params[i].first;
  }

  const float step = 1e-2f;
  auto check = [&](Tensor* param, const Tensor& grad, const std::vector<int64_t>& indices,
                   const char* what) {
    for (int64_t i : indices) {
      const float saved = param->data()[i];
      param->data()[i] = saved + step;
      const double up = loss(weights);
      param->data()[i] = saved - step;
      const double down = loss(weights);
      param->data()[i] = saved;
      const double numeric = (up - down) / (2.0 * step);
      EXPECT_NEAR(grad.data()[i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << what << " element " << i;
    }
  };
  // Buckets 0..8 (keys before the query, exact and logarithmic) and 16..25 (after), both heads;
  // buckets beyond distance 17 get no gradient.
  std::vector<int64_t> bias_elements;
  for (int bucket : {0, 1, 5, 8, 16, 17, 20, 24, 25, 15, 31}) {
    for (int h = 0; h < 2; ++h) bias_elements.push_back(bucket * 2 + h);
  }
  check(&weights.relative_attention_bias, grads.relative_attention_bias, bias_elements,
        "relative_attention_bias");
  double used = 0;
  for (float g : grads.relative_attention_bias.values()) used += std::abs(g);
  EXPECT_GT(used, 1e-3) << "no gradient reached the bias table";
  EXPECT_EQ(grads.relative_attention_bias.data()[31 * 2], 0.0f) << "bucket 31 is never used";
  check(&weights.layers[0].qkv_weight, grads.layers[0].qkv_weight, {0, 9, 37, 64 + 5, 128 + 3},
        "layers.0.qkv_weight");
  check(&weights.position_embeddings, grads.position_embeddings, {2 * 8 + 1, 10 * 8 + 3, 19 * 8},
        "position_embeddings");
}

}  // namespace
}  // namespace attn
