#include "engine/training/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/ops/avx512_math.h"
#include "engine/ops/cpu_kernels.h"

namespace attn {
namespace {

// Tensors at least this large are updated by all threads (the word embeddings are 11.7M floats).
constexpr int64_t kParallelElements = 1 << 15;
// Elements per partial sum of the gradient norm.
constexpr int64_t kNormChunk = 1 << 14;

// A tensor's Hugging Face-style suffix, its accessor, and whether it is decayed.
struct LayerTensor {
  const char* suffix;
  Tensor LayerWeights::*member;
  bool decay;
  bool attention;  // part of kAttentionOnly
};

constexpr LayerTensor kLayerTensors[] = {
    {"attention.self.qkv.weight", &LayerWeights::qkv_weight, true, true},
    {"attention.self.qkv.bias", &LayerWeights::qkv_bias, false, true},
    {"attention.output.dense.weight", &LayerWeights::attn_output_weight, true, true},
    {"attention.output.dense.bias", &LayerWeights::attn_output_bias, false, true},
    {"attention.output.LayerNorm.weight", &LayerWeights::attn_norm_gamma, false, false},
    {"attention.output.LayerNorm.bias", &LayerWeights::attn_norm_beta, false, false},
    {"intermediate.dense.weight", &LayerWeights::ffn_in_weight, true, false},
    {"intermediate.dense.bias", &LayerWeights::ffn_in_bias, false, false},
    {"output.dense.weight", &LayerWeights::ffn_out_weight, true, false},
    {"output.dense.bias", &LayerWeights::ffn_out_bias, false, false},
    {"output.LayerNorm.weight", &LayerWeights::ffn_norm_gamma, false, false},
    {"output.LayerNorm.bias", &LayerWeights::ffn_norm_beta, false, false},
};

absl::Status AddEntry(std::string name, Tensor* param, Tensor* grad, bool decay,
                      std::vector<ParamEntry>* out) {
  if (param->shape() != grad->shape()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gradient of %s has shape %s, parameter has %s", name, grad->ShapeString(),
                        param->ShapeString()));
  }
  out->push_back(ParamEntry{std::move(name), param, grad, decay});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ParamEntry>> CollectTrainableParameters(BertWeights* weights,
                                                                   BertWeights* grads,
                                                                   TrainableSet set,
                                                                   ClassificationHead* head,
                                                                   ClassificationHead* head_grads) {
  if (weights == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError("weights and grads must be non-null");
  }
  if ((head == nullptr) != (head_grads == nullptr)) {
    return absl::InvalidArgumentError("head and head_grads must be given together");
  }
  if (set == TrainableSet::kHeadOnly && head == nullptr) {
    return absl::InvalidArgumentError("TrainableSet kHeadOnly needs a classification head");
  }
  if (weights->layers.size() != grads->layers.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "grads have %d layers, weights have %d", grads->layers.size(), weights->layers.size()));
  }
  std::vector<ParamEntry> out;
  if (set == TrainableSet::kAll) {
    const std::pair<const char*, Tensor BertWeights::*> embeddings[] = {
        {"embeddings.word_embeddings.weight", &BertWeights::word_embeddings},
        {"embeddings.position_embeddings.weight", &BertWeights::position_embeddings},
        {"embeddings.token_type_embeddings.weight", &BertWeights::token_type_embeddings},
        {"embeddings.LayerNorm.weight", &BertWeights::embedding_norm_gamma},
        {"embeddings.LayerNorm.bias", &BertWeights::embedding_norm_beta},
    };
    for (const auto& [name, member] : embeddings) {
      if ((weights->*member).numel() == 0) continue;  // MPNet has no token-type table
      // The three embedding matrices are decayed (sentence-transformers decays every tensor
      // whose name lacks "bias"/"LayerNorm.weight"); the LayerNorm is not.
      const bool decay = member != &BertWeights::embedding_norm_gamma &&
                         member != &BertWeights::embedding_norm_beta;
      if (auto s = AddEntry(name, &(weights->*member), &(grads->*member), decay, &out); !s.ok()) {
        return s;
      }
    }
  }
  if (set != TrainableSet::kHeadOnly && weights->relative_attention_bias.numel() > 0) {
    // MPNet's attention bias: not decayed ("bias" is in its name, sentence-transformers' rule).
    if (auto s = AddEntry("encoder.relative_attention_bias.weight",
                          &weights->relative_attention_bias, &grads->relative_attention_bias,
                          /*decay=*/false, &out);
        !s.ok()) {
      return s;
    }
  }
  if (set != TrainableSet::kHeadOnly) {
    for (size_t i = 0; i < weights->layers.size(); ++i) {
      for (const LayerTensor& t : kLayerTensors) {
        if (set == TrainableSet::kAttentionOnly && !t.attention) continue;
        if (auto s = AddEntry(absl::StrCat("encoder.layer.", i, ".", t.suffix),
                              &(weights->layers[i].*t.member), &(grads->layers[i].*t.member),
                              t.decay, &out);
            !s.ok()) {
          return s;
        }
      }
    }
  }
  if (head != nullptr) {
    if (auto s = AddEntry("classifier.weight", &head->weight, &head_grads->weight, true, &out);
        !s.ok()) {
      return s;
    }
    if (auto s = AddEntry("classifier.bias", &head->bias, &head_grads->bias, false, &out);
        !s.ok()) {
      return s;
    }
  }
  return out;
}

void ZeroGrads(absl::Span<const ParamEntry> params) {
  for (const ParamEntry& e : params) std::fill(e.grad->values().begin(), e.grad->values().end(), 0);
}

namespace {

// Adds the sum of squares of e's gradient to *sq as fixed chunks of kNormChunk elements, each
// summed in element order and added in chunk order: the same result for any thread count.
// With nonzero_rows, only those rows are read: a skipped zero adds nothing to a chunk's sum
// (x + 0.0 == x), so the result is bit-identical to the dense walk.
void AddSumOfSquares(const ParamEntry& e, double* sq) {
  const float* g = e.grad->data();
  const int64_t n = e.grad->numel();
  if (e.nonzero_rows != nullptr) {
    const int64_t row_len = n / e.grad->dim(0);
    int64_t chunk = 0;
    double chunk_sq = 0.0;
    for (const int32_t row : *e.nonzero_rows) {
      for (int64_t k = row * row_len; k < (row + 1) * row_len; ++k) {
        if (k / kNormChunk != chunk) {
          *sq += chunk_sq;
          chunk_sq = 0.0;
          chunk = k / kNormChunk;
        }
        chunk_sq += double{g[k]} * g[k];
      }
    }
    *sq += chunk_sq;
    return;
  }
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t c = 0; c < chunks; ++c) {
    double chunk_sq = 0.0;
    for (int64_t k = c * kNormChunk; k < std::min(n, (c + 1) * kNormChunk); ++k) {
      chunk_sq += double{g[k]} * g[k];
    }
    partial[c] = chunk_sq;
  }
  for (double p : partial) *sq += p;
}

// Calls fn(begin, end) over element ranges of e that may hold non-zero gradients: the listed
// rows, or the whole tensor in chunks.
template <typename Fn>
void ForEachNonzeroRange(const ParamEntry& e, Fn fn) {
  const int64_t n = e.grad->numel();
  if (e.nonzero_rows != nullptr) {
    const int64_t row_len = n / e.grad->dim(0);
    for (const int32_t row : *e.nonzero_rows) fn(row * row_len, (row + 1) * row_len);
    return;
  }
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t c = 0; c < chunks; ++c) fn(c * kNormChunk, std::min(n, (c + 1) * kNormChunk));
}

}  // namespace

double GlobalGradNorm(absl::Span<const ParamEntry> params) {
  double sq = 0.0;
  for (const ParamEntry& e : params) AddSumOfSquares(e, &sq);
  return std::sqrt(sq);
}

absl::StatusOr<GradClip> ComputeGradClip(absl::Span<const ParamEntry> params, double max_norm) {
  if (!(max_norm > 0.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("max_norm must be > 0, got %g", max_norm));
  }
  const double norm = GlobalGradNorm(params);
  if (!std::isfinite(norm)) {
    // Name the culprit so the abort message says where the training blew up. (A finite-element
    // gradient can still overflow the sum of squares; then no element is named.)
    std::string where = "no single element is non-finite: the sum of squares overflowed";
    for (const ParamEntry& e : params) {
      const FloatBuffer& g = e.grad->values();
      auto it = std::find_if(g.begin(), g.end(), [](float x) { return !std::isfinite(x); });
      if (it != g.end()) {
        where =
            absl::StrFormat("first non-finite gradient: %s[%d] = %f", e.name, it - g.begin(), *it);
        break;
      }
    }
    return absl::OutOfRangeError(
        absl::StrFormat("gradient norm is not finite (%f); %s", norm, where));
  }
  // The coefficient in fp32 exactly as torch evaluates it on the fp32 total_norm tensor:
  // `max_norm / (total_norm + 1e-6)` is `(total_norm + 1e-6).reciprocal() * max_norm`. A double
  // coefficient can sit one fp32 ulp away, which moves AdamW's first step by a few ulps where
  // |g| is near eps; this way a norm that rounds to torch's fp32 value gives identical grads.
  const float coef = (1.0f / (static_cast<float>(norm) + 1e-6f)) * static_cast<float>(max_norm);
  // torch multiplies by clamp(coef, max=1): a no-op when coef >= 1
  return GradClip{norm, std::min(coef, 1.0f)};
}

absl::StatusOr<double> ClipGradNorm(absl::Span<const ParamEntry> params, double max_norm) {
  absl::StatusOr<GradClip> clip = ComputeGradClip(params, max_norm);
  if (!clip.ok()) return clip.status();
  const float coef = clip->coef;
  if (coef < 1.0f) {
    for (const ParamEntry& e : params) {
      float* g = e.grad->data();
      ForEachNonzeroRange(e, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) g[k] *= coef;
      });
    }
  }
  return clip->norm;
}

double LinearScheduleLr(double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step) /
           static_cast<double>(std::max<int64_t>(1, warmup_steps));
  }
  return base_lr *
         std::max(0.0, static_cast<double>(total_steps - step) /
                           static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps)));
}

AdamW::AdamW(std::vector<ParamEntry> params, AdamWOptions options)
    : params_(std::move(params)), options_(options), state_(params_.size()) {}

absl::Status ValidateAdamWOptions(const AdamWOptions& options) {
  for (auto [value, name] : {std::pair<double, const char*>{options.lr, "learning_rate"},
                             {options.eps, "epsilon"},
                             {options.weight_decay, "weight_decay"}}) {
    if (!(value >= 0.0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is %g; it must be finite and >= 0", name, value));
    }
  }
  for (auto [beta, name] :
       {std::pair<double, const char*>{options.beta1, "beta1"}, {options.beta2, "beta2"}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is %g; it must be in [0, 1)", name, beta));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AdamW> AdamW::Create(std::vector<ParamEntry> params, AdamWOptions options) {
  if (absl::Status valid = ValidateAdamWOptions(options); !valid.ok()) return valid;
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamEntry& e = params[i];
    if (e.param == nullptr || e.grad == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("parameter %d (%s) has a null param or grad", i, e.name));
    }
    if (e.param->shape() != e.grad->shape()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gradient of %s has shape %s, parameter has %s", e.name,
                          e.grad->ShapeString(), e.param->ShapeString()));
    }
    if (!names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("parameter name %s appears more than once", e.name));
    }
  }
  return AdamW(std::move(params), options);
}

namespace {

// Scalars of one parameter's update, as torch's single-tensor AdamW computes them in Python
// (double), rounded to fp32 where they reach a fp32 kernel.
struct AdamWScalars {
  float decay_factor;  // 1 - lr * wd, or exactly 1 for an undecayed tensor (p * 1 == p)
  float b1, one_minus_b1, b2, one_minus_b2;
  float eps;
  float neg_step_size;  // -lr / (1 - b1^t)
  float bc2_sqrt;       // sqrt(1 - b2^t)
  float grad_scale;     // the clipping coefficient, or exactly 1
};

// p, m, v (n) updated in place from g (n), one element at a time: the reference the AVX-512
// kernel must match bit for bit. (GCC keeps this loop scalar: std::sqrt may set errno.)
void AdamWUpdatePortable(const AdamWScalars& s, int64_t n, const float* g, float* p, float* m,
                         float* v) {
  for (int64_t k = 0; k < n; ++k) {
    const float grad = g[k] * s.grad_scale;                    // clip_grad_norm_'s g.mul_(coef)
    p[k] *= s.decay_factor;                                    // param.mul_(1 - lr * wd)
    m[k] = m[k] * s.b1 + s.one_minus_b1 * grad;                // exp_avg.mul_(b1).add_(g, 1-b1)
    v[k] = v[k] * s.b2 + s.one_minus_b2 * grad * grad;         // exp_avg_sq...addcmul_(g, g, 1-b2)
    const float denom = std::sqrt(v[k]) / s.bc2_sqrt + s.eps;  // (v.sqrt() / bc2_sqrt).add_(eps)
    p[k] += s.neg_step_size * m[k] / denom;                    // param.addcdiv_(m, denom, -step)
  }
}

// The same operations in the same order, 16 lanes at a time. Vector sqrt, division and
// products round exactly like the scalar ones, and this file is compiled without
// floating-point contraction (engine/CMakeLists.txt), so no multiply-add is fused.
ATTN_AVX512 void AdamWUpdateAvx512(const AdamWScalars& s, int64_t n, const float* g, float* p,
                                   float* m, float* v) {
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
  const __m512 decay_factor = _mm512_set1_ps(s.decay_factor);
  const __m512 b1 = _mm512_set1_ps(s.b1), one_minus_b1 = _mm512_set1_ps(s.one_minus_b1);
  const __m512 b2 = _mm512_set1_ps(s.b2), one_minus_b2 = _mm512_set1_ps(s.one_minus_b2);
  const __m512 bc2_sqrt = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps);
  const __m512 neg_step_size = _mm512_set1_ps(s.neg_step_size);
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 lanes = avx512::TailMask(n - k);
    const __m512 grad = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, g + k), grad_scale);
    const __m512 decayed = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, p + k), decay_factor);
    const __m512 m_new = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, m + k), b1),
                                       _mm512_mul_ps(one_minus_b1, grad));
    const __m512 v_new = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, v + k), b2),
                                       _mm512_mul_ps(_mm512_mul_ps(one_minus_b2, grad), grad));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v_new), bc2_sqrt), eps);
    const __m512 p_new =
        _mm512_add_ps(decayed, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m_new), denom));
    _mm512_mask_storeu_ps(m + k, lanes, m_new);
    _mm512_mask_storeu_ps(v + k, lanes, v_new);
    _mm512_mask_storeu_ps(p + k, lanes, p_new);
  }
}

void AdamWUpdate(const AdamWScalars& s, int64_t n, const float* g, float* p, float* m, float* v) {
  if (UseAvx512Kernels()) {
    AdamWUpdateAvx512(s, n, g, p, m, v);
  } else {
    AdamWUpdatePortable(s, n, g, p, m, v);
  }
}

// The sums of one row after its update: g (the gradient as given), before (p before the update),
// p (after) and p0 (the job's start), each n long.
void AddRowSums(int64_t n, const float* g, const float* before, const float* p, const float* p0,
                double* grad_sq, double* update_sq, double* moved_sq) {
  double gg = 0, uu = 0, mm = 0;
#pragma omp simd reduction(+ : gg, uu, mm)
  for (int64_t k = 0; k < n; ++k) {
    const double grad = g[k], update = double{p[k]} - before[k], moved = double{p[k]} - p0[k];
    gg += grad * grad;
    uu += update * update;
    mm += moved * moved;
  }
  *grad_sq += gg;
  *update_sq += uu;
  *moved_sq += mm;
}

// One entry's update with its per-row sums: the same per-element operations as Step's paths
// (so the same bits), over blocks of whole rows so that each row is summed by one thread.
void UpdateWithRowSums(const AdamWScalars& s, const ParamEntry& e, const uint8_t* live, float* m,
                       float* v, const float* p0, double* grad_sq, double* update_sq,
                       double* moved_sq) {
  float* p = e.param->data();
  const float* g = e.grad->data();
  const int64_t n = e.param->numel(), rows = e.param->dim(0), row_len = n / rows;
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t{1} << 12) / row_len);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
#pragma omp parallel if (n >= kParallelElements)
  {
    std::vector<float> before(rows_per_block * row_len);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * rows_per_block, last = std::min(rows, first + rows_per_block);
      const int64_t at = first * row_len, len = (last - first) * row_len;
      std::copy(p + at, p + at + len, before.begin());
      if (live == nullptr) {
        AdamWUpdate(s, len, g + at, p + at, m + at, v + at);
      } else {
        for (int64_t row = first; row < last; ++row) {
          const int64_t r = row * row_len;
          if (live[row]) {
            AdamWUpdate(s, row_len, g + r, p + r, m + r, v + r);
          } else {
#pragma omp simd
            for (int64_t k = r; k < r + row_len; ++k) p[k] *= s.decay_factor;
          }
        }
      }
      for (int64_t row = first; row < last; ++row) {
        const int64_t r = row * row_len;
        AddRowSums(row_len, g + r, before.data() + (r - at), p + r, p0 + r, &grad_sq[row],
                   &update_sq[row], &moved_sq[row]);
      }
    }
  }
}

}  // namespace

absl::Status AdamW::Step(double lr, float grad_scale, StepRowSums* sums) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrFormat("AdamW step lr must be >= 0, got %g", lr));
  }
  if (!(grad_scale >= 0.0f && grad_scale <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW gradient scale must be in [0, 1], got %g", grad_scale));
  }
  // Check everything before touching anything, so a failed Step leaves no half-update.
  if (sums != nullptr && sums->initial.size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AdamW step sums need %d initial tensors, got %d", params_.size(), sums->initial.size()));
  }
  if (sums != nullptr) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (sums->initial[i] == nullptr || params_[i].param->rank() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("AdamW step sums: no initial values, or a scalar, for ", params_[i].name));
      }
    }
    for (auto* per_entry : {&sums->grad_sq, &sums->update_sq, &sums->moved_sq}) {
      per_entry->resize(params_.size());
      for (size_t i = 0; i < params_.size(); ++i) {
        (*per_entry)[i].assign(params_[i].param->dim(0), 0.0);
      }
    }
  }
  for (const ParamEntry& e : params_) {
    if (e.param->shape() != e.grad->shape()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("gradient of %s has shape %s, parameter has %s", e.name,
                          e.grad->ShapeString(), e.param->ShapeString()));
    }
    if (e.nonzero_rows != nullptr) {
      const int64_t rows = e.param->dim(0);
      int64_t previous = -1;
      for (const int32_t row : *e.nonzero_rows) {
        if (row <= previous || row >= rows) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "non-zero gradient rows of %s must be ascending, unique and in [0, %d); got %d "
              "after %d",
              e.name, rows, row, previous));
        }
        previous = row;
      }
    }
  }
  const double b1 = options_.beta1, b2 = options_.beta2;
  AdamWScalars scalars;
  scalars.b1 = static_cast<float>(b1);
  scalars.one_minus_b1 = static_cast<float>(1.0 - b1);
  scalars.b2 = static_cast<float>(b2);
  scalars.one_minus_b2 = static_cast<float>(1.0 - b2);
  scalars.eps = static_cast<float>(options_.eps);
  scalars.grad_scale = grad_scale;
  const float decay_factor = static_cast<float>(1.0 - lr * options_.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamEntry& e = params_[i];
    State& st = state_[i];
    if (st.exp_avg.shape() != e.param->shape()) {  // lazily, on the parameter's first step
      st.exp_avg = Tensor(e.param->shape());
      st.exp_avg_sq = Tensor(e.param->shape());
      st.live_rows.clear();
      st.step = 0;
    }
    ++st.step;
    const double t = static_cast<double>(st.step);
    AdamWScalars s = scalars;
    s.decay_factor = e.decay ? decay_factor : 1.0f;
    s.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(b1, t))));
    s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));

    float* p = e.param->data();
    const float* g = e.grad->data();
    float* m = st.exp_avg.data();
    float* v = st.exp_avg_sq.data();
    const int64_t n = e.param->numel();
    // A row with m = v = 0 and g = 0 gets m = v = 0, denom = eps and p += (-step * 0) / eps,
    // which adds a zero: only the decay changes p. With eps = 0 that would be 0/0, so no skip.
    const bool skip_dead_rows = e.nonzero_rows != nullptr && s.eps > 0.0f;
    if (skip_dead_rows) {
      const int64_t rows = e.param->dim(0);
      if (static_cast<int64_t>(st.live_rows.size()) != rows) st.live_rows.assign(rows, 0);
      for (const int32_t row : *e.nonzero_rows) st.live_rows[row] = 1;
    }
    if (sums != nullptr) {
      UpdateWithRowSums(s, e, skip_dead_rows ? st.live_rows.data() : nullptr, m, v,
                        sums->initial[i], sums->grad_sq[i].data(), sums->update_sq[i].data(),
                        sums->moved_sq[i].data());
      continue;
    }
    if (skip_dead_rows) {
      const int64_t rows = e.param->dim(0), row_len = n / rows;
      const uint8_t* live = st.live_rows.data();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t at = row * row_len;
        if (live[row]) {
          AdamWUpdate(s, row_len, g + at, p + at, m + at, v + at);
        } else {
#pragma omp simd
          for (int64_t k = at; k < at + row_len; ++k) p[k] *= s.decay_factor;
        }
      }
      continue;
    }
    constexpr int64_t kBlock = 1 << 12;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = b * kBlock;
      AdamWUpdate(s, std::min(kBlock, n - at), g + at, p + at, m + at, v + at);
    }
  }
  ++step_count_;
  return absl::OkStatus();
}

}  // namespace attn
