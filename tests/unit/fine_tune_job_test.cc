// The fine-tuning job's pure functions (server/core/fine_tune_job.h), reached from the protocol's
// messages through the front end's conversion (server/fine_tune_convert.h), with the real
// tokenizer and no server: a config resolves into the trainer's options, and every check lives in
// one place: the protocol's own (enums, 0 = default, empty texts, fields of another objective, the
// server's batch limit) here, the trainer's (ValidateTrainerOptions, ValidateTrainingBatch)
// in the engine, whose messages the server only prefixes with "config: " or "batch N, ".
#include "server/core/fine_tune_job.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "server/core/evaluation.h"
#include "server/fine_tune_convert.h"
#include "tests/test_model.h"

namespace attn::server {
namespace {

namespace v1 = ::attnserve::v1;
using core::CheckBatchShape;
using core::JobSettings;

absl::StatusOr<JobSettings> ResolveJobConfig(const v1::FineTuneConfig& config, const Model& base) {
  absl::StatusOr<core::FineTuneConfig> converted = ToCore(config);
  if (!converted.ok()) return converted.status();
  return core::ResolveJobConfig(*converted, base);
}

class FineTuneJobTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status(); }
  const Model& model() const { return **testing::TestModel(); }

  static v1::FineTuneConfig Config(v1::Objective objective) {
    v1::FineTuneConfig config;
    config.set_objective(objective);
    if (objective == v1::CLASSIFICATION) config.set_num_labels(3);
    return config;
  }
  // The config's error message, or "" if it resolves.
  std::string ConfigError(const v1::FineTuneConfig& config) const {
    absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, model());
    if (settings.ok()) return "";
    EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(settings.status().message());
  }
  // Batch 4 of a job with `config`: its conversion's error message, or "".
  std::string BatchError(const v1::FineTuneConfig& config, const v1::TrainingBatch& batch) const {
    absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, model());
    EXPECT_TRUE(settings.ok()) << settings.status();
    if (!settings.ok()) return "no settings";
    TrainingBatch out;
    absl::Status status = core::ConvertBatch(ToCore(batch), *settings, model(), 4, &out);
    if (status.ok()) return "";
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  }
  static v1::TrainingExample Pair(const std::string& anchor, const std::string& positive,
                                  const std::string& negative = "") {
    v1::TrainingExample e;
    e.set_anchor(anchor);
    e.set_positive(positive);
    e.set_negative(negative);
    return e;
  }
  static v1::TrainingBatch Batch(std::initializer_list<v1::TrainingExample> examples) {
    v1::TrainingBatch batch;
    for (const v1::TrainingExample& e : examples) *batch.add_examples() = e;
    return batch;
  }
};

TEST_F(FineTuneJobTest, ConfigDefaultsAndValues) {
  v1::FineTuneConfig config = Config(v1::CONTRASTIVE);
  absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, model());
  ASSERT_TRUE(settings.ok()) << settings.status();
  const TrainerOptions defaults;
  EXPECT_EQ(settings->trainer.adamw.lr, defaults.adamw.lr);  // 0 = the default
  EXPECT_EQ(settings->trainer.contrastive_scale, defaults.contrastive_scale);
  config.set_learning_rate(3e-5);
  config.set_beta2(0.98);
  config.set_contrastive_scale(10);
  config.set_warmup_steps(2);
  config.set_total_steps(8);
  settings = ResolveJobConfig(config, model());
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->trainer.adamw.lr, 3e-5);
  EXPECT_EQ(settings->trainer.adamw.beta2, 0.98);
  EXPECT_EQ(settings->trainer.contrastive_scale, 10);
  EXPECT_EQ(settings->trainer.total_steps, 8);
}

TEST_F(FineTuneJobTest, ConfigErrorsOneWordingEach) {
  v1::FineTuneConfig config = Config(v1::CONTRASTIVE);
  // The protocol's: enums and options of another objective.
  config.set_objective(v1::OBJECTIVE_UNSPECIFIED);
  EXPECT_EQ(ConfigError(config),
            "config.objective is not set; use CONTRASTIVE, COSINE_SIMILARITY, CLASSIFICATION or "
            "PAIR_CLASSIFICATION");
  config.set_objective(static_cast<v1::Objective>(7));
  EXPECT_EQ(ConfigError(config), "config.objective: unknown value 7");
  config = Config(v1::CONTRASTIVE);
  config.set_parameters(static_cast<v1::ParameterSelection>(9));
  EXPECT_EQ(ConfigError(config), "config.parameters: unknown value 9");
  config = Config(v1::COSINE_SIMILARITY);
  config.set_contrastive_scale(5);
  EXPECT_EQ(ConfigError(config), "config.contrastive_scale is only for the CONTRASTIVE objective");

  // The engine's, prefixed.
  config = Config(v1::CONTRASTIVE);
  config.set_learning_rate(std::nan(""));
  EXPECT_EQ(ConfigError(config), "config: learning_rate is nan; it must be finite and >= 0");
  config = Config(v1::CONTRASTIVE);
  config.set_beta1(1);
  EXPECT_EQ(ConfigError(config), "config: beta1 is 1; it must be in [0, 1)");
  config = Config(v1::CONTRASTIVE);
  config.set_weight_decay(-0.5);
  EXPECT_EQ(ConfigError(config), "config: weight_decay is -0.5; it must be finite and >= 0");
  config = Config(v1::CONTRASTIVE);
  config.set_contrastive_scale(-1);
  EXPECT_EQ(ConfigError(config), "config: contrastive_scale is -1; it must be finite and > 0");
  config = Config(v1::CONTRASTIVE);
  config.set_max_grad_norm(std::numeric_limits<double>::infinity());
  EXPECT_EQ(ConfigError(config),
            "config: max_grad_norm is inf; it must be finite and >= 0 (0 = no clipping)");
  config = Config(v1::CONTRASTIVE);
  config.set_warmup_steps(9);
  config.set_total_steps(4);
  EXPECT_EQ(ConfigError(config), "config: warmup_steps (9) is more than total_steps (4)");
  config.set_warmup_steps(-1);
  EXPECT_EQ(ConfigError(config), "config: warmup_steps (-1) and total_steps (4) must be >= 0");
  config = Config(v1::CONTRASTIVE);
  config.set_parameters(v1::PARAMETERS_HEAD_ONLY);
  EXPECT_EQ(ConfigError(config),
            "config: training the head only needs the classification objective (the other "
            "objectives have no head)");
  config = Config(v1::CONTRASTIVE);
  config.set_num_labels(4);
  EXPECT_EQ(ConfigError(config),
            "config: num_labels is 4; only the classification objective has labels");
  config = Config(v1::CLASSIFICATION);
  config.set_num_labels(1);
  EXPECT_EQ(ConfigError(config),
            "config: num_labels is 1; the classification objective needs 2 to 65536 classes");

  // Label names: one distinct, non-empty name per label of a classification objective.
  config = Config(v1::CLASSIFICATION);
  config.set_num_labels(3);
  config.add_label_names("a");
  EXPECT_EQ(ConfigError(config),
            "config.label_names has 1 names for num_labels 3; give one name per label, or none");
  config.add_label_names("b");
  config.add_label_names("a");
  EXPECT_EQ(ConfigError(config), "config.label_names[2] repeats 'a'; names must differ");
  config.set_label_names(2, std::string(300, 'x'));
  EXPECT_EQ(ConfigError(config), "config.label_names[2] is 300 bytes; give 1 to 256 bytes");
  config = Config(v1::CONTRASTIVE);
  config.add_label_names("a");
  EXPECT_EQ(ConfigError(config),
            "config.label_names is set but the contrastive objective has no labels; label names "
            "are for CLASSIFICATION and PAIR_CLASSIFICATION");
}

TEST_F(FineTuneJobTest, BatchErrorsNameTheBatchAndTheExample) {
  const v1::FineTuneConfig contrastive = Config(v1::CONTRASTIVE);
  EXPECT_EQ(BatchError(contrastive, Batch({Pair("a", "b"), Pair("c", "d")})), "");
  // The server's limit, before any tokenization.
  EXPECT_EQ(CheckBatchShape(ToCore(Batch({Pair("a", "b"), Pair("c", "d")})), 4, 1).message(),
            "batch 4 has 2 examples; send 1 to 1 (--max-inputs-per-request) per batch");
  // The protocol's: texts and fields.
  EXPECT_EQ(BatchError(contrastive, Batch({Pair("a", "b"), Pair("", "d")})),
            "batch 4, examples[1].anchor is empty");
  v1::TrainingExample stray = Pair("a", "b");
  stray.set_label(2);
  EXPECT_EQ(BatchError(contrastive, Batch({Pair("c", "d"), stray})),
            "batch 4, examples[1].label is set but the contrastive objective does not use it");
  // The engine's, prefixed.
  EXPECT_EQ(BatchError(contrastive, Batch({})), "batch 4, 0 examples; send at least 1 per batch");
  EXPECT_TRUE(absl::StartsWith(BatchError(contrastive, Batch({Pair("a", "b")})),
                               "batch 4, 1 example; the contrastive objective"));
  EXPECT_EQ(BatchError(contrastive, Batch({Pair("a", "b"), Pair("c", "d", "n"), Pair("e", "f")})),
            "batch 4, examples[0] has no negative but others do; give a hard negative for every "
            "example of a batch or for none");

  v1::FineTuneConfig cosine = Config(v1::COSINE_SIMILARITY);
  v1::TrainingExample scored;
  scored.set_first("a");
  scored.set_second("b");
  scored.set_score(0.5f);
  v1::TrainingExample too_high = scored;
  too_high.set_score(1.5f);
  EXPECT_EQ(BatchError(cosine, Batch({scored, too_high})),
            "batch 4, examples[1].score is 1.5; gold scores must be finite and in [-1, 1]");

  v1::FineTuneConfig classification = Config(v1::CLASSIFICATION);
  v1::TrainingExample labelled;
  labelled.set_text("x");
  labelled.set_label(3);
  EXPECT_EQ(BatchError(classification, Batch({labelled})),
            "batch 4, examples[0].label is 3, outside [0, 3) (num_labels)");
}

// The evaluation set and the promotion gate, checked with the config (before any work): one
// wording per problem, naming the field.
TEST_F(FineTuneJobTest, EvaluationConfigErrorsNameTheField) {
  auto retrieval = [](int queries, int corpus) {
    v1::EvaluationSet set;
    set.set_task(v1::EVALUATION_RETRIEVAL);
    for (int i = 0; i < queries; ++i) {
      set.add_queries("query " + std::to_string(i));
      set.add_relevant(i % corpus);
    }
    for (int i = 0; i < corpus; ++i) set.add_corpus("item " + std::to_string(i));
    return set;
  };
  v1::FineTuneConfig config = Config(v1::CONTRASTIVE);
  *config.mutable_evaluation() = retrieval(3, 5);
  config.set_eval_every(2);
  config.set_promote_if("recall@1>=0.8, mrr@10 > base+0.02");
  absl::StatusOr<JobSettings> settings = ResolveJobConfig(config, model());
  ASSERT_TRUE(settings.ok()) << settings.status();
  ASSERT_TRUE(settings->evaluation.has_value());
  EXPECT_EQ(settings->evaluation->queries.size(), 3u);
  EXPECT_EQ(settings->evaluation->corpus.size(), 5u);
  EXPECT_EQ(settings->eval_every, 2);
  ASSERT_TRUE(settings->gate.has_value());
  ASSERT_EQ(settings->gate->conditions.size(), 2u);
  EXPECT_EQ(settings->gate->conditions[1].metric, "mrr@10");
  EXPECT_TRUE(settings->gate->conditions[1].relative_to_base);
  EXPECT_DOUBLE_EQ(settings->gate->conditions[1].value, 0.02);

  config.set_eval_every(-1);
  EXPECT_EQ(ConfigError(config),
            "config.eval_every is -1; give 0 (evaluate the base and the end only) or the number "
            "of steps between evaluations");
  config.set_eval_every(0);
  config.set_promote_if("accuracy>=0.9");
  EXPECT_EQ(ConfigError(config),
            "config.promote_if 'accuracy>=0.9': a retrieval evaluation reports mrr@10, recall@1, "
            "recall@10, ndcg@10, not 'accuracy'; write conditions like \"recall@1>=0.8\" or "
            "\"mrr@10>base+0.02\", separated by ','");
  config.set_promote_if("recall@1 = 0.8");
  EXPECT_TRUE(
      absl::StartsWith(ConfigError(config), "config.promote_if 'recall@1 = 0.8': no comparison"));
  config.set_promote_if("recall@1 >= high");
  EXPECT_TRUE(absl::StrContains(ConfigError(config), "the threshold is not a number"));
  config.set_promote_if("recall@1 >= base*2");
  EXPECT_TRUE(absl::StrContains(ConfigError(config), "expected base, base+X or base-X"));
  config.set_promote_if(std::string(300, '>'));
  EXPECT_EQ(ConfigError(config), "config.promote_if has 300 bytes; the limit is 256");

  config = Config(v1::CONTRASTIVE);
  config.set_promote_if("recall@1>=0.8");
  EXPECT_EQ(ConfigError(config),
            "config.promote_if needs an evaluation set (config.evaluation): the gate compares "
            "its scores on the trained weights with the base version's");
  config.clear_promote_if();
  config.set_eval_every(3);
  EXPECT_EQ(ConfigError(config),
            "config.eval_every is set but the config has no evaluation set (config.evaluation)");

  config = Config(v1::CONTRASTIVE);
  *config.mutable_evaluation() = retrieval(3, 5);
  config.mutable_evaluation()->set_relevant(1, 9);
  EXPECT_EQ(ConfigError(config),
            "config.evaluation.relevant[1] is 9; give an index into corpus (0 to 4)");
  config.mutable_evaluation()->set_task(v1::EVALUATION_TASK_UNSPECIFIED);
  EXPECT_EQ(ConfigError(config),
            "config.evaluation.task is not set; use RETRIEVAL, COSINE_SIMILARITY, CLASSIFICATION "
            "or PAIR_CLASSIFICATION");
  config.mutable_evaluation()->set_task(static_cast<v1::EvaluationTask>(9));
  EXPECT_EQ(ConfigError(config), "config.evaluation.task: unknown value 9");
  *config.mutable_evaluation() = retrieval(3, 5);
  config.mutable_evaluation()->set_queries(2, "");
  EXPECT_EQ(ConfigError(config), "config.evaluation.queries[2] is empty");
  *config.mutable_evaluation() = retrieval(3, 5);
  config.mutable_evaluation()->set_corpus(0, std::string(9000, 'x'));
  EXPECT_EQ(ConfigError(config), "config.evaluation.corpus[0] has 9000 bytes; the limit is 8192");
  *config.mutable_evaluation() = retrieval(4000, 1001);
  EXPECT_EQ(ConfigError(config),
            "config.evaluation has 5001 texts to encode; the limit is 5000 (split it, or sample "
            "it)");

  // A classification set needs the job's head; a retrieval set must not carry examples.
  v1::EvaluationSet labelled;
  labelled.set_task(v1::EVALUATION_CLASSIFICATION);
  labelled.add_examples()->set_text("a");
  labelled.add_examples()->set_text("b");
  *config.mutable_evaluation() = labelled;
  EXPECT_EQ(ConfigError(config),
            "config.evaluation is a classification set, but a contrastive job has no "
            "classification head to score it with; use a retrieval or cosine_similarity set, or "
            "the classification objective");
  config = Config(v1::CLASSIFICATION);  // 3 labels
  *config.mutable_evaluation() = labelled;
  config.mutable_evaluation()->mutable_examples(1)->set_label(3);
  EXPECT_EQ(ConfigError(config),
            "config.evaluation.examples[1].label is 3; the job has num_labels 3");
  config.mutable_evaluation()->mutable_examples(1)->set_label(1);
  EXPECT_EQ(ConfigError(config), "");
  config.mutable_evaluation()->mutable_examples(0)->set_first("x");
  EXPECT_EQ(ConfigError(config),
            "config.evaluation.examples[0].first is set but a classification evaluation uses "
            "examples with text and label");
  v1::EvaluationSet mixed = retrieval(2, 2);
  mixed.add_examples()->set_text("a");
  *config.mutable_evaluation() = mixed;
  EXPECT_EQ(ConfigError(config),
            "config.evaluation.examples is set but a retrieval evaluation uses queries, corpus "
            "and relevant");
}

TEST(PromotionGateTest, ConditionsHoldOrFailWithTheirNumbers) {
  absl::StatusOr<core::PromotionGate> gate =
      core::ParsePromotionGate(" Recall@1 >= 0.5 , mrr@10>base , ndcg@10 >= base-0.1 ",
                               EvaluationTask::kRetrieval, "promote_if");
  ASSERT_TRUE(gate.ok()) << gate.status();
  ASSERT_EQ(gate->conditions.size(), 3u);
  EXPECT_EQ(gate->conditions[0].metric, "recall@1");
  EXPECT_EQ(gate->conditions[2].op, ">=");
  EXPECT_DOUBLE_EQ(gate->conditions[2].value, -0.1);
  EvaluationResult base, better, worse;
  base.metrics = {{"mrr@10", 0.30}, {"recall@1", 0.20}, {"recall@10", 0.5}, {"ndcg@10", 0.4}};
  better.metrics = {{"mrr@10", 0.70}, {"recall@1", 0.60}, {"recall@10", 0.9}, {"ndcg@10", 0.8}};
  worse.metrics = {{"mrr@10", 0.25}, {"recall@1", 0.60}, {"recall@10", 0.5}, {"ndcg@10", 0.35}};
  core::GateOutcome outcome = core::CheckPromotionGate(*gate, better, base);
  EXPECT_TRUE(outcome.holds) << outcome.detail;
  EXPECT_EQ(outcome.detail,
            "recall@1 0.6000 >= 0.5 holds; mrr@10 0.7000 > base 0.3000 holds; ndcg@10 0.8000 >= "
            "base 0.4000 - 0.1 = 0.3000 holds");
  outcome = core::CheckPromotionGate(*gate, worse, base);
  EXPECT_FALSE(outcome.holds);
  EXPECT_TRUE(absl::StrContains(outcome.detail, "mrr@10 0.2500 > base 0.3000 fails"))
      << outcome.detail;
  // A NaN score (Spearman of constant cosines) never passes.
  gate = core::ParsePromotionGate("spearman>0", EvaluationTask::kCosineSimilarity, "g");
  ASSERT_TRUE(gate.ok());
  EvaluationResult nan_result;
  nan_result.metrics = {{"spearman", std::nan("")}};
  EXPECT_FALSE(core::CheckPromotionGate(*gate, nan_result, nan_result).holds);
  EXPECT_FALSE(core::ParsePromotionGate("", EvaluationTask::kRetrieval, "g").ok());
  EXPECT_FALSE(core::ParsePromotionGate("recall@1>=0.5,", EvaluationTask::kRetrieval, "g").ok());
}

}  // namespace
}  // namespace attn::server
