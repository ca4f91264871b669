// Scores an encoder on a held-out evaluation set (issue 16): the texts are encoded in chunks by
// a caller-given forward (a served Model's, or a training job's current weights), turned into
// what each task compares — the L2-normalised pooled embedding, or for a cross-encoder the
// segment product its head reads (engine/ops/segment_product.h) — and scored with the metrics
// of evaluation.h:
//
//   task                    inputs                                  metrics, in this order
//   kRetrieval              queries, corpus, relevant[q]            mrr@10 recall@1 recall@10
//                                                                   ndcg@10
//   kCosineSimilarity       first[i], second[i], gold score[i]      spearman
//   kClassification         inputs[i] (texts), labels[i]            accuracy macro_f1
//   kPairClassification     inputs[i] (pairs encoded together),     accuracy macro_f1
//                           labels[i]
//
// Classification tasks need the version's head (the class with the largest logit is the
// prediction). No transport, no threads of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "engine/model_config.h"
#include "engine/training/losses.h"

namespace attn {

enum class EvaluationTask { kRetrieval, kCosineSimilarity, kClassification, kPairClassification };

// "retrieval", "cosine_similarity", "classification", "pair_classification".
const char* EvaluationTaskName(EvaluationTask task);
// The task of a name EvaluationTaskName gives; false for any other text.
bool ParseEvaluationTask(std::string_view name, EvaluationTask* task);
// The metric names a task reports, in order (the table above).
const std::vector<std::string>& EvaluationMetricNames(EvaluationTask task);

// A tokenized evaluation set; the fields of its task are filled, the others empty.
struct EvaluationSet {
  EvaluationTask task = EvaluationTask::kRetrieval;
  // kRetrieval: queries[q]'s one relevant item is corpus[relevant[q]]; every other corpus item
  // is a distractor.
  std::vector<SequenceInput> queries, corpus;
  std::vector<int64_t> relevant;
  // kCosineSimilarity: cos(first[i], second[i]) is ranked against scores[i].
  std::vector<SequenceInput> first, second;
  std::vector<double> scores;
  // kClassification, kPairClassification: inputs[i] has class labels[i].
  std::vector<SequenceInput> inputs;
  std::vector<int64_t> labels;

  // Queries, pairs or inputs: what the metrics average over.
  int64_t examples() const;
  // Sequences the evaluation encodes, and their tokens.
  int64_t sequences() const;
  int64_t tokens() const;
};

struct EvaluationResult {
  EvaluationTask task = EvaluationTask::kRetrieval;
  std::vector<std::pair<std::string, double>> metrics;  // EvaluationMetricNames(task) order
  int64_t examples = 0;
  // Per example: kRetrieval the relevant item's 1-based rank; kCosineSimilarity the predicted
  // cosine; classification tasks the predicted label.
  std::vector<double> per_example;
  double seconds = 0;

  // NaN when the task has no metric of that name.
  double Metric(const std::string& name) const;
};

// The encoder forward to evaluate with: `batch` with `options` (pooling and layers set by
// EvaluateEncoder). A Model's Forward, or EncoderForward on a job's raw weights.
using EvaluationForward = std::function<absl::StatusOr<ForwardResult>(
    const std::vector<SequenceInput>& batch, const ForwardOptions& options)>;

struct EvaluationOptions {
  PoolingMode pooling = PoolingMode::kMean;  // the model's sentence pooling
  int num_layers = 0;                        // the last hidden layer (pair features)
  const ClassificationHead* head = nullptr;  // required by the classification tasks
  // Chunks of at most this many sequences and tokens go through one forward.
  int64_t chunk_sequences = 64;
  int64_t chunk_tokens = 4096;
  // Asked between chunks; true stops the evaluation with its status (CANCELLED). May be empty.
  std::function<bool()> yield;
};

// FailedPrecondition when a classification task has no head (or a head of fewer classes than
// a label), InvalidArgument for a set its task cannot score (no examples, counts that differ,
// a relevant index outside the corpus), the forward's error otherwise.
absl::StatusOr<EvaluationResult> EvaluateEncoder(const EvaluationSet& set,
                                                 const EvaluationOptions& options,
                                                 const EvaluationForward& forward);

}  // namespace attn
