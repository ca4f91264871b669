// Fine-tuning steps on the real all-MiniLM-L6-v2: the loss goes down on a repeated batch for
// each objective, a diverging job stops with a clear error and leaves the base untouched,
// malformed batches are rejected, and snapshots are independent of the served base.
#include "engine/training/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/test_model.h"

namespace attn {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status();
    base_ = &*testing::TestModel();
  }

  // One step's loss; a failed step fails the test (and reads as NaN, so no bound holds).
  static double StepLoss(Trainer& trainer, const TrainingBatch& batch) {
    absl::StatusOr<StepResult> result = trainer.Step(batch);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->loss : std::nan("");
  }

  static SequenceInput Tokens(const std::string& text) {
    auto encoding = (*base_)->tokenizer().Encode(text);
    EXPECT_TRUE(encoding.ok());
    return {encoding->ids, encoding->type_ids};
  }

  static TrainingBatch ContrastiveBatch() {
    TrainingBatch batch;
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {"blue widget model X7", "the X7 widget comes in blue"},
        {"red gadget model Q2", "Q2 gadgets are red"},
        {"green gizmo model Z9", "a gizmo in green, model Z9"},
        {"yellow sprocket model K4", "sprocket K4, yellow finish"}};
    for (const auto& [anchor, positive] : pairs) {
      batch.anchors.push_back(Tokens(anchor));
      batch.positives.push_back(Tokens(positive));
    }
    return batch;
  }

  static const std::shared_ptr<const Model>* base_;
};
const std::shared_ptr<const Model>* TrainerTest::base_ = nullptr;

TEST_F(TrainerTest, ContrastiveLossDecreasesOnARepeatedBatch) {
  TrainerOptions options;
  options.adamw.lr = 1e-4;
  options.dropout = false;
  auto trainer = Trainer::Create(*base_, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const TrainingBatch batch = ContrastiveBatch();
  double first = 0, last = 0;
  for (int step = 0; step < 6; ++step) {
    auto result = (*trainer)->Step(batch);
    ASSERT_TRUE(result.ok()) << result.status();
    if (step == 0) first = result->loss;
    last = result->loss;
    EXPECT_EQ(result->step, step + 1);
    EXPECT_EQ(result->examples, 4);
    EXPECT_GT(result->grad_norm, 0);
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST_F(TrainerTest, CosineSimilarityAndClassificationLearn) {
  {
    TrainerOptions options;
    options.objective = Objective::kCosineSimilarity;
    options.adamw.lr = 1e-4;
    options.dropout = false;
    auto trainer = Trainer::Create(*base_, options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    TrainingBatch batch;
    batch.first = {Tokens("a cat sits on the mat"), Tokens("stock prices fell today")};
    batch.second = {Tokens("the weather is sunny"), Tokens("markets dropped sharply")};
    batch.scores = {0.9f, 0.1f};  // deliberately the opposite of what the base model thinks
    const double first = StepLoss(**trainer, batch);
    double last = first;
    for (int i = 0; i < 5; ++i) last = StepLoss(**trainer, batch);
    EXPECT_LT(last, 0.5 * first);
  }
  {
    TrainerOptions options;
    options.objective = Objective::kClassification;
    options.num_labels = 2;
    options.adamw.lr = 1e-3;
    options.dropout = false;
    options.trainable = TrainableSet::kHeadOnly;
    auto trainer = Trainer::Create(*base_, options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    TrainingBatch batch;
    batch.inputs = {Tokens("great movie, loved it"), Tokens("terrible film, hated it"),
                    Tokens("wonderful and fun"), Tokens("boring and awful")};
    batch.labels = {1, 0, 1, 0};
    const double first = StepLoss(**trainer, batch);
    double last = first;
    for (int i = 0; i < 20; ++i) last = StepLoss(**trainer, batch);
    EXPECT_LT(last, first);
    ASSERT_NE((*trainer)->head(), nullptr);
    EXPECT_EQ((*trainer)->head()->num_labels(), 2);
    // Head-only training leaves the encoder exactly as it was.
    EXPECT_EQ((*trainer)->weights().layers[3].qkv_weight.values(),
              (*base_)->weights().layers[3].qkv_weight.values());
  }
}

TEST_F(TrainerTest, DivergingJobStopsAndLeavesTheBaseUntouched) {
  const FloatBuffer base_query = (*base_)->weights().layers[0].qkv_weight.values();
  TrainerOptions options;
  options.adamw.lr = 1e6;  // absurd
  options.max_grad_norm = 0;
  options.dropout = false;
  auto trainer = Trainer::Create(*base_, options);
  ASSERT_TRUE(trainer.ok());
  absl::Status failure;
  for (int step = 0; step < 20 && failure.ok(); ++step) {
    auto result = (*trainer)->Step(ContrastiveBatch());
    if (!result.ok()) failure = result.status();
  }
  ASSERT_FALSE(failure.ok()) << "an absurd learning rate should make the loss or gradient NaN/Inf";
  EXPECT_EQ(failure.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(failure.message().find("the weights are unchanged"), std::string::npos) << failure;
  EXPECT_EQ((*base_)->weights().layers[0].qkv_weight.values(), base_query);
}

TEST_F(TrainerTest, RejectsMalformedBatchesAndOptions) {
  auto trainer = Trainer::Create(*base_, TrainerOptions{});
  ASSERT_TRUE(trainer.ok());
  TrainingBatch batch = ContrastiveBatch();
  batch.positives.pop_back();
  auto result = (*trainer)->Step(batch);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("4 anchors but 3 positives"), std::string::npos);
  EXPECT_FALSE((*trainer)->Step(TrainingBatch{}).ok());
  EXPECT_EQ((*trainer)->steps(), 0);

  TrainerOptions cosine;
  cosine.objective = Objective::kCosineSimilarity;
  auto cosine_trainer = Trainer::Create(*base_, cosine);
  TrainingBatch bad_score;
  bad_score.first = {Tokens("a")};
  bad_score.second = {Tokens("b")};
  bad_score.scores = {std::nanf("")};
  EXPECT_NE((*cosine_trainer)->Step(bad_score).status().message().find("examples[0].score is nan"),
            std::string::npos);

  TrainerOptions classify;
  classify.objective = Objective::kClassification;
  EXPECT_FALSE(Trainer::Create(*base_, classify).ok());  // no num_labels
  classify.num_labels = 3;
  auto classifier = Trainer::Create(*base_, classify);
  TrainingBatch bad_label;
  bad_label.inputs = {Tokens("x")};
  bad_label.labels = {3};
  EXPECT_NE((*classifier)
                ->Step(bad_label)
                .status()
                .message()
                .find("examples[0].label is 3, outside [0, 3)"),
            std::string::npos);

  TrainerOptions head_only;
  head_only.trainable = TrainableSet::kHeadOnly;
  EXPECT_FALSE(Trainer::Create(*base_, head_only).ok());
}

TEST_F(TrainerTest, SnapshotIsIndependentOfTheBase) {
  TrainerOptions options;
  options.adamw.lr = 1e-4;
  options.dropout = true;
  options.seed = 5;
  auto trainer = Trainer::Create(*base_, options);
  ASSERT_TRUE((*trainer)->Step(ContrastiveBatch()).ok());
  std::shared_ptr<const Model> tuned = (*trainer)->Snapshot();
  const std::vector<SequenceInput> probe = {Tokens("blue widget model X7")};
  auto base_out = (*base_)->Forward(probe, (*base_)->DefaultForwardOptions());
  auto tuned_out = tuned->Forward(probe, tuned->DefaultForwardOptions());
  ASSERT_TRUE(base_out.ok() && tuned_out.ok());
  double diff = 0;
  for (int j = 0; j < 384; ++j)
    diff += std::abs(base_out->pooled.data()[j] - tuned_out->pooled.data()[j]);
  EXPECT_GT(diff, 1e-4);
  // Another step does not change the snapshot.
  const FloatBuffer snapshot_weights = tuned->weights().layers[2].ffn_in_weight.values();
  ASSERT_TRUE((*trainer)->Step(ContrastiveBatch()).ok());
  EXPECT_EQ(tuned->weights().layers[2].ffn_in_weight.values(), snapshot_weights);
}

}  // namespace
}  // namespace attn
