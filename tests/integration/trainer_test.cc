// The Trainer service against a real attnserve with --trainer-token-file and --model-store in a
// temp dir: authentication, fine-tuning jobs streamed over FineTune (progress, commit, abort,
// divergence, bad input), version management (ListVersions, Rollback, SetServingVersion),
// Encode serving the committed version while "base" stays pinnable, Encode during a job, and a
// restart on the same store. Plus TLS and the start-up checks of the new flags.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "engine/safetensors.h"
#include "engine/serving_state.h"
#include "tests/integration/harness.h"

namespace attn::integration {

// Every test here needs its own server flags (token, store), so no shared server.
std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

using Clock = std::chrono::steady_clock;
using Stream = grpc::ClientReaderWriter<pb::FineTuneRequest, pb::FineTuneProgress>;

constexpr char kToken[] = "it-s3cret-token_42";

std::string WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::trunc);
  out << contents;
  return path;
}

// The probe texts whose embeddings tell versions apart.
const std::vector<std::string>& ProbeTexts() {
  static const std::vector<std::string> texts = {"the cat sits on the mat",
                                                 "quarterly revenue grew by ten percent"};
  return texts;
}

pb::TrainingBatch ContrastiveBatch() {
  // Arbitrary pairings the model does not know yet, so the loss starts high and visibly falls
  // when the same batch is trained on repeatedly.
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {"a red bicycle", "the tuesday meeting"},
      {"fresh bread", "a broken umbrella"},
      {"the violin concerto", "tax forms"},
      {"mountain hiking boots", "a cup of green tea"},
      {"the chess tournament", "rainy weather in spring"},
      {"quantum computing", "a birthday cake"},
  };
  pb::TrainingBatch batch;
  for (const auto& [anchor, positive] : pairs) {
    pb::TrainingExample* example = batch.add_examples();
    example->set_anchor(anchor);
    example->set_positive(positive);
  }
  return batch;
}

pb::FineTuneRequest ConfigRequest(pb::Objective objective, double learning_rate) {
  pb::FineTuneRequest request;
  pb::FineTuneConfig* config = request.mutable_config();
  config->set_objective(objective);
  config->set_learning_rate(learning_rate);
  config->set_disable_dropout(true);
  config->set_seed(7);
  return request;
}

pb::FineTuneRequest BatchRequest(const pb::TrainingBatch& batch) {
  pb::FineTuneRequest request;
  *request.mutable_batch() = batch;
  return request;
}

// A commit, staged unless `promote`.
pb::FineTuneRequest CommitRequest(const std::string& description = "", bool promote = false) {
  pb::FineTuneRequest request;
  request.mutable_commit()->set_description(description);
  request.mutable_commit()->set_promote(promote);
  return request;
}

// Calls `call` from `clients` threads, each waiting 10 ms between calls, until Stop(): the
// latencies and the failures. Paced, like real traffic: a saturated server would starve
// training by design (--trainer-nice) and make the tests slow. The destructor stops and joins
// the threads, so a test that returns early (a failed ASSERT) reports its failure instead of
// dying in std::terminate for an unjoined std::thread.
class PacedLoad {
 public:
  // One call; its latency in *ms.
  using Call = std::function<grpc::Status(double* ms)>;

  PacedLoad(Call call, int clients) {
    for (int t = 0; t < clients; ++t) {
      threads_.emplace_back([this, call] {
        while (running_.load()) {
          double ms = 0;
          const grpc::Status status = call(&ms);
          {
            std::lock_guard<std::mutex> lock(mutex_);
            ms_.push_back(ms);
            if (!status.ok()) failures_.push_back(status);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
    }
  }
  PacedLoad(const PacedLoad&) = delete;
  PacedLoad& operator=(const PacedLoad&) = delete;
  ~PacedLoad() { Stop(); }

  void Stop() {
    running_.store(false);
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }
  // After Stop().
  const std::vector<double>& ms() const { return ms_; }
  const std::vector<grpc::Status>& failures() const { return failures_; }

 private:
  std::atomic<bool> running_{true};
  std::mutex mutex_;
  std::vector<double> ms_;
  std::vector<grpc::Status> failures_;
  std::vector<std::thread> threads_;
};

// What a failed ASSERT does in the middle of a load: leave the scope with the clients running.
// The process must go on (to report the failure), not abort.
TEST(PacedLoadTest, LeavingTheScopeEarlyJoinsTheClients) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        [] {
          PacedLoad load(
              [](double* ms) {
                *ms = 0;
                return grpc::Status::OK;
              },
              2);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return;  // as ASSERT_TRUE(false) would
        }();
        std::fprintf(stderr, "still running\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "still running");
}

// One FineTune stream.
struct Job {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream;

  // Writes `request` and reads the answer; false if the stream ended instead.
  bool Send(const pb::FineTuneRequest& request, pb::FineTuneProgress* progress) {
    if (!stream->Write(request)) return false;
    return stream->Read(progress);
  }
  // Writes `request` (ignoring a refused write: the server may already have finished) and
  // returns the final status, draining any messages.
  grpc::Status SendAndFinish(const pb::FineTuneRequest& request) {
    stream->Write(request);
    stream->WritesDone();
    pb::FineTuneProgress ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  }
  grpc::Status Finish() {
    stream->WritesDone();
    pb::FineTuneProgress ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  }
};

// Each test gets its own server on its own empty model store, so it runs alone or in any order
// (--gtest_shuffle) and asserts on exactly the versions it made.
class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = new std::string(std::filesystem::temp_directory_path() /
                            ("attnserve-it-trainer-" + std::to_string(getpid())));
    std::filesystem::remove_all(*work_);
    std::filesystem::create_directories(*work_);
    token_file_ = new std::string(WriteFile(*work_ + "/token", std::string("  ") + kToken + "\n"));
    store_ = new std::string(*work_ + "/store");  // created by the server
    StartServer();
  }

  void TearDown() override {
    StopServer();
    if (std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ignored;
      std::filesystem::remove_all(*work_, ignored);
    }
    delete work_;
    delete token_file_;
    delete store_;
  }

  static void StartServer() {
    server_ = new ServerProcess({"--trainer_token_file=" + *token_file_, "--model_store=" + *store_,
                                 "--trainer_threads=1", "--drain_timeout_s=2"});
    std::string error;
    const bool started = server_->StartAndWait(ScaledSeconds(90), &error);
    encoder_ = server_->NewStub().release();
    trainer_ = pb::Trainer::NewStub(server_->NewChannel()).release();
    ASSERT_TRUE(started) << error;
  }

  static void StopServer() {
    if (server_ == nullptr) return;
    StopOwnServer(server_);  // unspawned: StartServer already reported why
    delete encoder_;
    delete trainer_;
    delete server_;
    encoder_ = nullptr;
    trainer_ = nullptr;
    server_ = nullptr;
  }

  static void Authorize(grpc::ClientContext* context, const std::string& token = kToken) {
    context->AddMetadata("authorization", "Bearer " + token);
  }

  static std::unique_ptr<Job> OpenJob(bool authorized = true) {
    auto job = std::make_unique<Job>();
    if (authorized) Authorize(&job->context);
    // Scaled: under ASan on a busy machine five MiniLM steps next to the Encode load took
    // longer than 120 s, the stream hit its deadline and the job failed.
    job->context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(120));
    job->stream = trainer_->FineTune(&job->context);
    return job;
  }

  // A two-label CLASSIFICATION job (`config` gets num_labels 2) of `steps` steps on three
  // sentiment examples, committed staged with `description`; the final progress.
  static pb::FineTuneProgress CommitSentimentClassifier(pb::FineTuneRequest config, int steps,
                                                        const std::string& description) {
    auto job = OpenJob();
    config.mutable_config()->set_num_labels(2);
    pb::FineTuneProgress progress;
    EXPECT_TRUE(job->stream->Write(config));
    pb::TrainingBatch batch;
    for (const auto& [text, label] : std::vector<std::pair<std::string, int>>{
             {"great movie, loved it", 1}, {"terrible film", 0}, {"wonderful and fun", 1}}) {
      pb::TrainingExample* example = batch.add_examples();
      example->set_text(text);
      example->set_label(label);
    }
    for (int step = 1; step <= steps; ++step) {
      if (!job->Send(BatchRequest(batch), &progress)) {
        ADD_FAILURE() << "step " << step << ": " << StatusString(job->Finish());
        return {};
      }
    }
    EXPECT_TRUE(job->Send(CommitRequest(description), &progress));
    EXPECT_TRUE(job->Finish().ok());
    return progress;
  }

  // Embeddings of the probe texts from `version` ("" = the served one); its name in *served.
  static std::vector<std::vector<float>> Embed(const std::string& version,
                                               std::string* served = nullptr) {
    pb::EncodeRequest request;
    for (const std::string& text : ProbeTexts()) request.add_inputs()->set_text(text);
    request.set_model_version(version);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = encoder_->Encode(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    std::vector<std::vector<float>> out;
    for (const auto& result : response.results()) {
      out.emplace_back(result.embedding().begin(), result.embedding().end());
    }
    if (served != nullptr) *served = response.model_version();
    return out;
  }

  static double MaxDiff(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b) {
    EXPECT_EQ(a.size(), b.size());
    double diff = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      diff = std::max(diff, MaxAbsDiff(a[i], b[i]));
    }
    return diff;
  }

  static pb::ListVersionsResponse ListVersions() {
    grpc::ClientContext context;
    Authorize(&context);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->ListVersions(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
    return response;
  }

  // Runs a contrastive job of `steps` identical batches and commits it, promoted (served by
  // default) unless `promote` is false; the committed version.
  static std::string TrainAndCommit(int steps, std::vector<double>* losses = nullptr,
                                    bool promote = true) {
    auto job = OpenJob();
    EXPECT_TRUE(job->stream->Write(ConfigRequest(pb::CONTRASTIVE, 5e-5)));
    for (int i = 0; i < steps; ++i) {
      pb::FineTuneProgress progress;
      if (!job->Send(BatchRequest(ContrastiveBatch()), &progress)) {
        ADD_FAILURE() << "the job ended at batch " << i + 1 << ": " << StatusString(job->Finish());
        return "";
      }
      if (losses != nullptr) losses->push_back(progress.loss());
    }
    pb::FineTuneProgress final_progress;
    EXPECT_TRUE(job->Send(CommitRequest("integration test", promote), &final_progress));
    const grpc::Status status = job->Finish();
    EXPECT_TRUE(status.ok()) << StatusString(status);
    EXPECT_FALSE(final_progress.committed_version().empty());
    EXPECT_EQ(final_progress.promoted(), promote) << final_progress.promotion();
    EXPECT_EQ(final_progress.step(), steps);
    return final_progress.committed_version();
  }

  static std::string* work_;
  static std::string* token_file_;
  static std::string* store_;
  static ServerProcess* server_;
  static pb::Encoder::Stub* encoder_;
  static pb::Trainer::Stub* trainer_;
};

std::string* TrainerTest::work_ = nullptr;
std::string* TrainerTest::token_file_ = nullptr;
std::string* TrainerTest::store_ = nullptr;
ServerProcess* TrainerTest::server_ = nullptr;
pb::Encoder::Stub* TrainerTest::encoder_ = nullptr;
pb::Trainer::Stub* TrainerTest::trainer_ = nullptr;

TEST_F(TrainerTest, MissingOrWrongTokenIsRejectedAndEncoderStaysOpen) {
  {
    grpc::ClientContext context;
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->ListVersions(&context, {}, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << StatusString(status);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Basic " + std::string(kToken));
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->ListVersions(&context, {}, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << StatusString(status);
  }
  for (const std::string& wrong :
       std::vector<std::string>{"wrong", std::string(kToken) + "x", std::string(kToken, 5), ""}) {
    grpc::ClientContext context;
    Authorize(&context, wrong);
    pb::SetServingVersionRequest request;
    request.set_version("base");
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->SetServingVersion(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "'" << wrong << "': " << StatusString(status);
    // The token never shows in an error.
    EXPECT_EQ(status.error_message().find(kToken), std::string::npos);
  }
  {
    auto job = OpenJob(/*authorized=*/false);
    const grpc::Status status = job->SendAndFinish(ConfigRequest(pb::CONTRASTIVE, 1e-5));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << StatusString(status);
  }
  {
    grpc::ClientContext context;
    Authorize(&context);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->ListVersions(&context, {}, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    ASSERT_GE(response.versions_size(), 1);
    EXPECT_EQ(response.versions(0).version(), "base");
  }
  // The Encoder needs no token.
  std::string served;
  EXPECT_EQ(Embed("", &served).size(), ProbeTexts().size());
  EXPECT_EQ(served, "base");
}

TEST_F(TrainerTest, BadStreamsGetTheRightCode) {
  struct Case {
    std::string name;
    std::vector<pb::FineTuneRequest> requests;
    grpc::StatusCode code;
    std::string message_part;
  };
  pb::FineTuneRequest classification = ConfigRequest(pb::CLASSIFICATION, 1e-4);
  classification.mutable_config()->set_num_labels(3);
  pb::TrainingBatch labels;
  for (int label : {0, 3}) {
    pb::TrainingExample* example = labels.add_examples();
    example->set_text("a text to classify");
    example->set_label(label);
  }
  pb::TrainingBatch nan_score;
  for (float score : {0.5f, std::numeric_limits<float>::quiet_NaN()}) {
    pb::TrainingExample* example = nan_score.add_examples();
    example->set_first("first text");
    example->set_second("second text");
    example->set_score(score);
  }
  pb::TrainingBatch wrong_fields = ContrastiveBatch();
  wrong_fields.mutable_examples(2)->set_text("classification text in a contrastive batch");
  pb::TrainingBatch empty_anchor = ContrastiveBatch();
  empty_anchor.mutable_examples(1)->clear_anchor();
  pb::FineTuneRequest no_objective = ConfigRequest(pb::OBJECTIVE_UNSPECIFIED, 1e-5);
  pb::FineTuneRequest no_labels = ConfigRequest(pb::CLASSIFICATION, 1e-5);
  pb::FineTuneRequest unknown_base = ConfigRequest(pb::CONTRASTIVE, 1e-5);
  unknown_base.mutable_config()->set_base_version("no-such-version");
  pb::FineTuneRequest bad_base = ConfigRequest(pb::CONTRASTIVE, 1e-5);
  bad_base.mutable_config()->set_base_version("../x");
  pb::FineTuneRequest negative_lr = ConfigRequest(pb::CONTRASTIVE, -1);
  pb::FineTuneRequest abort;
  abort.set_abort(true);
  const pb::FineTuneRequest contrastive = ConfigRequest(pb::CONTRASTIVE, 1e-5);
  const pb::FineTuneRequest cosine = ConfigRequest(pb::COSINE_SIMILARITY, 1e-5);

  const std::vector<Case> cases = {
      {"batch before config",
       {BatchRequest(ContrastiveBatch())},
       grpc::StatusCode::INVALID_ARGUMENT,
       "the first message must be a config"},
      {"commit before config",
       {CommitRequest()},
       grpc::StatusCode::INVALID_ARGUMENT,
       "the first message must be a config"},
      {"empty message", {pb::FineTuneRequest()}, grpc::StatusCode::INVALID_ARGUMENT, "empty"},
      {"no objective", {no_objective}, grpc::StatusCode::INVALID_ARGUMENT, "objective"},
      {"classification without num_labels",
       {no_labels},
       grpc::StatusCode::INVALID_ARGUMENT,
       "num_labels"},
      {"negative learning rate",
       {negative_lr},
       grpc::StatusCode::INVALID_ARGUMENT,
       "learning_rate"},
      {"unknown base version", {unknown_base}, grpc::StatusCode::NOT_FOUND, "no-such-version"},
      {"base version escaping the store",
       {bad_base},
       grpc::StatusCode::INVALID_ARGUMENT,
       "base_version"},
      {"commit without steps",
       {contrastive, CommitRequest()},
       grpc::StatusCode::FAILED_PRECONDITION,
       "nothing to commit"},
      {"second config",
       {contrastive, contrastive},
       grpc::StatusCode::INVALID_ARGUMENT,
       "second config"},
      {"empty batch",
       {contrastive, BatchRequest(pb::TrainingBatch())},
       grpc::StatusCode::INVALID_ARGUMENT,
       "0 examples"},
      {"label out of range",
       {classification, BatchRequest(labels)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "examples[1].label is 3"},
      {"NaN score",
       {cosine, BatchRequest(nan_score)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "examples[1].score"},
      {"fields of another objective",
       {contrastive, BatchRequest(wrong_fields)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "examples[2].text"},
      {"empty anchor",
       {contrastive, BatchRequest(empty_anchor)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "examples[1].anchor is empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto job = OpenJob();
    for (size_t i = 0; i + 1 < c.requests.size(); ++i) job->stream->Write(c.requests[i]);
    const grpc::Status status = job->SendAndFinish(c.requests.back());
    EXPECT_EQ(status.error_code(), c.code) << StatusString(status);
    EXPECT_NE(status.error_message().find(c.message_part), std::string::npos)
        << StatusString(status);
  }
  // An explicit abort ends the job cleanly with a final progress message.
  auto job = OpenJob();
  pb::FineTuneProgress progress;
  ASSERT_TRUE(job->stream->Write(contrastive));
  ASSERT_TRUE(job->Send(BatchRequest(ContrastiveBatch()), &progress));
  EXPECT_EQ(progress.step(), 1);
  EXPECT_EQ(progress.base_version(), "base");
  pb::FineTuneProgress final_progress;
  ASSERT_TRUE(job->Send(abort, &final_progress));
  EXPECT_TRUE(final_progress.committed_version().empty());
  EXPECT_EQ(final_progress.job_id(), progress.job_id());
  const grpc::Status status = job->Finish();
  EXPECT_TRUE(status.ok()) << StatusString(status);
  // None of this changed what is served.
  std::string served;
  Embed("", &served);
  EXPECT_EQ(served, "base");
}

TEST_F(TrainerTest, ContrastiveJobCommitsANewServedVersionWhileEncodeKeepsServing) {
  const auto base_embeddings = Embed("base");

  // One Encode call of one short text, timed.
  const PacedLoad::Call encode_once = [](double* ms) {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("latency probe sentence for the encoder");
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const auto start = Clock::now();
    const grpc::Status status = encoder_->Encode(&context, request, &response);
    *ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return status;
  };
  // The same load without training first, for comparison (after a warm-up: the first calls of
  // a shape build oneDNN primitives).
  for (int i = 0; i < 5; ++i) {
    double ignored;
    ASSERT_TRUE(encode_once(&ignored).ok());
  }
  PacedLoad idle(encode_once, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  idle.Stop();
  ASSERT_TRUE(idle.failures().empty()) << StatusString(idle.failures()[0]);

  // Encode calls from two client threads while the job trains.
  PacedLoad busy(encode_once, 2);
  auto job = OpenJob();
  ASSERT_TRUE(job->stream->Write(ConfigRequest(pb::CONTRASTIVE, 5e-5)));
  std::vector<double> losses;
  std::string job_id;
  int64_t examples_seen = 0;
  constexpr int kSteps = 5;
  for (int i = 0; i < kSteps; ++i) {
    pb::FineTuneProgress progress;
    ASSERT_TRUE(job->Send(BatchRequest(ContrastiveBatch()), &progress))
        << "batch " << i + 1 << ": " << StatusString(job->Finish());
    EXPECT_EQ(progress.step(), i + 1);
    EXPECT_TRUE(std::isfinite(progress.loss()));
    EXPECT_GT(progress.grad_norm(), 0);
    EXPECT_NEAR(progress.learning_rate(), 5e-5, 1e-12);
    EXPECT_GT(progress.examples_per_second(), 0);
    EXPECT_EQ(progress.examples_seen(), examples_seen + ContrastiveBatch().examples_size());
    examples_seen = progress.examples_seen();
    if (i == 0) {
      EXPECT_EQ(progress.base_version(), "base");
      job_id = progress.job_id();
      EXPECT_FALSE(job_id.empty());
    } else {
      EXPECT_TRUE(progress.base_version().empty());
      EXPECT_EQ(progress.job_id(), job_id);
    }
    losses.push_back(progress.loss());
  }
  busy.Stop();

  // The same batch again and again: the loss goes down.
  EXPECT_LT(losses.back(), losses.front()) << "losses: " << ::testing::PrintToString(losses);
  std::printf("[trainer] losses: %s\n", ::testing::PrintToString(losses).c_str());
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1] + 1e-6);
  // Serving went on during training.
  EXPECT_TRUE(busy.failures().empty())
      << busy.failures().size() << " of " << busy.ms().size()
      << " Encode calls failed, first: " << StatusString(busy.failures()[0]);
  EXPECT_GT(busy.ms().size(), 0u);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf(
      "[trainer] Encode latency (1 short text, 2 paced clients): median %.2f ms "
      "idle (%zu calls), %.2f ms during training (%zu calls)\n",
      median(idle.ms()), idle.ms().size(), median(busy.ms()), busy.ms().size());
  // Not committed yet: still the base.
  std::string served;
  EXPECT_LT(MaxDiff(Embed("", &served), base_embeddings), 1e-6);
  EXPECT_EQ(served, "base");

  pb::FineTuneProgress final_progress;
  ASSERT_TRUE(job->Send(CommitRequest("first fine-tune", /*promote=*/true), &final_progress));
  const grpc::Status status = job->Finish();
  ASSERT_TRUE(status.ok()) << StatusString(status);
  const std::string version = final_progress.committed_version();
  ASSERT_FALSE(version.empty());
  EXPECT_EQ(final_progress.step(), kSteps);
  EXPECT_EQ(final_progress.job_id(), job_id);
  EXPECT_TRUE(std::filesystem::is_directory(*store_ + "/" + version));
  EXPECT_TRUE(std::filesystem::exists(*store_ + "/" + version + "/model.safetensors"));

  // Encode serves the new version by default, with different embeddings; "base" stays pinnable.
  const auto tuned = Embed("", &served);
  EXPECT_EQ(served, version);
  EXPECT_GT(MaxDiff(tuned, base_embeddings), 1e-4);
  std::string pinned;
  EXPECT_LT(MaxDiff(Embed("base", &pinned), base_embeddings), 1e-6);
  EXPECT_EQ(pinned, "base");

  pb::ModelInfo info;
  {
    grpc::ClientContext context;
    pb::GetModelInfoRequest request;
    ASSERT_TRUE(encoder_->GetModelInfo(&context, request, &info).ok());
  }
  EXPECT_EQ(info.version(), version);
  EXPECT_NE(info.version_origin().find("fine-tuned from base"), std::string::npos)
      << info.version_origin();
  EXPECT_EQ(
      std::vector<std::string>(info.available_versions().begin(), info.available_versions().end()),
      (std::vector<std::string>{"base", version}));

  const pb::ListVersionsResponse listed = ListVersions();
  EXPECT_EQ(listed.serving_version(), version);
  ASSERT_EQ(listed.versions_size(), 2);
  EXPECT_EQ(listed.versions(1).version(), version);
  EXPECT_TRUE(listed.versions(1).serving());
  EXPECT_FALSE(listed.versions(0).serving());
  EXPECT_EQ(listed.versions(1).description(), "first fine-tune");
  EXPECT_FALSE(listed.versions(1).created_utc().empty());

  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_EQ(metrics.Sum("attnserve_serving_version_info", {{"version", version}}), 1);
  EXPECT_FALSE(metrics.Has("attnserve_serving_version_info", {{"version", "base"}}));
  EXPECT_EQ(metrics.Sum("attnserve_model_info", {{"version", version}}), 1);
  EXPECT_GE(metrics.Sum("attnserve_finetune_steps_total"), kSteps);
  EXPECT_GE(metrics.Sum("attnserve_finetune_examples_total"),
            kSteps * ContrastiveBatch().examples_size());
  EXPECT_EQ(metrics.Sum("attnserve_model_versions_published_total"), 1);
  EXPECT_NEAR(metrics.Sum("attnserve_finetune_loss"), losses.back(), 1e-4);
  EXPECT_EQ(metrics.Sum("attnserve_finetune_jobs_total", {{"outcome", "committed"}}), 1);
  EXPECT_GE(metrics.Sum("attnserve_requests_total", {{"method", "FineTune"}, {"code", "OK"}}), 1);

  // The served version's distance from base, against a naive loop over the two checkpoints'
  // tensors (the pooler is in neither sum: the engine does not load it).
  auto base_file = SafetensorsFile::Open(TestModelDir() + "/model.safetensors");
  auto tuned_file = SafetensorsFile::Open(*store_ + "/" + version + "/model.safetensors");
  ASSERT_TRUE(base_file.ok() && tuned_file.ok());
  double moved = 0, norm = 0;
  for (const TensorInfo& info : (*tuned_file)->tensors()) {
    const std::string name = info.name.rfind("bert.", 0) == 0 ? info.name.substr(5) : info.name;
    const TensorInfo* original = (*base_file)->Find(name);
    if (original == nullptr) original = (*base_file)->Find("bert." + name);
    ASSERT_NE(original, nullptr) << name;
    const std::string_view a = (*tuned_file)->RawBytes(info), b = (*base_file)->RawBytes(*original);
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t k = 0; k < a.size() / 4; ++k) {
      float x, y;
      std::memcpy(&x, a.data() + 4 * k, 4);
      std::memcpy(&y, b.data() + 4 * k, 4);
      moved += (double{x} - y) * (double{x} - y);
      norm += double{y} * y;
    }
  }
  EXPECT_NEAR(metrics.Sum("attnserve_served_version_weight_change"), std::sqrt(moved / norm),
              1e-9 + 1e-6 * std::sqrt(moved / norm));
}

TEST_F(TrainerTest, OneJobAtATime) {
  auto first = OpenJob();
  pb::FineTuneProgress progress;
  ASSERT_TRUE(first->stream->Write(ConfigRequest(pb::CONTRASTIVE, 1e-5)));
  ASSERT_TRUE(first->Send(BatchRequest(ContrastiveBatch()), &progress))
      << StatusString(first->Finish());
  ASSERT_FALSE(progress.job_id().empty());

  auto second = OpenJob();
  const grpc::Status refused = second->SendAndFinish(ConfigRequest(pb::CONTRASTIVE, 1e-5));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(refused);
  EXPECT_NE(refused.error_message().find(progress.job_id()), std::string::npos)
      << StatusString(refused);

  // Closing the first stream without commit discards the job and frees the slot.
  const grpc::Status closed = first->Finish();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::CANCELLED) << StatusString(closed);

  auto third = OpenJob();
  ASSERT_TRUE(third->stream->Write(ConfigRequest(pb::CONTRASTIVE, 1e-5)));
  ASSERT_TRUE(third->Send(BatchRequest(ContrastiveBatch()), &progress))
      << StatusString(third->Finish());
  // A cancelled job is discarded too. The client's Finish returns before the server has seen
  // the cancellation, so the slot frees shortly after: poll with new jobs until one starts.
  third->context.TryCancel();
  EXPECT_EQ(third->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const auto deadline = Clock::now() + ScaledSeconds(10);
  while (true) {
    auto next = OpenJob();
    ASSERT_TRUE(next->stream->Write(ConfigRequest(pb::CONTRASTIVE, 1e-5)));
    if (next->Send(BatchRequest(ContrastiveBatch()), &progress)) {
      pb::FineTuneRequest abort;
      abort.set_abort(true);
      ASSERT_TRUE(next->Send(abort, &progress));
      EXPECT_TRUE(next->Finish().ok());
      break;
    }
    const grpc::Status status = next->Finish();
    ASSERT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(status);
    ASSERT_LT(Clock::now(), deadline) << "the cancelled job still holds the slot";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST_F(TrainerTest, ListRollbackAndSetServingVersion) {
  // A first version, promoted, and a second, staged (committed without promotion).
  const std::string first = TrainAndCommit(1);
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(ListVersions().serving_version(), first);
  const std::string second = TrainAndCommit(1, nullptr, /*promote=*/false);
  ASSERT_FALSE(second.empty());
  pb::ListVersionsResponse listed = ListVersions();
  EXPECT_EQ(listed.serving_version(), first);
  ASSERT_EQ(listed.versions_size(), 3);
  EXPECT_EQ(listed.versions(0).version(), "base");
  EXPECT_EQ(listed.versions(1).version(), first);
  EXPECT_EQ(listed.versions(2).version(), second);
  EXPECT_FALSE(listed.versions(0).staged());
  EXPECT_FALSE(listed.versions(1).staged());
  EXPECT_TRUE(listed.versions(2).staged());

  auto call_set = [](const std::string& version, pb::ListVersionsResponse* response) {
    grpc::ClientContext context;
    Authorize(&context);
    pb::SetServingVersionRequest request;
    request.set_version(version);
    return trainer_->SetServingVersion(&context, request, response);
  };
  auto call_rollback = [](const std::string& version, pb::ListVersionsResponse* response) {
    grpc::ClientContext context;
    Authorize(&context);
    pb::RollbackRequest request;
    request.set_version(version);
    return trainer_->Rollback(&context, request, response);
  };

  pb::ListVersionsResponse response;
  grpc::Status status = call_set(second, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), second);
  std::string served;
  Embed("", &served);
  EXPECT_EQ(served, second);

  status = call_rollback("", &response);  // -> the one committed before
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), first);
  status = call_rollback("", &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), "base");
  Embed("", &served);
  EXPECT_EQ(served, "base");
  status = call_rollback("", &response);  // nothing was served before base
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(status);
  status = call_rollback(second, &response);  // served before: allowed; then back to base
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), second);
  status = call_rollback("", &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), "base");

  status = call_set("no-such-version", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << StatusString(status);
  for (const std::string& bad :
       std::vector<std::string>{"../x", "", ".hidden", "a/b", std::string(100, 'a')}) {
    status = call_set(bad, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << "'" << bad << "': " << StatusString(status);
  }
  status = call_rollback("../x", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << StatusString(status);

  status = call_set(second, &response);
  ASSERT_TRUE(status.ok()) << StatusString(status);
  status = call_rollback(first, &response);  // a named older one
  ASSERT_TRUE(status.ok()) << StatusString(status);
  EXPECT_EQ(response.serving_version(), first);
  // An older version stays served: the restart test checks that start-up serves the latest
  // committed one whatever was served before.
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_EQ(metrics.Sum("attnserve_serving_version_info", {{"version", first}}), 1);
  EXPECT_EQ(metrics.Sum("attnserve_serving_version_info"), 1);
}

TEST_F(TrainerTest, CosineAndClassificationJobs) {
  const std::string served_before = ListVersions().serving_version();
  {
    auto job = OpenJob();
    ASSERT_TRUE(job->stream->Write(ConfigRequest(pb::COSINE_SIMILARITY, 2e-5)));
    pb::TrainingBatch batch;
    for (const auto& [first, second, score] :
         std::vector<std::tuple<std::string, std::string, float>>{
             {"a man is playing a guitar", "a person plays an instrument", 0.8f},
             {"a dog runs in the park", "stock markets fell sharply", -0.2f},
             {"the sun is shining", "it is a sunny day", 0.9f}}) {
      pb::TrainingExample* example = batch.add_examples();
      example->set_first(first);
      example->set_second(second);
      example->set_score(score);
    }
    pb::FineTuneProgress progress;
    for (int step = 1; step <= 2; ++step) {
      ASSERT_TRUE(job->Send(BatchRequest(batch), &progress)) << StatusString(job->Finish());
      EXPECT_EQ(progress.step(), step);
    }
    pb::FineTuneRequest abort;
    abort.set_abort(true);
    ASSERT_TRUE(job->Send(abort, &progress));
    EXPECT_TRUE(job->Finish().ok());
  }
  std::string version;
  {
    pb::FineTuneRequest config = ConfigRequest(pb::CLASSIFICATION, 1e-3);
    config.mutable_config()->set_parameters(pb::PARAMETERS_HEAD_ONLY);
    version = CommitSentimentClassifier(config, 2, "head only").committed_version();
  }
  ASSERT_FALSE(version.empty());
  EXPECT_TRUE(std::filesystem::exists(*store_ + "/" + version + "/head.safetensors"));
  const pb::ListVersionsResponse listed = ListVersions();
  EXPECT_EQ(listed.serving_version(), served_before);  // staged
  EXPECT_EQ(listed.versions(listed.versions_size() - 1).version(), version);
  EXPECT_NE(listed.versions(listed.versions_size() - 1).origin().find("classification"),
            std::string::npos);
  // Head-only training leaves the encoder as it was: the pinned version embeds like its base.
  std::string pinned;
  EXPECT_LT(MaxDiff(Embed(version, &pinned), Embed(served_before)), 1e-6);
  EXPECT_EQ(pinned, version);
}

// A parameter selection sent over RPC trains what it names and nothing else: in the committed
// checkpoint (read back from the store) every tensor outside the selection is bit-identical to
// the base model's, and the selected weight matrices moved.
TEST_F(TrainerTest, ParameterSelectionsLeaveFrozenTensorsBitIdentical) {
  auto base = SafetensorsFile::Open(TestModelDir() + "/model.safetensors");
  ASSERT_TRUE(base.ok()) << base.status();
  struct Selection {
    pb::ParameterSelection selection;
    std::function<bool(const std::string&)> trains;  // by Hugging Face name
  };
  const std::vector<Selection> selections = {
      {pb::PARAMETERS_ATTENTION_ONLY,
       [](const std::string& name) {
         return name.find(".attention.self.") != std::string::npos ||
                name.find(".attention.output.dense.") != std::string::npos;
       }},
      {pb::PARAMETERS_ALL_BUT_EMBEDDINGS,
       [](const std::string& name) { return name.rfind("encoder.layer.", 0) == 0; }},
  };
  for (const Selection& s : selections) {
    const std::string selection = pb::ParameterSelection_Name(s.selection);
    SCOPED_TRACE(selection);
    auto job = OpenJob();
    pb::FineTuneRequest config = ConfigRequest(pb::CONTRASTIVE, 1e-3);
    config.mutable_config()->set_parameters(s.selection);
    ASSERT_TRUE(job->stream->Write(config));
    pb::FineTuneProgress progress;
    for (int step = 1; step <= 2; ++step) {
      ASSERT_TRUE(job->Send(BatchRequest(ContrastiveBatch()), &progress))
          << StatusString(job->Finish());
      EXPECT_EQ(progress.step(), step);
    }
    ASSERT_TRUE(job->Send(CommitRequest(selection), &progress));
    ASSERT_TRUE(job->Finish().ok());
    const std::string version = progress.committed_version();
    ASSERT_FALSE(version.empty());

    auto tuned = SafetensorsFile::Open(*store_ + "/" + version + "/model.safetensors");
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    int frozen = 0, trained = 0;
    for (const TensorInfo& info : (*tuned)->tensors()) {
      const std::string name = info.name.rfind("bert.", 0) == 0 ? info.name.substr(5) : info.name;
      const TensorInfo* original = (*base)->Find(name);
      if (original == nullptr) original = (*base)->Find("bert." + name);
      ASSERT_NE(original, nullptr) << "the checkpoint has " << info.name << ", the base not";
      const bool identical = (*tuned)->RawBytes(info) == (*base)->RawBytes(*original);
      if (!s.trains(name)) {
        ++frozen;
        EXPECT_TRUE(identical) << name << " is frozen under " << selection << " but changed";
      } else if (name.find(".weight") != std::string::npos) {
        ++trained;
        EXPECT_FALSE(identical) << name << " is selected but did not change";
      }
    }
    EXPECT_GT(frozen, 0);
    EXPECT_GT(trained, 0);
    std::printf("[trainer] %s: %d frozen tensors bit-identical, %d selected weights changed\n",
                selection.c_str(), frozen, trained);
  }
}

// Training telemetry on the real model: what each parameter selection moves, and which
// word-embedding rows training touches (the tokens of the data, counted with Tokenize; without
// weight decay no other row changes at all in the committed checkpoint).
TEST_F(TrainerTest, TelemetryShowsWhatTrainingMoved) {
  // The served model's shape (MiniLM here; the tiny model under TSan).
  pb::ModelInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->GetModelInfo(&context, pb::GetModelInfoRequest(), &info).ok());
  }
  const int layers = info.num_layers();
  {
    SCOPED_TRACE("PARAMETERS_ATTENTION_ONLY");
    auto job = OpenJob();
    pb::FineTuneRequest config = ConfigRequest(pb::CONTRASTIVE, 1e-3);
    config.mutable_config()->set_parameters(pb::PARAMETERS_ATTENTION_ONLY);
    config.mutable_config()->set_telemetry_every(1);
    ASSERT_TRUE(job->stream->Write(config));
    pb::FineTuneProgress progress;
    for (int step = 1; step <= 2; ++step) {
      ASSERT_TRUE(job->Send(BatchRequest(ContrastiveBatch()), &progress))
          << StatusString(job->Finish());
      ASSERT_TRUE(progress.has_telemetry()) << "step " << step;
    }
    const pb::TrainingTelemetry& telemetry = progress.telemetry();
    int attention = 0, frozen = 0;
    for (const pb::ParameterGroupTelemetry& g : telemetry.groups()) {
      const std::string& kind = g.kind();
      if (kind == "W_Q" || kind == "W_K" || kind == "W_V" || kind == "W_O") {
        ++attention;
        EXPECT_TRUE(g.trainable()) << g.name();
        EXPECT_GT(g.relative_change(), 0) << g.name();
        EXPECT_GT(g.update_norm(), 0) << g.name();
        EXPECT_GT(g.grad_norm(), 0) << g.name();
      } else {
        ++frozen;
        EXPECT_FALSE(g.trainable()) << g.name();
        EXPECT_EQ(g.relative_change(), 0.0) << g.name();
        EXPECT_EQ(g.update_norm(), 0.0) << g.name();
      }
    }
    EXPECT_EQ(attention, layers * 4);
    EXPECT_EQ(frozen, 4 + layers * 4) << "embeddings, their LayerNorm, FFN in/out and 2 LayerNorms";
    EXPECT_EQ(telemetry.embedding_rows_touched(), 0) << "the embeddings are frozen";
    pb::FineTuneRequest abort;
    abort.set_abort(true);
    job->SendAndFinish(abort);  // nothing to keep
  }

  // PARAMETERS_ALL without weight decay: the rows touched are the data's tokens.
  std::set<int32_t> data_tokens;
  {
    pb::TokenizeRequest tokenize;
    const pb::TrainingBatch batch = ContrastiveBatch();
    for (const pb::TrainingExample& e : batch.examples()) {
      tokenize.add_inputs()->set_text(e.anchor());
      tokenize.add_inputs()->set_text(e.positive());
    }
    pb::TokenizeResponse tokens;
    grpc::ClientContext context;
    ASSERT_TRUE(encoder_->Tokenize(&context, tokenize, &tokens).ok());
    for (const pb::TokenizeResult& r : tokens.results()) {
      for (const pb::Token& t : r.tokens()) data_tokens.insert(t.id());
    }
  }
  auto job = OpenJob();
  pb::FineTuneRequest config = ConfigRequest(pb::CONTRASTIVE, 1e-3);
  config.mutable_config()->set_weight_decay(0);
  config.mutable_config()->set_telemetry_every(2);
  ASSERT_TRUE(job->stream->Write(config));
  pb::FineTuneProgress progress;
  std::vector<int64_t> telemetry_steps;
  pb::TrainingTelemetry last;
  std::vector<double> losses;
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(job->Send(BatchRequest(ContrastiveBatch()), &progress))
        << StatusString(job->Finish());
    losses.push_back(progress.loss());
    if (!progress.has_telemetry()) continue;
    telemetry_steps.push_back(progress.step());
    last = progress.telemetry();
  }
  EXPECT_EQ(telemetry_steps, (std::vector<int64_t>{1, 2})) << "step 1, then every 2nd";
  EXPECT_EQ(last.embedding_rows_touched(), static_cast<int64_t>(data_tokens.size()));
  ASSERT_EQ(last.most_changed_tokens_size(), 10);
  for (const pb::TokenChange& t : last.most_changed_tokens()) {
    EXPECT_TRUE(data_tokens.count(t.id())) << t.token();
    EXPECT_GT(t.relative_change(), 0) << t.token();
  }
  ASSERT_TRUE(job->Send(CommitRequest("telemetry", /*do_not_serve=*/true), &progress));
  ASSERT_TRUE(job->Finish().ok());
  const std::string version = progress.committed_version();
  ASSERT_FALSE(version.empty());
  auto base = SafetensorsFile::Open(TestModelDir() + "/model.safetensors");
  auto tuned = SafetensorsFile::Open(*store_ + "/" + version + "/model.safetensors");
  ASSERT_TRUE(base.ok() && tuned.ok());
  auto word_table = [](SafetensorsFile& file) {
    for (const char* name :
         {"embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"}) {
      if (const TensorInfo* info = file.Find(name)) return file.RawBytes(*info);
    }
    return std::string_view();
  };
  const std::string_view before = word_table(**base), after = word_table(**tuned);
  ASSERT_EQ(before.size(), after.size());
  const size_t row_bytes = static_cast<size_t>(info.hidden_size()) * sizeof(float);
  std::set<int32_t> changed;
  for (size_t row = 0; row * row_bytes < before.size(); ++row) {
    if (before.substr(row * row_bytes, row_bytes) != after.substr(row * row_bytes, row_bytes)) {
      changed.insert(static_cast<int32_t>(row));
    }
  }
  EXPECT_EQ(changed, data_tokens) << "rows changed in the checkpoint vs the data's tokens";
  // The last telemetry step's update norms per kind, as Prometheus gauges.
  const Metrics metrics = ScrapeOrFail(*server_);
  for (const char* kind : {"W_Q", "W_K", "W_V", "W_O", "FFN_in", "FFN_out", "LayerNorm",
                           "word_embeddings", "position_embeddings", "token_type_embeddings"}) {
    EXPECT_GT(metrics.Sum("attnserve_finetune_update_norm", {{"kind", kind}}), 0) << kind;
  }

  // The training report stored with the version: the same loss curve, the changed rows, and
  // every layer group moved (all parameters trained).
  pb::GetTrainingReportRequest report_request;
  report_request.set_version(version);
  pb::TrainingReport report;
  {
    grpc::ClientContext context;
    Authorize(&context);
    const grpc::Status status = trainer_->GetTrainingReport(&context, report_request, &report);
    ASSERT_TRUE(status.ok()) << StatusString(status);
  }
  ASSERT_EQ(report.loss_curve_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(report.loss_curve(i).step(), i + 1);
    EXPECT_EQ(report.loss_curve(i).loss(), losses[i]);
  }
  EXPECT_EQ(report.embedding_rows_changed(), static_cast<int64_t>(data_tokens.size()));
  EXPECT_EQ(report.settings().at("weight_decay"), "0");
  EXPECT_EQ(report.settings().at("objective"), "contrastive");
  EXPECT_EQ(report.relative_change_size(), 4 + layers * 8);
  for (const pb::ParameterGroupTelemetry& g : report.relative_change()) {
    EXPECT_GT(g.relative_change(), 0) << g.name();
  }
  // base exists and has no report: that is what the answer says, not "no version 'base'"
  // (issue 31, finding 13).
  report_request.set_version("base");
  {
    grpc::ClientContext context;
    Authorize(&context);
    const grpc::Status status = trainer_->GetTrainingReport(&context, report_request, &report);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(status);
    EXPECT_TRUE(absl::StartsWith(status.error_message(), "base has no training report"))
        << StatusString(status);
  }
  std::printf(
      "[trainer] telemetry: %zu distinct tokens in the data, %zu word-embedding rows "
      "changed\n",
      data_tokens.size(), changed.size());
}

TEST_F(TrainerTest, DivergingJobFailsAndLeavesTheServedVersionAlone) {
  std::string served_before;
  const auto before = Embed("", &served_before);
  auto job = OpenJob();
  pb::FineTuneRequest config = ConfigRequest(pb::CONTRASTIVE, 1e6);
  config.mutable_config()->set_max_grad_norm(0);
  ASSERT_TRUE(job->stream->Write(config));
  grpc::Status status;
  int steps = 0;
  for (; steps < 25; ++steps) {
    pb::FineTuneProgress progress;
    if (!job->Send(BatchRequest(ContrastiveBatch()), &progress)) break;
  }
  status = job->Finish();
  ASSERT_LT(steps, 25) << "an absurd learning rate should make the job diverge";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << StatusString(status);
  EXPECT_NE(status.error_message().find("served version is unchanged"), std::string::npos)
      << StatusString(status);
  std::string served_after;
  EXPECT_LT(MaxDiff(Embed("", &served_after), before), 1e-6);
  EXPECT_EQ(served_after, served_before);
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_GE(metrics.Sum("attnserve_finetune_jobs_total", {{"outcome", "failed"}}), 1);
}

// The served version survives a restart: a rollback is recorded in the model store
// (serving.json), so the restarted server serves the rolled-back version, not the newest (the
// issue's finding: a rolled-back model came back after a pod restart).
TEST_F(TrainerTest, RestartServesTheVersionServedBefore) {
  // Two committed versions, the older one served (rolled back to).
  const std::string older = TrainAndCommit(1);
  const std::string newer = TrainAndCommit(1);
  ASSERT_FALSE(older.empty());
  ASSERT_FALSE(newer.empty());
  {
    grpc::ClientContext context;
    Authorize(&context);
    pb::RollbackRequest request;
    request.set_version(older);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->Rollback(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
  }
  const pb::ListVersionsResponse before = ListVersions();
  ASSERT_EQ(before.versions_size(), 3);
  const std::string latest = before.versions(before.versions_size() - 1).version();
  EXPECT_EQ(latest, newer);
  ASSERT_EQ(before.serving_version(), older);
  const auto older_embeddings = Embed(older);
  // A crash leftover that start-up must clean.
  std::filesystem::create_directories(*store_ + "/.tmp-ft-999999-20000101T000000Z-1");
  // A job still open at SIGTERM gets the drain window (--drain-timeout-s 2), then is cancelled
  // and discarded; the server still exits 0.
  auto open_job = OpenJob();
  pb::FineTuneProgress progress;
  ASSERT_TRUE(open_job->stream->Write(ConfigRequest(pb::CONTRASTIVE, 1e-3)));
  ASSERT_TRUE(open_job->Send(BatchRequest(ContrastiveBatch()), &progress));
  const auto stop_start = Clock::now();
  StopServer();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - stop_start).count(), 15);
  EXPECT_FALSE(open_job->Finish().ok());
  StartServer();
  ASSERT_NE(server_, nullptr);
  const pb::ListVersionsResponse after = ListVersions();
  EXPECT_EQ(after.serving_version(), older) << "the rollback did not survive the restart";
  ASSERT_EQ(after.versions_size(), before.versions_size());
  for (int i = 0; i < after.versions_size(); ++i) {
    EXPECT_EQ(after.versions(i).version(), before.versions(i).version());
  }
  std::string served;
  const auto reloaded = Embed("", &served);
  EXPECT_EQ(served, older);
  // The checkpoint reproduces the in-memory weights exactly (or within fp32 noise).
  EXPECT_LT(MaxDiff(reloaded, older_embeddings), 1e-6);
  EXPECT_FALSE(std::filesystem::exists(*store_ + "/.tmp-ft-999999-20000101T000000Z-1"));
  // The next commit continues the sequence.
  const std::string next = TrainAndCommit(1);
  EXPECT_GT(next, latest);
  EXPECT_EQ(ListVersions().serving_version(), next);
}

// Issue 16's finding: a classification job's commit became every client's default embedding
// model. A commit is now staged: unpinned Encode stays bit-identical (the raw float bytes), a
// request pinning the new version gets it, Promote makes it the default, and the promotion is
// recorded in the store so a restart serves it.
TEST_F(TrainerTest, StagedClassificationLeavesTheDefaultBitIdenticalUntilPromoted) {
  auto raw_bytes = [](const std::vector<std::vector<float>>& embeddings) {
    std::string bytes;
    for (const std::vector<float>& e : embeddings) {
      bytes.append(reinterpret_cast<const char*>(e.data()), e.size() * sizeof(float));
    }
    return bytes;
  };
  std::string served;
  const auto before = Embed("", &served);
  ASSERT_EQ(served, "base");
  ASSERT_FALSE(before.empty());

  const pb::FineTuneProgress progress =
      CommitSentimentClassifier(ConfigRequest(pb::CLASSIFICATION, 1e-4), 3, "classifier, staged");
  const std::string version = progress.committed_version();
  EXPECT_FALSE(progress.promoted());
  EXPECT_NE(progress.promotion().find("staged"), std::string::npos) << progress.promotion();
  ASSERT_FALSE(version.empty());

  // Unpinned requests: the same version, the same bytes.
  const auto after_commit = Embed("", &served);
  EXPECT_EQ(served, "base");
  EXPECT_EQ(raw_bytes(after_commit), raw_bytes(before)) << "the staged commit changed Encode";
  pb::ListVersionsResponse listed = ListVersions();
  EXPECT_EQ(listed.serving_version(), "base");
  ASSERT_EQ(listed.versions_size(), 2);
  EXPECT_TRUE(listed.versions(1).staged());
  EXPECT_FALSE(listed.versions(1).serving());
  // A request pinning the staged version gets it, trained (the encoder moved).
  std::string pinned;
  const auto staged = Embed(version, &pinned);
  EXPECT_EQ(pinned, version);
  EXPECT_GT(MaxDiff(staged, before), 1e-5);

  // Promote: the default changes.
  {
    grpc::ClientContext context;
    Authorize(&context);
    pb::PromoteRequest request;
    request.set_version(version);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer_->Promote(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(response.serving_version(), version);
    EXPECT_FALSE(response.versions(1).staged());
  }
  const auto promoted = Embed("", &served);
  EXPECT_EQ(served, version);
  EXPECT_EQ(raw_bytes(promoted), raw_bytes(staged));

  // Restart on the same store: the promoted version is still the default.
  StopServer();
  StartServer();
  ASSERT_NE(server_, nullptr);
  EXPECT_EQ(ListVersions().serving_version(), version) << "the promotion did not survive";
  EXPECT_LT(MaxDiff(Embed("", &served), staged), 1e-6);
  EXPECT_EQ(served, version);
  absl::StatusOr<ServingState> state = ReadServingState(*store_);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_FALSE(state->history.empty());
  EXPECT_EQ(state->history.back().action, "promote");
  EXPECT_EQ(state->history.back().from, "base");
  EXPECT_EQ(state->history.back().to, version);
}

TEST_F(TrainerTest, DisabledWithoutTokenAndFlagChecks) {
  const std::string binary = AttnserveBinary();
  auto run = [&](const std::string& flags) {
    const std::string command = binary + " --model_dir=" + TestModelDir() +
                                " --port=0 --metrics_port=-1 " + flags + " > /dev/null 2>&1";
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const std::string empty_token = WriteFile(*work_ + "/empty-token", " \n\t\n");
  EXPECT_EQ(run("--trainer_token_file=" + empty_token), 2);
  EXPECT_EQ(run("--trainer_token_file=" + *work_ + "/no-such-file"), 2);
  EXPECT_EQ(run("--tls_cert=" + *token_file_), 2);  // without --tls-key
  EXPECT_EQ(run("--trainer_threads=-1"), 2);
  EXPECT_EQ(run("--trainer_nice=20"), 2);

  // Without --trainer-token-file the Trainer answers UNIMPLEMENTED; the Encoder works.
  ServerProcess plain({"--trainer_threads=1"});
  std::string error;
  ASSERT_TRUE(plain.StartAndWait(ScaledSeconds(90), &error)) << error;
  auto stub = pb::Trainer::NewStub(plain.NewChannel());
  grpc::ClientContext context;
  Authorize(&context);
  pb::ListVersionsResponse response;
  const grpc::Status status = stub->ListVersions(&context, {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << StatusString(status);
  EXPECT_NE(status.error_message().find("--trainer-token-file"), std::string::npos);
  plain.process().Stop();

  // With a token but no --model-store, a job is refused at its config, before any training:
  // its result could not be committed.
  ServerProcess no_store({"--trainer_token_file=" + *token_file_, "--trainer_threads=1"});
  ASSERT_TRUE(no_store.StartAndWait(ScaledSeconds(90), &error)) << error;
  auto no_store_trainer = pb::Trainer::NewStub(no_store.NewChannel());
  grpc::ClientContext job_context;
  Authorize(&job_context);
  auto stream = no_store_trainer->FineTune(&job_context);
  ASSERT_TRUE(stream->Write(ConfigRequest(pb::CONTRASTIVE, 1e-5)));
  pb::FineTuneProgress progress;
  EXPECT_FALSE(stream->Read(&progress));
  const grpc::Status refused = stream->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << StatusString(refused);
  EXPECT_NE(refused.error_message().find("--model-store"), std::string::npos)
      << StatusString(refused);
  no_store.process().Stop();
}

TEST_F(TrainerTest, TlsServesEveryService) {
  std::string openssl;
  ASSERT_TRUE(FindOnPath("openssl", &openssl))
      << "no openssl on PATH to make a test certificate (scripts/setup.sh installs it)";
  const std::string cert = *work_ + "/cert.pem", key = *work_ + "/key.pem";
  const std::string command =
      openssl + " req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext " +
      "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key + " -out " + cert +
      " > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  ServerProcess tls(
      {"--tls_cert=" + cert, "--tls_key=" + key, "--trainer_token_file=" + *token_file_});
  std::string error;
  ASSERT_TRUE(tls.StartAndWait(ScaledSeconds(90), &error)) << error;

  std::ifstream in(cert);
  const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto channel = TlsChannel(tls.grpc_port(), pem);
  {
    auto encoder = pb::Encoder::NewStub(channel);
    pb::EncodeRequest request;
    request.add_inputs()->set_text("over tls");
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = encoder->Encode(&context, request, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
  }
  {
    auto trainer = pb::Trainer::NewStub(channel);
    grpc::ClientContext context;
    Authorize(&context);
    pb::ListVersionsResponse response;
    const grpc::Status status = trainer->ListVersions(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << StatusString(status);
  }
  {
    // A plaintext client gets nowhere.
    auto encoder = pb::Encoder::NewStub(tls.NewChannel());
    pb::EncodeRequest request;
    request.add_inputs()->set_text("plaintext");
    pb::EncodeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + ScaledSeconds(5));
    EXPECT_FALSE(encoder->Encode(&context, request, &response).ok());
  }
  tls.process().Stop();
}

}  // namespace
}  // namespace attn::integration
