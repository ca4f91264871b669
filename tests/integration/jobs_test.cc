// Server-side jobs (CreateJob, GetJob, ListJobs, WatchJob, CancelJob) against the real attnserve
// and the real model, created through the client library's CreateJob (the upload attnctl
// finetune --detach makes): a job runs to its commit with no client attached and its events
// replay from any index; a watcher follows a live job and CancelJob stops it within a step with
// nothing published; kill -9 during a job leaves it failed, with the reason, at the next start
// and nothing of it served; the checks made before any upload. Each test runs its own servers.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "client/training_data.h"
#include "tests/integration/harness.h"

namespace attn::integration {

std::optional<std::vector<std::string>> SharedServerFlags() { return std::nullopt; }

namespace {

constexpr char kToken[] = "jobs-test-token";

// Eight arbitrary pairings the model does not know.
std::vector<pb::TrainingExample> Pairs() {
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {"a red bicycle", "the tuesday meeting"},      {"fresh bread", "a broken umbrella"},
      {"the violin concerto", "tax forms"},          {"mountain hiking boots", "green tea"},
      {"the chess tournament", "rainy weather"},     {"quantum computing", "a birthday cake"},
      {"an old lighthouse", "spreadsheet formulas"}, {"jazz trumpet", "a parking ticket"}};
  std::vector<pb::TrainingExample> examples;
  for (const auto& [anchor, positive] : pairs) {
    pb::TrainingExample& e = examples.emplace_back();
    e.set_anchor(anchor);
    e.set_positive(positive);
  }
  return examples;
}

// A contrastive job over Pairs() in batches of 4: 2 steps per epoch.
pb::JobSpec Spec(int epochs, int telemetry_every = 0) {
  pb::JobSpec spec;
  pb::FineTuneConfig* config = spec.mutable_config();
  config->set_objective(pb::CONTRASTIVE);
  config->set_learning_rate(5e-5);
  config->set_disable_dropout(true);
  config->set_seed(11);
  config->set_telemetry_every(telemetry_every);
  spec.set_epochs(epochs);
  spec.set_batch_size(4);
  spec.set_description("a detached job");
  return spec;
}

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = std::filesystem::temp_directory_path() /
            ("attnserve-it-jobs-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    token_file_ = work_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    store_ = work_ + "/store";
  }
  void TearDown() override {
    StopOwnServer(server_.get());
    server_.reset();
    RemoveTestDir(work_);
  }

  void StartServer(bool with_store = true) {
    std::vector<std::string> flags = {"--trainer_token_file=" + token_file_, "--trainer_threads=1",
                                      "--drain_timeout_s=5"};
    if (with_store) flags.push_back("--model_store=" + store_);
    server_ = std::make_unique<ServerProcess>(flags);
    std::string error;
    ASSERT_TRUE(server_->StartAndWait(ScaledSeconds(120), &error)) << error;
    client::ClientOptions options;
    options.bearer_token = kToken;
    options.timeout = std::chrono::milliseconds(ScaledMilliseconds(60000));
    client_ =
        std::make_unique<client::TrainerClient>(server_->NewChannel(), server_->address(), options);
  }

  pb::Job CreateOrFail(const pb::JobSpec& spec) {
    absl::StatusOr<pb::Job> job = client_->CreateJob(spec, Pairs());
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : pb::Job();
  }

  // Polls GetJob until `done` holds (a test failure after `seconds`).
  pb::Job WaitForJob(const std::string& id, const std::function<bool(const pb::Job&)>& done,
                     double seconds = 120) {
    pb::Job job;
    const bool held = WaitFor(
        [&] {
          absl::StatusOr<pb::Job> got = client_->GetJob(id);
          if (got.ok()) job = *got;
          return got.ok() && done(job);
        },
        ScaledSeconds(seconds));
    EXPECT_TRUE(held) << "job " << id << " is " << pb::JobState_Name(job.state()) << " at step "
                      << job.step() << ": " << job.error();
    return job;
  }

  std::vector<pb::JobEvent> Watch(const std::string& id, int64_t from,
                                  absl::Status* status = nullptr) {
    std::vector<pb::JobEvent> events;
    const absl::Status watched = client_->WatchJob(id, "", from, [&](const pb::JobEvent& e) {
      events.push_back(e);
      return true;
    });
    if (status != nullptr) {
      *status = watched;
    } else {
      EXPECT_TRUE(watched.ok()) << watched;
    }
    return events;
  }

  pb::ListVersionsResponse Versions() {
    absl::StatusOr<pb::ListVersionsResponse> versions = client_->ListVersions();
    EXPECT_TRUE(versions.ok()) << versions.status();
    return versions.ok() ? *versions : pb::ListVersionsResponse();
  }

  // Entries of the store whose name starts with `prefix` (checkpoint temp dirs: ".tmp-").
  int StoreEntries(const std::string& prefix) {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(store_)) {
      n += absl::StartsWith(entry.path().filename().string(), prefix);
    }
    return n;
  }

  std::string work_, token_file_, store_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<client::TrainerClient> client_;
};

TEST_F(JobsTest, ADetachedJobFinishesWithNoClientAndItsEventsReplay) {
  StartServer();
  // 2 epochs x 2 steps, telemetry on the first and every 2nd step; nobody watches while it runs.
  const pb::Job created = CreateOrFail(Spec(/*epochs=*/2, /*telemetry_every=*/2));
  ASSERT_FALSE(created.job_id().empty());
  EXPECT_EQ(created.total_steps(), 4);
  EXPECT_EQ(created.base_version(), "base");
  const std::string id = created.job_id();
  const pb::Job done = WaitForJob(id, [](const pb::Job& j) {
    return j.state() != pb::JOB_PENDING && j.state() != pb::JOB_RUNNING;
  });
  ASSERT_EQ(done.state(), pb::JOB_SUCCEEDED) << done.error();
  EXPECT_EQ(done.step(), 4);
  EXPECT_FALSE(done.promoted());
  const std::string version = done.committed_version();
  ASSERT_FALSE(version.empty());
  // Staged: listed, not served; what it trained is a real version a request can pin.
  const pb::ListVersionsResponse versions = Versions();
  EXPECT_EQ(versions.serving_version(), "base");
  ASSERT_EQ(versions.versions_size(), 2);
  EXPECT_EQ(versions.versions(1).version(), version);
  EXPECT_TRUE(versions.versions(1).staged());
  EXPECT_EQ(versions.versions(1).description(), "a detached job");
  {
    pb::EncodeRequest request;
    request.add_inputs()->set_text("a red bicycle");
    request.set_model_version(version);
    pb::EncodeResponse response;
    grpc::ClientContext context;
    const grpc::Status status = server_->NewStub()->Encode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(response.model_version(), version);
  }
  // The same FineTuneJob as the stream path: the version's training report names the job.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::GetTrainingReportRequest request;
    request.set_version(version);
    pb::TrainingReport report;
    const grpc::Status status =
        pb::Trainer::NewStub(server_->NewChannel())->GetTrainingReport(&context, request, &report);
    ASSERT_TRUE(status.ok()) << StatusString(status);
    EXPECT_EQ(report.settings().at("job_id"), id);
    EXPECT_EQ(report.loss_curve_size(), 4);
  }

  // Every event from index 0: queued, started, each step, committed.
  const std::vector<pb::JobEvent> events = Watch(id, 0);
  ASSERT_EQ(events.size(), 7u);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].index(), static_cast<int>(i));
  EXPECT_EQ(events[0].state(), pb::JOB_PENDING);
  EXPECT_TRUE(absl::StrContains(events[0].message(), "queued")) << events[0].message();
  EXPECT_EQ(events[1].state(), pb::JOB_RUNNING);
  EXPECT_EQ(events[1].message(), "started from version base");
  for (int step = 1; step <= 4; ++step) {
    const pb::FineTuneProgress& p = events[1 + step].progress();
    EXPECT_EQ(p.step(), step);
    EXPECT_EQ(p.job_id(), id);
    EXPECT_GT(p.loss(), 0);
    EXPECT_EQ(p.examples_seen(), 4 * step);
    EXPECT_EQ(p.has_telemetry(), step == 1 || step % 2 == 0) << "step " << step;
  }
  EXPECT_EQ(events[2].progress().base_version(), "base");
  EXPECT_EQ(events[6].state(), pb::JOB_SUCCEEDED);
  EXPECT_EQ(events[6].progress().committed_version(), version);
  EXPECT_FALSE(events[6].progress().promoted());
  // From the middle: the same events, byte for byte.
  const std::vector<pb::JobEvent> tail = Watch(id, 3);
  ASSERT_EQ(tail.size(), 4u);
  for (size_t i = 0; i < tail.size(); ++i) {
    EXPECT_EQ(tail[i].SerializeAsString(), events[3 + i].SerializeAsString());
  }
  EXPECT_TRUE(Watch(id, 7).empty());  // caught up with an ended job: the stream just ends
  absl::Status beyond;
  Watch(id, 8, &beyond);
  EXPECT_EQ(beyond.code(), absl::StatusCode::kOutOfRange) << beyond;
  EXPECT_TRUE(absl::StrContains(beyond.message(), "has 7 events so far: give 0 to 7")) << beyond;

  // GetJob has the spec as created; ListJobs the job.
  absl::StatusOr<pb::Job> got = client_->GetJob(id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->spec().config().objective(), pb::CONTRASTIVE);
  EXPECT_EQ(got->spec().dataset().sha256(), client::EncodeJobDataset(Pairs()).info.sha256());
  EXPECT_EQ(got->events(), 7);
  absl::StatusOr<pb::ListJobsResponse> list = client_->ListJobs();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->jobs_size(), 1);
  EXPECT_FALSE(list->jobs(0).has_spec());
  EXPECT_EQ(list->max_queued_jobs(), 16);
  // The metrics count it like a streamed job.
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_EQ(metrics.Sum("attnserve_finetune_jobs_total", {{"outcome", "committed"}}), 1);
  EXPECT_EQ(metrics.Sum("attnserve_finetune_steps_total"), 4);
  EXPECT_EQ(metrics.Sum("attnserve_finetune_jobs_queued"), 0);
  EXPECT_EQ(metrics.Sum("attnserve_requests_total", {{"method", "CreateJob"}, {"code", "OK"}}), 1);
  EXPECT_FALSE(std::filesystem::exists(store_ + "/jobs/" + id + "/dataset.bin"));
}

TEST_F(JobsTest, AWatcherFollowsALiveJobAndCancelStopsItWithinAStep) {
  StartServer();
  const pb::Job created = CreateOrFail(Spec(/*epochs=*/200));
  const std::string id = created.job_id();
  std::mutex mutex;
  std::vector<pb::JobEvent> seen;
  absl::Status watched;
  std::thread watcher([&] {
    watched = client_->WatchJob(id, "", 0, [&](const pb::JobEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(e);
      return true;
    });
  });
  auto last_step = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return seen.empty() ? int64_t{0} : seen.back().progress().step();
  };
  ASSERT_TRUE(WaitFor([&] { return last_step() >= 3; }, ScaledSeconds(120)));

  // One job at a time: an interactive stream is refused while it runs, naming it.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    auto stream = pb::Trainer::NewStub(server_->NewChannel())->FineTune(&context);
    pb::FineTuneRequest config;
    config.mutable_config()->set_objective(pb::CONTRASTIVE);
    stream->Write(config);
    stream->WritesDone();
    pb::FineTuneProgress ignored;
    while (stream->Read(&ignored)) {
    }
    const grpc::Status refused = stream->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(absl::StrContains(refused.error_message(), id)) << refused.error_message();
  }

  const int64_t before = client_->GetJob(id)->step();
  absl::StatusOr<pb::Job> cancelled = client_->CancelJob(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), pb::JOB_CANCELLED);
  EXPECT_LE(cancelled->step(), before + 1) << "the step under way finishes, no other starts";
  EXPECT_EQ(cancelled->error_code(), "CANCELLED");
  watcher.join();
  EXPECT_TRUE(watched.ok()) << watched;
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().state(), pb::JOB_CANCELLED);
  EXPECT_TRUE(absl::StrContains(seen.back().message(), "nothing was published"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(client_->GetJob(id)->step(), cancelled->step());
  EXPECT_EQ(Versions().versions_size(), 1);  // base only
  EXPECT_EQ(StoreEntries(".tmp-"), 0);

  absl::StatusOr<pb::Job> again = client_->CancelJob(id);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(again.status().message(), "has already ended (cancelled"))
      << again.status();
  // The slot is free again: a short job runs to its commit.
  const pb::Job next = CreateOrFail(Spec(/*epochs=*/1));
  EXPECT_EQ(
      WaitForJob(next.job_id(), [](const pb::Job& j) { return j.state() == pb::JOB_SUCCEEDED; })
          .step(),
      2);
}

TEST_F(JobsTest, AKillDuringAJobMarksItFailedAtTheNextStartAndNothingOfItIsServed) {
  StartServer();
  const pb::Job running = CreateOrFail(Spec(/*epochs=*/200));
  const pb::Job queued = CreateOrFail(Spec(/*epochs=*/1));
  EXPECT_EQ(queued.state(), pb::JOB_PENDING);
  // Its record is rewritten at a step's event when the last write is over a second old, so a
  // step that ends more than a second after step 2 was seen leaves a record at step 2 or later
  // (a loaded machine's steps can take seconds each: no fixed sleep is enough).
  WaitForJob(running.job_id(), [](const pb::Job& j) { return j.step() >= 2; });
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  const int64_t step_after_a_second = client_->GetJob(running.job_id())->step();
  WaitForJob(running.job_id(),
             [&](const pb::Job& j) { return j.step() > step_after_a_second; });
  server_->process().Signal(SIGKILL);
  int wait_status = 0;
  ASSERT_TRUE(server_->process().WaitExit(ScaledSeconds(10), &wait_status));
  server_.reset();

  StartServer();
  const pb::Job failed = *client_->GetJob(running.job_id());
  EXPECT_EQ(failed.state(), pb::JOB_FAILED);
  EXPECT_EQ(failed.error_code(), "UNAVAILABLE");
  EXPECT_TRUE(absl::StrContains(failed.error(),
                                "the server stopped while the job was running, at "
                                "step "))
      << failed.error();
  EXPECT_TRUE(absl::StrContains(failed.error(), "killed, crashed or restarted"));
  EXPECT_GE(failed.step(), 2);
  const pb::Job never_started = *client_->GetJob(queued.job_id());
  EXPECT_EQ(never_started.state(), pb::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains(never_started.error(), "before the job started"))
      << never_started.error();
  // Nothing of it is served or listed, no checkpoint half-written, no dataset kept.
  const pb::ListVersionsResponse versions = Versions();
  EXPECT_EQ(versions.serving_version(), "base");
  EXPECT_EQ(versions.versions_size(), 1);
  EXPECT_EQ(StoreEntries(".tmp-"), 0);
  EXPECT_FALSE(std::filesystem::exists(store_ + "/jobs/" + running.job_id() + "/dataset.bin"));
  // Its events replay up to the kill, then say why it failed.
  const std::vector<pb::JobEvent> events = Watch(running.job_id(), 0);
  ASSERT_GE(events.size(), 5u);
  EXPECT_GE(events[events.size() - 2].progress().step(), 2);
  EXPECT_EQ(events.back().state(), pb::JOB_FAILED);
  EXPECT_EQ(events.back().message(), failed.error());
  // The restarted server runs new jobs.
  const pb::Job next = CreateOrFail(Spec(/*epochs=*/1));
  EXPECT_EQ(
      WaitForJob(next.job_id(), [](const pb::Job& j) { return j.state() == pb::JOB_SUCCEEDED; })
          .committed_version()
          .empty(),
      false);
}

// A one-model server's store served by two models is refused with a command that moves it under
// the first model; run as printed, it must move the job history too (issue 31, finding 13: it
// moved the versions and serving.json and left jobs/ behind, so the model's jobs were gone).
TEST_F(JobsTest, TheSuggestedStoreMigrationKeepsTheJobHistory) {
  StartServer();
  const pb::Job job = CreateOrFail(Spec(/*epochs=*/1));
  const std::string version = WaitForJob(job.job_id(), [](const pb::Job& j) {
                                return j.state() == pb::JOB_SUCCEEDED;
                              }).committed_version();
  ASSERT_FALSE(version.empty());
  ASSERT_TRUE(client_->Promote(version).ok());
  StopOwnServer(server_.get());
  server_.reset();

  const std::vector<std::string> two_models = {"--trainer_token_file=" + token_file_,
                                               "--trainer_threads=1",
                                               "--drain_timeout_s=5",
                                               "--model_store=" + store_,
                                               "--model=first=" + TestModelDir(),
                                               "--model=second=" + TestModelDir()};
  auto refused = std::make_unique<ServerProcess>(two_models);
  std::string error;
  ASSERT_FALSE(refused->StartAndWait(ScaledSeconds(120), &error));
  int wait_status = 0;
  ASSERT_TRUE(refused->process().WaitExit(ScaledSeconds(30), &wait_status));
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 1) << error;
  const std::string log = refused->process().LogTail();
  const size_t begin = log.find("mkdir ");
  const size_t end = log.find(" (or serve one model", begin);
  ASSERT_TRUE(begin != std::string::npos && end != std::string::npos) << log;
  const std::string command = log.substr(begin, end - begin);
  std::printf("[migration] %s\n", command.c_str());
  int exit_code = -1;
  const std::string output = RunCommand(command + " 2>&1", &exit_code);
  ASSERT_EQ(exit_code, 0) << command << "\n" << output;
  refused.reset();

  server_ = std::make_unique<ServerProcess>(two_models);
  ASSERT_TRUE(server_->StartAndWait(ScaledSeconds(180), &error)) << error;
  client::ClientOptions options;
  options.bearer_token = kToken;
  client_ =
      std::make_unique<client::TrainerClient>(server_->NewChannel(), server_->address(), options);
  absl::StatusOr<pb::ListVersionsResponse> versions = client_->ListVersions("first");
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->serving_version(), version) << "the serving record moved with it";
  absl::StatusOr<pb::ListJobsResponse> jobs = client_->ListJobs("first");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->jobs_size(), 1) << "the job history stayed behind at the store's top";
  EXPECT_EQ(jobs->jobs(0).job_id(), job.job_id());
  EXPECT_EQ(jobs->jobs(0).committed_version(), version);
}

TEST_F(JobsTest, BadJobsAreRefusedAtCreationBeforeAnyUpload) {
  // No model store: nowhere to keep the job or its version.
  StartServer(/*with_store=*/false);
  absl::StatusOr<pb::Job> no_store = client_->CreateJob(Spec(1), Pairs());
  EXPECT_EQ(no_store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_store.status().message(), "--model-store DIR"))
      << no_store.status();
  EXPECT_EQ(client_->ListJobs().status().code(), absl::StatusCode::kFailedPrecondition);
  StopOwnServer(server_.get());

  StartServer();
  pb::JobSpec spec = Spec(1);
  spec.mutable_config()->set_base_version("ft-000042-20261125T103000Z");
  absl::StatusOr<pb::Job> unknown_base = client_->CreateJob(spec, Pairs());
  EXPECT_EQ(unknown_base.status().code(), absl::StatusCode::kNotFound) << unknown_base.status();
  EXPECT_TRUE(absl::StrContains(unknown_base.status().message(), "ft-000042-20261125T103000Z"));
  spec = Spec(1);
  spec.mutable_config()->set_beta1(1);
  absl::StatusOr<pb::Job> bad_config = client_->CreateJob(spec, Pairs());
  EXPECT_EQ(bad_config.status().code(), absl::StatusCode::kInvalidArgument) << bad_config.status();
  EXPECT_TRUE(absl::StrContains(bad_config.status().message(), "beta1")) << bad_config.status();
  // The store stops being usable under the running server (an unmounted volume).
  std::filesystem::remove_all(store_);
  std::ofstream(store_) << "not a directory";
  absl::StatusOr<pb::Job> broken = client_->CreateJob(Spec(1), Pairs());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(broken.status().message(), "is not a directory"))
      << broken.status();
  std::filesystem::remove(store_);
  // Refused calls are counted, and nothing was queued.
  const Metrics metrics = ScrapeOrFail(*server_);
  EXPECT_EQ(
      metrics.Sum("attnserve_requests_total", {{"method", "CreateJob"}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(metrics.Sum("attnserve_requests_total",
                        {{"method", "CreateJob"}, {"code", "FAILED_PRECONDITION"}}),
            1);
}

}  // namespace
}  // namespace attn::integration
