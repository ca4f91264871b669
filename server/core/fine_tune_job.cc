#include "server/core/fine_tune_job.h"

#include <initializer_list>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model_store.h"
#include "engine/precision.h"
#include "engine/quote.h"
#include "server/core/request_plan.h"

namespace attn::server::core {

const char* ObjectiveName(Objective objective) {
  switch (objective) {
    case Objective::kContrastive:
      return "contrastive";
    case Objective::kCosineSimilarity:
      return "cosine_similarity";
    case Objective::kClassification:
      return "classification";
    case Objective::kPairClassification:
      return "pair_classification";
  }
  return "unknown";
}

const char* TrainableSetName(TrainableSet set) {
  switch (set) {
    case TrainableSet::kAll:
      return "all";
    case TrainableSet::kAttentionOnly:
      return "attention";
    case TrainableSet::kAllButEmbeddings:
      return "all_but_embeddings";
    case TrainableSet::kHeadOnly:
      return "head";
  }
  return "unknown";
}

absl::Status StepFailure(const absl::Status& step, const std::string& message) {
  return absl::Status(
      step.code() == absl::StatusCode::kOutOfRange ? absl::StatusCode::kAborted : step.code(),
      message);
}

std::string FineTunedOrigin(const std::string& base, const std::string& objective, int64_t steps) {
  return absl::StrCat("fine-tuned from ", base, " (", objective, ", ", steps,
                      steps == 1 ? " step)" : " steps)");
}

absl::Status CheckLabelNames(const std::vector<std::string>& names, const TrainerOptions& t) {
  if (names.empty()) return absl::OkStatus();
  if (!HasClassificationHead(t.objective)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.label_names is set but the ", ObjectiveName(t.objective),
        " objective has no labels; label names are for CLASSIFICATION and PAIR_CLASSIFICATION"));
  }
  if (static_cast<int64_t>(names.size()) != t.num_labels) {
    return absl::InvalidArgumentError(absl::StrCat("config.label_names has ", names.size(),
                                                   " names for num_labels ", t.num_labels,
                                                   "; give one name per label, or none"));
  }
  size_t bytes = 0;
  std::set<std::string_view> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (name.empty() || name.size() > kMaxLabelNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("config.label_names[", i, "] is ", name.size(),
                                                     " bytes; give 1 to ", kMaxLabelNameBytes,
                                                     " bytes"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("config.label_names[", i, "] repeats ",
                                                     QuoteInput(name), "; names must differ"));
    }
    bytes += name.size();
  }
  if (bytes > kMaxLabelNamesBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config.label_names total ", bytes,
                                                   " bytes, more than ", kMaxLabelNamesBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSettings> ResolveJobConfig(const FineTuneConfig& config, const Model& base) {
  JobSettings s;
  TrainerOptions& t = s.trainer;
  if (!config.objective.has_value()) {
    return absl::InvalidArgumentError(
        "config.objective is not set; use CONTRASTIVE, COSINE_SIMILARITY, CLASSIFICATION or "
        "PAIR_CLASSIFICATION");
  }
  t.objective = *config.objective;

  // AdamW: 0 means the default for every setting but weight_decay, which is optional. The
  // values themselves are checked by the engine (ValidateTrainerOptions, below).
  if (config.learning_rate != 0) t.adamw.lr = config.learning_rate;
  if (config.beta1 != 0) t.adamw.beta1 = config.beta1;
  if (config.beta2 != 0) t.adamw.beta2 = config.beta2;
  if (config.epsilon != 0) t.adamw.eps = config.epsilon;
  if (config.weight_decay) t.adamw.weight_decay = *config.weight_decay;
  t.warmup_steps = config.warmup_steps;
  t.total_steps = config.total_steps;
  if (config.max_grad_norm) t.max_grad_norm = *config.max_grad_norm;  // 0 = no clipping
  t.trainable = config.parameters;
  t.seed = config.seed;
  t.dropout = !config.disable_dropout;
  if (config.telemetry_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.telemetry_every is ", config.telemetry_every,
                     "; give 0 (no telemetry) or the number of steps between reports"));
  }
  t.telemetry_every = config.telemetry_every;
  if (!config.precision.empty() &&
      (!ParsePrecision(config.precision, &t.precision) || t.precision == Precision::kInt8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.precision is ", QuoteInput(config.precision),
        "; use float32 (the default) or bfloat16 (mixed precision: bf16 matmuls, fp32 weights)"));
  }

  if (config.contrastive_scale != 0) {  // 0 = the default
    if (t.objective != Objective::kContrastive) {
      return absl::InvalidArgumentError(
          "config.contrastive_scale is only for the CONTRASTIVE objective");
    }
    t.contrastive_scale = config.contrastive_scale;
  }
  t.num_labels = config.num_labels;
  if (absl::Status valid = ValidateTrainerOptions(t); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", valid.message()));
  }
  if (absl::Status names = CheckLabelNames(config.label_names, t); !names.ok()) return names;
  s.label_names = config.label_names;

  absl::StatusOr<TruncationOptions> truncation = ResolveTruncation(base, config.tokenization);
  if (!truncation.ok())
    return absl::InvalidArgumentError(absl::StrCat("config.", truncation.status().message()));
  s.truncation = *truncation;

  if (config.eval_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.eval_every is ", config.eval_every,
                     "; give 0 (evaluate the base and the end only) or the number of steps between "
                     "evaluations"));
  }
  s.eval_every = config.eval_every;
  if (!config.evaluation.empty()) {
    absl::StatusOr<EvaluationSet> set =
        ConvertEvaluationSet(config.evaluation, base, s.truncation, "config.evaluation");
    if (!set.ok()) return set.status();
    if (absl::Status fits =
            CheckEvaluationFitsObjective(*set, t.objective, t.num_labels, "config.evaluation");
        !fits.ok()) {
      return fits;
    }
    s.evaluation = *std::move(set);
  } else if (config.eval_every > 0) {
    return absl::InvalidArgumentError(
        "config.eval_every is set but the config has no evaluation set (config.evaluation)");
  }
  if (!config.promote_if.empty()) {
    if (config.promote_if.size() > kMaxPromoteIfBytes) {
      return absl::InvalidArgumentError(absl::StrCat("config.promote_if has ",
                                                     config.promote_if.size(),
                                                     " bytes; the limit is ", kMaxPromoteIfBytes));
    }
    if (!s.evaluation) {
      return absl::InvalidArgumentError(
          "config.promote_if needs an evaluation set (config.evaluation): the gate compares its "
          "scores on the trained weights with the base version's");
    }
    absl::StatusOr<PromotionGate> gate =
        ParsePromotionGate(config.promote_if, s.evaluation->task, "config.promote_if");
    if (!gate.ok()) return gate.status();
    s.gate = *std::move(gate);
  }
  return s;
}

absl::Status CheckBatchShape(const TrainingBatchRequest& batch, int64_t batch_number,
                             int max_examples) {
  const int examples = static_cast<int>(batch.examples.size());
  if (examples > max_examples) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch_number, " has ", examples,
                                                   " examples; send 1 to ", max_examples,
                                                   " (--max-inputs-per-request) per batch"));
  }
  return absl::OkStatus();
}

std::vector<std::string> BatchWarnings(const TrainingBatchRequest& batch,
                                       const JobSettings& settings, int64_t batch_number) {
  std::vector<std::string> warnings;
  if (settings.trainer.objective == Objective::kContrastive) {
    int same = 0;
    for (const TrainingExample& e : batch.examples) same += e.anchor == e.positive;
    if (same > 0) {
      warnings.push_back(absl::StrCat(
          "batch ", batch_number, ": ", same, " of ", static_cast<int>(batch.examples.size()),
          " examples have anchor == positive; an identical pair is trivially similar (loss "
          "near 0) and teaches nothing, give real paraphrases or related texts"));
    }
  }
  return warnings;
}

absl::Status ConvertBatch(const TrainingBatchRequest& in, const JobSettings& settings,
                          const Model& model, int64_t batch_number, TrainingBatch* out) {
  const std::string batch_name = absl::StrCat("batch ", batch_number);
  const int examples = static_cast<int>(in.examples.size());
  auto tokenize = [&](int i, const char* field, const std::string& text,
                      std::vector<SequenceInput>* into) -> absl::Status {
    const std::string where = absl::StrCat(batch_name, ", examples[", i, "].", field);
    if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
    absl::StatusOr<Encoding> encoding = model.tokenizer().Encode(text, settings.truncation);
    if (!encoding.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", encoding.status().message()));
    if (!settings.truncation.enabled && encoding->size() > settings.truncation.max_length) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has ", encoding->size(), " tokens, more than max_length ",
                       settings.truncation.max_length, " and truncation is TRUNCATION_NONE"));
    }
    into->push_back({std::move(encoding->ids), std::move(encoding->type_ids)});
    return absl::OkStatus();
  };
  auto tokenize_pair = [&](int i, const std::string& first, const std::string& second,
                           std::vector<SequenceInput>* into) -> absl::Status {
    const std::string where = absl::StrCat(batch_name, ", examples[", i, "].");
    if (first.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "first is empty"));
    if (second.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "second is empty"));
    absl::StatusOr<Encoding> encoding =
        model.tokenizer().EncodePair(first, second, settings.truncation);
    if (!encoding.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "first/second: ", encoding.status().message()));
    }
    if (!settings.truncation.enabled && encoding->size() > settings.truncation.max_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "first + second have ", encoding->size(), " tokens, more than max_length ",
          settings.truncation.max_length, " and truncation is TRUNCATION_NONE"));
    }
    into->push_back({std::move(encoding->ids), std::move(encoding->type_ids)});
    return absl::OkStatus();
  };
  // Fields of another objective are a client bug worth reporting, not silently ignoring.
  auto unused = [&](int i, const TrainingExample& e,
                    std::initializer_list<std::pair<const char*, bool>> fields) {
    for (const auto& [name, set] : fields) {
      if (set) {
        return absl::InvalidArgumentError(
            absl::StrCat(batch_name, ", examples[", i, "].", name, " is set but the ",
                         ObjectiveName(settings.trainer.objective), " objective does not use it"));
      }
    }
    return absl::OkStatus();
  };
  bool batch_has_negatives = false;
  for (const TrainingExample& e : in.examples) batch_has_negatives |= !e.negative.empty();
  for (int i = 0; i < examples; ++i) {
    const TrainingExample& e = in.examples[i];
    absl::Status status;
    switch (settings.trainer.objective) {
      case Objective::kContrastive: {
        status = unused(i, e,
                        {{"first", !e.first.empty()},
                         {"second", !e.second.empty()},
                         {"score", e.score != 0},
                         {"text", !e.text.empty()},
                         {"label", e.label != 0}});
        if (!status.ok()) return status;
        if (!(status = tokenize(i, "anchor", e.anchor, &out->anchors)).ok()) return status;
        if (!(status = tokenize(i, "positive", e.positive, &out->positives)).ok()) {
          return status;
        }
        // One negative per anchor once any example has one; an empty sequence stands for a
        // missing one, which ValidateTrainingBatch reports with its index.
        if (e.negative.empty()) {
          if (batch_has_negatives) out->negatives.emplace_back();
        } else if (!(status = tokenize(i, "negative", e.negative, &out->negatives)).ok()) {
          return status;
        }
        break;
      }
      case Objective::kCosineSimilarity: {
        status = unused(i, e,
                        {{"anchor", !e.anchor.empty()},
                         {"positive", !e.positive.empty()},
                         {"negative", !e.negative.empty()},
                         {"text", !e.text.empty()},
                         {"label", e.label != 0}});
        if (!status.ok()) return status;
        if (!(status = tokenize(i, "first", e.first, &out->first)).ok()) return status;
        if (!(status = tokenize(i, "second", e.second, &out->second)).ok()) return status;
        out->scores.push_back(e.score);
        break;
      }
      case Objective::kClassification: {
        status = unused(i, e,
                        {{"anchor", !e.anchor.empty()},
                         {"positive", !e.positive.empty()},
                         {"negative", !e.negative.empty()},
                         {"first", !e.first.empty()},
                         {"second", !e.second.empty()},
                         {"score", e.score != 0}});
        if (!status.ok()) return status;
        if (!(status = tokenize(i, "text", e.text, &out->inputs)).ok()) return status;
        out->labels.push_back(e.label);
        break;
      }
      case Objective::kPairClassification: {
        status = unused(i, e,
                        {{"anchor", !e.anchor.empty()},
                         {"positive", !e.positive.empty()},
                         {"negative", !e.negative.empty()},
                         {"text", !e.text.empty()},
                         {"score", e.score != 0}});
        if (!status.ok()) return status;
        if (!(status = tokenize_pair(i, e.first, e.second, &out->inputs)).ok()) return status;
        out->labels.push_back(e.label);
        break;
      }
    }
  }
  // The engine's checks of the whole batch (counts, negatives, scores, labels), said of this
  // batch.
  if (absl::Status valid = ValidateTrainingBatch(*out, settings.trainer); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(batch_name, ", ", valid.message()));
  }
  return absl::OkStatus();
}

}  // namespace attn::server::core
