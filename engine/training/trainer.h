// A fine-tuning job on a private copy of a model's weights: one Step() per batch runs the
// training forward, pooling + L2 normalisation, the objective's loss, the whole backward,
// gradient clipping and AdamW. The served model is never touched; Snapshot() gives an immutable
// Model with the current weights (for commit).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "engine/model.h"
#include "engine/precision.h"
#include "engine/training/encoder_training.h"
#include "engine/training/losses.h"
#include "engine/training/optimizer.h"
#include "engine/training/telemetry.h"

namespace attn {

enum class Objective {
  kContrastive,       // MultipleNegativesRankingLoss over (anchor, positive[, negative])
  kCosineSimilarity,  // MSE between cos(first, second) and a gold score
  kClassification,    // a new linear head over the pooled embedding, cross-entropy
  // The same head and loss over a text pair encoded together ([CLS] a [SEP] b [SEP]): a
  // cross-encoder. The engine trains it exactly like kClassification (the batch's inputs are
  // the pairs); the objective is kept apart so a version records how its head reads inputs.
  kPairClassification,
};

// Whether the objective trains a classification head (kClassification, kPairClassification).
inline bool HasClassificationHead(Objective objective) {
  return objective == Objective::kClassification || objective == Objective::kPairClassification;
}

struct TrainerOptions {
  Objective objective = Objective::kContrastive;
  AdamWOptions adamw;          // lr 2e-5, betas (0.9, 0.999), eps 1e-6, weight decay 0.01
  int64_t warmup_steps = 0;    // linear warm-up, then linear decay to 0 at total_steps
  int64_t total_steps = 0;     // 0 = constant learning rate after warm-up
  double max_grad_norm = 1.0;  // clip by global norm; 0 disables clipping
  TrainableSet trainable = TrainableSet::kAll;
  uint64_t seed = 0;                // dropout masks and head initialisation
  bool dropout = true;              // use config.json's dropout probabilities; false = off
  double contrastive_scale = 20.0;  // contrastive: cosine similarity x scale
  int num_labels = 0;  // classification objectives: number of classes (2 to kMaxLabels); else 0
  // Training telemetry (engine/training/telemetry.h) on step 1, every telemetry_every-th step
  // and the last (total_steps); 0 = off.
  int64_t telemetry_every = 0;
  // kFp32, or kBf16 for mixed precision: the linear layers' matmuls forward and backward on
  // bfloat16 inputs with fp32 accumulation (TrainingForwardOptions::matmul_inputs); master
  // weights, gradients and AdamW stay fp32. Native where CpuHasNativeBf16(), emulated elsewhere.
  Precision precision = Precision::kFp32;
};

constexpr int kMaxLabels = 1 << 16;

// One batch. Fill the fields of the job's objective; the others stay empty.
struct TrainingBatch {
  // kContrastive: anchors[i] pairs with positives[i]; negatives empty or one per anchor.
  std::vector<SequenceInput> anchors, positives, negatives;
  // kCosineSimilarity: cos(first[i], second[i]) should equal scores[i].
  std::vector<SequenceInput> first, second;
  std::vector<float> scores;
  // kClassification, kPairClassification: inputs[i] (a pair for the latter) has class
  // labels[i] in [0, num_labels).
  std::vector<SequenceInput> inputs;
  std::vector<int64_t> labels;

  int64_t examples() const;
  int64_t tokens() const;
};

struct StepResult {
  int64_t step = 0;  // 1-based count of completed steps
  double loss = 0;
  double grad_norm = 0;  // before clipping
  double learning_rate = 0;
  int64_t examples = 0;
  int64_t tokens = 0;
  double seconds = 0;
  std::optional<StepTelemetry> telemetry;  // on telemetry steps (TrainerOptions::telemetry_every)
};

// What Trainer::Create refuses, for callers that check a job's options before starting it (the
// server, when the job's config arrives): the AdamW settings (ValidateAdamWOptions), num_labels
// for the objective, head-only training without a head, warm-up and total steps,
// max_grad_norm and contrastive_scale. Messages start with the TrainerOptions field they are
// about ("num_labels is 1; ...").
absl::Status ValidateTrainerOptions(const TrainerOptions& options);

// What Trainer::Step refuses in a batch for a job with `options`: no examples (a contrastive
// batch needs 2 pairs: with one its loss is exactly 0), counts that do not match, hard
// negatives for some anchors only (an empty negative sequence marks an anchor without one),
// gold scores outside [-1, 1], labels outside [0, num_labels). A problem with one example
// names it by its index in the batch ("examples[2].score is 1.5; ..."), so the caller can
// prefix which batch it was.
absl::Status ValidateTrainingBatch(const TrainingBatch& batch, const TrainerOptions& options);

class Trainer {
 public:
  // Copies `base`'s weights. Errors for options that cannot work (ValidateTrainerOptions).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(std::shared_ptr<const Model> base,
                                                         const TrainerOptions& options);
  // The optimizer holds pointers into this object (weights, gradients, the backward's row list).
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimisation step. InvalidArgument for a malformed batch (ValidateTrainingBatch; the
  // weights are untouched);
  // a NaN/Inf loss or gradient returns an error and leaves the weights as they were before
  // the step. After any error from the engine the job should be abandoned.
  absl::StatusOr<StepResult> Step(const TrainingBatch& batch);

  int64_t steps() const { return steps_; }
  const TrainerOptions& options() const { return options_; }
  const BertWeights& weights() const { return weights_; }
  const ClassificationHead* head() const { return head_ ? &*head_ : nullptr; }
  const Model& base() const { return *base_; }

  // The current weights as an immutable model with the base's config and tokenizer.
  std::shared_ptr<const Model> Snapshot() const;

 private:
  Trainer() = default;

  std::shared_ptr<const Model> base_;
  TrainerOptions options_;
  BertWeights weights_;
  BertWeights grads_;
  std::optional<ClassificationHead> head_, head_grads_;
  std::optional<AdamW> optimizer_;
  int64_t steps_ = 0;
  // The last step's activations, kept so the next step reuses the buffers (EncoderForwardTraining
  // with a TrainingForward*): the same peak memory, without ~0.3 GB of fresh pages per step.
  TrainingForward forward_;
  // The backward's buffers, and which word-embedding gradient rows are non-zero (the
  // optimizer's entry for the word embeddings points at backward_.word_rows).
  BackwardWorkspace backward_;
  std::optional<TrainingTelemetry> telemetry_;  // when options_.telemetry_every > 0
};

}  // namespace attn
