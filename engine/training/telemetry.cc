#include "engine/training/telemetry.h"

#include <algorithm>
#include <cmath>

#include "engine/tokenizer.h"

namespace attn {
namespace {

double Ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : 0.0;
}

double SquaredNorm(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += double{v} * v;
  return sum;
}

double SquaredDistance(const float* a, const float* b, int64_t n) {
  double sum = 0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (n >= (1 << 16))
  for (int64_t k = 0; k < n; ++k) {
    const double d = double{a[k]} - b[k];
    sum += d * d;
  }
  return sum;
}

std::vector<float> HeadValues(const ClassificationHead& head) {
  std::vector<float> values(head.weight.data(), head.weight.data() + head.weight.numel());
  values.insert(values.end(), head.bias.data(), head.bias.data() + head.bias.numel());
  return values;
}

}  // namespace

TrainingTelemetry::TrainingTelemetry(const BertWeights& initial, const BertWeights& weights,
                                     const BertWeights& grads, const ClassificationHead* head,
                                     const ClassificationHead* head_grads,
                                     const std::vector<const Tensor*>& trainable)
    : initial_(ParameterGroups(initial)),
      weights_(ParameterGroups(weights)),
      grads_(ParameterGroups(grads)),
      head_(head),
      head_grads_(head_grads) {
  for (const ParameterGroup& group : weights_) {
    const Tensor* first = group.parts.front().tensor;
    trainable_.push_back(std::find(trainable.begin(), trainable.end(), first) != trainable.end());
  }
  // ‖W₀‖ per group: constant for the job, so computed once.
  for (const ParameterGroup& group : initial_) {
    initial_norms_.push_back(std::sqrt(attn::SquaredNorm(group)));
  }
  if (head_ != nullptr) initial_head_ = *head_;
  before_.resize(weights_.size());
  touched_.assign(weights.word_embeddings.dim(0), 0);
}

void TrainingTelemetry::MarkRows(const std::vector<int32_t>& word_rows) {
  for (const int32_t row : word_rows) {
    if (row >= 0 && row < static_cast<int32_t>(touched_.size()) && !touched_[row]) {
      touched_[row] = 1;
      ++touched_count_;
    }
  }
}

void TrainingTelemetry::BeforeUpdate() {
  for (size_t g = 0; g < weights_.size(); ++g) {
    std::vector<float>& copy = before_[g];
    if (!trainable_[g]) continue;
    int64_t size = 0;
    for (const TensorRows& part : weights_[g].parts) size += part.size();
    copy.resize(size);  // allocated once, at the first telemetry step
    float* to = copy.data();
    for (const TensorRows& part : weights_[g].parts) {
      const float* from = part.begin();
      const int64_t n = part.size();
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
      for (int64_t k = 0; k < n; ++k) to[k] = from[k];
      to += n;
    }
  }
  if (head_ != nullptr) head_before_ = HeadValues(*head_);
}

StepTelemetry TrainingTelemetry::AfterUpdate(const WordPieceTokenizer& tokenizer) const {
  StepTelemetry out;
  for (size_t g = 0; g < weights_.size(); ++g) {
    const ParameterGroup& group = weights_[g];
    GroupTelemetry& t = out.groups.emplace_back();
    t.name = group.name;
    t.kind = group.kind;
    t.layer = group.layer;
    t.trainable = trainable_[g];
    if (!t.trainable) continue;  // frozen: unchanged, its gradient unused
    t.grad_norm = std::sqrt(attn::SquaredNorm(grads_[g]));
    // ‖W − W_before‖² and ‖W − W₀‖² in one pass over W.
    double update = 0, moved = 0;
    int64_t at = 0;
    for (size_t p = 0; p < group.parts.size(); ++p) {
      const float* now = group.parts[p].begin();
      const float* before = before_[g].data() + at;
      const float* initial = initial_[g].parts[p].begin();
      const int64_t n = group.parts[p].size();
#pragma omp parallel for simd reduction(+ : update, moved) schedule(static) if (n >= (1 << 16))
      for (int64_t k = 0; k < n; ++k) {
        const double step = double{now[k]} - before[k];
        const double since_start = double{now[k]} - initial[k];
        update += step * step;
        moved += since_start * since_start;
      }
      at += n;
    }
    t.update_norm = std::sqrt(update);
    t.relative_change = Ratio(std::sqrt(moved), initial_norms_[g]);
  }
  if (head_ != nullptr) {
    GroupTelemetry& t = out.groups.emplace_back();
    t.name = "head";
    t.kind = "head";
    t.trainable = true;
    t.grad_norm = std::sqrt(SquaredNorm(HeadValues(*head_grads_)));
    const std::vector<float> now = HeadValues(*head_);
    t.update_norm = std::sqrt(SquaredDistance(now.data(), head_before_.data(), now.size()));
    const std::vector<float> initial = HeadValues(initial_head_);
    t.relative_change = Ratio(std::sqrt(SquaredDistance(now.data(), initial.data(), now.size())),
                              std::sqrt(SquaredNorm(initial)));
  }

  out.embedding_rows_touched = touched_count_;
  const Tensor& now = *weights_.front().parts.front().tensor;  // embeddings.word
  const Tensor& initial = *initial_.front().parts.front().tensor;
  const int64_t H = now.dim(1);
  std::vector<TokenChange> changes;
  for (size_t row = 0; row < touched_.size(); ++row) {
    if (!touched_[row]) continue;
    const float* a = now.data() + row * H;
    const float* b = initial.data() + row * H;
    double base = 0;
    for (int64_t j = 0; j < H; ++j) base += double{b[j]} * b[j];
    changes.push_back({static_cast<int32_t>(row), std::string(),
                       Ratio(std::sqrt(SquaredDistance(a, b, H)), std::sqrt(base))});
  }
  const size_t keep = std::min<size_t>(kMostChangedTokens, changes.size());
  std::partial_sort(changes.begin(), changes.begin() + keep, changes.end(),
                    [](const TokenChange& x, const TokenChange& y) {
                      return x.relative_change > y.relative_change ||
                             (x.relative_change == y.relative_change && x.id < y.id);
                    });
  changes.resize(keep);
  for (TokenChange& change : changes) change.token = tokenizer.IdToToken(change.id);
  out.most_changed_tokens = std::move(changes);
  return out;
}

}  // namespace attn
