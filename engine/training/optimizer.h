// AdamW, the linear warm-up/decay schedule and global-norm gradient clipping, as PyTorch
// (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_) and transformers
// (get_linear_schedule_with_warmup) do them, over a generic list of (param, grad) tensors.
//
// A training step, in sentence-transformers' order:
//   loss.backward()                                   -> grads
//   norm = ClipGradNorm(params, max_norm)             -> abort the job if !ok (NaN/Inf)
//   optimizer.Step(LinearScheduleLr(base, t, warmup, total))   t = 0, 1, 2, ...
//   ZeroGrads(params)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tensor.h"
#include "engine/training/losses.h"
#include "engine/weights.h"

namespace attn {

// One trainable tensor. The optimizer reads `grad` and updates `param` in place; both must
// stay alive (and not be reallocated) while the optimizer uses them.
struct ParamEntry {
  std::string name;  // Hugging Face-style name; fused QKV as "...attention.self.qkv.{weight,bias}"
  Tensor* param;
  Tensor* grad;  // same shape as param
  bool decay;    // apply decoupled weight decay (false for biases and LayerNorm gamma/beta)
  // When set: the rows (first dimension) whose gradient may be non-zero, ascending and unique;
  // every other row's gradient is exactly zero. The norm, clipping and AdamW then skip the
  // zero rows wherever that changes no bit of the result. For the word embeddings, where a
  // batch uses a few hundred of 30,522 rows. Must stay alive while the optimizer uses it.
  const std::vector<int32_t>* nonzero_rows = nullptr;
};

// Which parameters fine-tuning updates.
enum class TrainableSet {
  kAll,               // embeddings, every layer, head
  kAttentionOnly,     // W_Q, W_K, W_V, W_O and their biases (qkv_weight, qkv_bias,
                      // attn_output_weight, attn_output_bias) per layer, + head
  kAllButEmbeddings,  // every encoder layer (incl. its LayerNorms), + head; embeddings and
                      // the embedding LayerNorm frozen
  kHeadOnly,          // only the classification head (which must be given)
};

// Entries for `weights` with gradients in `grads` (same struct type, same shapes) and, when
// `head` is non-null, the classification head with gradients `head_grads`. The head is part of
// every set when given. Decay follows sentence-transformers' no_decay = ["bias",
// "LayerNorm.bias", "LayerNorm.weight"]: *_bias (incl. the fused qkv_bias), *_norm_gamma,
// *_norm_beta and the head bias are not decayed; weights and embedding matrices are.
// Errors: shape mismatch between a parameter and its gradient (naming the tensor), kHeadOnly
// without a head, null pointers.
absl::StatusOr<std::vector<ParamEntry>> CollectTrainableParameters(
    BertWeights* weights, BertWeights* grads, TrainableSet set, ClassificationHead* head = nullptr,
    ClassificationHead* head_grads = nullptr);

// Sets every gradient of `params` to 0.
void ZeroGrads(absl::Span<const ParamEntry> params);

// ---------------------------------------------------------------------------------------------
// Gradient clipping (torch.nn.utils.clip_grad_norm_, norm_type 2):
//   norm  = sqrt(sum over all grads of g^2)            (accumulated in double)
//   coef  = max_norm / (norm + 1e-6);    if coef < 1: every g *= coef
// coef is evaluated in fp32 the way torch does on its fp32 norm tensor (bit-identical clipped
// gradients whenever the norm rounds to torch's fp32 norm).
// Returns the pre-clip norm. If the norm is NaN or Inf, returns OutOfRange naming the first
// parameter with a non-finite gradient and leaves the gradients untouched: the caller must
// abort (the step would corrupt the weights). max_norm must be > 0.
absl::StatusOr<double> ClipGradNorm(absl::Span<const ParamEntry> params, double max_norm);

// ClipGradNorm's decision without touching the gradients: the pre-clip norm and the factor
// `coef` (1 when the norm is within max_norm) that AdamW::Step(lr, coef) applies as it reads
// each gradient, saving a pass over them. Same errors as ClipGradNorm.
struct GradClip {
  double norm = 0.0;
  float coef = 1.0f;
};
absl::StatusOr<GradClip> ComputeGradClip(absl::Span<const ParamEntry> params, double max_norm);

// The global L2 norm of the gradients, without clipping (NaN/Inf propagate).
double GlobalGradNorm(absl::Span<const ParamEntry> params);

// ---------------------------------------------------------------------------------------------
// Linear warm-up then linear decay (transformers.get_linear_schedule_with_warmup):
//   step <  warmup: lr = base * step / max(1, warmup)
//   step >= warmup: lr = base * max(0, (total - step) / max(1, total - warmup))
// `step` counts optimizer steps already taken: the k-th Step() (k = 0, 1, ...) uses
// LinearScheduleLr(base, k, ...), as LambdaLR sets lr(0) at construction and each
// scheduler.step() after optimizer.step() advances it. So with warmup > 0 the very first update
// runs at lr 0 (the moments still move); lr reaches base at step == warmup and 0 at total.
double LinearScheduleLr(double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

// ---------------------------------------------------------------------------------------------
// AdamW (torch.optim.AdamW, amsgrad=False, maximize=False), per parameter p with gradient g and
// its own step count t (1-based, incremented before the update):
//   p  *= 1 - lr * weight_decay                       (only if entry.decay)
//   m   = b1 * m + (1 - b1) * g
//   v   = b2 * v + (1 - b2) * g * g
//   p  -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// which is p -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - b1^t),
// v_hat = v / (1 - b2^t), evaluated in torch's order: fp32 tensors, scalars in double and
// rounded to fp32 where torch passes them to a kernel.
struct AdamWOptions {
  double lr = 2e-5;  // base learning rate (the schedule scales it)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;  // sentence-transformers' default (torch's is 1e-8)
  double weight_decay = 0.01;
};

// lr and eps finite and >= 0, beta1 and beta2 in [0, 1), weight_decay finite and >= 0: what
// AdamW::Create checks, for callers that check a job's options before creating anything. The
// messages name the settings as the Trainer API does (learning_rate, beta1, beta2, epsilon,
// weight_decay).
absl::Status ValidateAdamWOptions(const AdamWOptions& options);

// What a Step can measure as it updates, for training telemetry (engine/training/telemetry.h):
// per entry (params() order) and per row of its first dimension (per element of a 1-D tensor),
// in double: Σ g² of the gradient as given (before clipping), Σ (p_after − p_before)² of this
// step, and Σ (p_after − p₀)² against the entry's `initial` values (same shape). Each block is
// summed right after its update, while it is in cache; the update itself is unchanged to the bit.
struct StepRowSums {
  std::vector<const float*> initial;                              // in: p₀ per entry
  std::vector<std::vector<double>> grad_sq, update_sq, moved_sq;  // out: per entry, per row
};

class AdamW {
 public:
  // Validates options (lr >= 0, 0 <= beta < 1, eps >= 0, weight_decay >= 0) and entries
  // (non-null, grad shape == param shape, unique names).
  static absl::StatusOr<AdamW> Create(std::vector<ParamEntry> params, AdamWOptions options = {});

  // One update of every parameter at learning rate `lr` (typically from LinearScheduleLr),
  // reading each gradient as g * grad_scale (GradClip::coef: the same fp32 product
  // ClipGradNorm would have stored; grads themselves are not modified).
  // Moment buffers m and v are allocated (zeroed) on a parameter's first step. For an entry
  // with nonzero_rows, a row whose gradient has been zero at every step so far has m = v = 0,
  // and its update is exactly the decay p *= 1 - lr * wd (when eps > 0): only that is done.
  // With `sums`, also fills its per-row sums (its `initial` has one pointer per entry).
  absl::Status Step(double lr, float grad_scale = 1.0f, StepRowSums* sums = nullptr);
  // One update at options().lr.
  absl::Status Step() { return Step(options_.lr); }

  const AdamWOptions& options() const { return options_; }
  const std::vector<ParamEntry>& params() const { return params_; }
  // Completed Step() calls.
  int64_t step_count() const { return step_count_; }

  // Per-parameter state, index-aligned with params(); empty tensors before the first step.
  struct State {
    int64_t step = 0;
    Tensor exp_avg;     // m
    Tensor exp_avg_sq;  // v
    // For an entry with nonzero_rows: 1 for each row that has had a non-zero gradient row
    // listed (its m, v may be non-zero); empty otherwise.
    std::vector<uint8_t> live_rows;
  };
  const State& state(size_t i) const { return state_[i]; }

 private:
  AdamW(std::vector<ParamEntry> params, AdamWOptions options);

  std::vector<ParamEntry> params_;
  AdamWOptions options_;
  std::vector<State> state_;
  int64_t step_count_ = 0;
};

}  // namespace attn
