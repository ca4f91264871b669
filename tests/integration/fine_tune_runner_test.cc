// attn::client::FineTuneRunner (the driver behind `attnctl finetune`) against the real attnserve
// with the real model, without the attnctl binary: batches and epochs as the server counts
// them, commit (a new version served by default), an interrupt that aborts the job after the
// current step, a second interrupt and a silent server, both of which cancel the call. Every
// case leaves the served version as it should and the server ready for the next job.
#include "client/fine_tune_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "tests/integration/harness.h"

namespace attn::integration {
namespace {

constexpr char kToken[] = "runner-test-token";

std::string WorkDir() {
  static const std::string dir =
      std::filesystem::temp_directory_path() / ("attnserve-it-runner-" + std::to_string(getpid()));
  return dir;
}

// Removes the token and the model store after the shared server has stopped (environments are
// torn down in reverse order of registration; this one registers before main() runs).
class WorkDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    if (std::getenv("ATTN_KEEP_TEST_DIRS") == nullptr)
      std::filesystem::remove_all(WorkDir(), ignored);
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new WorkDirCleanup);

}  // namespace

std::optional<std::vector<std::string>> SharedServerFlags() {
  std::filesystem::remove_all(WorkDir());
  std::filesystem::create_directories(WorkDir());
  const std::string token_file = WorkDir() + "/token";
  std::ofstream(token_file) << kToken << "\n";
  return std::vector<std::string>{"--trainer_token_file=" + token_file,
                                  "--model_store=" + WorkDir() + "/store", "--trainer_threads=1"};
}

namespace {

using client::FineTuneEvent;
using client::FineTuneJob;
using client::FineTuneOutcome;
using client::FineTuneRunner;
using client::FineTuneRunnerOptions;

// Records what the runner reports; optionally interrupts it at a given step.
class Recorder final : public client::FineTuneObserver {
 public:
  void OnProgress(const pb::FineTuneProgress& progress, bool new_step) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (new_step) steps_.push_back(progress.step());
    if (runner_ != nullptr && new_step && progress.step() == interrupt_at_step_) {
      runner_->Interrupt();
    }
  }
  void OnEvent(FineTuneEvent event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
    if (event == FineTuneEvent::kAbortingOnInterrupt && interrupt_again_) runner_->Interrupt();
  }
  void InterruptAt(FineTuneRunner* runner, int64_t step, bool again) {
    runner_ = runner;
    interrupt_at_step_ = step;
    interrupt_again_ = again;
  }
  std::vector<int64_t> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  std::vector<FineTuneEvent> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<int64_t> steps_;
  std::vector<FineTuneEvent> events_;
  FineTuneRunner* runner_ = nullptr;
  int64_t interrupt_at_step_ = 0;
  bool interrupt_again_ = false;
};

class FineTuneRunnerTest : public ::testing::Test {
 protected:
  client::ClientOptions Options() const {
    client::ClientOptions options;
    options.bearer_token = kToken;
    return options;
  }
  std::string Target() const { return SharedServer().address(); }

  // `n` contrastive pairs of made-up phrases.
  static FineTuneJob Job(int n, int batch_size, int epochs) {
    FineTuneJob job;
    job.config.set_objective(pb::CONTRASTIVE);
    job.config.set_learning_rate(5e-5);
    job.config.set_disable_dropout(true);
    job.config.set_seed(3);
    job.config.set_total_steps((n + batch_size - 1) / batch_size * epochs);
    for (int i = 0; i < n; ++i) {
      pb::TrainingExample* e = &job.examples.emplace_back();
      e->set_anchor("zorbel item number " + std::to_string(i));
      e->set_positive("a quiet vendel of kind " + std::to_string(i % 7));
    }
    job.batch_size = batch_size;
    job.epochs = epochs;
    return job;
  }

  // Runs `job` on a new session; until the previous test's job has ended on the server (one
  // job at a time), a start refused for that reason is tried again.
  FineTuneOutcome Run(const FineTuneJob& job, Recorder* recorder, FineTuneRunnerOptions options,
                      int64_t interrupt_at_step = 0, bool interrupt_again = false) {
    client::TrainerClient trainer(Target(), Options());
    const auto until = std::chrono::steady_clock::now() + ScaledSeconds(60);
    while (true) {
      auto session = trainer.FineTune();
      FineTuneRunner runner(session.get(), options, recorder);
      if (interrupt_at_step > 0) recorder->InterruptAt(&runner, interrupt_at_step, interrupt_again);
      FineTuneOutcome outcome = runner.Run(job);
      recorder->InterruptAt(nullptr, 0, false);
      const bool busy =
          outcome.status.code() == absl::StatusCode::kFailedPrecondition && outcome.job_id.empty();
      if (!busy || std::chrono::steady_clock::now() > until) return outcome;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  pb::ListVersionsResponse Versions() {
    client::TrainerClient trainer(Target(), Options());
    auto versions = trainer.ListVersions();
    EXPECT_TRUE(versions.ok()) << versions.status();
    return versions.ok() ? *versions : pb::ListVersionsResponse();
  }

  std::string ServedVersion() {
    client::EncoderClient encoder(Target(), Options());
    pb::EncodeRequest request;
    request.add_inputs()->set_text("the served version answers");
    auto response = encoder.Encode(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->model_version() : "";
  }
};

TEST_F(FineTuneRunnerTest, EpochsOfBatchesThenCommit) {
  const int versions_before = Versions().versions_size();
  // 7 pairs in batches of 3 would leave one pair, which a contrastive step refuses: the runner
  // sends 3, 2, 2 instead; 6 steps.
  FineTuneJob job = Job(/*n=*/7, /*batch_size=*/3, /*epochs=*/2);
  job.commit = true;
  job.promote = true;
  job.description = "runner test";
  Recorder recorder;
  FineTuneRunnerOptions options;
  options.idle_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ScaledSeconds(60));
  const FineTuneOutcome outcome = Run(job, &recorder, options);
  ASSERT_TRUE(outcome.started) << outcome.status;
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_TRUE(outcome.ended_ok());
  EXPECT_EQ(outcome.batches_sent, 6);
  EXPECT_EQ(outcome.steps, 6);
  EXPECT_EQ(recorder.steps(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(recorder.events().empty());
  EXPECT_FALSE(outcome.interrupted || outcome.timed_out || outcome.aborted_by_us);
  EXPECT_FALSE(outcome.job_id.empty());
  EXPECT_FALSE(outcome.base_version.empty());
  EXPECT_TRUE(std::isfinite(outcome.first_loss) && std::isfinite(outcome.last_loss));
  ASSERT_FALSE(outcome.committed_version.empty());
  EXPECT_TRUE(outcome.promoted) << outcome.promotion;

  const pb::ListVersionsResponse versions = Versions();
  EXPECT_EQ(versions.versions_size(), versions_before + 1);
  EXPECT_EQ(versions.serving_version(), outcome.committed_version);
  EXPECT_EQ(versions.versions(versions.versions_size() - 1).description(), "runner test");
  EXPECT_EQ(ServedVersion(), outcome.committed_version);
}

TEST_F(FineTuneRunnerTest, InterruptAbortsAfterTheCurrentStep) {
  const pb::ListVersionsResponse before = Versions();
  FineTuneJob job = Job(/*n=*/8, /*batch_size=*/2, /*epochs=*/25);  // 100 steps
  job.commit = true;
  Recorder recorder;
  FineTuneRunnerOptions options;
  options.idle_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ScaledSeconds(60));
  const FineTuneOutcome outcome = Run(job, &recorder, options, /*interrupt_at_step=*/2);
  ASSERT_TRUE(outcome.started) << outcome.status;
  EXPECT_TRUE(outcome.interrupted);
  EXPECT_TRUE(outcome.aborted_by_us);
  EXPECT_TRUE(outcome.ended_ok()) << outcome.status;
  EXPECT_EQ(recorder.events(), std::vector<FineTuneEvent>{FineTuneEvent::kAbortingOnInterrupt});
  // Stopped within the batches in flight, nothing published.
  EXPECT_GE(outcome.steps, 2);
  EXPECT_LE(outcome.batches_sent, 2 + options.batches_in_flight);
  EXPECT_TRUE(outcome.committed_version.empty());
  const pb::ListVersionsResponse after = Versions();
  EXPECT_EQ(after.versions_size(), before.versions_size());
  EXPECT_EQ(after.serving_version(), before.serving_version());
}

TEST_F(FineTuneRunnerTest, SecondInterruptCancelsTheCall) {
  const pb::ListVersionsResponse before = Versions();
  FineTuneJob job = Job(/*n=*/8, /*batch_size=*/4, /*epochs=*/25);
  Recorder recorder;
  FineTuneRunnerOptions options;
  options.idle_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ScaledSeconds(60));
  const FineTuneOutcome outcome =
      Run(job, &recorder, options, /*interrupt_at_step=*/1, /*interrupt_again=*/true);
  ASSERT_TRUE(outcome.started) << outcome.status;
  EXPECT_TRUE(outcome.interrupted);
  EXPECT_EQ(recorder.events(), (std::vector<FineTuneEvent>{FineTuneEvent::kAbortingOnInterrupt,
                                                           FineTuneEvent::kDisconnecting}));
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kCancelled) << outcome.status;
  EXPECT_TRUE(outcome.committed_version.empty());
  const pb::ListVersionsResponse after = Versions();
  EXPECT_EQ(after.versions_size(), before.versions_size());
  EXPECT_EQ(after.serving_version(), before.serving_version());
  EXPECT_EQ(ServedVersion(), before.serving_version());
}

TEST_F(FineTuneRunnerTest, SilentServerIsCancelled) {
  const pb::ListVersionsResponse before = Versions();
  // No step of the real model answers within 1 ms of the job's start: the runner cancels.
  FineTuneJob job = Job(/*n=*/8, /*batch_size=*/8, /*epochs=*/5);
  job.commit = true;
  Recorder recorder;
  FineTuneRunnerOptions options;
  options.idle_timeout = std::chrono::milliseconds(1);
  const FineTuneOutcome outcome = Run(job, &recorder, options);
  ASSERT_TRUE(outcome.started) << outcome.status;
  EXPECT_TRUE(outcome.timed_out);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kCancelled) << outcome.status;
  EXPECT_FALSE(outcome.ended_ok());
  EXPECT_LE(outcome.batches_sent, options.batches_in_flight);
  EXPECT_TRUE(outcome.committed_version.empty());
  EXPECT_EQ(Versions().versions_size(), before.versions_size());
}

}  // namespace
}  // namespace attn::integration
