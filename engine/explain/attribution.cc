#include "engine/explain/attribution.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/dnnl_context.h"
#include "engine/encoder.h"
#include "engine/ops/linear.h"
#include "engine/ops/pooling.h"
#include "engine/training/encoder_training.h"

namespace attn {
namespace {

constexpr float kNormClamp = 1e-12f;  // torch.nn.functional.normalize's eps (L2NormalizeRows)

// One text's hidden states at the attribution layer, and a run of path points through the
// encoder (a chunk of the path, or its two end points).
struct TextPath {
  int64_t T = 0;              // tokens
  int m = 0;                  // steps
  Tensor x, r;                // (T, H) hidden states of the text and of its baseline
  std::vector<float> alphas;  // the points of this run: x(alpha) = r + alpha (x - r)
  TrainingForward forward;    // one sequence per alpha
  Tensor pooled;              // (alphas, H) before normalisation
  Tensor embedding;           // (alphas, H) f = normalize(pooled) (or pooled when not)
};

// The yield point of AttributionOptions: CANCELLED when the caller abandons the call.
absl::Status Checkpoint(const std::function<bool()>& checkpoint) {
  if (checkpoint && checkpoint()) return absl::CancelledError("attribution stopped by its caller");
  return absl::OkStatus();
}

float Dot(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

const Tensor& LayerInput(const TrainingForward& f, int layer) {
  return layer < static_cast<int>(f.layers.size()) ? f.layers[layer].input : f.output;
}

// Hidden states at `layer` of the text and of its baseline (one training forward of both).
absl::Status HiddenAtLayer(const BertConfig& config, const BertWeights& weights,
                           const WordPieceTokenizer& tokenizer, const Encoding& e,
                           const AttributionOptions& options, TextPath* path) {
  const int64_t T = e.size(), H = config.hidden_size;
  SequenceInput input{e.ids, e.type_ids};
  SequenceInput baseline = input;
  const int32_t filler = options.baseline == AttributionBaseline::kMaskTokens
                             ? tokenizer.TokenToId(tokenizer.options().mask_token)
                             : tokenizer.pad_id();
  if (filler < 0) return absl::FailedPreconditionError("the vocabulary has no [MASK] token");
  for (int64_t i = 0; i < T; ++i) {
    if (e.special_tokens_mask.empty() || !e.special_tokens_mask[i]) baseline.token_ids[i] = filler;
  }
  absl::StatusOr<TrainingForward> forward =
      EncoderForwardTraining(config, weights, {input, baseline}, TrainingForwardOptions{});
  if (!forward.ok()) return forward.status();
  const float* hidden = LayerInput(*forward, options.layer).data();
  path->x = Tensor({T, H});
  path->r = Tensor({T, H});  // zeros for kZero
  std::copy_n(hidden, T * H, path->x.data());
  if (options.baseline != AttributionBaseline::kZero) {
    std::copy_n(hidden + T * H, T * H, path->r.data());
  }
  return absl::OkStatus();
}

// Runs path->alphas as one packed batch and pools them.
absl::Status ForwardPath(const BertConfig& config, const BertWeights& weights,
                         const SentenceEmbeddingConfig& pooling, int layer, TextPath* path) {
  const int64_t T = path->T, H = config.hidden_size;
  const int64_t S = static_cast<int64_t>(path->alphas.size());
  std::vector<int64_t> offsets(S + 1);
  for (int64_t s = 0; s <= S; ++s) offsets[s] = s * T;
  Tensor hidden({S * T, H});  // x(alpha) = r + alpha (x - r)
  for (int64_t s = 0; s < S; ++s) {
    const float alpha = path->alphas[s];
    float* out = hidden.data() + s * T * H;
    for (int64_t k = 0; k < T * H; ++k) {
      out[k] = path->r.data()[k] + alpha * (path->x.data()[k] - path->r.data()[k]);
    }
  }
  if (absl::Status status = EncoderForwardTrainingFromHidden(
          config, weights, offsets, layer, hidden.data(), TrainingForwardOptions{}, &path->forward);
      !status.ok()) {
    return status;
  }
  path->pooled = Tensor({S, H});
  PoolForward(path->forward.output.data(), H, offsets, pooling.pooling, path->pooled.data());
  path->embedding = path->pooled;
  if (pooling.normalize) L2NormalizeRows(path->embedding.data(), S, H);
  return absl::OkStatus();
}

// d s / d (hidden states at the layer) at every point of the run, s = f(x(alpha)) . other
// (other fixed); (alphas T, H).
absl::StatusOr<Tensor> PathGradient(const BertConfig& config, const BertWeights& weights,
                                    const SentenceEmbeddingConfig& pooling, const TextPath& path,
                                    const float* other) {
  const int64_t T = path.T, H = config.hidden_size;
  const int64_t S = static_cast<int64_t>(path.alphas.size());
  Tensor d_pooled({S, H});
  for (int64_t s = 0; s < S; ++s) std::copy_n(other, H, d_pooled.data() + s * H);
  if (pooling.normalize) {
    L2NormalizeBackward(path.pooled.data(), d_pooled.data(), S, H, d_pooled.data());
  }
  Tensor d_output({S * T, H});
  PoolBackward(path.forward.output.data(), H, path.forward.seq_offsets, pooling.pooling,
               d_pooled.data(), d_output.data());
  Tensor d_input({S * T, H});
  BackwardWorkspace workspace;
  if (absl::Status status = EncoderInputBackward(config, weights, path.forward, d_output.data(),
                                                 d_input.data(), &workspace);
      !status.ok()) {
    return status;
  }
  return d_input;
}

// ---------------------------------------------------------------------------------------------
// Forward-mode (Jacobian-vector products) through layers [layer, L) of a saved training forward.
// A batch of n tangents, each a (T, H) perturbation of one path sequence `seq[t]`, is carried
// through every op's linearisation at that sequence's saved activations:
//   linear      dy = dx . W^T                        (the bias has no tangent)
//   attention   dS = (dQ K^T + Q dK^T) / sqrt(d);  dP = P * (dS - rowsum(P * dS));
//               dC = dP V + P dV                      (per head, with the saved P)
//   LayerNorm   dy = gamma * rstd * (dx - mean(dx) - xhat * mean(dx * xhat))
//   GELU        dy = gelu'(pre) * dx,  gelu'(x) = Phi(x) + x phi(x)
//   residual    d(x + y) = dx + dy
// Rows of the tangent batch: tangent t, token i at t * T + i.

void LayerNormJvp(const float* x, const float* mean, const float* variance, const Tensor& gamma,
                  float eps, const std::vector<int64_t>& primal_row, int64_t rows, int64_t H,
                  float* d) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t p = primal_row[row];
    const float mu = mean[p], rstd = 1.0f / std::sqrt(variance[p] + eps);
    const float* xp = x + p * H;
    float* dr = d + row * H;
    double sum_d = 0, sum_dx = 0;
    for (int64_t c = 0; c < H; ++c) {
      sum_d += dr[c];
      sum_dx += dr[c] * (xp[c] - mu) * rstd;
    }
    const float mean_d = static_cast<float>(sum_d / H), mean_dx = static_cast<float>(sum_dx / H);
    for (int64_t c = 0; c < H; ++c) {
      const float xhat = (xp[c] - mu) * rstd;
      dr[c] = gamma.data()[c] * rstd * (dr[c] - mean_d - xhat * mean_dx);
    }
  }
}

void AttentionJvp(const BertConfig& config, const float* qkv,
                  const std::vector<const float*>& probs, const std::vector<int64_t>& seq,
                  int64_t T, const float* dqkv, float* dcontext) {
  const int64_t heads = config.num_attention_heads, d = config.head_dim(), H = config.hidden_size,
                n = static_cast<int64_t>(seq.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
  {
    std::vector<float> dS(T * T);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = seq[t] * T;  // primal rows of this tangent's sequence
        const float* P = probs[seq[t]] + h * T * T;
        auto Q = [&](int64_t i) { return qkv + (base + i) * 3 * H + h * d; };
        auto K = [&](int64_t i) { return qkv + (base + i) * 3 * H + H + h * d; };
        auto V = [&](int64_t i) { return qkv + (base + i) * 3 * H + 2 * H + h * d; };
        auto dQ = [&](int64_t i) { return dqkv + (t * T + i) * 3 * H + h * d; };
        auto dK = [&](int64_t i) { return dqkv + (t * T + i) * 3 * H + H + h * d; };
        auto dV = [&](int64_t i) { return dqkv + (t * T + i) * 3 * H + 2 * H + h * d; };
        for (int64_t i = 0; i < T; ++i) {
          const float* q = Q(i);
          const float* dq = dQ(i);
          float weighted = 0;
          for (int64_t j = 0; j < T; ++j) {
            const float* k = K(j);
            const float* dk = dK(j);
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t c = 0; c < d; ++c) s += dq[c] * k[c] + q[c] * dk[c];
            dS[i * T + j] = s * scale;
            weighted += P[i * T + j] * dS[i * T + j];
          }
          float* out = dcontext + (t * T + i) * H + h * d;
          std::fill_n(out, d, 0.0f);
          for (int64_t j = 0; j < T; ++j) {
            const float p = P[i * T + j];
            const float dp = p * (dS[i * T + j] - weighted);
            const float* v = V(j);
            const float* dv = dV(j);
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) out[c] += dp * v[c] + p * dv[c];
          }
        }
      }
    }
  }
}

// Pushes the tangents `dx` ((n T, H), tangent t perturbing path sequence seq[t]) to the change of
// the sentence embedding f of that sequence: returns (n, H).
absl::StatusOr<Tensor> EmbeddingJvp(const BertConfig& config, const BertWeights& weights,
                                    const SentenceEmbeddingConfig& pooling, const TextPath& path,
                                    int layer, const std::vector<int64_t>& seq, Tensor dx,
                                    ExecContext& ctx, const std::function<bool()>& checkpoint) {
  const TrainingForward& f = path.forward;
  const int64_t T = path.T, H = config.hidden_size, I = config.intermediate_size;
  const int64_t n = static_cast<int64_t>(seq.size()), rows = n * T;
  const float eps = config.layer_norm_eps;
  std::vector<int64_t> primal_row(rows);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < T; ++i) primal_row[t * T + i] = seq[t] * T + i;
  }
  const Tensor zero_3h({3 * H}), zero_h({H}), zero_i({I});
  Tensor dqkv({rows, 3 * H}), dcontext({rows, H}), dffn({rows, I});
  for (int l = layer; l < config.num_hidden_layers; ++l) {
    if (absl::Status status = Checkpoint(checkpoint); !status.ok()) return status;
    const LayerWeights& w = weights.layers[l];
    const LayerActivations& a = f.layers[l];
    // qkv = x W_qkv^T + b  ->  dqkv = dx W_qkv^T
    LinearForward(ctx, dx.data(), rows, w.qkv_weight, zero_3h, LinearEpilogue::kNone, dqkv.data());
    std::vector<const float*> probs;
    for (const Tensor& p : a.probs) probs.push_back(p.data());
    AttentionJvp(config, a.qkv.data(), probs, seq, T, dqkv.data(), dcontext.data());
    // attn_sum = x + context W_o^T + b_o;  attn_out = LayerNorm(attn_sum)
    LinearForward(ctx, dcontext.data(), rows, w.attn_output_weight, zero_h,
                  LinearEpilogue::kAccumulate, dx.data());
    LayerNormJvp(a.attn_sum.data(), a.attn_mean.data(), a.attn_variance.data(), w.attn_norm_gamma,
                 eps, primal_row, rows, H, dx.data());
    // Between the halves of a layer too: a batch of 4096 tangent rows is ~7 GFLOP a layer, and
    // Encode calls queued meanwhile wait for the next checkpoint.
    if (absl::Status status = Checkpoint(checkpoint); !status.ok()) return status;
    // ffn_pre = attn_out W_i^T + b_i;  ffn_act = gelu(ffn_pre)
    LinearForward(ctx, dx.data(), rows, w.ffn_in_weight, zero_i, LinearEpilogue::kNone,
                  dffn.data());
    const float* pre = a.ffn_pre.data();
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const float* xp = pre + primal_row[row] * I;
      float* dr = dffn.data() + row * I;
      for (int64_t c = 0; c < I; ++c) {
        const float x = xp[c];
        const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
        const float pdf = 0.39894228040143268f * std::exp(-0.5f * x * x);
        dr[c] *= cdf + x * pdf;
      }
    }
    // ffn_sum = attn_out + ffn_act W_f^T + b_f;  output = LayerNorm(ffn_sum)
    LinearForward(ctx, dffn.data(), rows, w.ffn_out_weight, zero_h, LinearEpilogue::kAccumulate,
                  dx.data());
    LayerNormJvp(a.ffn_sum.data(), a.ffn_mean.data(), a.ffn_variance.data(), w.ffn_norm_gamma, eps,
                 primal_row, rows, H, dx.data());
  }
  // pooled = pool(output): linear in the hidden states (mean, CLS).
  std::vector<int64_t> offsets(n + 1);
  for (int64_t t = 0; t <= n; ++t) offsets[t] = t * T;
  Tensor d_embedding({n, H});
  PoolForward(dx.data(), H, offsets, pooling.pooling, d_embedding.data());
  if (pooling.normalize) {
    // f = p / max(|p|, c)  ->  df = (dp - f (f . dp)) / max(|p|, c)
    for (int64_t t = 0; t < n; ++t) {
      const float* p = path.pooled.data() + seq[t] * H;
      const float* e = path.embedding.data() + seq[t] * H;
      float* dp = d_embedding.data() + t * H;
      const float norm = std::max(std::sqrt(Dot(p, p, H)), kNormClamp);
      const float radial = Dot(e, dp, H);
      for (int64_t c = 0; c < H; ++c) dp[c] = (dp[c] - e[c] * radial) / norm;
    }
  }
  return d_embedding;
}

// u (T, H) += (1/m) sum over the run's points of J_f(x(alpha))[:, i] (x_i - r_i), batched over
// (point, token i).
absl::Status AddIntegratedJacobianColumns(const BertConfig& config, const BertWeights& weights,
                                          const SentenceEmbeddingConfig& pooling,
                                          const TextPath& path, int layer,
                                          const std::function<bool()>& checkpoint, Tensor* u) {
  const int64_t T = path.T, H = config.hidden_size, m = path.m;
  const int64_t per_batch = std::max<int64_t>(1, kJvpBatchRows / T);
  ExecContext ctx;
  const int64_t total = static_cast<int64_t>(path.alphas.size()) * T;  // tangents (point, token)
  for (int64_t begin = 0; begin < total; begin += per_batch) {
    const int64_t n = std::min(per_batch, total - begin);
    std::vector<int64_t> seq(n);
    Tensor dx({n * T, H});
    for (int64_t t = 0; t < n; ++t) {
      const int64_t s = (begin + t) / T, i = (begin + t) % T;
      seq[t] = s;
      float* row = dx.data() + (t * T + i) * H;
      for (int64_t c = 0; c < H; ++c) row[c] = path.x.data()[i * H + c] - path.r.data()[i * H + c];
    }
    absl::StatusOr<Tensor> df =
        EmbeddingJvp(config, weights, pooling, path, layer, seq, std::move(dx), ctx, checkpoint);
    if (!df.ok()) return df.status();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t i = (begin + t) % T;
      for (int64_t c = 0; c < H; ++c) u->data()[i * H + c] += df->data()[t * H + c] / m;
    }
  }
  return absl::OkStatus();
}

// Path points per run so that one run's saved activations stay near kRunBytes: per token and
// layer the training forward keeps ~8 H + 2 I floats and a row of each head's probabilities.
int64_t PointsPerRun(const BertConfig& config, int64_t T, int layer) {
  constexpr int64_t kRunBytes = int64_t{256} << 20;
  const int64_t layers = std::max(1, config.num_hidden_layers - layer);
  const int64_t per_point =
      layers * T * 4 *
      (8 * config.hidden_size + 2 * config.intermediate_size + config.num_attention_heads * T);
  return std::max<int64_t>(1, kRunBytes / per_point);
}

// ---------------------------------------------------------------------------------------------

absl::Status Validate(const BertConfig& config, const SentenceEmbeddingConfig& pooling,
                      const Encoding& a, const Encoding& b, const AttributionOptions& options) {
  if (options.steps < 1 || options.steps > options.max_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps ", options.steps, " outside [1, ", options.max_steps, "]"));
  }
  if (options.layer < 0 || options.layer > config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", options.layer, " outside [0, ",
                                                   config.num_hidden_layers,
                                                   "] (0 = input embeddings)"));
  }
  if (pooling.pooling == PoolingMode::kMax) {
    return absl::InvalidArgumentError(
        "attributions need mean or CLS pooling; this model pools with max");
  }
  const bool pairwise = options.method == AttributionMethod::kPairwise;
  const int limit =
      pairwise ? std::min(options.max_tokens, options.max_pairwise_tokens) : options.max_tokens;
  for (const auto& [name, e] : {std::pair<const char*, const Encoding*>{"a", &a}, {"b", &b}}) {
    int content = 0;
    for (int i = 0; i < e->size(); ++i) {
      content += e->special_tokens_mask.empty() || !e->special_tokens_mask[i];
    }
    if (content == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text ", name, " has no tokens besides [CLS]/[SEP]: nothing to attribute"));
    }
    if (e->size() > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("text ", name, " has ", e->size(), " tokens; the limit",
                       pairwise ? " for pairwise" : "", " attributions is ", limit));
    }
  }
  return absl::OkStatus();
}

void AggregateWords(const Encoding& e, TextAttribution* t) {
  t->words = WordSpansOf(e);
  auto sum_into = [&](const std::vector<float>& tokens, std::vector<float>* words) {
    if (tokens.empty()) return;
    words->assign(t->words.size(), 0.0f);
    for (size_t w = 0; w < t->words.size(); ++w) {
      for (int32_t k = 0; k < t->words[w].num_tokens; ++k) {
        (*words)[w] += tokens[t->words[w].first_token + k];
      }
    }
  };
  sum_into(t->integrated_gradients, &t->word_integrated_gradients);
  sum_into(t->gradient_x_input, &t->word_gradient_x_input);
}

}  // namespace

int64_t AttributionCostTokens(const BertConfig& config, const AttributionOptions& options,
                              int64_t tokens_a, int64_t tokens_b) {
  const int64_t m = options.method == AttributionMethod::kGradientXInput ? 1 : options.steps;
  const int L = std::max(1, config.num_hidden_layers);
  const int64_t tail = config.num_hidden_layers - options.layer;  // layers after the point
  int64_t cost = 0;
  for (const int64_t T : {tokens_a, tokens_b}) {
    cost += 2 * T + 2 * T * tail / L;  // HiddenAtLayer (text + baseline) and the end points
    cost += 3 * m * T * tail / L;      // the path: forward + input backward
    if (options.method == AttributionMethod::kPairwise) cost += m * T * T * tail / L;
  }
  return cost;
}

std::vector<WordSpan> WordSpansOf(const Encoding& e) {
  std::vector<WordSpan> words;
  for (int i = 0; i < e.size(); ++i) {
    const std::string& token = e.tokens.size() > static_cast<size_t>(i) ? e.tokens[i] : "";
    const bool special = !e.special_tokens_mask.empty() && e.special_tokens_mask[i];
    const bool continuation = !special && token.rfind("##", 0) == 0 && !words.empty() &&
                              words.back().sequence_index == e.sequence_index[i] &&
                              words.back().char_end == e.char_start[i];
    if (continuation) {
      words.back().text += token.substr(2);
      words.back().char_end = e.char_end[i];
      ++words.back().num_tokens;
      continue;
    }
    WordSpan w;
    w.text = token;
    w.char_start = e.char_start[i];
    w.char_end = e.char_end[i];
    w.first_token = i;
    w.num_tokens = 1;
    w.sequence_index = special ? -1 : e.sequence_index[i];
    words.push_back(std::move(w));
  }
  return words;
}

absl::StatusOr<AttributionResult> ExplainSimilarity(const BertConfig& config,
                                                    const BertWeights& weights,
                                                    const SentenceEmbeddingConfig& pooling,
                                                    const WordPieceTokenizer& tokenizer,
                                                    const Encoding& a, const Encoding& b,
                                                    const AttributionOptions& options) {
  if (absl::Status status = Validate(config, pooling, a, b, options); !status.ok()) return status;
  const int64_t H = config.hidden_size;
  const bool gxi_only = options.method == AttributionMethod::kGradientXInput;
  const bool pairwise = options.method == AttributionMethod::kPairwise;
  const int m = gxi_only ? 1 : options.steps;
  // The end points of both paths first: f(x) and f(r) of each text.
  TextPath paths[2];
  const Encoding* encodings[2] = {&a, &b};
  Tensor ends[2];  // (2, H): f(x), f(r)
  for (int side = 0; side < 2; ++side) {
    TextPath& p = paths[side];
    p.T = encodings[side]->size();
    p.m = m;
    if (absl::Status s = HiddenAtLayer(config, weights, tokenizer, *encodings[side], options, &p);
        !s.ok()) {
      return s;
    }
    p.alphas = {1.0f, 0.0f};
    if (absl::Status s = ForwardPath(config, weights, pooling, options.layer, &p); !s.ok()) {
      return s;
    }
    ends[side] = p.embedding;
  }
  const float* fa = ends[0].data();
  const float* fb = ends[1].data();
  const float* fra = fa + H;
  const float* frb = fb + H;
  AttributionResult result;
  result.similarity = Dot(fa, fb, H);
  result.a.baseline_similarity = Dot(fra, fb, H);
  result.b.baseline_similarity = Dot(fa, frb, H);
  result.baselines_similarity = Dot(fra, frb, H);

  // The path points alpha_s = (m - s) / m, s = 0..m-1, in runs of bounded memory: per run the
  // gradient of s w.r.t. this text (the other held fixed) for the per-token views, and the
  // Jacobian-vector products for the pair matrix.
  TextAttribution* texts[2] = {&result.a, &result.b};
  Tensor u[2];
  float worst_error = -1;
  for (int side = 0; side < 2; ++side) {
    TextPath& p = paths[side];
    const int64_t T = p.T;
    Tensor grad_sum({T, H});   // sum over the points of d s / d x
    Tensor grad_at_x({T, H});  // at alpha = 1
    if (pairwise) u[side] = Tensor({T, H});
    const int64_t per_run = PointsPerRun(config, T, options.layer);
    for (int64_t s0 = 0; s0 < m; s0 += per_run) {
      if (absl::Status st = Checkpoint(options.checkpoint); !st.ok()) return st;
      p.alphas.clear();
      for (int64_t s = s0; s < std::min<int64_t>(m, s0 + per_run); ++s) {
        p.alphas.push_back(static_cast<float>(m - s) / static_cast<float>(m));
      }
      if (absl::Status st = ForwardPath(config, weights, pooling, options.layer, &p); !st.ok()) {
        return st;
      }
      absl::StatusOr<Tensor> grad = PathGradient(config, weights, pooling, p, side == 0 ? fb : fa);
      if (!grad.ok()) return grad.status();
      if (s0 == 0) std::copy_n(grad->data(), T * H, grad_at_x.data());
      for (size_t k = 0; k < p.alphas.size(); ++k) {
        for (int64_t e = 0; e < T * H; ++e) grad_sum.data()[e] += grad->data()[k * T * H + e];
      }
      if (pairwise) {
        if (absl::Status st = AddIntegratedJacobianColumns(
                config, weights, pooling, p, options.layer, options.checkpoint, &u[side]);
            !st.ok()) {
          return st;
        }
      }
    }
    p.forward = TrainingForward();  // release the last run's activations
    TextAttribution& t = *texts[side];
    t.gradient_x_input.assign(T, 0.0f);
    if (!gxi_only) t.integrated_gradients.assign(T, 0.0f);
    double ig_sum = 0;
    for (int64_t i = 0; i < T; ++i) {
      const float* x = p.x.data() + i * H;
      const float* r = p.r.data() + i * H;
      t.gradient_x_input[i] = Dot(x, grad_at_x.data() + i * H, H);
      if (gxi_only) continue;
      double ig = 0;
      for (int64_t c = 0; c < H; ++c) ig += (x[c] - r[c]) * grad_sum.data()[i * H + c] / m;
      t.integrated_gradients[i] = static_cast<float>(ig);
      ig_sum += ig;
    }
    if (options.method == AttributionMethod::kIntegratedGradients) {
      const float target = result.similarity - t.baseline_similarity;
      const float error = std::fabs(static_cast<float>(ig_sum) - target);
      if (error > worst_error) {
        worst_error = error;
        result.completeness_error = error;
        result.attribution_sum = static_cast<float>(ig_sum);
        result.completeness_target = target;
      }
    }
  }

  if (pairwise) {
    result.rows = paths[0].T;
    result.cols = paths[1].T;
    result.pair_matrix.assign(result.rows * result.cols, 0.0f);
    double sum = 0;
    for (int64_t i = 0; i < result.rows; ++i) {
      for (int64_t j = 0; j < result.cols; ++j) {
        const float v = Dot(u[0].data() + i * H, u[1].data() + j * H, H);
        result.pair_matrix[i * result.cols + j] = v;
        sum += v;
      }
    }
    result.attribution_sum = static_cast<float>(sum);
    result.completeness_target = result.similarity - result.a.baseline_similarity -
                                 result.b.baseline_similarity + result.baselines_similarity;
    result.completeness_error = std::fabs(result.attribution_sum - result.completeness_target);
  }

  if (options.word_level) {
    AggregateWords(a, &result.a);
    AggregateWords(b, &result.b);
    if (!result.pair_matrix.empty()) {
      const auto& wa = result.a.words;
      const auto& wb = result.b.words;
      result.word_pair_matrix.assign(wa.size() * wb.size(), 0.0f);
      for (size_t i = 0; i < wa.size(); ++i) {
        for (size_t j = 0; j < wb.size(); ++j) {
          float v = 0;
          for (int32_t r = 0; r < wa[i].num_tokens; ++r) {
            for (int32_t c = 0; c < wb[j].num_tokens; ++c) {
              v +=
                  result.pair_matrix[(wa[i].first_token + r) * result.cols + wb[j].first_token + c];
            }
          }
          result.word_pair_matrix[i * wb.size() + j] = v;
        }
      }
    }
  }
  return result;
}

}  // namespace attn
