#include "engine/neighbors.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attn {

namespace {

double Dot(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

}  // namespace

std::vector<TokenNeighbour> StaticNeighbours(const Tensor& table,
                                             const std::vector<int32_t>& query_ids, int k) {
  const int64_t V = table.shape()[0];
  const int64_t H = table.shape()[1];
  std::vector<double> query(H, 0.0);
  for (int32_t id : query_ids) {
    for (int64_t j = 0; j < H; ++j) query[j] += table.data()[id * H + j];
  }
  double query_norm = 0;
  for (int64_t j = 0; j < H; ++j) {
    query[j] /= static_cast<double>(query_ids.size());
    query_norm += query[j] * query[j];
  }
  query_norm = std::sqrt(query_norm);
  std::vector<TokenNeighbour> all;
  all.reserve(V);
  for (int64_t v = 0; v < V; ++v) {
    if (std::find(query_ids.begin(), query_ids.end(), v) != query_ids.end()) continue;
    const float* row = table.data() + v * H;
    double dot = 0, norm = 0;
    for (int64_t j = 0; j < H; ++j) {
      dot += query[j] * row[j];
      norm += static_cast<double>(row[j]) * row[j];
    }
    const double denominator = query_norm * std::sqrt(norm);
    all.push_back({static_cast<int32_t>(v), denominator > 0 ? dot / denominator : 0.0});
  }
  k = std::min<int>(k, static_cast<int>(all.size()));
  std::partial_sort(all.begin(), all.begin() + k, all.end(),
                    [](const TokenNeighbour& x, const TokenNeighbour& y) {
                      return x.cosine != y.cosine ? x.cosine > y.cosine : x.id < y.id;
                    });
  all.resize(k);
  return all;
}

int64_t FindSubsequence(const std::vector<int32_t>& sentence_ids,
                        const std::vector<int32_t>& word_ids) {
  if (word_ids.empty() || word_ids.size() > sentence_ids.size()) return -1;
  auto it = std::search(sentence_ids.begin(), sentence_ids.end(), word_ids.begin(), word_ids.end());
  return it == sentence_ids.end() ? -1 : it - sentence_ids.begin();
}

absl::StatusOr<ContextualSimilarity> ContextualNeighbours(
    const Model& model, const std::vector<SequenceInput>& sentences,
    const std::vector<int64_t>& word_starts, int64_t word_length, int layer) {
  ForwardOptions forward;
  forward.pool = false;
  forward.hidden_layers = {layer};
  absl::StatusOr<ForwardResult> result = model.Forward(sentences, forward);
  if (!result.ok()) return result.status();
  const int64_t H = model.config().hidden_size;
  const Tensor& hidden = *result->HiddenState(layer);  // (M, H)
  ContextualSimilarity out;
  const size_t S = sentences.size();
  for (size_t s = 0; s < S; ++s) {
    std::vector<float>& vector = out.vectors.emplace_back(H, 0.0f);
    std::vector<double> sum(H, 0.0);
    const int64_t first_row = result->seq_offsets[s] + word_starts[s];
    for (int64_t t = 0; t < word_length; ++t) {
      const float* row = hidden.data() + (first_row + t) * H;
      for (int64_t j = 0; j < H; ++j) sum[j] += row[j];
    }
    for (int64_t j = 0; j < H; ++j) vector[j] = static_cast<float>(sum[j] / word_length);
  }
  out.cosine.assign(S * S, 0.0);
  for (size_t i = 0; i < S; ++i) {
    for (size_t j = 0; j < S; ++j) {
      const double denominator = std::sqrt(Dot(out.vectors[i].data(), out.vectors[i].data(), H) *
                                           Dot(out.vectors[j].data(), out.vectors[j].data(), H));
      out.cosine[i * S + j] =
          denominator > 0 ? Dot(out.vectors[i].data(), out.vectors[j].data(), H) / denominator
                          : 0.0;
    }
  }
  return out;
}

}  // namespace attn
