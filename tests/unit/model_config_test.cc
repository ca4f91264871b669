#include "engine/model_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace attn {
namespace {

using Json = nlohmann::json;

const std::string kModelDir = ATTN_TEST_MODEL_DIR;

// The required fields of MiniLM-L6's config.json; tests edit one field at a time.
Json MinimalConfig() {
  return Json{{"vocab_size", 30522},       {"hidden_size", 384},
              {"num_hidden_layers", 6},    {"num_attention_heads", 12},
              {"intermediate_size", 1536}, {"max_position_embeddings", 512}};
}

template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code,
                 const std::string& substring) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << substring;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), substring))
      << "message: " << result.status().message() << "\nexpected substring: " << substring;
}

void ExpectConfigRejected(const Json& config, const std::string& substring) {
  ExpectError(ParseBertConfig(config.dump()), absl::StatusCode::kInvalidArgument, substring);
}

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/model_config_test_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

using testing::WriteFile;

TEST(BertConfigTest, LoadsAllMiniLmL6V2) {
  auto config = LoadBertConfig(kModelDir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "bert");
  EXPECT_EQ(config->vocab_size, 30522);
  EXPECT_EQ(config->hidden_size, 384);
  EXPECT_EQ(config->num_hidden_layers, 6);
  EXPECT_EQ(config->num_attention_heads, 12);
  EXPECT_EQ(config->intermediate_size, 1536);
  EXPECT_EQ(config->max_position_embeddings, 512);
  EXPECT_EQ(config->type_vocab_size, 2);
  EXPECT_FLOAT_EQ(config->layer_norm_eps, 1e-12f);
  EXPECT_EQ(config->hidden_act, "gelu");
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_FLOAT_EQ(config->hidden_dropout_prob, 0.1f);
  EXPECT_FLOAT_EQ(config->attention_probs_dropout_prob, 0.1f);
  EXPECT_EQ(config->head_dim(), 32);
}

TEST(BertConfigTest, OptionalFieldsDefault) {
  auto config = ParseBertConfig(MinimalConfig().dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->type_vocab_size, 2);
  EXPECT_FLOAT_EQ(config->layer_norm_eps, 1e-12f);
  EXPECT_EQ(config->hidden_act, "gelu");
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_FLOAT_EQ(config->hidden_dropout_prob, 0.1f);
  EXPECT_FLOAT_EQ(config->attention_probs_dropout_prob, 0.1f);
}

TEST(BertConfigTest, OptionalFieldsOverride) {
  Json json = MinimalConfig();
  json["type_vocab_size"] = 1;
  json["layer_norm_eps"] = 1e-5;
  json["pad_token_id"] = 1;
  json["hidden_dropout_prob"] = 0;
  json["attention_probs_dropout_prob"] = 0.2;
  json["model_type"] = "bert";
  json["position_embedding_type"] = "absolute";
  auto config = ParseBertConfig(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->type_vocab_size, 1);
  EXPECT_FLOAT_EQ(config->layer_norm_eps, 1e-5f);
  EXPECT_EQ(config->pad_token_id, 1);
  EXPECT_FLOAT_EQ(config->hidden_dropout_prob, 0.0f);
  EXPECT_FLOAT_EQ(config->attention_probs_dropout_prob, 0.2f);
}

TEST(BertConfigTest, RejectsUnsupportedModelType) {
  Json json = MinimalConfig();
  json["model_type"] = "roberta";
  ExpectConfigRejected(json, "model_type 'roberta' is not supported (only 'bert', 'mpnet')");
}

// MPNet's row of the architecture table: its defaults and its own checks.
TEST(BertConfigTest, MpnetConfig) {
  Json json = MinimalConfig();
  json["model_type"] = "mpnet";
  json["pad_token_id"] = 1;
  json["max_position_embeddings"] = 514;
  json["vocab_size"] = 30527;
  auto config = ParseBertConfig(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, Architecture::kMpnet);
  EXPECT_FLOAT_EQ(config->layer_norm_eps, 1e-5f);
  EXPECT_EQ(config->type_vocab_size, 1);
  EXPECT_EQ(config->relative_attention_num_buckets, 32);
  EXPECT_EQ(config->position_offset(), 2);
  EXPECT_EQ(config->max_sequence_length(), 512);
  EXPECT_TRUE(config->spec().relative_attention_bias);
  EXPECT_FALSE(config->spec().token_type_embeddings);

  json["relative_attention_num_buckets"] = 64;
  ExpectConfigRejected(json, "field 'relative_attention_num_buckets' must be 32");
  json["relative_attention_num_buckets"] = 32;
  json["max_position_embeddings"] = 2;
  ExpectConfigRejected(json, "max_position_embeddings 2 leaves no room");
}

TEST(BertConfigTest, RejectsHiddenActOtherThanGelu) {
  Json json = MinimalConfig();
  json["hidden_act"] = "relu";
  ExpectConfigRejected(json, "hidden_act 'relu' is not supported");
  json["hidden_act"] = "gelu_new";  // the tanh approximation differs numerically
  ExpectConfigRejected(json, "hidden_act 'gelu_new'");
}

TEST(BertConfigTest, RejectsRelativePositions) {
  Json json = MinimalConfig();
  json["position_embedding_type"] = "relative_key";
  ExpectConfigRejected(json, "position_embedding_type 'relative_key' is not supported");
}

TEST(BertConfigTest, RejectsDecoderConfigs) {
  Json json = MinimalConfig();
  json["is_decoder"] = true;
  ExpectConfigRejected(json, "is_decoder=true is not supported");
}

TEST(BertConfigTest, RejectsHeadsNotDividingHidden) {
  Json json = MinimalConfig();
  json["num_attention_heads"] = 10;
  ExpectConfigRejected(json, "hidden_size 384 is not divisible by num_attention_heads 10");
}

TEST(BertConfigTest, RejectsMissingRequiredField) {
  for (const char* field : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "intermediate_size", "max_position_embeddings"}) {
    Json json = MinimalConfig();
    json.erase(field);
    ExpectConfigRejected(json, std::string("missing required field '") + field + "'");
  }
}

TEST(BertConfigTest, RejectsWrongTypes) {
  Json json = MinimalConfig();
  json["hidden_size"] = "384";
  ExpectConfigRejected(json, "field 'hidden_size' must be an integer, found string '\"384\"'");
  json = MinimalConfig();
  json["num_hidden_layers"] = 6.5;
  ExpectConfigRejected(json, "field 'num_hidden_layers' must be an integer");
  json = MinimalConfig();
  json["layer_norm_eps"] = "1e-12";
  ExpectConfigRejected(json, "field 'layer_norm_eps' must be a number");
  json = MinimalConfig();
  json["hidden_act"] = 3;
  ExpectConfigRejected(json, "field 'hidden_act' must be a string");
  json = MinimalConfig();
  json["vocab_size"] = 1ull << 40;
  ExpectConfigRejected(json, "field 'vocab_size' is out of range");
}

TEST(BertConfigTest, RejectsBadValues) {
  Json json = MinimalConfig();
  json["num_hidden_layers"] = 0;
  ExpectConfigRejected(json, "field 'num_hidden_layers' must be > 0, found 0");
  json = MinimalConfig();
  json["vocab_size"] = -5;
  ExpectConfigRejected(json, "field 'vocab_size' must be > 0, found -5");
  json = MinimalConfig();
  json["pad_token_id"] = 30522;
  ExpectConfigRejected(json, "pad_token_id 30522 is outside the vocabulary");
  json = MinimalConfig();
  json["layer_norm_eps"] = 0;
  ExpectConfigRejected(json, "layer_norm_eps must be a positive finite number");
  json = MinimalConfig();
  json["hidden_dropout_prob"] = 1.5;
  ExpectConfigRejected(json, "field 'hidden_dropout_prob' must be in [0, 1)");
}

TEST(BertConfigTest, RejectsMalformedJson) {
  ExpectError(ParseBertConfig("{\"vocab_size\": "), absl::StatusCode::kInvalidArgument,
              "config.json: not valid JSON");
  ExpectError(ParseBertConfig("[]"), absl::StatusCode::kInvalidArgument,
              "expected a JSON object, found array");
}

TEST(BertConfigTest, LoadErrorsNameTheFile) {
  const std::string dir = MakeTempDir();
  ExpectError(LoadBertConfig(dir + "/config.json"), absl::StatusCode::kNotFound,
              dir + "/config.json");
  Json json = MinimalConfig();
  json["hidden_act"] = "relu";
  WriteFile(dir + "/config.json", json.dump());
  ExpectError(LoadBertConfig(dir + "/config.json"), absl::StatusCode::kInvalidArgument,
              dir + "/config.json: hidden_act 'relu'");
}

TEST(PoolingConfigTest, ParsesEachMode) {
  const std::pair<const char*, PoolingMode> cases[] = {
      {"pooling_mode_cls_token", PoolingMode::kCls},
      {"pooling_mode_mean_tokens", PoolingMode::kMean},
      {"pooling_mode_max_tokens", PoolingMode::kMax}};
  for (const auto& [key, mode] : cases) {
    Json json = {{"word_embedding_dimension", 384},
                 {"pooling_mode_cls_token", false},
                 {"pooling_mode_mean_tokens", false},
                 {"pooling_mode_max_tokens", false},
                 {"pooling_mode_mean_sqrt_len_tokens", false}};
    json[key] = true;
    auto parsed = ParsePoolingConfig(json.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode) << key;
  }
  EXPECT_EQ(PoolingModeName(PoolingMode::kCls), "cls");
  EXPECT_EQ(PoolingModeName(PoolingMode::kMean), "mean");
  EXPECT_EQ(PoolingModeName(PoolingMode::kMax), "max");
}

TEST(PoolingConfigTest, RejectsTwoModes) {
  ExpectError(
      ParsePoolingConfig(R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})"),
      absl::StatusCode::kInvalidArgument,
      "found pooling_mode_cls_token and pooling_mode_mean_tokens");
}

TEST(PoolingConfigTest, RejectsNoModeUnsupportedModesAndWrongTypes) {
  ExpectError(ParsePoolingConfig(R"({"pooling_mode_cls_token": false})"),
              absl::StatusCode::kInvalidArgument, "must be true, found none");
  ExpectError(ParsePoolingConfig(R"({"pooling_mode_mean_tokens": true,
                                     "pooling_mode_mean_sqrt_len_tokens": true})"),
              absl::StatusCode::kInvalidArgument,
              "pooling_mode_mean_sqrt_len_tokens is not supported");
  ExpectError(ParsePoolingConfig(R"({"pooling_mode_weightedmean_tokens": true})"),
              absl::StatusCode::kInvalidArgument, "pooling_mode_weightedmean_tokens");
  ExpectError(ParsePoolingConfig(R"({"pooling_mode_mean_tokens": "yes"})"),
              absl::StatusCode::kInvalidArgument,
              "field 'pooling_mode_mean_tokens' must be true or false");
  ExpectError(ParsePoolingConfig("not json"), absl::StatusCode::kInvalidArgument, "not valid JSON");
}

TEST(SentenceEmbeddingConfigTest, LoadsAllMiniLmL6V2) {
  auto config = LoadSentenceEmbeddingConfig(kModelDir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pooling, PoolingMode::kMean);
  EXPECT_TRUE(config->normalize);
  EXPECT_EQ(config->max_seq_length, 256);
  EXPECT_TRUE(config->from_files);
  // A trailing slash on the directory makes no difference.
  auto slash = LoadSentenceEmbeddingConfig(kModelDir + "/");
  ASSERT_TRUE(slash.ok()) << slash.status();
  EXPECT_TRUE(slash->from_files);
}

TEST(SentenceEmbeddingConfigTest, MissingFilesGiveDefaults) {
  auto config = LoadSentenceEmbeddingConfig(MakeTempDir());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pooling, PoolingMode::kMean);
  EXPECT_FALSE(config->normalize);
  EXPECT_EQ(config->max_seq_length, 0);
  EXPECT_FALSE(config->from_files);
}

TEST(SentenceEmbeddingConfigTest, FollowsPoolingPathFromModulesJson) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/modules.json", R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "pool", "type": "sentence_transformers.models.Pooling"}])");
  ASSERT_EQ(mkdir((dir + "/pool").c_str(), 0755), 0);
  WriteFile(dir + "/pool/config.json", R"({"pooling_mode_cls_token": true})");
  auto config = LoadSentenceEmbeddingConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pooling, PoolingMode::kCls);
  EXPECT_FALSE(config->normalize);
  EXPECT_TRUE(config->from_files);
}

TEST(SentenceEmbeddingConfigTest, DefaultPoolingDirWithoutModulesJson) {
  const std::string dir = MakeTempDir();
  ASSERT_EQ(mkdir((dir + "/1_Pooling").c_str(), 0755), 0);
  WriteFile(dir + "/1_Pooling/config.json", R"({"pooling_mode_max_tokens": true})");
  WriteFile(dir + "/sentence_bert_config.json", R"({"max_seq_length": 128})");
  auto config = LoadSentenceEmbeddingConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->pooling, PoolingMode::kMax);
  EXPECT_EQ(config->max_seq_length, 128);
  EXPECT_TRUE(config->from_files);
}

TEST(SentenceEmbeddingConfigTest, MalformedFilesAreErrorsNamingTheFile) {
  {
    const std::string dir = MakeTempDir();
    WriteFile(dir + "/modules.json", "[{");
    ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
                dir + "/modules.json: not valid JSON");
  }
  {
    const std::string dir = MakeTempDir();
    ASSERT_EQ(mkdir((dir + "/1_Pooling").c_str(), 0755), 0);
    WriteFile(dir + "/1_Pooling/config.json",
              R"({"pooling_mode_cls_token": true, "pooling_mode_max_tokens": true})");
    ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
                dir + "/1_Pooling/config.json: exactly one of");
  }
  {
    const std::string dir = MakeTempDir();
    WriteFile(dir + "/sentence_bert_config.json", R"({"max_seq_length": "256"})");
    ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
                dir + "/sentence_bert_config.json: field 'max_seq_length' must be an integer");
  }
  {
    const std::string dir = MakeTempDir();
    WriteFile(dir + "/sentence_bert_config.json", R"({"max_seq_length": 0})");
    ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
                "field 'max_seq_length' must be > 0");
  }
}

TEST(SentenceEmbeddingConfigTest, RejectsModulesItCannotRun) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/modules.json", R"([
    {"path": "", "type": "sentence_transformers.models.Transformer"},
    {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])");
  ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
              "unsupported type 'sentence_transformers.models.Dense'");

  WriteFile(dir + "/modules.json",
            R"([{"path": "../elsewhere", "type": "sentence_transformers.models.Pooling"}])");
  ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
              "Pooling module path '../elsewhere' must be a relative path");

  WriteFile(dir + "/modules.json", R"({"type": "sentence_transformers.models.Pooling"})");
  ExpectError(LoadSentenceEmbeddingConfig(dir), absl::StatusCode::kInvalidArgument,
              "expected a JSON array of modules, found object");
}

}  // namespace
}  // namespace attn
