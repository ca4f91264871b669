#include "server/core/evaluation.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/quote.h"
#include "server/core/fine_tune_job.h"
#include "server/core/request_plan.h"
#include "server/core/version_tasks.h"

namespace attn::server::core {

namespace {

// Tokenizes one text (or a pair, `second` non-null) of an evaluation set named `where`.
absl::StatusOr<SequenceInput> TokenizeEvaluationText(const Model& model,
                                                     const TruncationOptions& truncation,
                                                     const std::string& where,
                                                     const std::string& text,
                                                     const std::string* second = nullptr) {
  for (const std::string* t : {&text, second}) {
    if (t == nullptr) continue;
    if (t->empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
    if (t->size() > kMaxEvaluationTextBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has ", t->size(), " bytes; the limit is ", kMaxEvaluationTextBytes));
    }
  }
  absl::StatusOr<Encoding> encoding = second == nullptr
                                          ? model.tokenizer().Encode(text, truncation)
                                          : model.tokenizer().EncodePair(text, *second, truncation);
  if (!encoding.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", encoding.status().message()));
  }
  if (!truncation.enabled && encoding->size() > truncation.max_length) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", encoding->size(), " tokens, more than max_length ",
                     truncation.max_length, " and truncation is TRUNCATION_NONE"));
  }
  return SequenceInput{std::move(encoding->ids), std::move(encoding->type_ids)};
}

const char* TaskFieldsHint(EvaluationTask task) {
  switch (task) {
    case EvaluationTask::kRetrieval:
      return "queries, corpus and relevant";
    case EvaluationTask::kCosineSimilarity:
      return "examples with first, second and score";
    case EvaluationTask::kClassification:
      return "examples with text and label";
    case EvaluationTask::kPairClassification:
      return "examples with first, second and label";
  }
  return "";
}

}  // namespace

absl::StatusOr<EvaluationSet> ConvertEvaluationSet(const EvaluationSetRequest& in,
                                                   const Model& model,
                                                   const TruncationOptions& truncation,
                                                   absl::string_view field_name) {
  const std::string field(field_name);
  if (!in.task.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".task is not set; use RETRIEVAL, COSINE_SIMILARITY, CLASSIFICATION or "
                     "PAIR_CLASSIFICATION"));
  }
  EvaluationSet out;
  out.task = *in.task;
  const char* task = EvaluationTaskName(out.task);
  auto wrong_fields = [&](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".", what, " is set but a ", task,
                                                   " evaluation uses ", TaskFieldsHint(out.task)));
  };
  const bool retrieval = out.task == EvaluationTask::kRetrieval;
  if (!retrieval) {
    if (!in.queries.empty()) return wrong_fields("queries");
    if (!in.corpus.empty()) return wrong_fields("corpus");
    if (!in.relevant.empty()) return wrong_fields("relevant");
  } else if (!in.examples.empty()) {
    return wrong_fields("examples");
  }
  const int64_t texts = retrieval ? static_cast<int64_t>(in.queries.size() + in.corpus.size())
                                  : static_cast<int64_t>(in.examples.size()) *
                                        (out.task == EvaluationTask::kCosineSimilarity ? 2 : 1);
  if (texts > kMaxEvaluationTexts) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", texts, " texts to encode; the limit is ", kMaxEvaluationTexts,
                     " (split it, or sample it)"));
  }
  auto tokenize = [&](const std::string& where, const std::string& text, const std::string* second,
                      std::vector<SequenceInput>* into) {
    absl::StatusOr<SequenceInput> sequence =
        TokenizeEvaluationText(model, truncation, where, text, second);
    if (!sequence.ok()) return sequence.status();
    into->push_back(*std::move(sequence));
    return absl::OkStatus();
  };
  if (retrieval) {
    if (in.queries.empty() || in.corpus.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has ", in.queries.size(), " queries and ", in.corpus.size(),
                       " corpus items; a retrieval evaluation needs at least one of each"));
    }
    if (in.relevant.size() != in.queries.size()) {
      return absl::InvalidArgumentError(absl::StrCat(field, " has ", in.queries.size(),
                                                     " queries but ", in.relevant.size(),
                                                     " relevant indices; give one per query"));
    }
    for (size_t i = 0; i < in.queries.size(); ++i) {
      const int64_t relevant = in.relevant[i];
      if (relevant < 0 || relevant >= static_cast<int64_t>(in.corpus.size())) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".relevant[", i, "] is ", relevant,
                                                       "; give an index into corpus (0 to ",
                                                       in.corpus.size() - 1, ")"));
      }
      absl::Status status =
          tokenize(absl::StrCat(field, ".queries[", i, "]"), in.queries[i], nullptr, &out.queries);
      if (!status.ok()) return status;
      out.relevant.push_back(relevant);
    }
    for (size_t i = 0; i < in.corpus.size(); ++i) {
      absl::Status status =
          tokenize(absl::StrCat(field, ".corpus[", i, "]"), in.corpus[i], nullptr, &out.corpus);
      if (!status.ok()) return status;
    }
    return out;
  }
  if (in.examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has no examples; a ", task,
                                                   " evaluation needs ", TaskFieldsHint(out.task)));
  }
  for (size_t i = 0; i < in.examples.size(); ++i) {
    const TrainingExample& e = in.examples[i];
    const std::string where = absl::StrCat(field, ".examples[", i, "]");
    auto unused = [&](const char* name) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".", name, " is set but a ", task, " evaluation uses ", TaskFieldsHint(out.task)));
    };
    if (!e.anchor.empty()) return unused("anchor");
    if (!e.positive.empty()) return unused("positive");
    if (!e.negative.empty()) return unused("negative");
    absl::Status status;
    switch (out.task) {
      case EvaluationTask::kCosineSimilarity:
        if (!e.text.empty()) return unused("text");
        if (e.label != 0) return unused("label");
        if (!std::isfinite(e.score)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ".score is not a finite number"));
        }
        if (!(status = tokenize(where + ".first", e.first, nullptr, &out.first)).ok()) {
          return status;
        }
        if (!(status = tokenize(where + ".second", e.second, nullptr, &out.second)).ok()) {
          return status;
        }
        out.scores.push_back(e.score);
        break;
      case EvaluationTask::kClassification:
      case EvaluationTask::kPairClassification: {
        const bool pairs = out.task == EvaluationTask::kPairClassification;
        if (e.score != 0) return unused("score");
        if (pairs && !e.text.empty()) return unused("text");
        if (!pairs && !e.first.empty()) return unused("first");
        if (!pairs && !e.second.empty()) return unused("second");
        if (e.label < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".label is ", e.label, "; labels are class indices >= 0"));
        }
        if (pairs) {
          if (e.first.empty()) return absl::InvalidArgumentError(where + ".first is empty");
          status = tokenize(where + ".first/second", e.first, &e.second, &out.inputs);
        } else {
          status = tokenize(where + ".text", e.text, nullptr, &out.inputs);
        }
        if (!status.ok()) return status;
        out.labels.push_back(e.label);
        break;
      }
      case EvaluationTask::kRetrieval:
        break;
    }
  }
  if (out.task == EvaluationTask::kCosineSimilarity && out.first.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has 1 pair; Spearman's rho needs at least 2"));
  }
  return out;
}

absl::Status CheckEvaluationFitsObjective(const EvaluationSet& set, Objective objective,
                                          int num_labels, absl::string_view field) {
  const bool classification = set.task == EvaluationTask::kClassification;
  const bool pairs = set.task == EvaluationTask::kPairClassification;
  if (!classification && !pairs) return absl::OkStatus();
  const Objective needed = pairs ? Objective::kPairClassification : Objective::kClassification;
  if (objective != needed) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is a ", EvaluationTaskName(set.task),
                                                   " set, but a ", ObjectiveName(objective),
                                                   " job has no ", pairs ? "pair " : "",
                                                   "classification head to score it with; use a "
                                                   "retrieval or cosine_similarity set, or the ",
                                                   ObjectiveName(needed), " objective"));
  }
  for (size_t i = 0; i < set.labels.size(); ++i) {
    if (set.labels[i] >= num_labels) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".examples[", i, "].label is ",
                                                     set.labels[i], "; the job has num_labels ",
                                                     num_labels));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PromotionGate> ParsePromotionGate(absl::string_view text, EvaluationTask task,
                                                 absl::string_view field) {
  PromotionGate gate;
  gate.text = std::string(text);
  const std::vector<std::string>& metrics = EvaluationMetricNames(task);
  auto bad = [&](absl::string_view part, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " ", QuoteInput(std::string(part)), ": ", why,
        "; write conditions like \"recall@1>=0.8\" or \"mrr@10>base+0.02\", separated by ','"));
  };
  if (absl::StripAsciiWhitespace(text).empty()) return bad(text, "no condition");
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const absl::string_view condition = absl::StripAsciiWhitespace(part);
    const size_t op_at = condition.find_first_of("<>");
    if (op_at == absl::string_view::npos) return bad(condition, "no comparison (>=, >, <= or <)");
    PromotionGate::Condition c;
    c.metric = absl::AsciiStrToLower(absl::StripAsciiWhitespace(condition.substr(0, op_at)));
    const bool or_equal = op_at + 1 < condition.size() && condition[op_at + 1] == '=';
    c.op = std::string(condition.substr(op_at, or_equal ? 2 : 1));
    absl::string_view rhs = absl::StripAsciiWhitespace(condition.substr(op_at + c.op.size()));
    if (std::find(metrics.begin(), metrics.end(), c.metric) == metrics.end()) {
      return bad(condition,
                 absl::StrCat("a ", EvaluationTaskName(task), " evaluation reports ",
                              absl::StrJoin(metrics, ", "), ", not ", QuoteInput(c.metric)));
    }
    if (absl::ConsumePrefix(&rhs, "base")) {
      c.relative_to_base = true;
      rhs = absl::StripAsciiWhitespace(rhs);
      if (rhs.empty()) {
        c.value = 0;
      } else {
        const bool minus = rhs.front() == '-';
        if (rhs.front() != '+' && !minus) return bad(condition, "expected base, base+X or base-X");
        double offset = 0;
        if (!absl::SimpleAtod(absl::StripAsciiWhitespace(rhs.substr(1)), &offset) ||
            !std::isfinite(offset)) {
          return bad(condition, "the offset from base is not a number");
        }
        c.value = minus ? -offset : offset;
      }
    } else if (!absl::SimpleAtod(rhs, &c.value) || !std::isfinite(c.value)) {
      return bad(condition, "the threshold is not a number (or base, base+X, base-X)");
    }
    gate.conditions.push_back(std::move(c));
  }
  return gate;
}

GateOutcome CheckPromotionGate(const PromotionGate& gate, const EvaluationResult& final_result,
                               const EvaluationResult& base_result) {
  GateOutcome outcome;
  outcome.holds = true;
  std::vector<std::string> parts;
  for (const PromotionGate::Condition& c : gate.conditions) {
    const double value = final_result.Metric(c.metric);
    const double base = base_result.Metric(c.metric);
    const double threshold = c.relative_to_base ? base + c.value : c.value;
    bool holds = false;
    if (c.op == ">=") holds = value >= threshold;
    if (c.op == ">") holds = value > threshold;
    if (c.op == "<=") holds = value <= threshold;
    if (c.op == "<") holds = value < threshold;
    outcome.holds = outcome.holds && holds;  // NaN compares false: never promotes
    std::string threshold_text =
        c.relative_to_base ? (c.value == 0 ? absl::StrFormat("base %.4f", base)
                                           : absl::StrFormat("base %.4f %c %g = %.4f", base,
                                                             c.value < 0 ? '-' : '+',
                                                             std::abs(c.value), threshold))
                           : absl::StrFormat("%g", threshold);
    parts.push_back(absl::StrFormat("%s %.4f %s %s %s", c.metric, value, c.op, threshold_text,
                                    holds ? "holds" : "fails"));
  }
  outcome.detail = absl::StrJoin(parts, "; ");
  return outcome;
}

std::string FormatMetrics(const EvaluationResult& result) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : result.metrics) {
    parts.push_back(absl::StrFormat("%s %.4f", name, value));
  }
  return absl::StrJoin(parts, ", ");
}

void Evaluate(const ModelSet& models, const EvaluateRequest& request, const CallControl& control,
              std::function<void(absl::StatusOr<EvaluateResponse>)> done) {
  absl::StatusOr<const ServedModel*> served = models.Find(request.model);
  if (!served.ok()) return done(served.status());
  absl::StatusOr<ModelVersion> version = request.version.empty()
                                             ? (*served)->registry->Get("")
                                             : FindVersion(**served, request.version, "version");
  if (!version.ok()) return done(version.status());
  std::shared_ptr<const Model> model = version->model;
  absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(*model, request.tokenization);
  if (!truncation.ok()) return done(truncation.status());
  absl::StatusOr<EvaluationSet> set =
      ConvertEvaluationSet(request.evaluation, *model, *truncation, "evaluation");
  if (!set.ok()) return done(set.status());
  std::optional<VersionHead> head;
  const bool pairs = set->task == EvaluationTask::kPairClassification;
  if (pairs || set->task == EvaluationTask::kClassification) {
    absl::StatusOr<std::optional<VersionHead>> stored =
        StoredHead(**served, *version, model->config().hidden_size);
    if (!stored.ok()) return done(stored.status());
    if (!stored->has_value() || (*stored)->pairs != pairs) {
      return done(absl::FailedPreconditionError(absl::StrCat(
          "version ", version->version, " has no ", pairs ? "pair " : "",
          "classification head to score a ", EvaluationTaskName(set->task),
          " set with; name a version fine-tuned with the ",
          pairs ? "PAIR_CLASSIFICATION" : "CLASSIFICATION", " objective (ListVersions)")));
    }
    head = std::move(**stored);
  }
  auto response = std::make_shared<EvaluateResponse>();
  response->model = (*served)->name;
  response->model_version = version->version;
  const int64_t tokens = set->tokens();
  SubmitTask<EvaluationResult>(
      **served, model, tokens, control,
      [model, set = *std::move(set), head = std::move(head)](
          const std::function<bool()>& yield, EvaluationResult* out) -> absl::Status {
        EvaluationOptions options;
        options.pooling = model->sentence_config().pooling;
        options.num_layers = model->config().num_hidden_layers;
        options.head = head ? &head->head : nullptr;
        options.yield = yield;
        absl::StatusOr<EvaluationResult> result = EvaluateEncoder(
            set, options,
            [&model](const std::vector<SequenceInput>& batch, const ForwardOptions& forward) {
              return model->Forward(batch, forward);
            });
        if (!result.ok()) return result.status();
        *out = *std::move(result);
        return absl::OkStatus();
      },
      [response, done = std::move(done)](absl::StatusOr<EvaluationResult> result) {
        if (!result.ok()) return done(result.status());
        response->result = *std::move(result);
        done(std::move(*response));
      });
}

}  // namespace attn::server::core
