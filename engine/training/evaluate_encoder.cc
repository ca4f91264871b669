#include "engine/training/evaluate_encoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/ops/pooling.h"
#include "engine/ops/segment_product.h"
#include "engine/training/evaluation.h"

namespace attn {

namespace {

// What each task compares, per sequence (S, H): the L2-normalised pooled embedding, or the
// segment product of the pair's last layer.
absl::StatusOr<std::vector<float>> Features(const std::vector<SequenceInput>& sequences,
                                            bool pair_features, const EvaluationOptions& options,
                                            const EvaluationForward& forward) {
  std::vector<float> features;
  ForwardOptions forward_options;
  if (pair_features) {
    forward_options.pool = false;
    forward_options.hidden_layers = {options.num_layers};
  } else {
    forward_options.pool = true;
    forward_options.pooling = options.pooling;
    forward_options.normalize = true;
  }
  std::vector<SequenceInput> chunk;
  int64_t chunk_tokens = 0;
  auto run = [&]() -> absl::Status {
    if (chunk.empty()) return absl::OkStatus();
    if (options.yield && options.yield()) {
      return absl::CancelledError("the evaluation was cancelled");
    }
    absl::StatusOr<ForwardResult> result = forward(chunk, forward_options);
    if (!result.ok()) return result.status();
    if (pair_features) {
      const Tensor* hidden = result->HiddenState(options.num_layers);
      if (hidden == nullptr) return absl::InternalError("the forward left out the last layer");
      const int64_t H = hidden->dim(1), B = static_cast<int64_t>(chunk.size());
      std::vector<int32_t> type_ids;
      type_ids.reserve(hidden->dim(0));
      for (const SequenceInput& s : chunk) {
        if (s.type_ids.empty()) {
          type_ids.insert(type_ids.end(), s.token_ids.size(), 0);
        } else {
          type_ids.insert(type_ids.end(), s.type_ids.begin(), s.type_ids.end());
        }
      }
      const size_t at = features.size();
      features.resize(at + B * H);
      if (absl::Status status =
              SegmentProductForward(hidden->data(), H, result->seq_offsets, type_ids.data(),
                                    features.data() + at, nullptr);
          !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            status.message(), " (a pair truncated to its first text: shorten the first text)"));
      }
    } else {
      features.insert(features.end(), result->pooled.data(),
                      result->pooled.data() + result->pooled.numel());
    }
    chunk.clear();
    chunk_tokens = 0;
    return absl::OkStatus();
  };
  for (const SequenceInput& sequence : sequences) {
    const int64_t tokens = static_cast<int64_t>(sequence.token_ids.size());
    if (!chunk.empty() && (static_cast<int64_t>(chunk.size()) >= options.chunk_sequences ||
                           chunk_tokens + tokens > options.chunk_tokens)) {
      if (absl::Status status = run(); !status.ok()) return status;
    }
    chunk.push_back(sequence);
    chunk_tokens += tokens;
  }
  if (absl::Status status = run(); !status.ok()) return status;
  return features;
}

absl::Status CheckHead(const EvaluationSet& set, const ClassificationHead* head) {
  if (head == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("a ", EvaluationTaskName(set.task),
                     " evaluation needs a version with a classification head (fine-tuned with "
                     "the ",
                     EvaluationTaskName(set.task), " objective)"));
  }
  for (size_t i = 0; i < set.labels.size(); ++i) {
    if (set.labels[i] < 0 || set.labels[i] >= head->num_labels()) {
      return absl::InvalidArgumentError(
          absl::StrCat("examples[", i, "].label is ", set.labels[i], "; the head has ",
                       head->num_labels(), " classes (0 to ", head->num_labels() - 1, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* EvaluationTaskName(EvaluationTask task) {
  switch (task) {
    case EvaluationTask::kRetrieval:
      return "retrieval";
    case EvaluationTask::kCosineSimilarity:
      return "cosine_similarity";
    case EvaluationTask::kClassification:
      return "classification";
    case EvaluationTask::kPairClassification:
      return "pair_classification";
  }
  return "unknown";
}

bool ParseEvaluationTask(std::string_view name, EvaluationTask* task) {
  for (EvaluationTask candidate :
       {EvaluationTask::kRetrieval, EvaluationTask::kCosineSimilarity,
        EvaluationTask::kClassification, EvaluationTask::kPairClassification}) {
    if (name == EvaluationTaskName(candidate)) {
      *task = candidate;
      return true;
    }
  }
  return false;
}

const std::vector<std::string>& EvaluationMetricNames(EvaluationTask task) {
  static const std::vector<std::string> retrieval = {"mrr@10", "recall@1", "recall@10", "ndcg@10"};
  static const std::vector<std::string> cosine = {"spearman"};
  static const std::vector<std::string> classification = {"accuracy", "macro_f1"};
  switch (task) {
    case EvaluationTask::kRetrieval:
      return retrieval;
    case EvaluationTask::kCosineSimilarity:
      return cosine;
    case EvaluationTask::kClassification:
    case EvaluationTask::kPairClassification:
      break;
  }
  return classification;
}

int64_t EvaluationSet::examples() const {
  switch (task) {
    case EvaluationTask::kRetrieval:
      return static_cast<int64_t>(queries.size());
    case EvaluationTask::kCosineSimilarity:
      return static_cast<int64_t>(first.size());
    case EvaluationTask::kClassification:
    case EvaluationTask::kPairClassification:
      break;
  }
  return static_cast<int64_t>(inputs.size());
}

int64_t EvaluationSet::sequences() const {
  return static_cast<int64_t>(queries.size() + corpus.size() + first.size() + second.size() +
                              inputs.size());
}

int64_t EvaluationSet::tokens() const {
  return CountTokens(queries) + CountTokens(corpus) + CountTokens(first) + CountTokens(second) +
         CountTokens(inputs);
}

double EvaluationResult::Metric(const std::string& name) const {
  for (const auto& [metric, value] : metrics) {
    if (metric == name) return value;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

absl::StatusOr<EvaluationResult> EvaluateEncoder(const EvaluationSet& set,
                                                 const EvaluationOptions& options,
                                                 const EvaluationForward& forward) {
  const auto start = std::chrono::steady_clock::now();
  EvaluationResult result;
  result.task = set.task;
  result.examples = set.examples();
  if (result.examples == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", EvaluationTaskName(set.task), " evaluation set has no examples"));
  }
  auto features_of = [&](const std::vector<SequenceInput>& sequences, bool pairs) {
    return Features(sequences, pairs, options, forward);
  };
  switch (set.task) {
    case EvaluationTask::kRetrieval: {
      if (set.relevant.size() != set.queries.size() || set.corpus.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("retrieval: ", set.queries.size(), " queries, ", set.relevant.size(),
                         " relevant items and a corpus of ", set.corpus.size(),
                         "; give one relevant item per query and a corpus of at least one item"));
      }
      absl::StatusOr<std::vector<float>> queries = features_of(set.queries, false);
      if (!queries.ok()) return queries.status();
      absl::StatusOr<std::vector<float>> corpus = features_of(set.corpus, false);
      if (!corpus.ok()) return corpus.status();
      const int64_t dim = static_cast<int64_t>(queries->size()) / result.examples;
      absl::StatusOr<RetrievalMetrics> m = RetrievalScores(*queries, *corpus, dim, set.relevant);
      if (!m.ok()) return m.status();
      result.metrics = {{"mrr@10", m->mrr_at_10},
                        {"recall@1", m->recall_at_1},
                        {"recall@10", m->recall_at_10},
                        {"ndcg@10", m->ndcg_at_10}};
      result.per_example.assign(m->ranks.begin(), m->ranks.end());
      break;
    }
    case EvaluationTask::kCosineSimilarity: {
      if (set.second.size() != set.first.size() || set.scores.size() != set.first.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cosine_similarity: ", set.first.size(), " first texts, ", set.second.size(),
            " second texts and ", set.scores.size(), " scores; give one of each per pair"));
      }
      if (set.first.size() < 2) {
        return absl::InvalidArgumentError(
            "cosine_similarity: Spearman's rho needs at least 2 pairs");
      }
      absl::StatusOr<std::vector<float>> first = features_of(set.first, false);
      if (!first.ok()) return first.status();
      absl::StatusOr<std::vector<float>> second = features_of(set.second, false);
      if (!second.ok()) return second.status();
      const int64_t dim = static_cast<int64_t>(first->size()) / result.examples;
      for (int64_t i = 0; i < result.examples; ++i) {
        // Both rows are unit vectors: their dot product is the cosine.
        double dot = 0;
        for (int64_t d = 0; d < dim; ++d) {
          dot += static_cast<double>((*first)[i * dim + d]) * (*second)[i * dim + d];
        }
        result.per_example.push_back(dot);
      }
      absl::StatusOr<double> rho = SpearmanCorrelation(result.per_example, set.scores);
      if (!rho.ok()) return rho.status();
      result.metrics = {{"spearman", *rho}};
      break;
    }
    case EvaluationTask::kClassification:
    case EvaluationTask::kPairClassification: {
      if (set.labels.size() != set.inputs.size()) {
        return absl::InvalidArgumentError(absl::StrCat(EvaluationTaskName(set.task), ": ",
                                                       set.inputs.size(), " inputs and ",
                                                       set.labels.size(), " labels"));
      }
      if (absl::Status head = CheckHead(set, options.head); !head.ok()) return head;
      const bool pairs = set.task == EvaluationTask::kPairClassification;
      absl::StatusOr<std::vector<float>> features = features_of(set.inputs, pairs);
      if (!features.ok()) return features.status();
      const int64_t k = options.head->num_labels();
      std::vector<float> logits(result.examples * k);
      ClassificationHeadForward(*options.head, features->data(), result.examples, logits.data());
      std::vector<int64_t> predicted(result.examples);
      for (int64_t i = 0; i < result.examples; ++i) {
        const float* row = logits.data() + i * k;
        // The first of equal logits wins, as Classify's stable sort answers.
        predicted[i] = std::max_element(row, row + k) - row;
        result.per_example.push_back(static_cast<double>(predicted[i]));
      }
      absl::StatusOr<ClassificationMetrics> m = ClassificationScores(predicted, set.labels);
      if (!m.ok()) return m.status();
      result.metrics = {{"accuracy", m->accuracy}, {"macro_f1", m->macro_f1}};
      break;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace attn
