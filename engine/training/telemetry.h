// Training telemetry: per parameter group (engine/parameter_groups.h) and the head, what a step's
// gradient and update were and how far the group has moved since the job started; and which
// word-embedding rows training has touched. Answers "are W_Q, W_K and W_V trained like the
// embedding matrix?" on the user's own data.
//
// Cost: on a telemetry step, AdamW sums per row what it reads and writes anyway (StepRowSums),
// while each block is in cache, plus one read of the job's starting weights; other steps only
// mark the word-embedding rows of the batch. The bench's "telemetry" row measures it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/parameter_groups.h"
#include "engine/training/losses.h"
#include "engine/training/optimizer.h"

namespace attn {

class WordPieceTokenizer;

struct GroupTelemetry {
  std::string name;  // "layers.3.query", "embeddings.word", "head", ...
  std::string kind;  // "W_Q", "word_embeddings", "LayerNorm", "head", ... (ParameterGroup::kind)
  int layer = -1;    // 0-based encoder layer; -1 outside the layers
  bool trainable = false;      // false: frozen by the job's parameter selection (all three are 0)
  double grad_norm = 0;        // ‖g‖ of this step's gradient, before clipping
  double update_norm = 0;      // ‖W_after − W_before‖ of this step
  double relative_change = 0;  // ‖W − W₀‖ / ‖W₀‖, W₀ = the job's starting weights
};

struct TokenChange {
  int32_t id = 0;
  std::string token;
  double relative_change = 0;  // of its word-embedding row, since the job started
};

struct StepTelemetry {
  std::vector<GroupTelemetry> groups;  // ParameterGroups order, then the head
  int64_t embedding_rows_touched = 0;  // word-embedding rows with a non-zero gradient so far
  std::vector<TokenChange> most_changed_tokens;  // of those rows, largest change first
};

// The job's view of its weights across steps. Groups are formed once for each BertWeights it is
// given (the trainer's weights, gradients, the base), so those must outlive it.
class TrainingTelemetry {
 public:
  static constexpr int kMostChangedTokens = 10;

  // `params` are the optimizer's entries: the tensors of `weights` (and of `head`) it updates.
  TrainingTelemetry(const BertWeights& initial, const BertWeights& weights,
                    const ClassificationHead* head, const std::vector<ParamEntry>& params);

  // Every step: the word-embedding rows of this step's gradient.
  void MarkRows(const std::vector<int32_t>& word_rows);
  // On a telemetry step: what to pass to AdamW::Step, which fills it.
  StepRowSums* row_sums() { return &sums_; }
  // After that step: the numbers. `tokenizer` names the most changed rows.
  StepTelemetry AfterUpdate(const WordPieceTokenizer& tokenizer) const;

 private:
  // Adds the step's sums of `entry`'s rows [row_begin, row_end) (row_end -1: to its last row).
  void AddSums(int entry, int64_t row_begin, int64_t row_end, double* grad_sq, double* update_sq,
               double* moved_sq) const;

  std::vector<ParameterGroup> initial_, weights_;
  std::vector<bool> trainable_;
  // Per group and part: the optimizer entry that updates the part's tensor (-1: none).
  std::vector<std::vector<int>> part_entries_;
  std::vector<double> initial_norms_;  // ‖W₀‖ per group
  const ClassificationHead* head_;
  ClassificationHead initial_head_;
  std::vector<int> head_entries_;  // the head's weight and bias entries
  double initial_head_norm_ = 0;
  StepRowSums sums_;
  std::vector<uint8_t> touched_;  // per word-embedding row
  int64_t touched_count_ = 0;
};

}  // namespace attn
