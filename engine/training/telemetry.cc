#include "engine/training/telemetry.h"

#include <algorithm>
#include <cmath>

#include "engine/tokenizer.h"

namespace attn {
namespace {

double Ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : 0.0;
}

double SquaredDistance(const float* a, const float* b, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < n; ++k) {
    const double d = double{a[k]} - b[k];
    sum += d * d;
  }
  return sum;
}

double SquaredNorm(const Tensor& t) {
  double sum = 0;
  for (float v : t.values()) sum += double{v} * v;
  return sum;
}

}  // namespace

TrainingTelemetry::TrainingTelemetry(const BertWeights& initial, const BertWeights& weights,
                                     const ClassificationHead* head,
                                     const std::vector<ParamEntry>& params)
    : initial_(ParameterGroups(initial)), weights_(ParameterGroups(weights)), head_(head) {
  const auto entry_of = [&params](const Tensor* tensor) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].param == tensor) return static_cast<int>(i);
    }
    return -1;
  };
  sums_.initial.assign(params.size(), nullptr);
  for (size_t g = 0; g < weights_.size(); ++g) {
    std::vector<int>& entries = part_entries_.emplace_back();
    for (size_t p = 0; p < weights_[g].parts.size(); ++p) {
      const int entry = entry_of(weights_[g].parts[p].tensor);
      entries.push_back(entry);
      if (entry >= 0) sums_.initial[entry] = initial_[g].parts[p].tensor->data();
    }
    trainable_.push_back(entries.front() >= 0);
  }
  // ‖W₀‖ per group: constant for the job, so computed once.
  for (const ParameterGroup& group : initial_) {
    initial_norms_.push_back(std::sqrt(attn::SquaredNorm(group)));
  }
  if (head_ != nullptr) {
    initial_head_ = *head_;
    initial_head_norm_ =
        std::sqrt(SquaredNorm(initial_head_.weight) + SquaredNorm(initial_head_.bias));
    for (auto [now, start] : {std::pair{&head_->weight, &initial_head_.weight},
                              std::pair{&head_->bias, &initial_head_.bias}}) {
      const int entry = entry_of(now);
      if (entry < 0) continue;
      head_entries_.push_back(entry);
      sums_.initial[entry] = start->data();
    }
  }
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

void TrainingTelemetry::AddSums(int entry, int64_t row_begin, int64_t row_end, double* grad_sq,
                                double* update_sq, double* moved_sq) const {
  if (entry < 0 || static_cast<size_t>(entry) >= sums_.grad_sq.size()) return;
  if (row_end < 0) row_end = static_cast<int64_t>(sums_.grad_sq[entry].size());
  for (int64_t row = row_begin; row < row_end; ++row) {
    *grad_sq += sums_.grad_sq[entry][row];
    *update_sq += sums_.update_sq[entry][row];
    *moved_sq += sums_.moved_sq[entry][row];
  }
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
    double grad = 0, update = 0, moved = 0;
    for (size_t p = 0; p < group.parts.size(); ++p) {
      AddSums(part_entries_[g][p], group.parts[p].row_begin, group.parts[p].row_end, &grad, &update,
              &moved);
    }
    t.grad_norm = std::sqrt(grad);
    t.update_norm = std::sqrt(update);
    t.relative_change = Ratio(std::sqrt(moved), initial_norms_[g]);
  }
  if (head_ != nullptr) {
    GroupTelemetry& t = out.groups.emplace_back();
    t.name = "head";
    t.kind = "head";
    t.trainable = !head_entries_.empty();
    double grad = 0, update = 0, moved = 0;
    for (const int entry : head_entries_) AddSums(entry, 0, -1, &grad, &update, &moved);
    t.grad_norm = std::sqrt(grad);
    t.update_norm = std::sqrt(update);
    t.relative_change = Ratio(std::sqrt(moved), initial_head_norm_);
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
