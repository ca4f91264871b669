#include "server/fine_tune_job.h"

#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/request_plan.h"
#include "server/proto_convert.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

// Checks a finite, non-negative optional setting; `zero_means` documents what 0 does.
absl::Status CheckNonNegative(const char* field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.", field, " is ", value, "; it must be finite and >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ObjectiveName(v1::Objective objective) {
  switch (objective) {
    case v1::CONTRASTIVE:
      return "contrastive";
    case v1::COSINE_SIMILARITY:
      return "cosine_similarity";
    case v1::CLASSIFICATION:
      return "classification";
    default:
      return "unspecified";
  }
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

absl::StatusOr<JobSettings> ResolveJobConfig(const v1::FineTuneConfig& config, const Model& base) {
  JobSettings s;
  TrainerOptions& t = s.trainer;
  switch (config.objective()) {
    case v1::CONTRASTIVE:
      t.objective = Objective::kContrastive;
      break;
    case v1::COSINE_SIMILARITY:
      t.objective = Objective::kCosineSimilarity;
      break;
    case v1::CLASSIFICATION:
      t.objective = Objective::kClassification;
      break;
    case v1::OBJECTIVE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "config.objective is not set; use CONTRASTIVE, COSINE_SIMILARITY or "
          "CLASSIFICATION");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config.objective: unknown value ", config.objective()));
  }
  s.objective = config.objective();

  // AdamW: 0 means the default for every setting but weight_decay, which is optional.
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"learning_rate", config.learning_rate()},
        {"epsilon", config.epsilon()}}) {
    if (absl::Status ok = CheckNonNegative(field, value); !ok.ok()) return ok;
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"beta1", config.beta1()}, {"beta2", config.beta2()}}) {
    if (!std::isfinite(value) || value < 0 || value >= 1) {
      return absl::InvalidArgumentError(absl::StrCat("config.", field, " is ", value,
                                                     "; it must be in [0, 1) (0 = the default)"));
    }
  }
  if (config.learning_rate() > 0) t.adamw.lr = config.learning_rate();
  if (config.beta1() > 0) t.adamw.beta1 = config.beta1();
  if (config.beta2() > 0) t.adamw.beta2 = config.beta2();
  if (config.epsilon() > 0) t.adamw.eps = config.epsilon();
  if (config.has_weight_decay()) {
    if (absl::Status ok = CheckNonNegative("weight_decay", config.weight_decay()); !ok.ok()) {
      return ok;
    }
    t.adamw.weight_decay = config.weight_decay();
  }
  if (config.warmup_steps() < 0 || config.total_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.warmup_steps (", config.warmup_steps(),
                                                   ") and config.total_steps (",
                                                   config.total_steps(), ") must be >= 0"));
  }
  if (config.total_steps() > 0 && config.warmup_steps() > config.total_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("config.warmup_steps (", config.warmup_steps(),
                                                   ") is more than config.total_steps (",
                                                   config.total_steps(), ")"));
  }
  t.warmup_steps = config.warmup_steps();
  t.total_steps = config.total_steps();
  if (config.has_max_grad_norm()) {
    if (absl::Status ok = CheckNonNegative("max_grad_norm", config.max_grad_norm()); !ok.ok()) {
      return ok;
    }
    t.max_grad_norm = config.max_grad_norm();  // 0 = no clipping
  }
  switch (config.parameters()) {
    case v1::PARAMETERS_UNSPECIFIED:
    case v1::PARAMETERS_ALL:
      t.trainable = TrainableSet::kAll;
      break;
    case v1::PARAMETERS_ATTENTION_ONLY:
      t.trainable = TrainableSet::kAttentionOnly;
      break;
    case v1::PARAMETERS_ALL_BUT_EMBEDDINGS:
      t.trainable = TrainableSet::kAllButEmbeddings;
      break;
    case v1::PARAMETERS_HEAD_ONLY:
      if (config.objective() != v1::CLASSIFICATION) {
        return absl::InvalidArgumentError(
            "config.parameters PARAMETERS_HEAD_ONLY needs the CLASSIFICATION objective "
            "(only it has a head)");
      }
      t.trainable = TrainableSet::kHeadOnly;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config.parameters: unknown value ", config.parameters()));
  }
  t.seed = config.seed();
  t.dropout = !config.disable_dropout();

  if (!std::isfinite(config.contrastive_scale()) || config.contrastive_scale() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.contrastive_scale is ",
                                                   config.contrastive_scale(),
                                                   "; it must be > 0 (0 = the default 20)"));
  }
  if (config.contrastive_scale() > 0) {
    if (config.objective() != v1::CONTRASTIVE) {
      return absl::InvalidArgumentError(
          "config.contrastive_scale is only for the CONTRASTIVE objective");
    }
    t.mnrl_scale = config.contrastive_scale();
  }
  constexpr int kMaxLabels = 1 << 16;
  if (config.objective() == v1::CLASSIFICATION) {
    if (config.num_labels() < 2 || config.num_labels() > kMaxLabels) {
      return absl::InvalidArgumentError(absl::StrCat("config.num_labels is ", config.num_labels(),
                                                     "; CLASSIFICATION needs 2 to ", kMaxLabels,
                                                     " classes"));
    }
  } else if (config.num_labels() != 0) {
    return absl::InvalidArgumentError("config.num_labels is only for the CLASSIFICATION objective");
  }
  t.num_labels = config.num_labels();
  s.num_labels = config.num_labels();

  absl::StatusOr<TruncationOptions> truncation =
      core::ResolveTruncation(base, ToCore(config.tokenization()));
  if (!truncation.ok())
    return absl::InvalidArgumentError(absl::StrCat("config.", truncation.status().message()));
  s.truncation = *truncation;
  return s;
}

absl::Status CheckBatchShape(const v1::TrainingBatch& batch, const JobSettings& settings,
                             int64_t batch_number, int max_examples) {
  const int examples = batch.examples_size();
  if (examples == 0 || examples > max_examples) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch_number, " has ", examples,
                                                   " examples; send 1 to ", max_examples,
                                                   " (--max-inputs-per-request) per batch"));
  }
  if (settings.objective == v1::CONTRASTIVE && examples < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", batch_number,
        " has 1 example; the CONTRASTIVE objective (multiple-negatives ranking loss) "
        "scores each anchor against the other pairs' positives as negatives, so a single "
        "pair has loss exactly 0 and teaches nothing: send at least 2 (anchor, positive) "
        "pairs per batch"));
  }
  return absl::OkStatus();
}

std::vector<std::string> BatchWarnings(const v1::TrainingBatch& batch, const JobSettings& settings,
                                       int64_t batch_number) {
  std::vector<std::string> warnings;
  if (settings.objective == v1::CONTRASTIVE) {
    int same = 0;
    for (const v1::TrainingExample& e : batch.examples()) same += e.anchor() == e.positive();
    if (same > 0) {
      warnings.push_back(absl::StrCat(
          "batch ", batch_number, ": ", same, " of ", batch.examples_size(),
          " examples have anchor == positive; an identical pair is trivially similar (loss "
          "near 0) and teaches nothing, give real paraphrases or related texts"));
    }
  }
  return warnings;
}

absl::Status ConvertBatch(const v1::TrainingBatch& in, const JobSettings& settings,
                          const Model& model, int64_t batch_number, TrainingBatch* out) {
  const std::string batch_name = absl::StrCat("batch ", batch_number);
  const int examples = in.examples_size();
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
  // Fields of another objective are a client bug worth reporting, not silently ignoring.
  auto unused = [&](int i, const v1::TrainingExample& e,
                    std::initializer_list<std::pair<const char*, bool>> fields) {
    for (const auto& [name, set] : fields) {
      if (set) {
        return absl::InvalidArgumentError(
            absl::StrCat(batch_name, ", examples[", i, "].", name, " is set but the ",
                         ObjectiveName(settings.objective), " objective does not use it"));
      }
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < examples; ++i) {
    const v1::TrainingExample& e = in.examples(i);
    absl::Status status;
    switch (settings.objective) {
      case v1::CONTRASTIVE: {
        status = unused(i, e,
                        {{"first", !e.first().empty()},
                         {"second", !e.second().empty()},
                         {"score", e.score() != 0},
                         {"text", !e.text().empty()},
                         {"label", e.label() != 0}});
        if (!status.ok()) return status;
        const bool has_negative = !e.negative().empty();
        const bool batch_has_negatives = !in.examples(0).negative().empty();
        if (has_negative != batch_has_negatives) {
          return absl::InvalidArgumentError(
              absl::StrCat(batch_name, ", examples[", i, "] ", has_negative ? "has" : "has no",
                           " negative but examples[0] ", batch_has_negatives ? "has" : "has not",
                           "; give a hard negative for every example of a batch or for none"));
        }
        if (!(status = tokenize(i, "anchor", e.anchor(), &out->anchors)).ok()) return status;
        if (!(status = tokenize(i, "positive", e.positive(), &out->positives)).ok()) {
          return status;
        }
        if (has_negative &&
            !(status = tokenize(i, "negative", e.negative(), &out->negatives)).ok()) {
          return status;
        }
        break;
      }
      case v1::COSINE_SIMILARITY: {
        status = unused(i, e,
                        {{"anchor", !e.anchor().empty()},
                         {"positive", !e.positive().empty()},
                         {"negative", !e.negative().empty()},
                         {"text", !e.text().empty()},
                         {"label", e.label() != 0}});
        if (!status.ok()) return status;
        if (!std::isfinite(e.score()) || e.score() < -1.0f || e.score() > 1.0f) {
          return absl::InvalidArgumentError(
              absl::StrCat(batch_name, ", examples[", i, "].score is ", e.score(),
                           "; gold scores must be finite and in [-1, 1]"));
        }
        if (!(status = tokenize(i, "first", e.first(), &out->first)).ok()) return status;
        if (!(status = tokenize(i, "second", e.second(), &out->second)).ok()) return status;
        out->scores.push_back(e.score());
        break;
      }
      case v1::CLASSIFICATION: {
        status = unused(i, e,
                        {{"anchor", !e.anchor().empty()},
                         {"positive", !e.positive().empty()},
                         {"negative", !e.negative().empty()},
                         {"first", !e.first().empty()},
                         {"second", !e.second().empty()},
                         {"score", e.score() != 0}});
        if (!status.ok()) return status;
        if (e.label() < 0 || e.label() >= settings.num_labels) {
          return absl::InvalidArgumentError(
              absl::StrCat(batch_name, ", examples[", i, "].label is ", e.label(), ", outside [0, ",
                           settings.num_labels, ") (config.num_labels)"));
        }
        if (!(status = tokenize(i, "text", e.text(), &out->inputs)).ok()) return status;
        out->labels.push_back(e.label());
        break;
      }
      default:
        return absl::InternalError("unresolved objective");
    }
  }
  return absl::OkStatus();
}

}  // namespace attn::server
