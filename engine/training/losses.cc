#include "engine/training/losses.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace attn {
namespace {

// Rows of x divided by n = max(|x|, eps), kept in double for the backward.
struct NormalizedRows {
  int64_t rows = 0, cols = 0;
  std::vector<double> unit;   // (rows, cols) x / n
  std::vector<double> norm;   // (rows) n = max(|x|, eps)
  std::vector<bool> clamped;  // (rows) |x| <= eps: n is the constant eps

  const double* row(int64_t r) const { return unit.data() + r * cols; }
};

NormalizedRows NormalizeForward(const float* x, int64_t rows, int64_t cols) {
  NormalizedRows out;
  out.rows = rows;
  out.cols = cols;
  out.unit.resize(rows * cols);
  out.norm.resize(rows);
  out.clamped.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double sq = 0.0;
    for (int64_t k = 0; k < cols; ++k) sq += double{xr[k]} * xr[k];
    const double raw = std::sqrt(sq);
    out.clamped[r] = !(raw > kCosineEps);
    out.norm[r] = out.clamped[r] ? kCosineEps : raw;
    for (int64_t k = 0; k < cols; ++k) out.unit[r * cols + k] = xr[k] / out.norm[r];
  }
  return out;
}

// Undoes x̂ = x / max(|x|, eps): given dunit = dL/dx̂ (rows, cols), writes dL/dx.
//   unclamped: dx = (dx̂ - x̂ (x̂ . dx̂)) / |x|      clamped: dx = dx̂ / eps
void NormalizeBackward(const NormalizedRows& fwd, const std::vector<double>& dunit, float* dx) {
  const int64_t cols = fwd.cols;
  for (int64_t r = 0; r < fwd.rows; ++r) {
    const double* u = fwd.row(r);
    const double* g = dunit.data() + r * cols;
    double radial = 0.0;
    if (!fwd.clamped[r]) {
      for (int64_t k = 0; k < cols; ++k) radial += u[k] * g[k];
    }
    for (int64_t k = 0; k < cols; ++k) {
      dx[r * cols + k] = static_cast<float>((g[k] - u[k] * radial) / fwd.norm[r]);
    }
  }
}

double Dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

// In place: row (cols) -> softmax(row); returns logsumexp(row).
double SoftmaxInPlace(double* row, int64_t cols) {
  const double mx = *std::max_element(row, row + cols);
  double sum = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  for (int64_t j = 0; j < cols; ++j) row[j] /= sum;
  return mx + std::log(sum);
}

absl::Status CheckPointer(const void* p, const char* what) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrFormat("%s is null", what));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> MultipleNegativesRankingLoss(const float* anchors, int64_t num_anchors,
                                                    const float* candidates, int64_t num_candidates,
                                                    int64_t hidden, const MnrlOptions& options,
                                                    float* d_anchors, float* d_candidates) {
  const int64_t N = num_anchors, C = num_candidates, H = hidden;
  if (N <= 0 || H <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MNRL needs at least one anchor and hidden > 0, got %d anchors, hidden %d", N, H));
  }
  if (C < N || C % N != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MNRL candidates must be the %d positives followed by whole blocks of %d hard "
        "negatives (C = k * N), got C = %d",
        N, N, C));
  }
  if (!std::isfinite(options.scale)) {
    return absl::InvalidArgumentError("MNRL scale must be finite");
  }
  for (auto [p, what] : {std::pair<const void*, const char*>{anchors, "anchors"},
                         {candidates, "candidates"},
                         {d_anchors, "d_anchors"},
                         {d_candidates, "d_candidates"}}) {
    if (absl::Status s = CheckPointer(p, what); !s.ok()) return s;
  }

  const NormalizedRows a = NormalizeForward(anchors, N, H);     // â (N, H)
  const NormalizedRows c = NormalizeForward(candidates, C, H);  // ĉ (C, H)

  // scores (N, C) = scale * â ĉ^T, turned row by row into probabilities.
  std::vector<double> probs(N * C);
  double loss = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    double* row = probs.data() + i * C;
    for (int64_t j = 0; j < C; ++j) row[j] = options.scale * Dot(a.row(i), c.row(j), H);
    const double target_score = row[i];
    loss += SoftmaxInPlace(row, C) - target_score;  // CE = logsumexp - score of the positive
  }
  loss /= N;

  // Backward of loss = mean_i CE: dscores_ij = (p_ij - [i == j]) / N, kept in `probs`.
  for (int64_t i = 0; i < N; ++i) {
    double* row = probs.data() + i * C;
    row[i] -= 1.0;
    for (int64_t j = 0; j < C; ++j) row[j] /= N;
  }
  // Backward of scores = scale * â ĉ^T:  dâ = scale * dscores ĉ,  dĉ = scale * dscores^T â.
  std::vector<double> da(N * H, 0.0), dc(C * H, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const double g = options.scale * probs[i * C + j];
      const double* ci = c.row(j);
      const double* ai = a.row(i);
      double* dai = da.data() + i * H;
      double* dcj = dc.data() + j * H;
      for (int64_t k = 0; k < H; ++k) {
        dai[k] += g * ci[k];
        dcj[k] += g * ai[k];
      }
    }
  }
  NormalizeBackward(a, da, d_anchors);
  NormalizeBackward(c, dc, d_candidates);
  return loss;
}

absl::StatusOr<double> CosineSimilarityLoss(const float* u, const float* v, int64_t hidden,
                                            absl::Span<const float> labels, float* d_u,
                                            float* d_v) {
  const int64_t N = static_cast<int64_t>(labels.size()), H = hidden;
  if (N <= 0 || H <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CosineSimilarityLoss needs at least one pair and hidden > 0, got %d labels, hidden %d", N,
        H));
  }
  for (auto [p, what] :
       {std::pair<const void*, const char*>{u, "u"}, {v, "v"}, {d_u, "d_u"}, {d_v, "d_v"}}) {
    if (absl::Status s = CheckPointer(p, what); !s.ok()) return s;
  }
  for (int64_t i = 0; i < N; ++i) {
    if (!std::isfinite(labels[i])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CosineSimilarityLoss label %d is not finite (%f)", i, labels[i]));
    }
  }

  const NormalizedRows un = NormalizeForward(u, N, H);  // û (N, H)
  const NormalizedRows vn = NormalizeForward(v, N, H);  // v̂ (N, H)
  std::vector<double> du(N * H), dv(N * H);
  double loss = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const double diff = Dot(un.row(i), vn.row(i), H) - labels[i];  // cos_i - label_i
    loss += diff * diff;
    // Backward of mean (cos - label)^2 then of cos = û . v̂.
    const double dcos = 2.0 * diff / N;
    for (int64_t k = 0; k < H; ++k) {
      du[i * H + k] = dcos * vn.row(i)[k];
      dv[i * H + k] = dcos * un.row(i)[k];
    }
  }
  NormalizeBackward(un, du, d_u);
  NormalizeBackward(vn, dv, d_v);
  return loss / N;
}

ClassificationHead MakeClassificationHead(int64_t num_labels, int64_t hidden, HeadInit init,
                                          uint64_t seed, float normal_std) {
  ClassificationHead head{Tensor({num_labels, hidden}), Tensor({num_labels})};
  std::mt19937_64 rng(seed);
  if (init == HeadInit::kXavierUniform) {
    const float bound = std::sqrt(6.0f / static_cast<float>(hidden + num_labels));
    std::uniform_real_distribution<float> dist(-bound, bound);
    for (float& w : head.weight.values()) w = dist(rng);
  } else {
    std::normal_distribution<float> dist(0.0f, normal_std);
    for (float& w : head.weight.values()) w = dist(rng);
  }
  return head;  // bias stays 0, as both PyTorch recipes
}

ClassificationHead MakePairHead(int64_t num_labels, int64_t hidden, float scale) {
  ClassificationHead head{Tensor({num_labels, hidden}), Tensor({num_labels})};
  for (int64_t k = 0; k < num_labels; ++k) {
    const float row = scale * (static_cast<float>(k) / static_cast<float>(num_labels - 1) - 0.5f);
    std::fill(head.weight.data() + k * hidden, head.weight.data() + (k + 1) * hidden, row);
  }
  return head;
}

ClassificationHead ZerosLike(const ClassificationHead& head) {
  return ClassificationHead{Tensor(head.weight.shape()), Tensor(head.bias.shape())};
}

void ClassificationHeadForward(const ClassificationHead& head, const float* pooled, int64_t rows,
                               float* logits) {
  const int64_t K = head.num_labels(), H = head.hidden_size();
  const float* w = head.weight.data();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      double s = head.bias.data()[k];
      for (int64_t h = 0; h < H; ++h) s += double{pooled[i * H + h]} * w[k * H + h];
      logits[i * K + k] = static_cast<float>(s);
    }
  }
}

absl::StatusOr<double> ClassificationHeadLoss(const ClassificationHead& head, const float* pooled,
                                              absl::Span<const int64_t> labels, float* d_pooled,
                                              ClassificationHead* d_head) {
  const int64_t N = static_cast<int64_t>(labels.size());
  const int64_t K = head.num_labels(), H = head.hidden_size();
  if (K <= 0 || H <= 0 || head.bias.rank() != 1 || head.bias.dim(0) != K) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "classification head must have weight (K, H) and bias (K), got weight %s, bias %s",
        head.weight.ShapeString(), head.bias.ShapeString()));
  }
  if (N <= 0) return absl::InvalidArgumentError("classification loss needs at least one label");
  for (auto [p, what] : {std::pair<const void*, const char*>{pooled, "pooled"},
                         {d_pooled, "d_pooled"},
                         {d_head, "d_head"}}) {
    if (absl::Status s = CheckPointer(p, what); !s.ok()) return s;
  }
  for (int64_t i = 0; i < N; ++i) {
    if (labels[i] < 0 || labels[i] >= K) {
      return absl::InvalidArgumentError(
          absl::StrFormat("classification label %d is %d, must be in [0, %d)", i, labels[i], K));
    }
  }

  const float* w = head.weight.data();
  const float* b = head.bias.data();
  // logits (N, K) = pooled . W^T + b, turned row by row into probabilities.
  std::vector<double> probs(N * K);
  double loss = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    double* row = probs.data() + i * K;
    for (int64_t k = 0; k < K; ++k) {
      double s = b[k];
      for (int64_t h = 0; h < H; ++h) s += double{pooled[i * H + h]} * w[k * H + h];
      row[k] = s;
    }
    const double target_logit = row[labels[i]];
    loss += SoftmaxInPlace(row, K) - target_logit;
  }
  loss /= N;

  // dlogits_ik = (p_ik - [k == label_i]) / N, kept in `probs`.
  for (int64_t i = 0; i < N; ++i) {
    double* row = probs.data() + i * K;
    row[labels[i]] -= 1.0;
    for (int64_t k = 0; k < K; ++k) row[k] /= N;
  }
  // Backward of logits = pooled . W^T + b.
  if (d_head->weight.shape() != head.weight.shape() || d_head->bias.shape() != head.bias.shape()) {
    *d_head = ZerosLike(head);
  }
  std::vector<double> dw(K * H, 0.0), db(K, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const double* g = probs.data() + i * K;
    for (int64_t h = 0; h < H; ++h) {
      double s = 0.0;  // dpooled_ih = sum_k dlogits_ik W_kh
      for (int64_t k = 0; k < K; ++k) s += g[k] * w[k * H + h];
      d_pooled[i * H + h] = static_cast<float>(s);
    }
    for (int64_t k = 0; k < K; ++k) {
      db[k] += g[k];  // dbias_k = sum_i dlogits_ik
      for (int64_t h = 0; h < H; ++h) dw[k * H + h] += g[k] * pooled[i * H + h];
    }
  }
  for (int64_t e = 0; e < K * H; ++e) d_head->weight.data()[e] = static_cast<float>(dw[e]);
  for (int64_t k = 0; k < K; ++k) d_head->bias.data()[k] = static_cast<float>(db[k]);
  return loss;
}

}  // namespace attn
