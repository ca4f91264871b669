#include "engine/version_compare.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/training/evaluation.h"

namespace attn {

namespace {

// ||b - a||_F and ||a||_F over `count` floats, in double.
void DiffNorms(const float* a, const float* b, int64_t count, double* norm_a, double* norm_diff) {
  double sum_a = 0, sum_diff = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = a[i];
    const double d = static_cast<double>(b[i]) - x;
    sum_a += x * x;
    sum_diff += d * d;
  }
  *norm_a = std::sqrt(sum_a);
  *norm_diff = std::sqrt(sum_diff);
}

constexpr int64_t kChunkAttentionCells = 32768;

double Relative(double norm_a, double norm_diff) {
  return norm_a > 0 ? norm_diff / norm_a : norm_diff;
}

TensorChange Change(int layer, std::string matrix, std::string part, const float* a, const float* b,
                    int64_t count) {
  TensorChange change;
  change.layer = layer;
  change.matrix = std::move(matrix);
  change.part = std::move(part);
  DiffNorms(a, b, count, &change.norm_a, &change.norm_diff);
  change.relative_change = Relative(change.norm_a, change.norm_diff);
  return change;
}

void AddTensor(int layer, const char* matrix, const char* part, const Tensor& a, const Tensor& b,
               std::vector<TensorChange>* out) {
  if (a.numel() == 0) return;  // the family has no such tensor (MPNet: token types)
  out->push_back(Change(layer, matrix, part, a.data(), b.data(), a.numel()));
}

// JS divergence of two distributions of length n, in double, natural log.
double JensenShannon(const float* p, const float* q, int64_t n) {
  double js = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double pj = p[j], qj = q[j];
    const double m = 0.5 * (pj + qj);
    if (pj > 0) js += 0.5 * pj * std::log(pj / m);
    if (qj > 0) js += 0.5 * qj * std::log(qj / m);
  }
  return std::max(0.0, js);
}

double Dot(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

// The k most similar other probes of probe i (ties to the lower index).
std::vector<int> TopNeighbours(const std::vector<double>& similarity, int n, int i, int k) {
  std::vector<int> others;
  for (int j = 0; j < n; ++j) {
    if (j != i) others.push_back(j);
  }
  std::partial_sort(others.begin(), others.begin() + k, others.end(), [&](int x, int y) {
    const double sx = similarity[static_cast<size_t>(i) * n + x];
    const double sy = similarity[static_cast<size_t>(i) * n + y];
    return sx != sy ? sx > sy : x < y;
  });
  others.resize(k);
  std::sort(others.begin(), others.end());
  return others;
}

}  // namespace

absl::Status CheckComparable(const Model& a, const Model& b) {
  const BertConfig& x = a.config();
  const BertConfig& y = b.config();
  auto differs = [](const char* what, auto va, auto vb) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the two versions belong to different models (", what, " ", va, " vs ", vb,
        "): their weights and embeddings cannot be compared; compare two versions of one model"));
  };
  if (x.model_type != y.model_type) return differs("model_type", x.model_type, y.model_type);
  if (x.hidden_size != y.hidden_size) return differs("hidden_size", x.hidden_size, y.hidden_size);
  if (x.num_hidden_layers != y.num_hidden_layers) {
    return differs("num_hidden_layers", x.num_hidden_layers, y.num_hidden_layers);
  }
  if (x.num_attention_heads != y.num_attention_heads) {
    return differs("num_attention_heads", x.num_attention_heads, y.num_attention_heads);
  }
  if (x.intermediate_size != y.intermediate_size) {
    return differs("intermediate_size", x.intermediate_size, y.intermediate_size);
  }
  if (x.vocab_size != y.vocab_size) return differs("vocab_size", x.vocab_size, y.vocab_size);
  if (x.max_position_embeddings != y.max_position_embeddings) {
    return differs("max_position_embeddings", x.max_position_embeddings, y.max_position_embeddings);
  }
  if (x.type_vocab_size != y.type_vocab_size) {
    return differs("type_vocab_size", x.type_vocab_size, y.type_vocab_size);
  }
  const WordPieceTokenizer& ta = a.tokenizer();
  const WordPieceTokenizer& tb = b.tokenizer();
  if (ta.vocab_size() != tb.vocab_size()) {
    return differs("tokenizer vocabulary size", ta.vocab_size(), tb.vocab_size());
  }
  for (int32_t id = 0; id < ta.vocab_size(); ++id) {
    if (ta.IdToToken(id) != tb.IdToToken(id)) {
      return differs(absl::StrCat("token ", id).c_str(), ta.IdToToken(id).substr(0, 20),
                     tb.IdToToken(id).substr(0, 20));
    }
  }
  return absl::OkStatus();
}

WeightComparison CompareWeights(const BertConfig& config, const BertWeights& a,
                                const BertWeights& b) {
  WeightComparison out;
  std::vector<TensorChange>& t = out.tensors;
  AddTensor(-1, "word_embeddings", "weight", a.word_embeddings, b.word_embeddings, &t);
  AddTensor(-1, "position_embeddings", "weight", a.position_embeddings, b.position_embeddings, &t);
  AddTensor(-1, "token_type_embeddings", "weight", a.token_type_embeddings, b.token_type_embeddings,
            &t);
  AddTensor(-1, "embedding_norm", "weight", a.embedding_norm_gamma, b.embedding_norm_gamma, &t);
  AddTensor(-1, "embedding_norm", "bias", a.embedding_norm_beta, b.embedding_norm_beta, &t);
  AddTensor(-1, "relative_attention_bias", "weight", a.relative_attention_bias,
            b.relative_attention_bias, &t);
  const int64_t H = config.hidden_size;
  const int64_t d = config.head_dim();
  static const char* const kQkv[3] = {"query", "key", "value"};
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights& la = a.layers[l];
    const LayerWeights& lb = b.layers[l];
    const int layer = static_cast<int>(l);
    // The fused (3H, H) QKV weight and (3H) bias: rows [0,H) query, [H,2H) key, [2H,3H) value.
    for (int part = 0; part < 3; ++part) {
      t.push_back(Change(layer, kQkv[part], "weight", la.qkv_weight.data() + part * H * H,
                         lb.qkv_weight.data() + part * H * H, H * H));
      t.push_back(Change(layer, kQkv[part], "bias", la.qkv_bias.data() + part * H,
                         lb.qkv_bias.data() + part * H, H));
    }
    AddTensor(layer, "attention_output", "weight", la.attn_output_weight, lb.attn_output_weight,
              &t);
    AddTensor(layer, "attention_output", "bias", la.attn_output_bias, lb.attn_output_bias, &t);
    AddTensor(layer, "attention_norm", "weight", la.attn_norm_gamma, lb.attn_norm_gamma, &t);
    AddTensor(layer, "attention_norm", "bias", la.attn_norm_beta, lb.attn_norm_beta, &t);
    AddTensor(layer, "ffn_in", "weight", la.ffn_in_weight, lb.ffn_in_weight, &t);
    AddTensor(layer, "ffn_in", "bias", la.ffn_in_bias, lb.ffn_in_bias, &t);
    AddTensor(layer, "ffn_out", "weight", la.ffn_out_weight, lb.ffn_out_weight, &t);
    AddTensor(layer, "ffn_out", "bias", la.ffn_out_bias, lb.ffn_out_bias, &t);
    AddTensor(layer, "ffn_norm", "weight", la.ffn_norm_gamma, lb.ffn_norm_gamma, &t);
    AddTensor(layer, "ffn_norm", "bias", la.ffn_norm_beta, lb.ffn_norm_beta, &t);
    for (int h = 0; h < config.num_attention_heads; ++h) {
      HeadWeightChange head;
      head.layer = layer;
      head.head = h;
      double* const targets[3] = {&head.query, &head.key, &head.value};
      for (int part = 0; part < 3; ++part) {
        const int64_t offset = (part * H + h * d) * H;  // (d, H) rows of this head
        double norm_a, norm_diff;
        DiffNorms(la.qkv_weight.data() + offset, lb.qkv_weight.data() + offset, d * H, &norm_a,
                  &norm_diff);
        *targets[part] = Relative(norm_a, norm_diff);
      }
      out.heads.push_back(head);
    }
  }
  return out;
}

bool AddHeadChange(const ClassificationHead& a, const ClassificationHead& b,
                   WeightComparison* comparison) {
  if (a.num_labels() == 0 || a.weight.shape() != b.weight.shape()) return false;
  AddTensor(-1, "head", "weight", a.weight, b.weight, &comparison->tensors);
  AddTensor(-1, "head", "bias", a.bias, b.bias, &comparison->tensors);
  return true;
}

absl::StatusOr<ProbeComparison> CompareOnProbes(const Model& a, const Model& b,
                                                const std::vector<SequenceInput>& probes,
                                                const std::function<bool()>& yield,
                                                int chunk_sequences) {
  if (probes.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("comparing on probes needs at least 2 texts, got ", probes.size()));
  }
  const BertConfig& config = a.config();
  const int L = config.num_hidden_layers;
  const int heads = config.num_attention_heads;
  const int64_t H = config.hidden_size;
  const int n = static_cast<int>(probes.size());
  ProbeComparison out;
  out.num_layers = L;
  out.num_heads = heads;
  out.probes = n;
  out.attention_js.assign(static_cast<size_t>(L) * heads, 0.0);
  ForwardOptions forward = a.DefaultForwardOptions();
  forward.pool = true;
  forward.normalize = true;
  for (int l = 0; l < L; ++l) forward.attention_layers.push_back(l);
  forward.attention_probs = true;
  std::vector<float> emb_a(static_cast<size_t>(n) * H), emb_b(static_cast<size_t>(n) * H);
  for (int begin = 0, end = 0; begin < n; begin = end) {
    if (yield && yield()) return absl::CancelledError("the comparison was cancelled");
    // Up to chunk_sequences probes whose attention maps (sum of T^2 per layer and head) stay
    // within kChunkAttentionCells: a chunk's maps take at most ~10 MB per model at MiniLM's
    // 72 layer-heads, more only for one probe longer than 181 tokens alone.
    int64_t cells = 0;
    end = begin;
    while (end < n && end - begin < chunk_sequences) {
      const int64_t T = static_cast<int64_t>(probes[end].token_ids.size());
      if (end > begin && cells + T * T > kChunkAttentionCells) break;
      cells += T * T;
      ++end;
    }
    const std::vector<SequenceInput> chunk(probes.begin() + begin, probes.begin() + end);
    absl::StatusOr<ForwardResult> ra = a.Forward(chunk, forward);
    if (!ra.ok()) return ra.status();
    absl::StatusOr<ForwardResult> rb = b.Forward(chunk, forward);
    if (!rb.ok()) return rb.status();
    std::copy(ra->pooled.data(), ra->pooled.data() + (end - begin) * H, emb_a.data() + begin * H);
    std::copy(rb->pooled.data(), rb->pooled.data() + (end - begin) * H, emb_b.data() + begin * H);
    for (int l = 0; l < L; ++l) {
      const LayerAttention& la = *ra->Attention(l);
      const LayerAttention& lb = *rb->Attention(l);
      for (int s = 0; s < end - begin; ++s) {
        const Tensor& pa = la.sequences[s].probs;  // (heads, T, T)
        const Tensor& pb = lb.sequences[s].probs;
        const int64_t T = pa.shape()[1];
        for (int h = 0; h < heads; ++h) {
          double sum = 0;
          for (int64_t i = 0; i < T; ++i) {
            const int64_t row = (h * T + i) * T;
            sum += JensenShannon(pa.data() + row, pb.data() + row, T);
          }
          out.attention_js[static_cast<size_t>(l) * heads + h] += sum;
        }
        if (l == 0) out.attention_rows += T;
      }
    }
  }
  for (double& js : out.attention_js) js /= static_cast<double>(out.attention_rows);

  // Drift: cosine of the same text (the embeddings are normalised; renormalised in double).
  auto norm = [&](const std::vector<float>& e, int i) {
    return std::sqrt(Dot(e.data() + i * H, e.data() + i * H, H));
  };
  std::vector<double> norm_a(n), norm_b(n);
  for (int i = 0; i < n; ++i) {
    norm_a[i] = norm(emb_a, i);
    norm_b[i] = norm(emb_b, i);
  }
  auto cosine = [&](const std::vector<float>& x, const std::vector<double>& nx, int i,
                    const std::vector<float>& y, const std::vector<double>& ny, int j) {
    const double denominator = nx[i] * ny[j];
    return denominator > 0 ? Dot(x.data() + i * H, y.data() + j * H, H) / denominator : 0.0;
  };
  out.cosines.resize(n);
  out.min_cosine = 2;
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    out.cosines[i] = std::min(1.0, cosine(emb_a, norm_a, i, emb_b, norm_b, i));
    sum += out.cosines[i];
    if (out.cosines[i] < out.min_cosine) {
      out.min_cosine = out.cosines[i];
      out.min_cosine_probe = i;
    }
  }
  out.mean_cosine = sum / n;

  // Neighbourhoods: the probe x probe similarity matrices of A and of B.
  std::vector<double> sim_a(static_cast<size_t>(n) * n), sim_b(static_cast<size_t>(n) * n);
  std::vector<double> upper_a, upper_b;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      sim_a[static_cast<size_t>(i) * n + j] = cosine(emb_a, norm_a, i, emb_a, norm_a, j);
      sim_b[static_cast<size_t>(i) * n + j] = cosine(emb_b, norm_b, i, emb_b, norm_b, j);
      if (j > i) {
        upper_a.push_back(sim_a[static_cast<size_t>(i) * n + j]);
        upper_b.push_back(sim_b[static_cast<size_t>(i) * n + j]);
      }
    }
  }
  // 0 when either side is constant (no order to preserve), as for too few probes.
  const absl::StatusOr<double> rho = SpearmanCorrelation(upper_a, upper_b);
  out.spearman = rho.ok() && std::isfinite(*rho) ? *rho : 0.0;
  out.neighbours_k = std::min(10, n - 1);
  double overlap = 0;
  for (int i = 0; i < n; ++i) {
    const std::vector<int> na = TopNeighbours(sim_a, n, i, out.neighbours_k);
    const std::vector<int> nb = TopNeighbours(sim_b, n, i, out.neighbours_k);
    std::vector<int> common;
    std::set_intersection(na.begin(), na.end(), nb.begin(), nb.end(), std::back_inserter(common));
    overlap += static_cast<double>(common.size()) / out.neighbours_k;
  }
  out.neighbour_overlap = overlap / n;
  return out;
}

ReindexVerdict DecideReindex(const ProbeComparison& probes) {
  ReindexVerdict verdict;
  std::vector<std::string> reasons;
  if (probes.min_cosine < kMixMinCosine) {
    reasons.push_back(absl::StrFormat("min cosine %.4f < %.2f (probe %d; mean %.4f)",
                                      probes.min_cosine, kMixMinCosine, probes.min_cosine_probe,
                                      probes.mean_cosine));
  }
  if (probes.neighbour_overlap < kMixMinOverlap) {
    reasons.push_back(absl::StrFormat("top-%d neighbour overlap %.3f < %.2f", probes.neighbours_k,
                                      probes.neighbour_overlap, kMixMinOverlap));
  }
  verdict.can_mix = reasons.empty();
  if (verdict.can_mix) {
    verdict.text = absl::StrFormat(
        "vectors from A can be mixed with B (min cosine %.4f >= %.2f, top-%d overlap %.3f >= "
        "%.2f, Spearman %.4f)",
        probes.min_cosine, kMixMinCosine, probes.neighbours_k, probes.neighbour_overlap,
        kMixMinOverlap, probes.spearman);
  } else {
    verdict.text = absl::StrCat("re-index: ", absl::StrJoin(reasons, "; "),
                                absl::StrFormat(" (Spearman %.4f)", probes.spearman));
  }
  return verdict;
}

}  // namespace attn
