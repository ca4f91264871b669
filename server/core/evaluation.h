// Evaluation in the serving core (issue 16): an evaluation set as a request carries it, checked
// and tokenized into the engine's EvaluationSet (engine/training/evaluate_encoder.h); the
// promotion gate a fine-tuning job may carry ("recall@1>=0.8", "mrr@10>base"); and Evaluate,
// which scores any version of a served model on a set without training (read-only, one task job
// on the model's batcher thread, like CompareVersions).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model.h"
#include "engine/training/evaluate_encoder.h"
#include "engine/training/trainer.h"
#include "server/core/calls.h"
#include "server/core/model_set.h"
#include "server/core/training_example.h"

namespace attn::server::core {

// Cost bounds of one evaluation set (INVALID_ARGUMENT beyond them, naming the limit): the texts
// it encodes (queries + corpus, or two per pair, or one per input), and each text's bytes
// (texts are truncated to the model's length in tokens anyway).
inline constexpr int64_t kMaxEvaluationTexts = 5000;
inline constexpr size_t kMaxEvaluationTextBytes = 8192;

// An evaluation set as a request carries it. The task's fields only:
//   kRetrieval            queries, corpus, relevant[q] (index into corpus)
//   kCosineSimilarity     examples[i].first, .second, .score
//   kClassification       examples[i].text, .label
//   kPairClassification   examples[i].first, .second, .label
struct EvaluationSetRequest {
  std::optional<EvaluationTask> task;  // required once anything else is set
  std::vector<std::string> queries, corpus;
  std::vector<int64_t> relevant;
  std::vector<TrainingExample> examples;

  bool empty() const {
    return !task.has_value() && queries.empty() && corpus.empty() && relevant.empty() &&
           examples.empty();
  }
};

// Checks `in` (field names prefixed with `field`, e.g. "config.evaluation") and tokenizes it with
// `model`'s tokenizer and `truncation`: INVALID_ARGUMENT naming the field and the limit for an
// unset task, fields of another task, an empty text, a relevant index outside the corpus, too
// many texts or bytes, a non-finite score or a negative label.
absl::StatusOr<EvaluationSet> ConvertEvaluationSet(const EvaluationSetRequest& in,
                                                   const Model& model,
                                                   const TruncationOptions& truncation,
                                                   absl::string_view field);

// Which evaluation tasks a job of `objective` can be scored on: retrieval and cosine similarity
// for any (they read embeddings), classification only with a CLASSIFICATION job's head of
// `num_labels`, pair classification only with a PAIR_CLASSIFICATION job's.
absl::Status CheckEvaluationFitsObjective(const EvaluationSet& set, Objective objective,
                                          int num_labels, absl::string_view field);

// A promotion gate: conditions on the job's final evaluation that must all hold, each
// "<metric> <op> <threshold>" with op one of >= > <= <, the threshold a number or relative to
// the base version's score ("base", "base+0.02", "base-0.01"); conditions separated by ','.
struct PromotionGate {
  struct Condition {
    std::string metric;
    std::string op;
    bool relative_to_base = false;
    double value = 0;  // the threshold, or the offset from base
  };
  std::string text;  // as given
  std::vector<Condition> conditions;
};

// INVALID_ARGUMENT naming `field` and quoting (shortly) what it cannot read, or a metric that
// `task` does not report (listing those it does).
absl::StatusOr<PromotionGate> ParsePromotionGate(absl::string_view text, EvaluationTask task,
                                                 absl::string_view field);

struct GateOutcome {
  bool holds = false;
  // Each condition with the numbers: "recall@1 0.850 >= 0.800 holds; mrr@10 0.70 > base 0.72
  // fails".
  std::string detail;
};
GateOutcome CheckPromotionGate(const PromotionGate& gate, const EvaluationResult& final_result,
                               const EvaluationResult& base_result);

// "mrr@10 0.9500, recall@1 0.9000, ..." for logs and messages.
std::string FormatMetrics(const EvaluationResult& result);

struct EvaluateRequest {
  std::string model;    // empty = the default model
  std::string version;  // empty = the one served now
  EvaluationSetRequest evaluation;
  TokenizationOptions tokenization;
};

struct EvaluateResponse {
  std::string model, model_version;
  EvaluationResult result;
};

// Scores `request.version` on `request.evaluation`: the set is checked and tokenized on the
// calling thread, the encoding and scoring run as one task job on the model's batcher (yielding
// to queued Encode batches between chunks). FAILED_PRECONDITION for a classification set on a
// version without a head of that kind. `done` is called exactly once.
void Evaluate(const ModelSet& models, const EvaluateRequest& request, const CallControl& control,
              std::function<void(absl::StatusOr<EvaluateResponse>)> done);

}  // namespace attn::server::core
