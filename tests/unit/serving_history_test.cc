// Rollback returns to what was served before, never to a staged version (issue 31, finding 3):
// the registry's serving history, and the same history replayed from a model store's record of
// the changes (server/core/serving_history.h), which a restarted server or a replica rebuilds.
#include "server/core/serving_history.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model.h"
#include "engine/serving_state.h"
#include "server/core/model_registry.h"

namespace attn::server {
namespace {

std::shared_ptr<const Model> TheModel() {
  static const absl::StatusOr<std::shared_ptr<const Model>>* model =
      new absl::StatusOr<std::shared_ptr<const Model>>(Model::Load(ATTN_TEST_MODEL_DIR));
  EXPECT_TRUE(model->ok()) << model->status();
  return model->ok() ? **model : nullptr;
}

ModelVersion Version(const std::string& name, int64_t sequence) {
  ModelVersion version;
  version.version = name;
  version.sequence = sequence;
  version.model = TheModel();  // every version shares the weights: only names matter here
  return version;
}

std::string Served(const ModelRegistry& registry) {
  std::string serving;
  registry.List(&serving);
  return serving;
}

// The finding's sequence: a staged commit (ft-1), then a gated job promotes ft-2, then Rollback.
TEST(ServingHistoryTest, RollbackAfterAGatedPromotionReturnsToTheVersionServedBefore) {
  ModelRegistry registry(8);
  registry.Add(Version("base", 0));
  ASSERT_TRUE(registry.Publish(Version("ft-1", 1), /*serve=*/false).ok());
  ASSERT_TRUE(registry.Publish(Version("ft-2", 2), /*serve=*/true).ok());
  ASSERT_EQ(Served(registry), "ft-2");

  absl::StatusOr<ModelVersion> back = registry.Rollback("");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, "base");  // not ft-1, committed after base but never served
  EXPECT_EQ(Served(registry), "base");

  // Nothing was served before base; ft-1 never was: a rollback to it is refused.
  absl::Status nothing = registry.Rollback("").status();
  EXPECT_EQ(nothing.code(), absl::StatusCode::kFailedPrecondition) << nothing;
  EXPECT_TRUE(absl::StrContains(nothing.message(), "nothing to roll back to")) << nothing;
  absl::Status staged = registry.Rollback("ft-1").status();
  EXPECT_EQ(staged.code(), absl::StatusCode::kFailedPrecondition) << staged;
  EXPECT_TRUE(absl::StrContains(staged.message(), "never served by default")) << staged;
  EXPECT_TRUE(absl::StrContains(staged.message(), "promote")) << staged;
  EXPECT_EQ(Served(registry), "base");
  // ft-2 was served (and rolled back from): serving it again by name is allowed, and the next
  // rollback returns to base, served before it this time.
  ASSERT_TRUE(registry.Rollback("ft-2").ok());
  EXPECT_EQ(Served(registry), "ft-2");
  EXPECT_EQ(registry.serving_history().served_before, std::vector<std::string>{"base"});
  ASSERT_TRUE(registry.Rollback("").ok());
  EXPECT_EQ(Served(registry), "base");
  EXPECT_EQ(registry.Rollback("no-such").status().code(), absl::StatusCode::kNotFound);
}

TEST(ServingHistoryTest, RollbackWalksBackThroughWhatWasServed) {
  ModelRegistry registry(8);
  registry.Add(Version("base", 0));
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(registry.Publish(Version("ft-" + std::to_string(i), i), i != 2).ok());
  }
  ASSERT_TRUE(registry.SetServing("ft-2").ok());  // promoted after ft-3
  // Served: base, ft-1, ft-3, ft-2.
  EXPECT_EQ(registry.serving_history().served_before,
            (std::vector<std::string>{"base", "ft-1", "ft-3"}));
  for (const char* expected : {"ft-3", "ft-1", "base"}) {
    absl::StatusOr<ModelVersion> back = registry.Rollback("");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->version, expected);
  }
  // A named rollback drops the versions served after it from the history.
  ASSERT_TRUE(registry.SetServing("ft-3").ok());
  ASSERT_TRUE(registry.SetServing("ft-2").ok());
  ASSERT_TRUE(registry.Rollback("base").ok());
  EXPECT_TRUE(registry.serving_history().served_before.empty());
}

TEST(ServingHistoryTest, AStoreWithoutARecordServedEveryCommitWhenItWasMade) {
  const ServingHistory history = CommitOrderHistory({"base", "ft-1", "ft-2", "ft-3"}, "ft-2");
  EXPECT_EQ(history.served_before, (std::vector<std::string>{"base", "ft-1"}));
  EXPECT_EQ(history.served_ever, (std::set<std::string>{"base", "ft-1", "ft-2"}));
}

TEST(ServingHistoryTest, ARecordStartedOnAnOlderStoreCountsTheCommitsBeforeIt) {
  ServingState state;
  state.serving = "ft-1";
  state.history.push_back({"", "promote", "ft-2", "ft-1", "", ""});  // ft-1 and ft-2 predate it
  state.history.push_back({"", "commit-staged", "ft-1", "", "ft-3", ""});
  const ServingHistory history = ReplayServingHistory(state, {"base", "ft-1", "ft-2", "ft-3"});
  EXPECT_EQ(history.served_before, (std::vector<std::string>{"base", "ft-1", "ft-2"}));
  EXPECT_EQ(history.served_ever, (std::set<std::string>{"base", "ft-1", "ft-2"}));
}

// A record that may have lost its oldest entries (kMaxServingHistory of them) says nothing about
// the versions before it: they do not count as served.
TEST(ServingHistoryTest, AFullRecordDoesNotGuessWhatCameBeforeIt) {
  ServingState state;
  state.history.assign(kMaxServingHistory, {"", "set-serving", "ft-2", "ft-2", "", ""});
  state.history.back().to = "ft-3";
  state.serving = "ft-3";
  const ServingHistory history = ReplayServingHistory(state, {"base", "ft-1", "ft-2", "ft-3"});
  EXPECT_EQ(history.served_before, std::vector<std::string>{"ft-2"});
  EXPECT_EQ(history.served_ever, (std::set<std::string>{"ft-2", "ft-3"}));
}

// The registry changes the default while the server records each change as it does
// (TrainerService, FineTuning::RecordOrRevert): replaying the record gives the registry's own
// history after every change, over random sequences of promotions, staged and promoted commits,
// rollbacks and named rollbacks.
TEST(ServingHistoryTest, ReplayingTheRecordGivesTheRegistrysHistory) {
  std::mt19937 random(31);
  for (int round = 0; round < 40; ++round) {
    ModelRegistry registry(64);
    registry.Add(Version("base", 0));
    std::vector<std::string> committed = {"base"};
    ServingState state;
    auto record = [&](const std::string& action, const std::string& from, const std::string& to,
                      const std::string& version) {
      state.history.push_back({"", action, from, to, version, ""});
      if (!to.empty()) state.serving = to;
    };
    record("record", "base", "base", "");
    for (int step = 0; step < 30; ++step) {
      const std::string before = Served(registry);
      const int what = static_cast<int>(random() % 5);
      if (what <= 1) {  // a commit, staged or promoted
        const std::string name = "ft-" + std::to_string(committed.size());
        ASSERT_TRUE(registry.Publish(Version(name, committed.size()), what == 1).ok());
        committed.push_back(name);
        record(what == 1 ? "commit" : "commit-staged", before, what == 1 ? name : "", name);
      } else if (what == 2) {  // a promotion of any version
        const std::string& name = committed[random() % committed.size()];
        ASSERT_TRUE(registry.SetServing(name).ok());
        record("promote", before, name, "");
      } else {  // a rollback, to the previous version or to a named one
        const std::string named = what == 4 ? committed[random() % committed.size()] : "";
        absl::StatusOr<ModelVersion> back = registry.Rollback(named);
        if (back.ok()) record("rollback", before, back->version, "");
      }
      const ServingHistory replayed = ReplayServingHistory(state, committed);
      const ServingHistory live = registry.serving_history();
      ASSERT_EQ(replayed.served_before, live.served_before)
          << "round " << round << " step " << step;
      ASSERT_EQ(replayed.served_ever, live.served_ever) << "round " << round << " step " << step;
      for (const std::string& version : live.served_before) {
        ASSERT_EQ(live.served_ever.count(version), 1u) << version;
      }
    }
  }
}

}  // namespace
}  // namespace attn::server
