#include "server/fine_tune_convert.h"

#include "absl/strings/str_cat.h"
#include "server/proto_convert.h"

namespace attn::server {

namespace v1 = attnserve::v1;

namespace {

v1::EvaluationTask TaskToProto(EvaluationTask task) {
  switch (task) {
    case EvaluationTask::kRetrieval:
      return v1::EVALUATION_RETRIEVAL;
    case EvaluationTask::kCosineSimilarity:
      return v1::EVALUATION_COSINE_SIMILARITY;
    case EvaluationTask::kClassification:
      return v1::EVALUATION_CLASSIFICATION;
    case EvaluationTask::kPairClassification:
      return v1::EVALUATION_PAIR_CLASSIFICATION;
  }
  return v1::EVALUATION_TASK_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<core::EvaluationSetRequest> ToCore(const v1::EvaluationSet& set,
                                                  absl::string_view field) {
  core::EvaluationSetRequest out;
  switch (set.task()) {
    case v1::EVALUATION_TASK_UNSPECIFIED:
      break;
    case v1::EVALUATION_RETRIEVAL:
      out.task = EvaluationTask::kRetrieval;
      break;
    case v1::EVALUATION_COSINE_SIMILARITY:
      out.task = EvaluationTask::kCosineSimilarity;
      break;
    case v1::EVALUATION_CLASSIFICATION:
      out.task = EvaluationTask::kClassification;
      break;
    case v1::EVALUATION_PAIR_CLASSIFICATION:
      out.task = EvaluationTask::kPairClassification;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".task: unknown value ", static_cast<int>(set.task())));
  }
  out.queries.assign(set.queries().begin(), set.queries().end());
  out.corpus.assign(set.corpus().begin(), set.corpus().end());
  out.relevant.assign(set.relevant().begin(), set.relevant().end());
  out.examples.reserve(set.examples_size());
  for (const v1::TrainingExample& e : set.examples()) out.examples.push_back(ToCore(e));
  return out;
}

void ToProto(const EvaluationResult& result, int64_t step, v1::EvaluationResult* out) {
  out->set_task(TaskToProto(result.task));
  out->set_step(step);
  for (const auto& [name, value] : result.metrics) {
    v1::EvaluationMetric* metric = out->add_metrics();
    metric->set_name(name);
    metric->set_value(value);
  }
  out->set_examples(result.examples);
  out->set_seconds(result.seconds);
  for (double value : result.per_example) out->add_per_example(value);
}

absl::StatusOr<core::FineTuneConfig> ToCore(const v1::FineTuneConfig& config) {
  core::FineTuneConfig out;
  switch (config.objective()) {
    case v1::OBJECTIVE_UNSPECIFIED:
      break;
    case v1::CONTRASTIVE:
      out.objective = Objective::kContrastive;
      break;
    case v1::COSINE_SIMILARITY:
      out.objective = Objective::kCosineSimilarity;
      break;
    case v1::CLASSIFICATION:
      out.objective = Objective::kClassification;
      break;
    case v1::PAIR_CLASSIFICATION:
      out.objective = Objective::kPairClassification;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config.objective: unknown value ", config.objective()));
  }
  switch (config.parameters()) {
    case v1::PARAMETERS_UNSPECIFIED:
    case v1::PARAMETERS_ALL:
      out.parameters = TrainableSet::kAll;
      break;
    case v1::PARAMETERS_ATTENTION_ONLY:
      out.parameters = TrainableSet::kAttentionOnly;
      break;
    case v1::PARAMETERS_ALL_BUT_EMBEDDINGS:
      out.parameters = TrainableSet::kAllButEmbeddings;
      break;
    case v1::PARAMETERS_HEAD_ONLY:
      out.parameters = TrainableSet::kHeadOnly;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config.parameters: unknown value ", config.parameters()));
  }
  out.learning_rate = config.learning_rate();
  out.beta1 = config.beta1();
  out.beta2 = config.beta2();
  out.epsilon = config.epsilon();
  if (config.has_weight_decay()) out.weight_decay = config.weight_decay();
  out.warmup_steps = config.warmup_steps();
  out.total_steps = config.total_steps();
  if (config.has_max_grad_norm()) out.max_grad_norm = config.max_grad_norm();
  out.seed = config.seed();
  out.disable_dropout = config.disable_dropout();
  out.contrastive_scale = config.contrastive_scale();
  out.num_labels = config.num_labels();
  out.label_names.assign(config.label_names().begin(), config.label_names().end());
  out.base_version = config.base_version();
  out.tokenization = ToCore(config.tokenization());
  out.telemetry_every = config.telemetry_every();
  if (config.has_evaluation()) {
    absl::StatusOr<core::EvaluationSetRequest> evaluation =
        ToCore(config.evaluation(), "config.evaluation");
    if (!evaluation.ok()) return evaluation.status();
    out.evaluation = *std::move(evaluation);
  }
  out.eval_every = config.eval_every();
  out.promote_if = config.promote_if();
  out.precision = config.precision();
  return out;
}

core::TrainingExample ToCore(const v1::TrainingExample& e) {
  core::TrainingExample example;
  example.anchor = e.anchor();
  example.positive = e.positive();
  example.negative = e.negative();
  example.first = e.first();
  example.second = e.second();
  example.score = e.score();
  example.text = e.text();
  example.label = e.label();
  return example;
}

core::TrainingBatchRequest ToCore(const v1::TrainingBatch& batch) {
  core::TrainingBatchRequest out;
  out.examples.reserve(batch.examples_size());
  for (const v1::TrainingExample& e : batch.examples()) out.examples.push_back(ToCore(e));
  return out;
}

core::CommitRequest ToCore(const v1::CommitRequest& commit) {
  // do_not_serve is deprecated, read only to refuse it next to promote.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const bool do_not_serve = commit.do_not_serve();
#pragma GCC diagnostic pop
  return core::CommitRequest{commit.description(), commit.promote(), do_not_serve};
}

void ToProto(const core::FineTuneProgress& progress, v1::FineTuneProgress* out) {
  out->Clear();
  out->set_job_id(progress.job_id);
  out->set_step(progress.step);
  out->set_loss(progress.loss);
  out->set_grad_norm(progress.grad_norm);
  out->set_learning_rate(progress.learning_rate);
  out->set_examples_per_second(progress.examples_per_second);
  out->set_examples_seen(progress.examples_seen);
  out->set_committed_version(progress.committed_version);
  out->set_base_version(progress.base_version);
  for (const std::string& warning : progress.warnings) out->add_warnings(warning);
  if (progress.telemetry) {
    v1::TrainingTelemetry* telemetry = out->mutable_telemetry();
    for (const GroupTelemetry& g : progress.telemetry->groups) {
      v1::ParameterGroupTelemetry* group = telemetry->add_groups();
      group->set_name(g.name);
      group->set_kind(g.kind);
      group->set_layer(g.layer);
      group->set_trainable(g.trainable);
      group->set_grad_norm(g.grad_norm);
      group->set_update_norm(g.update_norm);
      group->set_relative_change(g.relative_change);
    }
    telemetry->set_embedding_rows_touched(progress.telemetry->embedding_rows_touched);
    for (const TokenChange& t : progress.telemetry->most_changed_tokens) {
      v1::TokenChange* token = telemetry->add_most_changed_tokens();
      token->set_id(t.id);
      token->set_token(t.token);
      token->set_relative_change(t.relative_change);
    }
  }
  for (const StepEvaluation& e : progress.evaluations) {
    ToProto(e.result, e.step, out->add_evaluations());
  }
  out->set_promoted(progress.promoted);
  out->set_promotion(progress.promotion);
}

}  // namespace attn::server
