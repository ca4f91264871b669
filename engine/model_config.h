// Model configuration: Hugging Face config.json (the encoder families of ArchitectureSpec) and
// the sentence-transformers extras (modules.json, 1_Pooling/config.json,
// sentence_bert_config.json).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attn {

enum class Architecture { kBert, kMpnet };

// What differs between the encoder families the engine runs: the one place that says it (the
// table in model_config.cc, one row per family). Everything else asks the config's spec().
struct ArchitectureSpec {
  Architecture architecture;
  const char* model_type;     // config.json "model_type"
  const char* weight_prefix;  // optional prefix of the checkpoint's tensor names ("bert.")
  // static embeddings = word + position (+ token type when true)
  bool token_type_embeddings;
  // MPNet: a learned bias per (relative-position bucket, head), bucketed as T5 does
  // (bidirectional, kRelativeBuckets buckets, exact below 8, logarithmic up to
  // kRelativeMaxDistance), added to the scaled scores before the softmax in every layer.
  bool relative_attention_bias;
  // MPNet (HF create_position_ids_from_input_ids): position ids count from pad_token_id + 1
  // over the non-pad tokens; pad tokens get pad_token_id. BERT: 0, 1, 2, ...
  bool positions_after_padding;
  float default_layer_norm_eps;
  // The tokenizer.json post-processors of the family, '|'-separated: what frames a text
  // ([CLS] a [SEP] / <s> a </s>) and a pair.
  const char* tokenizer_post_processors;
  // Separators between the two texts of a pair: 1 ([CLS] a [SEP] b [SEP]) or 2
  // (<s> a </s></s> b </s>).
  int pair_separators;
  // The Hugging Face class of the bare encoder ("BertModel"), as GetModelInfo reports it.
  const char* model_class;
};

inline constexpr int kRelativeBuckets = 32;       // HF MPNet compute_position_bias' default
inline constexpr int kRelativeMaxDistance = 128;  // HF relative_position_bucket's default

const ArchitectureSpec& SpecOf(Architecture architecture);
// nullptr if no family has this model_type.
const ArchitectureSpec* FindArchitecture(std::string_view model_type);

struct BertConfig {
  Architecture architecture = Architecture::kBert;
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
  int relative_attention_num_buckets = 0;  // MPNet: kRelativeBuckets; 0 otherwise

  int head_dim() const { return hidden_size / num_attention_heads; }
  const ArchitectureSpec& spec() const { return SpecOf(architecture); }
  // The first position id (pad_token_id + 1 for MPNet, else 0).
  int position_offset() const { return spec().positions_after_padding ? pad_token_id + 1 : 0; }
  // The longest input the position table allows, special tokens included.
  int max_sequence_length() const { return max_position_embeddings - position_offset(); }
};

// Parses and validates config.json text. Rejects what the engine cannot run (a model_type
// without a row in the architecture table, hidden_act other than gelu, position_embedding_type
// other than absolute, hidden_size not divisible by heads, non-positive sizes, an MPNet bucket
// count other than 32), naming the field and value.
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
