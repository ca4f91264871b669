// A fine-tuning job's plain request structs and its pure parts: the config resolved into the
// trainer's settings, and each batch validated and tokenized. Errors are INVALID_ARGUMENT naming
// the field ("config.beta1 ...", "batch 3, examples[1].label ..."), so these are easy to test
// and fuzz like the Encoder's request validation. The job itself (its thread, its commit) is in
// fine_tuning.h; a front end translates its messages to these structs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/training/trainer.h"
#include "engine/training/training_report.h"
#include "server/core/calls.h"
#include "server/core/evaluation.h"
#include "server/core/training_example.h"

namespace attn::server::core {

// What a job asks for. 0 means "the default" for every number except the optional ones, as in
// the protocol (attnserve.v1.FineTuneConfig documents each field).
struct FineTuneConfig {
  std::optional<Objective> objective;  // required
  double learning_rate = 0;
  double beta1 = 0;
  double beta2 = 0;
  double epsilon = 0;
  std::optional<double> weight_decay;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  std::optional<double> max_grad_norm;  // 0 = no clipping
  TrainableSet parameters = TrainableSet::kAll;
  uint64_t seed = 0;
  bool disable_dropout = false;
  double contrastive_scale = 0;
  int32_t num_labels = 0;
  std::vector<std::string> label_names;  // classification objectives: none or num_labels
  std::string base_version;              // empty = the served version
  TokenizationOptions tokenization;
  int32_t telemetry_every = 0;  // 0 = no telemetry
  // Held-out data scored on the base, every eval_every steps (0 = only there and at the end)
  // and on the committed weights; and a condition on the final scores for promotion.
  EvaluationSetRequest evaluation;
  int32_t eval_every = 0;
  std::string promote_if;  // "" = none (PromotionGate)
  std::string precision;        // empty = float32; "bfloat16"/"bf16": mixed precision
};

struct TrainingBatchRequest {
  std::vector<TrainingExample> examples;
};

struct CommitRequest {
  std::string description;
  // Serve the version by default once committed; otherwise it is staged (listed, pinnable).
  bool promote = false;
  // The protocol's deprecated do_not_serve: staging is the default, so it changes nothing; with
  // `promote` it contradicts it (INVALID_ARGUMENT).
  bool do_not_serve = false;
};

// Where a job stands, after each step and at its end.
struct FineTuneProgress {
  std::string job_id;
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  double examples_per_second = 0;
  int64_t examples_seen = 0;
  std::string committed_version;  // set by a commit
  std::string base_version;       // set in the first progress of a job only
  std::vector<std::string> warnings;
  std::optional<StepTelemetry> telemetry;  // on telemetry steps
  // Evaluations run since the previous progress: the base's (step 0) with the first step, one
  // every eval_every steps, the committed weights' with the commit.
  std::vector<StepEvaluation> evaluations;
  bool promoted = false;  // set by a commit: the version is now the default
  std::string promotion;  // set by a commit: why it was staged or promoted
};

// What a FineTuneConfig asks for, checked and with defaults filled in.
struct JobSettings {
  TrainerOptions trainer;
  TruncationOptions truncation;
  std::vector<std::string> label_names;     // recorded with the committed version
  std::optional<EvaluationSet> evaluation;  // tokenized, checked against the objective
  int32_t eval_every = 0;
  std::optional<PromotionGate> gate;  // needs `evaluation`
};

// One class name's limit (the store caps them all together: kMaxLabelNamesBytes).
inline constexpr size_t kMaxLabelNameBytes = 256;
// A promotion gate's text.
inline constexpr size_t kMaxPromoteIfBytes = 256;

// "contrastive", "cosine_similarity", "classification", "pair_classification".
const char* ObjectiveName(Objective objective);
// "all", "attention", "all_but_embeddings", "head" (attnctl's --parameters values).
const char* TrainableSetName(TrainableSet set);

// A job's label_names for its settings `t`: none, or one distinct non-empty name (at most
// kMaxLabelNameBytes) per label of a classification objective, within kMaxLabelNamesBytes.
absl::Status CheckLabelNames(const std::vector<std::string>& names, const TrainerOptions& t);

// `config` for a job that fine-tunes `base`: defaults filled in (0 = the default), then the
// engine's ValidateTrainerOptions, its message prefixed with "config: ".
absl::StatusOr<JobSettings> ResolveJobConfig(const FineTuneConfig& config, const Model& base);

// The batch's size against the server's limit, checked on arrival (before any tokenization):
// at most `max_examples` examples. The least a batch needs is the engine's to say
// (ValidateTrainingBatch, through ConvertBatch).
absl::Status CheckBatchShape(const TrainingBatchRequest& batch, int64_t batch_number,
                             int max_examples);
// What is legal but teaches nothing (anchor == positive), as warnings for the client.
std::vector<std::string> BatchWarnings(const TrainingBatchRequest& batch,
                                       const JobSettings& settings, int64_t batch_number);

// Converts batch number `batch_number` of a job into the engine's batch, tokenized with the
// base model's tokenizer: checks what only the request has (empty texts, fields of another
// objective), then the engine's ValidateTrainingBatch (counts, negatives, scores, labels), its
// message prefixed with "batch N, ".
absl::Status ConvertBatch(const TrainingBatchRequest& in, const JobSettings& settings,
                          const Model& model, int64_t batch_number, TrainingBatch* out);

// A failed training step as the job's end: the engine reports a diverged step (NaN/Inf loss or
// gradient) as OUT_OF_RANGE; for the client that is the job ABORTED (retrying the same job cannot
// help, a new one with other settings can). `message` replaces the step's message.
absl::Status StepFailure(const absl::Status& step, const std::string& message);

// The origin shown for a committed version: "fine-tuned from base (contrastive, 12 steps)".
std::string FineTunedOrigin(const std::string& base, const std::string& objective, int64_t steps);

}  // namespace attn::server::core
