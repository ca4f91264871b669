#include "engine/model_config.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/json_depth.h"
#include "engine/json_file.h"
#include "engine/quote.h"
#include "nlohmann/json.hpp"

// File-local; undefined at the end so it cannot clash with a shared macro.
#define CONFIG_RETURN_IF_ERROR(expr)   \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

namespace attn {
namespace {

using Json = nlohmann::json;

constexpr char kPoolingType[] = "sentence_transformers.models.Pooling";
constexpr char kNormalizeType[] = "sentence_transformers.models.Normalize";
constexpr char kTransformerType[] = "sentence_transformers.models.Transformer";

absl::Status Invalid(std::string_view source, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", source, message));
}

// Short rendering of an offending value for error messages.
std::string Describe(const Json& value) {
  return absl::StrCat(value.type_name(), " ", QuoteInput(value.dump()));
}

// Field readers: absent (or null, as some exported configs write) leaves *out untouched;
// present with the wrong type is an error naming the field.
absl::Status ReadInt(const Json& obj, const char* key, bool required, std::string_view source,
                     int* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return Invalid(source, absl::StrFormat("missing required field '%s'", key));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return Invalid(source,
                   absl::StrFormat("field '%s' must be an integer, found %s", key, Describe(*it)));
  }
  // Unsigned values above INT64_MAX would wrap in get<int64_t>().
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return Invalid(source, absl::StrFormat("field '%s' is out of range: %s", key, it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return Invalid(source, absl::StrFormat("field '%s' is out of range: %d", key, v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadFloat(const Json& obj, const char* key, std::string_view source, float* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return Invalid(source,
                   absl::StrFormat("field '%s' must be a number, found %s", key, Describe(*it)));
  }
  *out = static_cast<float>(it->get<double>());
  return absl::OkStatus();
}

absl::Status ReadString(const Json& obj, const char* key, std::string_view source,
                        std::optional<std::string>* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return Invalid(source,
                   absl::StrFormat("field '%s' must be a string, found %s", key, Describe(*it)));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& obj, const char* key, std::string_view source, bool* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return Invalid(
        source, absl::StrFormat("field '%s' must be true or false, found %s", key, Describe(*it)));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// The architecture table: one row per encoder family.
constexpr ArchitectureSpec kArchitectures[] = {
    {Architecture::kBert, "bert", "bert.", /*token_type_embeddings=*/true,
     /*relative_attention_bias=*/false, /*positions_after_padding=*/false,
     /*default_layer_norm_eps=*/1e-12f, "TemplateProcessing|BertProcessing",
     /*pair_separators=*/1, "BertModel"},
    {Architecture::kMpnet, "mpnet", "mpnet.", /*token_type_embeddings=*/false,
     /*relative_attention_bias=*/true, /*positions_after_padding=*/true,
     /*default_layer_norm_eps=*/1e-5f, "RobertaProcessing", /*pair_separators=*/2, "MPNetModel"},
};

std::string KnownModelTypes() {
  std::vector<std::string> names;
  for (const ArchitectureSpec& spec : kArchitectures)
    names.push_back(absl::StrCat("'", spec.model_type, "'"));
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<BertConfig> ParseBertConfigFrom(std::string_view json_text,
                                               std::string_view source) {
  absl::StatusOr<Json> parsed = ParseJsonObject(json_text, source);
  if (!parsed.ok()) return parsed.status();
  const Json& json = *parsed;
  BertConfig config;

  std::optional<std::string> model_type;
  CONFIG_RETURN_IF_ERROR(ReadString(json, "model_type", source, &model_type));
  if (model_type.has_value()) {
    const ArchitectureSpec* spec = FindArchitecture(*model_type);
    if (spec == nullptr) {
      return Invalid(source, absl::StrFormat("model_type '%s' is not supported (only %s)",
                                             *model_type, KnownModelTypes()));
    }
    config.architecture = spec->architecture;
    config.model_type = spec->model_type;
  }
  const ArchitectureSpec& spec = config.spec();
  config.layer_norm_eps = spec.default_layer_norm_eps;
  std::optional<std::string> position_type;
  CONFIG_RETURN_IF_ERROR(ReadString(json, "position_embedding_type", source, &position_type));
  if (position_type.has_value() && *position_type != "absolute") {
    return Invalid(source, absl::StrFormat("position_embedding_type '%s' is not supported (only "
                                           "'absolute')",
                                           *position_type));
  }
  std::optional<std::string> hidden_act;
  CONFIG_RETURN_IF_ERROR(ReadString(json, "hidden_act", source, &hidden_act));
  if (hidden_act.has_value()) {
    if (*hidden_act != "gelu") {
      return Invalid(source, absl::StrFormat("hidden_act '%s' is not supported (only 'gelu', "
                                             "the erf GELU)",
                                             *hidden_act));
    }
    config.hidden_act = *hidden_act;
  }
  // A decoder config would need a causal mask and cross-attention, which the encoder lacks.
  for (const char* flag : {"is_decoder", "add_cross_attention"}) {
    bool value = false;
    CONFIG_RETURN_IF_ERROR(ReadBool(json, flag, source, &value));
    if (value) {
      return Invalid(source, absl::StrFormat("%s=true is not supported (encoder only)", flag));
    }
  }

  struct IntField {
    const char* key;
    int* out;
    bool required;
  };
  const IntField int_fields[] = {
      {"vocab_size", &config.vocab_size, true},
      {"hidden_size", &config.hidden_size, true},
      {"num_hidden_layers", &config.num_hidden_layers, true},
      {"num_attention_heads", &config.num_attention_heads, true},
      {"intermediate_size", &config.intermediate_size, true},
      {"max_position_embeddings", &config.max_position_embeddings, true},
      {"type_vocab_size", &config.type_vocab_size, false},
  };
  for (const IntField& f : int_fields) {
    CONFIG_RETURN_IF_ERROR(ReadInt(json, f.key, f.required, source, f.out));
    if (*f.out <= 0) {
      return Invalid(source, absl::StrFormat("field '%s' must be > 0, found %d", f.key, *f.out));
    }
  }
  // No token-type table: the only type id is 0 (HF's MPNet ignores a type_vocab_size).
  if (!spec.token_type_embeddings) config.type_vocab_size = 1;
  CONFIG_RETURN_IF_ERROR(ReadInt(json, "pad_token_id", false, source, &config.pad_token_id));
  if (spec.relative_attention_bias) {
    // HF's MPNet buckets with its default of 32 whatever the config says; a table of another
    // size would be read out of range or partly.
    config.relative_attention_num_buckets = kRelativeBuckets;
    CONFIG_RETURN_IF_ERROR(ReadInt(json, "relative_attention_num_buckets", false, source,
                                   &config.relative_attention_num_buckets));
    if (config.relative_attention_num_buckets != kRelativeBuckets) {
      return Invalid(source, absl::StrFormat("field 'relative_attention_num_buckets' must be %d "
                                             "for model_type '%s', found %d",
                                             kRelativeBuckets, spec.model_type,
                                             config.relative_attention_num_buckets));
    }
  }
  CONFIG_RETURN_IF_ERROR(ReadFloat(json, "layer_norm_eps", source, &config.layer_norm_eps));
  CONFIG_RETURN_IF_ERROR(
      ReadFloat(json, "hidden_dropout_prob", source, &config.hidden_dropout_prob));
  CONFIG_RETURN_IF_ERROR(ReadFloat(json, "attention_probs_dropout_prob", source,
                                   &config.attention_probs_dropout_prob));

  if (config.hidden_size % config.num_attention_heads != 0) {
    return Invalid(source, absl::StrFormat("hidden_size %d is not divisible by "
                                           "num_attention_heads %d",
                                           config.hidden_size, config.num_attention_heads));
  }
  if (config.pad_token_id < 0 || config.pad_token_id >= config.vocab_size) {
    return Invalid(source, absl::StrFormat("pad_token_id %d is outside the vocabulary [0, %d)",
                                           config.pad_token_id, config.vocab_size));
  }
  if (config.max_sequence_length() < 2) {
    return Invalid(source,
                   absl::StrFormat("max_position_embeddings %d leaves no room for a "
                                   "sequence (positions start at %d)",
                                   config.max_position_embeddings, config.position_offset()));
  }
  if (!(config.layer_norm_eps > 0.0f) || !std::isfinite(config.layer_norm_eps)) {
    return Invalid(source, absl::StrFormat("layer_norm_eps must be a positive finite number, "
                                           "found %g",
                                           config.layer_norm_eps));
  }
  for (const auto& [key, value] :
       {std::pair<const char*, float>{"hidden_dropout_prob", config.hidden_dropout_prob},
        {"attention_probs_dropout_prob", config.attention_probs_dropout_prob}}) {
    // Written as a negated range test so NaN is rejected too.
    if (!(value >= 0.0f && value < 1.0f)) {
      return Invalid(source, absl::StrFormat("field '%s' must be in [0, 1), found %g", key, value));
    }
  }
  return config;
}

absl::StatusOr<PoolingMode> ParsePoolingConfigFrom(std::string_view json_text,
                                                   std::string_view source) {
  absl::StatusOr<Json> parsed = ParseJsonObject(json_text, source);
  if (!parsed.ok()) return parsed.status();
  const Json& json = *parsed;

  // sentence-transformers concatenates every enabled mode; the engine produces exactly one.
  for (const char* key : {"pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                          "pooling_mode_lasttoken"}) {
    bool enabled = false;
    CONFIG_RETURN_IF_ERROR(ReadBool(json, key, source, &enabled));
    if (enabled) {
      return Invalid(source, absl::StrFormat("%s is not supported (only cls, mean or max "
                                             "pooling)",
                                             key));
    }
  }
  struct Mode {
    const char* key;
    PoolingMode mode;
  };
  const Mode modes[] = {{"pooling_mode_cls_token", PoolingMode::kCls},
                        {"pooling_mode_mean_tokens", PoolingMode::kMean},
                        {"pooling_mode_max_tokens", PoolingMode::kMax}};
  std::vector<std::string> enabled_names;
  PoolingMode result = PoolingMode::kMean;
  for (const Mode& m : modes) {
    bool enabled = false;
    CONFIG_RETURN_IF_ERROR(ReadBool(json, m.key, source, &enabled));
    if (enabled) {
      enabled_names.push_back(m.key);
      result = m.mode;
    }
  }
  if (enabled_names.size() != 1) {
    return Invalid(
        source, absl::StrFormat("exactly one of pooling_mode_cls_token, pooling_mode_mean_tokens, "
                                "pooling_mode_max_tokens must be true, found %s",
                                enabled_names.empty() ? std::string("none")
                                                      : absl::StrJoin(enabled_names, " and ")));
  }
  return result;
}

// A module path from modules.json must stay inside the model directory.
bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (path.substr(start, slash - start) == "..") return false;
    start = slash + 1;
  }
  return true;
}

}  // namespace

const ArchitectureSpec& SpecOf(Architecture architecture) {
  for (const ArchitectureSpec& spec : kArchitectures) {
    if (spec.architecture == architecture) return spec;
  }
  return kArchitectures[0];  // unreachable: every enumerator has a row
}

const ArchitectureSpec* FindArchitecture(std::string_view model_type) {
  for (const ArchitectureSpec& spec : kArchitectures) {
    if (model_type == spec.model_type) return &spec;
  }
  return nullptr;
}

absl::StatusOr<BertConfig> ParseBertConfig(std::string_view json_text) {
  return ParseBertConfigFrom(json_text, "config.json");
}

absl::StatusOr<BertConfig> LoadBertConfig(const std::string& path) {
  absl::StatusOr<std::optional<std::string>> text = ReadFileIfExists(path);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return absl::NotFoundError(absl::StrCat(path, ": file not found"));
  return ParseBertConfigFrom(**text, path);
}

std::string_view PoolingModeName(PoolingMode mode) {
  switch (mode) {
    case PoolingMode::kCls:
      return "cls";
    case PoolingMode::kMean:
      return "mean";
    case PoolingMode::kMax:
      return "max";
  }
  return "unknown";
}

absl::StatusOr<PoolingMode> ParsePoolingConfig(std::string_view json_text) {
  return ParsePoolingConfigFrom(json_text, "pooling config");
}

absl::StatusOr<SentenceEmbeddingConfig> LoadSentenceEmbeddingConfig(const std::string& model_dir) {
  SentenceEmbeddingConfig config;
  std::string pooling_dir = "1_Pooling";

  const std::string modules_path = JoinPath(model_dir, "modules.json");
  absl::StatusOr<std::optional<std::string>> modules_text = ReadFileIfExists(modules_path);
  if (!modules_text.ok()) return modules_text.status();
  if (modules_text->has_value()) {
    Json modules;
    if (JsonNestsDeeperThan(**modules_text)) {
      return Invalid(modules_path,
                     absl::StrFormat("JSON nests deeper than %d levels", kMaxJsonDepth));
    }
    try {
      modules = Json::parse(**modules_text);
    } catch (const Json::exception& e) {
      return Invalid(modules_path, absl::StrCat("not valid JSON: ", e.what()));
    }
    if (!modules.is_array()) {
      return Invalid(modules_path,
                     absl::StrCat("expected a JSON array of modules, found ", modules.type_name()));
    }
    bool have_pooling = false;
    for (size_t i = 0; i < modules.size(); ++i) {
      const Json& module = modules[i];
      const std::string where = absl::StrFormat("module %d", i);
      if (!module.is_object()) {
        return Invalid(modules_path, absl::StrFormat("%s must be an object, found %s", where,
                                                     module.type_name()));
      }
      std::optional<std::string> type, path;
      CONFIG_RETURN_IF_ERROR(ReadString(module, "type", modules_path, &type));
      CONFIG_RETURN_IF_ERROR(ReadString(module, "path", modules_path, &path));
      if (!type.has_value()) {
        return Invalid(modules_path, absl::StrFormat("%s has no \"type\"", where));
      }
      if (*type == kPoolingType) {
        if (have_pooling) {
          return Invalid(modules_path, "more than one Pooling module is listed");
        }
        have_pooling = true;
        if (path.has_value()) {
          if (!IsSafeRelativePath(*path)) {
            return Invalid(modules_path,
                           absl::StrFormat("Pooling module path '%s' must be a relative path "
                                           "inside the model directory",
                                           *path));
          }
          pooling_dir = *path;
        }
      } else if (*type == kNormalizeType) {
        config.normalize = true;
      } else if (*type != kTransformerType) {
        // Skipping a module (a Dense projection, say) would silently serve wrong embeddings.
        return Invalid(modules_path,
                       absl::StrFormat("%s has unsupported type '%s' (supported: Transformer, "
                                       "Pooling, Normalize)",
                                       where, *type));
      }
    }
  }

  const std::string pooling_path = JoinPath(JoinPath(model_dir, pooling_dir), "config.json");
  absl::StatusOr<std::optional<std::string>> pooling_text = ReadFileIfExists(pooling_path);
  if (!pooling_text.ok()) return pooling_text.status();
  if (pooling_text->has_value()) {
    absl::StatusOr<PoolingMode> mode = ParsePoolingConfigFrom(**pooling_text, pooling_path);
    if (!mode.ok()) return mode.status();
    config.pooling = *mode;
    config.from_files = true;
  }

  const std::string sbert_path = JoinPath(model_dir, "sentence_bert_config.json");
  absl::StatusOr<std::optional<std::string>> sbert_text = ReadFileIfExists(sbert_path);
  if (!sbert_text.ok()) return sbert_text.status();
  if (sbert_text->has_value()) {
    absl::StatusOr<Json> sbert = ParseJsonObject(**sbert_text, sbert_path);
    if (!sbert.ok()) return sbert.status();
    const auto it = sbert->find("max_seq_length");
    const bool present = it != sbert->end() && !it->is_null();
    int max_seq_length = 0;
    CONFIG_RETURN_IF_ERROR(ReadInt(*sbert, "max_seq_length", false, sbert_path, &max_seq_length));
    if (present && max_seq_length <= 0) {
      return Invalid(sbert_path, absl::StrFormat("field 'max_seq_length' must be > 0, found %d",
                                                 max_seq_length));
    }
    config.max_seq_length = max_seq_length;
  }
  return config;
}

}  // namespace attn

#undef CONFIG_RETURN_IF_ERROR
