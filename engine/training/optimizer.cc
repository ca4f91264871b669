#include "engine/training/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
      // The three embedding matrices are decayed (sentence-transformers decays every tensor
      // whose name lacks "bias"/"LayerNorm.weight"); the LayerNorm is not.
      const bool decay = member != &BertWeights::embedding_norm_gamma &&
                         member != &BertWeights::embedding_norm_beta;
      if (auto s = AddEntry(name, &(weights->*member), &(grads->*member), decay, &out); !s.ok()) {
        return s;
      }
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

double GlobalGradNorm(absl::Span<const ParamEntry> params) {
  // Sums of squares over fixed chunks of each tensor, added in chunk order: the same result for
  // any thread count.
  double sq = 0.0;
  for (const ParamEntry& e : params) {
    const float* g = e.grad->data();
    const int64_t n = e.grad->numel();
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
    for (double p : partial) sq += p;
  }
  return std::sqrt(sq);
}

absl::StatusOr<double> ClipGradNorm(absl::Span<const ParamEntry> params, double max_norm) {
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
  if (coef < 1.0f) {  // torch multiplies by clamp(coef, max=1): a no-op when coef >= 1
    for (const ParamEntry& e : params) {
      float* g = e.grad->data();
      const int64_t n = e.grad->numel();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (int64_t k = 0; k < n; ++k) g[k] *= coef;
    }
  }
  return norm;
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

absl::StatusOr<AdamW> AdamW::Create(std::vector<ParamEntry> params, AdamWOptions options) {
  if (!(options.lr >= 0.0) || !std::isfinite(options.lr)) {
    return absl::InvalidArgumentError(absl::StrFormat("AdamW lr must be >= 0, got %g", options.lr));
  }
  for (auto [beta, name] :
       {std::pair<double, const char*>{options.beta1, "beta1"}, {options.beta2, "beta2"}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("AdamW %s must be in [0, 1), got %g", name, beta));
    }
  }
  if (!(options.eps >= 0.0) || !std::isfinite(options.eps)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW eps must be >= 0, got %g", options.eps));
  }
  if (!(options.weight_decay >= 0.0) || !std::isfinite(options.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AdamW weight_decay must be >= 0, got %g", options.weight_decay));
  }
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

absl::Status AdamW::Step(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrFormat("AdamW step lr must be >= 0, got %g", lr));
  }
  // Check everything before touching anything, so a failed Step leaves no half-update.
  for (const ParamEntry& e : params_) {
    if (e.param->shape() != e.grad->shape()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("gradient of %s has shape %s, parameter has %s", e.name,
                          e.grad->ShapeString(), e.param->ShapeString()));
    }
  }
  const double b1 = options_.beta1, b2 = options_.beta2;
  // Scalars as torch's single-tensor AdamW computes them in Python (double), rounded to fp32
  // where they reach a fp32 kernel.
  const float decay_factor = static_cast<float>(1.0 - lr * options_.weight_decay);
  const float b1f = static_cast<float>(b1), one_minus_b1 = static_cast<float>(1.0 - b1);
  const float b2f = static_cast<float>(b2), one_minus_b2 = static_cast<float>(1.0 - b2);
  const float eps = static_cast<float>(options_.eps);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamEntry& e = params_[i];
    State& st = state_[i];
    if (st.exp_avg.shape() != e.param->shape()) {  // lazily, on the parameter's first step
      st.exp_avg = Tensor(e.param->shape());
      st.exp_avg_sq = Tensor(e.param->shape());
      st.step = 0;
    }
    ++st.step;
    const double t = static_cast<double>(st.step);
    const double bias_correction1 = 1.0 - std::pow(b1, t);
    const double bias_correction2 = 1.0 - std::pow(b2, t);
    const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
    const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));

    float* p = e.param->data();
    const float* g = e.grad->data();
    float* m = st.exp_avg.data();
    float* v = st.exp_avg_sq.data();
    const int64_t n = e.param->numel();
    // Element-wise: the split across threads and SIMD lanes cannot change any result (vector
    // sqrt and division round like the scalar ones).
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t k = 0; k < n; ++k) {
      if (e.decay) p[k] *= decay_factor;               // param.mul_(1 - lr * wd)
      m[k] = m[k] * b1f + one_minus_b1 * g[k];         // exp_avg.mul_(b1).add_(g, alpha=1-b1)
      v[k] = v[k] * b2f + one_minus_b2 * g[k] * g[k];  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
      const float denom = std::sqrt(v[k]) / bc2_sqrt + eps;  // (v.sqrt() / bc2_sqrt).add_(eps)
      p[k] += neg_step_size * m[k] / denom;                  // param.addcdiv_(m, denom, -step)
    }
  }
  ++step_count_;
  return absl::OkStatus();
}

}  // namespace attn
