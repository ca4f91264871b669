// Scaling out over one model store: server A (the trainer replica) commits fine-tuned versions;
// server B, started with --watch-store 1 on the same store, picks each one up and serves it
// (Encode equal to A's for that version), unless an operator pinned an older version on B.
// Server C, with --max-loaded-versions 2 on a copy of the store, unloads least recently used
// versions and loads them again from the store when a request pins them, with the same
// results, and a clear error when the files are gone.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "attnserve/v1/trainer.grpc.pb.h"
#include "engine/serving_state.h"
#include "tests/integration/harness.h"

namespace attn::integration {

// Every test here starts its own servers (shared store, own flags).
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

using Clock = std::chrono::steady_clock;
using Embeddings = std::vector<std::vector<float>>;

constexpr char kToken[] = "watch-store-token";
constexpr double kWatchIntervalS = 1.0;

const std::vector<std::string>& ProbeTexts() {
  static const std::vector<std::string> texts = {"the cat sits on the mat",
                                                 "quarterly revenue grew by ten percent"};
  return texts;
}

// A server process with Encoder and Trainer stubs.
struct Server {
  explicit Server(std::vector<std::string> flags) : process(std::move(flags)) {}

  void Start(const char* name) {
    std::string error;
    ASSERT_TRUE(process.StartAndWait(ScaledSeconds(90), &error)) << name << ": " << error;
    encoder = process.NewStub();
    trainer = pb::Trainer::NewStub(process.NewChannel());
  }

  // SIGTERM must drain and exit 0; the log is printed if anything failed.
  void Stop(const char* name) {
    const bool was_running = process.process().Running();
    const int status = process.process().Stop(ScaledSeconds(35));
    EXPECT_TRUE(was_running && status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << name << ": " << process.process().ExitDescription();
    if (::testing::Test::HasFailure()) {
      std::printf("--- %s log ---\n%s\n--- end ---\n", name, process.process().LogTail().c_str());
    }
  }

  // Encode of the probe texts by `version` ("" = the served one).
  grpc::Status Embed(const std::string& version, Embeddings* out, std::string* served) {
    pb::EncodeRequest request;
    for (const std::string& text : ProbeTexts()) request.add_inputs()->set_text(text);
    request.set_model_version(version);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(60));
    const grpc::Status status = encoder->Encode(&context, request, &response);
    out->clear();
    for (const auto& result : response.results()) {
      out->emplace_back(result.embedding().begin(), result.embedding().end());
    }
    if (served != nullptr) *served = response.model_version();
    return status;
  }

  Embeddings EmbedOrFail(const std::string& version, std::string* served = nullptr) {
    Embeddings out;
    const grpc::Status status = Embed(version, &out, served);
    EXPECT_TRUE(status.ok()) << "Encode(" << version << "): " << StatusString(status);
    return out;
  }

  pb::ListVersionsResponse Versions() {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer->ListVersions(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response;
  }

  ServerProcess process;
  std::unique_ptr<pb::Encoder::Stub> encoder;
  std::unique_ptr<pb::Trainer::Stub> trainer;
};

double MaxDiff(const Embeddings& a, const Embeddings& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = a.size() == b.size() ? 0 : 1e9;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, MaxAbsDiff(a[i], b[i]));
  }
  return diff;
}

// One contrastive step on pairs the model does not know, committed (promoted unless `promote` is
// false: staged); the new version's name.
std::string TrainAndCommit(Server& server, double learning_rate, bool promote = true) {
  return CommitOneContrastiveStep(server.trainer.get(),
                                  {kToken, "", learning_rate, promote, "watch-store test"});
}

// Polls `server` until its default version is `version`; seconds it took, or -1 on timeout.
double WaitUntilServed(Server& server, const std::string& version,
                       std::chrono::duration<double> timeout) {
  const auto start = Clock::now();
  while (Clock::now() - start < timeout) {
    Embeddings ignored;
    std::string served;
    if (server.Embed("", &ignored, &served).ok() && served == version) {
      return std::chrono::duration<double>(Clock::now() - start).count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

class WatchStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ =
        std::filesystem::temp_directory_path() / ("attnserve-it-watch-" + std::to_string(getpid()));
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    token_file_ = (work_ / "token").string();
    std::ofstream(token_file_) << kToken << "\n";
    store_ = (work_ / "store").string();
  }

  void TearDown() override {
    if (std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ignored;
      std::filesystem::remove_all(work_, ignored);
    }
  }

  std::vector<std::string> Flags(const std::string& store, std::vector<std::string> more) const {
    std::vector<std::string> flags = {"--trainer_token_file=" + token_file_,
                                      "--model_store=" + store, "--trainer_threads=1",
                                      "--drain_timeout_s=2"};
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  }

  std::filesystem::path work_;
  std::string token_file_;
  std::string store_;
};

TEST_F(WatchStoreTest, WatchingServerServesVersionsCommittedByTheTrainerReplica) {
  // A also watches (fast): its own commits may be seen by its watcher before the trainer
  // publishes them, which must not fail the commit or list the version twice.
  Server a(Flags(store_, {"--watch_store=0.2"}));
  Server b(Flags(store_, {"--watch_store=" + std::to_string(kWatchIntervalS)}));
  a.Start("A");
  b.Start("B");
  if (HasFatalFailure()) return;

  std::string served;
  const Embeddings base_a = a.EmbedOrFail("", &served);
  EXPECT_EQ(served, "base");
  const Embeddings base_b = b.EmbedOrFail("", &served);
  EXPECT_EQ(served, "base");
  EXPECT_LE(MaxDiff(base_a, base_b), 1e-6);

  const std::string first = TrainAndCommit(a, 5e-4);
  ASSERT_FALSE(first.empty());
  const Embeddings first_a = a.EmbedOrFail(first);
  EXPECT_GT(MaxDiff(first_a, base_a), 1e-4) << "the fine-tune did not change the model";
  const double seconds = WaitUntilServed(b, first, ScaledSeconds(20));
  ASSERT_GE(seconds, 0) << "B never served " << first;
  std::printf("[watch] B served %s %.2f s after A's commit returned (interval %.1f s)\n",
              first.c_str(), seconds, kWatchIntervalS);
  // The interval plus loading the version (about a second); generous for a loaded machine.
  EXPECT_LE(seconds, kWatchIntervalS + 10);
  EXPECT_LE(MaxDiff(b.EmbedOrFail("", &served), first_a), 1e-5);
  EXPECT_EQ(served, first);
  EXPECT_LE(MaxDiff(b.EmbedOrFail("base"), base_a), 1e-6);  // older versions stay pinnable

  int listed = 0;
  const pb::ListVersionsResponse versions_a = a.Versions();
  for (const pb::VersionInfo& info : versions_a.versions()) listed += info.version() == first;
  EXPECT_EQ(listed, 1) << "A lists its own commit " << listed << " times";

  // An operator rolls back on B: the choice is recorded in the shared store, so it is the
  // store's default from now on (A does not watch, and keeps serving what it served).
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::RollbackRequest request;
    request.set_version("base");
    pb::ListVersionsResponse response;
    const grpc::Status status = b.trainer->Rollback(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(response.serving_version(), "base");
  }
  // A staged version (committed without promotion) is listed by the watcher, never served by it.
  const std::string second = TrainAndCommit(a, 5e-4, /*promote=*/false);
  ASSERT_FALSE(second.empty());
  const Embeddings second_a = a.EmbedOrFail(second);
  bool listed_on_b = false;
  for (auto start = Clock::now(); !listed_on_b && Clock::now() - start < ScaledSeconds(20);
       std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    const pb::ListVersionsResponse versions_b = b.Versions();
    for (const pb::VersionInfo& info : versions_b.versions()) {
      listed_on_b = listed_on_b || info.version() == second;
    }
  }
  ASSERT_TRUE(listed_on_b) << "B never listed " << second;
  // Listing and the decision to serve are one step of B's watcher, and its log says which it
  // took: no need to wait another interval to see what it did.
  EXPECT_NE(b.process.process().LogTail(64000).find("found new version " + second +
                                                    " (not served by default)"),
            std::string::npos)
      << b.process.process().LogTail();
  b.EmbedOrFail("", &served);
  EXPECT_EQ(served, "base") << "B served a staged version";
  EXPECT_LE(MaxDiff(b.EmbedOrFail(second), second_a), 1e-5);  // pinnable by name
  {
    // Promoting it on B serves it there; A, which watches too, follows the store's record.
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::PromoteRequest request;
    request.set_version(second);
    pb::ListVersionsResponse response;
    const grpc::Status status = b.trainer->Promote(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(response.serving_version(), second);
  }
  ASSERT_GE(WaitUntilServed(a, second, ScaledSeconds(20)), 0) << "A never followed the promotion";
  // A commit that serves is recorded by A and followed by B.
  const std::string third = TrainAndCommit(a, 5e-4);
  ASSERT_FALSE(third.empty());
  ASSERT_GE(WaitUntilServed(b, third, ScaledSeconds(20)), 0) << "B never served " << third;
  EXPECT_LE(MaxDiff(b.EmbedOrFail(""), a.EmbedOrFail(third)), 1e-5);

  // The store's record: every change, in order, with who made it.
  absl::StatusOr<ServingState> state = ReadServingState(store_);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->serving, third);
  std::vector<std::string> changes;
  for (const ServingChange& change : state->history) {
    changes.push_back(change.action + " " + change.from + " -> " + change.to);
    EXPECT_NE(change.by.find("attnserve on "), std::string::npos) << change.by;
    EXPECT_FALSE(change.at.empty());
  }
  EXPECT_EQ(changes, (std::vector<std::string>{
                         "commit base -> " + first,
                         "rollback " + first + " -> base",
                         "commit-staged base -> base",
                         "promote base -> " + second,
                         "commit " + second + " -> " + third,
                     }));

  a.Stop("A");
  b.Stop("B");
}

TEST_F(WatchStoreTest, UnloadsLeastRecentlyUsedVersionsAndLoadsThemAgainOnDemand) {
  Server a(Flags(store_, {}));
  a.Start("A");
  if (HasFatalFailure()) return;
  const std::string first = TrainAndCommit(a, 5e-4);
  const std::string second = TrainAndCommit(a, 5e-4);
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  const Embeddings reference_base = a.EmbedOrFail("base");
  const Embeddings reference_first = a.EmbedOrFail(first);
  const Embeddings reference_second = a.EmbedOrFail(second);
  a.Stop("A");

  // C works on a copy of the store, so removing a version below leaves A's store alone.
  const std::string copy = (work_ / "store-copy").string();
  std::filesystem::copy(store_, copy, std::filesystem::copy_options::recursive);
  Server c(Flags(copy, {"--max_loaded_versions=2"}));
  c.Start("C");
  if (HasFatalFailure()) return;
  auto unloads = [&c](const std::string& version) {
    const std::string log = c.process.process().LogTail(1 << 20);
    int count = 0;
    for (size_t at = 0;
         (at = log.find("unloaded version " + version + " ", at)) != std::string::npos; ++at) {
      ++count;
    }
    return count;
  };

  // Loaded now: base and the served newest; `first` is listed but not in memory.
  std::string served;
  EXPECT_LE(MaxDiff(c.EmbedOrFail("", &served), reference_second), 1e-5);
  EXPECT_EQ(served, second);
  EXPECT_EQ(unloads("base"), 0);
  // Pinning `first` loads it and unloads the least recently used other version (base).
  EXPECT_LE(MaxDiff(c.EmbedOrFail(first), reference_first), 1e-5);
  EXPECT_EQ(unloads("base"), 1);
  // Pinning base loads it again (same output) and unloads `first`; the served one stays.
  EXPECT_LE(MaxDiff(c.EmbedOrFail("base"), reference_base), 1e-6);
  EXPECT_EQ(unloads(first), 1);
  EXPECT_EQ(unloads(second), 0) << "the served version was unloaded";
  EXPECT_LE(MaxDiff(c.EmbedOrFail(first), reference_first), 1e-5);
  EXPECT_EQ(unloads("base"), 2);

  // `first` is unloaded again after pinning base; then its files disappear from the store.
  c.EmbedOrFail("base");
  ASSERT_EQ(unloads(first), 2);
  std::filesystem::remove_all(std::filesystem::path(copy) / first);
  Embeddings ignored;
  const grpc::Status gone = c.Embed(first, &ignored, nullptr);
  // Still listed, so not NOT_FOUND: the version exists and its files are broken.
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(gone);
  EXPECT_NE(gone.error_message().find(first), std::string::npos) << gone.error_message();
  EXPECT_NE(gone.error_message().find("not in memory"), std::string::npos) << gone.error_message();
  // The server goes on serving.
  EXPECT_LE(MaxDiff(c.EmbedOrFail("", &served), reference_second), 1e-5);
  EXPECT_EQ(served, second);
  c.Stop("C");
}

}  // namespace
}  // namespace attn::integration
