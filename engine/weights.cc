#include "engine/weights.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn {

int64_t BertWeights::ParameterCount() const {
  int64_t count = word_embeddings.numel() + position_embeddings.numel() +
                  token_type_embeddings.numel() + embedding_norm_gamma.numel() +
                  embedding_norm_beta.numel() + relative_attention_bias.numel();
  for (const LayerWeights& l : layers) {
    for (const Tensor* t :
         {&l.qkv_weight, &l.qkv_bias, &l.attn_output_weight, &l.attn_output_bias,
          &l.attn_norm_gamma, &l.attn_norm_beta, &l.ffn_in_weight, &l.ffn_in_bias,
          &l.ffn_out_weight, &l.ffn_out_bias, &l.ffn_norm_gamma, &l.ffn_norm_beta}) {
      count += t->numel();
    }
  }
  return count;
}

std::vector<std::pair<std::string, Tensor*>> EngineTensors(BertWeights* w) {
  std::vector<std::pair<std::string, Tensor*>> tensors = {
      {"word_embeddings", &w->word_embeddings},
      {"position_embeddings", &w->position_embeddings},
  };
  // The family's optional tensors, when it has them (the same for every model of one config).
  if (w->token_type_embeddings.numel() > 0) {
    tensors.emplace_back("token_type_embeddings", &w->token_type_embeddings);
  }
  tensors.emplace_back("embedding_norm_gamma", &w->embedding_norm_gamma);
  tensors.emplace_back("embedding_norm_beta", &w->embedding_norm_beta);
  if (w->relative_attention_bias.numel() > 0) {
    tensors.emplace_back("relative_attention_bias", &w->relative_attention_bias);
  }
  for (size_t i = 0; i < w->layers.size(); ++i) {
    LayerWeights& l = w->layers[i];
    const std::string p = absl::StrCat("layers.", i, ".");
    for (auto& [name, tensor] :
         std::vector<std::pair<const char*, Tensor*>>{{"qkv_weight", &l.qkv_weight},
                                                      {"qkv_bias", &l.qkv_bias},
                                                      {"attn_output_weight", &l.attn_output_weight},
                                                      {"attn_output_bias", &l.attn_output_bias},
                                                      {"attn_norm_gamma", &l.attn_norm_gamma},
                                                      {"attn_norm_beta", &l.attn_norm_beta},
                                                      {"ffn_in_weight", &l.ffn_in_weight},
                                                      {"ffn_in_bias", &l.ffn_in_bias},
                                                      {"ffn_out_weight", &l.ffn_out_weight},
                                                      {"ffn_out_bias", &l.ffn_out_bias},
                                                      {"ffn_norm_gamma", &l.ffn_norm_gamma},
                                                      {"ffn_norm_beta", &l.ffn_norm_beta}}) {
      tensors.emplace_back(p + name, tensor);
    }
  }
  return tensors;
}

namespace {

// The Hugging Face names of one family's tensors (after the optional prefix); nullptr: the
// family has no such tensor. Layer names follow "encoder.layer.<i>.".
struct FamilyTensorNames {
  const char* token_type_embeddings;
  const char* relative_attention_bias;
  const char* query;  // + ".weight" / ".bias"
  const char* key;
  const char* value;
  const char* attn_output;
  const char* attn_norm;
  std::vector<const char*> ignored;  // buffers and heads the encoder does not use
};

const FamilyTensorNames& NamesOf(Architecture architecture) {
  // position_ids is a registered buffer (0..P-1); the pooler (tanh dense on the first token)
  // feeds only the pre-training heads, which sentence embeddings do not use.
  static const FamilyTensorNames kBert = {
      "embeddings.token_type_embeddings.weight",
      nullptr,
      "attention.self.query",
      "attention.self.key",
      "attention.self.value",
      "attention.output.dense",
      "attention.output.LayerNorm",
      {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}};
  static const FamilyTensorNames kMpnet = {
      nullptr,
      "encoder.relative_attention_bias.weight",
      "attention.attn.q",
      "attention.attn.k",
      "attention.attn.v",
      "attention.attn.o",
      "attention.LayerNorm",
      {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}};
  return architecture == Architecture::kMpnet ? kMpnet : kBert;
}

}  // namespace

std::vector<ParameterSlot> BuildParameterTable(const BertConfig& config, BertWeights* w) {
  const FamilyTensorNames& names = NamesOf(config.architecture);
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  w->word_embeddings = Tensor({config.vocab_size, H});
  w->position_embeddings = Tensor({config.max_position_embeddings, H});
  w->embedding_norm_gamma = Tensor({H});
  w->embedding_norm_beta = Tensor({H});
  std::vector<ParameterSlot> table = {
      {"embeddings.word_embeddings.weight", {config.vocab_size, H}, &w->word_embeddings, 0},
      {"embeddings.position_embeddings.weight",
       {config.max_position_embeddings, H},
       &w->position_embeddings,
       0},
      {"embeddings.LayerNorm.weight", {H}, &w->embedding_norm_gamma, 0},
      {"embeddings.LayerNorm.bias", {H}, &w->embedding_norm_beta, 0},
  };
  if (names.token_type_embeddings != nullptr) {
    w->token_type_embeddings = Tensor({config.type_vocab_size, H});
    table.push_back(
        {names.token_type_embeddings, {config.type_vocab_size, H}, &w->token_type_embeddings, 0});
  }
  if (names.relative_attention_bias != nullptr) {
    const int64_t buckets = config.relative_attention_num_buckets;
    w->relative_attention_bias = Tensor({buckets, int64_t{config.num_attention_heads}});
    table.push_back({names.relative_attention_bias,
                     {buckets, int64_t{config.num_attention_heads}},
                     &w->relative_attention_bias,
                     0});
  }
  w->layers.assign(config.num_hidden_layers, LayerWeights{});
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights& l = w->layers[i];
    l.qkv_weight = Tensor({3 * H, H});
    l.qkv_bias = Tensor({3 * H});
    l.attn_output_weight = Tensor({H, H});
    l.attn_output_bias = Tensor({H});
    l.attn_norm_gamma = Tensor({H});
    l.attn_norm_beta = Tensor({H});
    l.ffn_in_weight = Tensor({I, H});
    l.ffn_in_bias = Tensor({I});
    l.ffn_out_weight = Tensor({H, I});
    l.ffn_out_bias = Tensor({H});
    l.ffn_norm_gamma = Tensor({H});
    l.ffn_norm_beta = Tensor({H});
    const std::string p = absl::StrCat("encoder.layer.", i, ".");
    auto name = [&](const char* base, const char* what) { return absl::StrCat(p, base, what); };
    const std::vector<ParameterSlot> layer_slots = {
        {name(names.query, ".weight"), {H, H}, &l.qkv_weight, 0},
        {name(names.key, ".weight"), {H, H}, &l.qkv_weight, H},
        {name(names.value, ".weight"), {H, H}, &l.qkv_weight, 2 * H},
        {name(names.query, ".bias"), {H}, &l.qkv_bias, 0},
        {name(names.key, ".bias"), {H}, &l.qkv_bias, H},
        {name(names.value, ".bias"), {H}, &l.qkv_bias, 2 * H},
        {name(names.attn_output, ".weight"), {H, H}, &l.attn_output_weight, 0},
        {name(names.attn_output, ".bias"), {H}, &l.attn_output_bias, 0},
        {name(names.attn_norm, ".weight"), {H}, &l.attn_norm_gamma, 0},
        {name(names.attn_norm, ".bias"), {H}, &l.attn_norm_beta, 0},
        {p + "intermediate.dense.weight", {I, H}, &l.ffn_in_weight, 0},
        {p + "intermediate.dense.bias", {I}, &l.ffn_in_bias, 0},
        {p + "output.dense.weight", {H, I}, &l.ffn_out_weight, 0},
        {p + "output.dense.bias", {H}, &l.ffn_out_bias, 0},
        {p + "output.LayerNorm.weight", {H}, &l.ffn_norm_gamma, 0},
        {p + "output.LayerNorm.bias", {H}, &l.ffn_norm_beta, 0},
    };
    table.insert(table.end(), layer_slots.begin(), layer_slots.end());
  }
  return table;
}

bool IsIgnoredTensorName(const BertConfig& config, const std::string& hf_name) {
  for (const char* ignored : NamesOf(config.architecture).ignored) {
    if (hf_name == ignored) return true;
  }
  return false;
}

absl::StatusOr<BertWeights> LoadBertWeights(const SafetensorsFile& file, const BertConfig& config) {
  BertWeights weights;
  const std::vector<ParameterSlot> table = BuildParameterTable(config, &weights);
  std::map<std::string, const ParameterSlot*> by_name;
  for (const ParameterSlot& slot : table) by_name[slot.hf_name] = &slot;

  std::set<std::string> seen;
  for (const TensorInfo& info : file.tensors()) {
    const absl::string_view prefix = config.spec().weight_prefix;
    const std::string name =
        absl::StartsWith(info.name, prefix) ? info.name.substr(prefix.size()) : info.name;
    if (IsIgnoredTensorName(config, name)) continue;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.source_name(), ": unknown tensor '", info.name, "' (not part of a ",
                       config.model_type, " encoder with ", config.num_hidden_layers,
                       " layers; is this the right config.json?)"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(file.source_name(), ": tensor '", name,
                                                     "' appears twice (with and without '", prefix,
                                                     "')"));
    }
    const ParameterSlot& slot = *it->second;
    if (info.shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.source_name(), ": tensor '", info.name, "' has shape ", ShapeToString(info.shape),
          ", expected ", ShapeToString(slot.shape), " from config.json"));
    }
    absl::StatusOr<Tensor> values = file.ReadFloat32(info.name);
    if (!values.ok()) return values.status();
    const int64_t row_size = slot.target->numel() / slot.target->dim(0);
    std::memcpy(slot.target->data() + slot.row_offset * row_size, values->data(),
                sizeof(float) * values->numel());
  }
  std::vector<std::string> missing;
  for (const ParameterSlot& slot : table) {
    if (!seen.count(slot.hf_name)) {
      missing.push_back(absl::StrCat("'", slot.hf_name, "' ", ShapeToString(slot.shape)));
    }
  }
  if (!missing.empty()) {
    const size_t shown = std::min<size_t>(missing.size(), 5);
    return absl::InvalidArgumentError(
        absl::StrCat(file.source_name(), ": missing ", missing.size(),
                     " tensor(s): ", absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
                     missing.size() > shown ? ", ..." : ""));
  }
  return weights;
}

}  // namespace attn
