// Model configuration: Hugging Face config.json (BERT family) and the sentence-transformers
// extras (modules.json, 1_Pooling/config.json, sentence_bert_config.json).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attn {

struct BertConfig {
  std::string model_type = "bert";
  int vocab_size = 0;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int intermediate_size = 0;
  int max_position_embeddings = 0;
  int type_vocab_size = 2;
  float layer_norm_eps = 1e-12f;
  std::string hidden_act = "gelu";  // erf GELU; the only activation supported
  int pad_token_id = 0;
  float hidden_dropout_prob = 0.1f;
  float attention_probs_dropout_prob = 0.1f;

  int head_dim() const { return hidden_size / num_attention_heads; }
};

// Parses and validates config.json text. Rejects what the engine cannot run (model_type other
// than bert, hidden_act other than gelu, position_embedding_type other than absolute,
// hidden_size not divisible by heads, non-positive sizes), naming the field and value.
absl::StatusOr<BertConfig> ParseBertConfig(std::string_view json_text);
absl::StatusOr<BertConfig> LoadBertConfig(const std::string& path);

enum class PoolingMode { kCls, kMean, kMax };
std::string_view PoolingModeName(PoolingMode mode);  // "cls", "mean", "max"

// What sentence-transformers does after the transformer. Defaults (no files): mean pooling,
// no normalisation, no max_seq_length.
struct SentenceEmbeddingConfig {
  PoolingMode pooling = PoolingMode::kMean;
  bool normalize = false;   // modules.json lists a sentence_transformers.models.Normalize
  int max_seq_length = 0;   // sentence_bert_config.json; 0 = not given
  bool from_files = false;  // true when 1_Pooling/config.json was found
};

// Parses 1_Pooling/config.json text (exactly one of cls/mean/max must be true; mean_sqrt_len
// and weighted modes are rejected with a clear error).
absl::StatusOr<PoolingMode> ParsePoolingConfig(std::string_view json_text);
// Reads the optional sentence-transformers files in `model_dir`; missing files give defaults,
// malformed ones are errors naming the file.
absl::StatusOr<SentenceEmbeddingConfig> LoadSentenceEmbeddingConfig(const std::string& model_dir);

}  // namespace attn
