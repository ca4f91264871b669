// Fine-tuning jobs through the core (server/core/fine_tuning.h) with the real model and no
// server: a job trains, commits to a model store and is served; the errors a client gets before
// any work (no store, a store that is no directory or has no room, one job at a time, nothing to
// commit, a batch over the limit, a bad config, an unknown base) and a cancelled call that does
// no work.
#include "server/core/fine_tuning.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model_store.h"
#include "engine/serving_state.h"
#include "server/core/serving_history.h"
#include "server/core/store_versions.h"

namespace attn::server::core {
namespace {

class CountingMetrics final : public TrainingMetrics {
 public:
  void RecordFineTuneStep(int64_t examples, double) override { examples_ += examples; }
  void RecordFineTuneJob(std::string_view outcome) override { outcomes_.emplace_back(outcome); }
  void RecordVersionPublished() override { ++published_; }
  void RecordUpdateNorms(const std::vector<std::pair<std::string, double>>&) override {}
  void SetQueuedJobs(int64_t) override {}

  int64_t examples_ = 0;
  std::vector<std::string> outcomes_;
  int published_ = 0;
};

class FineTuningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const absl::StatusOr<std::shared_ptr<const Model>>* model =
        new absl::StatusOr<std::shared_ptr<const Model>>(Model::Load(ATTN_TEST_MODEL_DIR));
    ASSERT_TRUE(model->ok()) << model->status();
    registry_ = std::make_unique<ModelRegistry>(4);
    ModelVersion base;
    base.version = "base";
    base.model = **model;
    registry_->Add(base);
    store_ = (std::filesystem::temp_directory_path() /
              ("fine_tuning_test_" + std::to_string(getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                 .string();
    std::filesystem::remove_all(store_);
    ASSERT_TRUE(std::filesystem::create_directories(store_));
  }
  void TearDown() override { std::filesystem::remove_all(store_); }

  std::unique_ptr<FineTuning> NewFineTuning(bool with_store) {
    return std::make_unique<FineTuning>(
        FineTuningOptions{/*max_examples_per_batch=*/8, with_store ? store_ : "",
                          /*trainer_threads=*/1, /*trainer_nice=*/0},
        registry_.get(), &metrics_);
  }

  static FineTuneConfig Contrastive() {
    FineTuneConfig config;
    config.objective = Objective::kContrastive;
    config.learning_rate = 1e-4;
    config.disable_dropout = true;
    return config;
  }
  static TrainingBatchRequest Pairs(int n) {
    TrainingBatchRequest batch;
    for (int i = 0; i < n; ++i) {
      TrainingExample& e = batch.examples.emplace_back();
      e.anchor = "question number " + std::to_string(i) + " about the weather";
      e.positive = "answer " + std::to_string(i) + ": it will rain tomorrow";
    }
    return batch;
  }

  static absl::Status Prepare(FineTuneJob& job, const CallControl& control = {}) {
    std::promise<absl::Status> done;
    job.Prepare(control, [&done](absl::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  }
  static absl::StatusOr<FineTuneProgress> Step(FineTuneJob& job, TrainingBatchRequest batch,
                                               const CallControl& control = {}) {
    std::promise<absl::StatusOr<FineTuneProgress>> done;
    job.Step(std::move(batch), control,
             [&done](absl::StatusOr<FineTuneProgress> p) { done.set_value(std::move(p)); });
    return done.get_future().get();
  }
  static absl::StatusOr<FineTuneProgress> Commit(FineTuneJob& job, CommitRequest request) {
    std::promise<absl::StatusOr<FineTuneProgress>> done;
    job.Commit(std::move(request), CallControl{},
               [&done](absl::StatusOr<FineTuneProgress> p) { done.set_value(std::move(p)); });
    return done.get_future().get();
  }

  std::unique_ptr<ModelRegistry> registry_;
  CountingMetrics metrics_;
  std::string store_;
};

TEST_F(FineTuningTest, AJobTrainsCommitsAndIsServed) {
  std::unique_ptr<FineTuning> fine_tuning = NewFineTuning(/*with_store=*/true);
  absl::StatusOr<std::unique_ptr<FineTuneJob>> job = fine_tuning->Begin(Contrastive());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Prepare(**job).ok());

  absl::StatusOr<FineTuneProgress> first = Step(**job, Pairs(4));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->job_id, (*job)->id());
  EXPECT_EQ(first->step, 1);
  EXPECT_EQ(first->examples_seen, 4);
  EXPECT_EQ(first->base_version, "base");  // the first progress only
  EXPECT_GT(first->loss, 0);
  absl::StatusOr<FineTuneProgress> second = Step(**job, Pairs(4));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->step, 2);
  EXPECT_EQ(second->base_version, "");
  EXPECT_LT(second->loss, first->loss) << "the same batch again, after one step on it";
  EXPECT_EQ(metrics_.examples_, 8);

  absl::StatusOr<FineTuneProgress> committed = Commit(**job, {"two steps", /*promote=*/true});
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string version = committed->committed_version;
  ASSERT_FALSE(version.empty());
  (*job)->End("committed", absl::OkStatus());
  EXPECT_EQ(metrics_.published_, 1);
  EXPECT_EQ(metrics_.outcomes_, std::vector<std::string>{"committed"});

  // Promoted: served now, written to the store with its description, and recorded as served.
  EXPECT_TRUE(committed->promoted);
  EXPECT_EQ(fine_tuning->ServedVersion(), version);
  absl::StatusOr<StoredVersion> stored = ReadStoredVersion(store_, version);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->description, "two steps");
  EXPECT_EQ(stored->steps, 2);
  absl::StatusOr<ServingState> state = ReadServingState(store_);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->serving, version);

  // The slot is free again.
  job->reset();
  EXPECT_TRUE(fine_tuning->Begin(Contrastive()).ok());
}

TEST_F(FineTuningTest, ACommitIsStagedUnlessPromoted) {
  std::unique_ptr<FineTuning> fine_tuning = NewFineTuning(/*with_store=*/true);
  absl::StatusOr<std::unique_ptr<FineTuneJob>> job = fine_tuning->Begin(Contrastive());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Prepare(**job).ok());
  ASSERT_TRUE(Step(**job, Pairs(4)).ok());
  // The deprecated do_not_serve next to promote is a contradiction, refused before any work.
  CommitRequest contradiction;
  contradiction.promote = true;
  contradiction.do_not_serve = true;
  absl::Status refused = Commit(**job, contradiction).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "do_not_serve")) << refused;
  EXPECT_EQ(metrics_.published_, 0);

  absl::StatusOr<FineTuneProgress> committed = Commit(**job, {"staged"});
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string version = committed->committed_version;
  ASSERT_FALSE(version.empty());
  EXPECT_FALSE(committed->promoted);
  EXPECT_TRUE(absl::StartsWith(committed->promotion, "staged")) << committed->promotion;
  EXPECT_EQ(metrics_.published_, 1);
  // Listed and pinnable, not the default; the store records that before the version appeared.
  EXPECT_EQ(fine_tuning->ServedVersion(), "base");
  absl::StatusOr<ServingState> state = ReadServingState(store_);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->serving, "base");
  ASSERT_EQ(state->history.size(), 2u);
  EXPECT_EQ(state->history[0].action, "record");
  EXPECT_EQ(state->history[1].action, "commit-staged");
  EXPECT_EQ(state->history[1].committed, version);
  // Never served, so Rollback can never return to it.
  EXPECT_EQ(ReplayServingHistory(*state, {"base", version}).served_ever,
            std::set<std::string>{"base"});
}

TEST_F(FineTuningTest, ErrorsBeforeAnyWork) {
  // Whatever would fail the commit is found before the job starts.
  absl::Status no_store = NewFineTuning(/*with_store=*/false)->Begin(Contrastive()).status();
  EXPECT_EQ(no_store.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_store.message(), "--model-store DIR")) << no_store;
  const std::string file = store_ + "/a-file";
  { std::ofstream(file) << "not a directory"; }
  absl::Status not_a_dir = CheckStoreCanTakeCheckpoint(file, 1 << 20);
  EXPECT_EQ(not_a_dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(not_a_dir.message(), "is not a directory")) << not_a_dir;
  absl::Status no_room = CheckStoreCanTakeCheckpoint(store_, int64_t{1} << 60);  // an exabyte
  EXPECT_EQ(no_room.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_room.message(), "MiB free; a checkpoint of this model needs"))
      << no_room;
  EXPECT_TRUE(CheckStoreCanTakeCheckpoint(store_, 1 << 20).ok());

  std::unique_ptr<FineTuning> fine_tuning = NewFineTuning(/*with_store=*/true);
  FineTuneConfig bad = Contrastive();
  bad.beta1 = 1;
  EXPECT_EQ(fine_tuning->Begin(bad).status(),
            absl::InvalidArgumentError("config: beta1 is 1; it must be in [0, 1)"));
  FineTuneConfig unknown_base = Contrastive();
  unknown_base.base_version = "ft-000099-20260101T000000Z";
  EXPECT_EQ(fine_tuning->Begin(unknown_base).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<std::unique_ptr<FineTuneJob>> job = fine_tuning->Begin(Contrastive());
  ASSERT_TRUE(job.ok()) << job.status();
  absl::Status second = fine_tuning->Begin(Contrastive()).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.message(), (*job)->id())) << second;

  ASSERT_TRUE(Prepare(**job).ok());
  absl::Status nothing = Commit(**job, {}).status();
  EXPECT_EQ(nothing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(nothing.message(), "nothing to commit")) << nothing;
  EXPECT_EQ(Step(**job, Pairs(9)).status(),
            absl::InvalidArgumentError(
                "batch 1 has 9 examples; send 1 to 8 (--max-inputs-per-request) per batch"));
  EXPECT_EQ(fine_tuning->ServedVersion(), "base");
  EXPECT_EQ(metrics_.published_, 0);
}

TEST_F(FineTuningTest, ACancelledCallDoesNoWork) {
  std::unique_ptr<FineTuning> fine_tuning = NewFineTuning(/*with_store=*/true);
  absl::StatusOr<std::unique_ptr<FineTuneJob>> job = fine_tuning->Begin(Contrastive());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Prepare(**job).ok());
  CallControl cancelled;
  cancelled.is_cancelled = [] { return true; };
  EXPECT_EQ(Step(**job, Pairs(4), cancelled).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*job)->steps(), 0);
  EXPECT_EQ(metrics_.examples_, 0);
  (*job)->End("cancelled", absl::CancelledError("test"));
  EXPECT_EQ(metrics_.outcomes_, std::vector<std::string>{"cancelled"});
  EXPECT_TRUE(fine_tuning->Begin(Contrastive()).ok()) << "an ended job frees the slot";
}

}  // namespace
}  // namespace attn::server::core
