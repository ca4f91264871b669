#include "engine/parameter_groups.h"

#include "absl/strings/str_cat.h"

namespace attn {

int64_t TensorRows::row_length() const {
  return tensor->rank() <= 1 ? 1 : tensor->numel() / tensor->dim(0);
}

const float* TensorRows::begin() const { return tensor->data() + row_begin * row_length(); }

namespace {

TensorRows Whole(const Tensor& t) { return {&t, 0, t.rank() == 0 ? 0 : t.dim(0)}; }

}  // namespace

std::vector<ParameterGroup> ParameterGroups(const BertWeights& w) {
  std::vector<ParameterGroup> groups;
  groups.push_back({"embeddings.word", "word_embeddings", -1, {Whole(w.word_embeddings)}});
  groups.push_back(
      {"embeddings.position", "position_embeddings", -1, {Whole(w.position_embeddings)}});
  if (w.token_type_embeddings.numel() > 0) {
    groups.push_back(
        {"embeddings.token_type", "token_type_embeddings", -1, {Whole(w.token_type_embeddings)}});
  }
  groups.push_back({"embeddings.norm",
                    "LayerNorm",
                    -1,
                    {Whole(w.embedding_norm_gamma), Whole(w.embedding_norm_beta)}});
  if (w.relative_attention_bias.numel() > 0) {
    groups.push_back({"relative_attention_bias",
                      "relative_attention_bias",
                      -1,
                      {Whole(w.relative_attention_bias)}});
  }
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const int layer = static_cast<int>(i);
    const std::string prefix = absl::StrCat("layers.", i, ".");
    const int64_t H = l.qkv_weight.dim(0) / 3;
    const char* qkv_names[3] = {"query", "key", "value"};
    const char* qkv_kinds[3] = {"W_Q", "W_K", "W_V"};
    for (int64_t block = 0; block < 3; ++block) {
      groups.push_back({prefix + qkv_names[block],
                        qkv_kinds[block],
                        layer,
                        {{&l.qkv_weight, block * H, (block + 1) * H},
                         {&l.qkv_bias, block * H, (block + 1) * H}}});
    }
    groups.push_back({prefix + "attention_output",
                      "W_O",
                      layer,
                      {Whole(l.attn_output_weight), Whole(l.attn_output_bias)}});
    groups.push_back({prefix + "attention_norm",
                      "LayerNorm",
                      layer,
                      {Whole(l.attn_norm_gamma), Whole(l.attn_norm_beta)}});
    groups.push_back(
        {prefix + "ffn_in", "FFN_in", layer, {Whole(l.ffn_in_weight), Whole(l.ffn_in_bias)}});
    groups.push_back(
        {prefix + "ffn_out", "FFN_out", layer, {Whole(l.ffn_out_weight), Whole(l.ffn_out_bias)}});
    groups.push_back({prefix + "ffn_norm",
                      "LayerNorm",
                      layer,
                      {Whole(l.ffn_norm_gamma), Whole(l.ffn_norm_beta)}});
  }
  return groups;
}

// The sums are `simd` reductions: without it GCC keeps a double sum scalar (it may not reorder
// the additions), one add per 4 cycles, which made training telemetry cost 5% of a step. The
// reordering changes the result in its last bits only.
double SquaredNorm(const ParameterGroup& group) {
  double sum = 0.0;
  for (const TensorRows& part : group.parts) {
    const float* x = part.begin();
    const int64_t n = part.size();
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (n >= (1 << 16))
    for (int64_t k = 0; k < n; ++k) sum += double{x[k]} * x[k];
  }
  return sum;
}

double SquaredDistance(const ParameterGroup& a, const ParameterGroup& b) {
  double sum = 0.0;
  for (size_t p = 0; p < a.parts.size(); ++p) {
    const float* x = a.parts[p].begin();
    const float* y = b.parts[p].begin();
    const int64_t n = a.parts[p].size();
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (n >= (1 << 16))
    for (int64_t k = 0; k < n; ++k) {
      const double d = double{x[k]} - y[k];
      sum += d * d;
    }
  }
  return sum;
}

}  // namespace attn
