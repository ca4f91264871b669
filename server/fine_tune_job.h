// A fine-tuning job's pure parts, free of the stream: the FineTuneConfig resolved into the
// trainer's settings, and each TrainingBatch validated and tokenized. Errors are
// INVALID_ARGUMENT naming the field ("config.beta1 ...", "batch 3, examples[1].label ..."), so
// these are easy to test and fuzz like the Encoder's request validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/trainer.pb.h"
#include "engine/model.h"
#include "engine/training/trainer.h"

namespace attn::server {

// What a FineTuneConfig asks for, checked and with defaults filled in.
struct JobSettings {
  TrainerOptions trainer;
  TruncationOptions truncation;
  attnserve::v1::Objective objective = attnserve::v1::OBJECTIVE_UNSPECIFIED;
};

// "contrastive", "cosine_similarity", "classification" (or "unspecified").
const char* ObjectiveName(attnserve::v1::Objective objective);

// `config` for a job that fine-tunes `base`: the protocol's enums and defaults (0 = the
// default), then the engine's ValidateTrainerOptions, its message prefixed with "config: ".
absl::StatusOr<JobSettings> ResolveJobConfig(const attnserve::v1::FineTuneConfig& config,
                                             const Model& base);

// The batch's size against the server's limit, checked on arrival (before any tokenization):
// at most `max_examples` examples. The least a batch needs is the engine's to say
// (ValidateTrainingBatch, through ConvertBatch).
absl::Status CheckBatchShape(const attnserve::v1::TrainingBatch& batch, int64_t batch_number,
                             int max_examples);
// What is legal but teaches nothing (anchor == positive), as warnings for the client.
std::vector<std::string> BatchWarnings(const attnserve::v1::TrainingBatch& batch,
                                       const JobSettings& settings, int64_t batch_number);

// Converts batch number `batch_number` of a job into the engine's batch, tokenized with the
// base model's tokenizer: checks what only the protocol has (empty texts, fields of another
// objective), then the engine's ValidateTrainingBatch (counts, negatives, scores, labels), its
// message prefixed with "batch N, ".
absl::Status ConvertBatch(const attnserve::v1::TrainingBatch& in, const JobSettings& settings,
                          const Model& model, int64_t batch_number, TrainingBatch* out);

// A failed training step as the job's end: the engine reports a diverged step (NaN/Inf loss or
// gradient) as OUT_OF_RANGE; for the client that is the job ABORTED (retrying the same job cannot
// help, a new one with other settings can). `message` replaces the step's message.
absl::Status StepFailure(const absl::Status& step, const std::string& message);

// The origin shown for a committed version: "fine-tuned from base (contrastive, 12 steps)".
std::string FineTunedOrigin(const std::string& base, const std::string& objective, int64_t steps);

}  // namespace attn::server
