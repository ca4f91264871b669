// The server-side job runner (server/core/job_runner.h) on the real model, without a server:
// the bounded queue (uploads included) and its order, cancelling a queued and a running job,
// the checks made before any upload, and what a restart makes of the jobs a stop left behind.
// A plain-text codec stands in for the front end's protobuf one.
#include "server/core/job_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/durable_file.h"
#include "engine/model_store.h"
#include "server/core/fine_tuning.h"
#include "tests/test_model.h"

namespace attn::server::core {
namespace {

class NullMetrics final : public TrainingMetrics {
 public:
  void RecordFineTuneStep(int64_t, double) override {}
  void RecordFineTuneJob(std::string_view) override {}
  void RecordVersionPublished() override {}
  void RecordUpdateNorms(const std::vector<std::pair<std::string, double>>&) override {}
  void SetQueuedJobs(int64_t jobs) override { queued_ = jobs; }
  std::atomic<int64_t> queued_{0};
};

// Examples as "anchor|positive"; events as "state|step|committed version|message".
JobCodec TextCodec() {
  JobCodec codec;
  codec.decode_example = [](std::string_view bytes) -> absl::StatusOr<TrainingExample> {
    std::vector<std::string> parts = absl::StrSplit(std::string(bytes), '|');
    if (parts.size() != 2) return absl::InvalidArgumentError("not 'anchor|positive'");
    TrainingExample e;
    e.anchor = parts[0];
    e.positive = parts[1];
    return e;
  };
  codec.encode_event = [](const JobEvent& event) {
    return absl::StrCat(JobStateName(event.state), "|", event.progress ? event.progress->step : -1,
                        "|", event.progress ? event.progress->committed_version : "", "|",
                        event.message);
  };
  return codec;
}

struct Upload {
  std::string bytes;
  DatasetInfo info;
};

Upload Pairs(int n) {
  Upload upload;
  for (int i = 0; i < n; ++i) {
    AppendDelimited(
        absl::StrCat("question ", i, " about the weather|answer ", i, ": it will rain tomorrow"),
        &upload.bytes);
  }
  Sha256 sha;
  sha.Update(upload.bytes);
  upload.info = {static_cast<int64_t>(upload.bytes.size()), n, sha.HexDigest()};
  return upload;
}

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::TestModel().ok()) << testing::TestModel().status();
    registry_ = std::make_unique<ModelRegistry>(4);
    registry_->Add({"base", "loaded for the test", *testing::TestModel()});
    store_ =
        absl::StrCat(std::filesystem::temp_directory_path().string(), "/job_runner_test_", getpid(),
                     "_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(store_);
    ASSERT_TRUE(std::filesystem::create_directories(store_));
    fine_tuning_ = std::make_unique<FineTuning>(
        FineTuningOptions{/*max_examples_per_batch=*/8, store_, /*trainer_threads=*/1,
                          /*trainer_nice=*/0},
        registry_.get(), &metrics_);
  }
  void TearDown() override {
    runner_.reset();
    fine_tuning_.reset();
    std::filesystem::remove_all(store_);
  }

  void StartRunner(int max_queued = 3, int64_t max_dataset_bytes = 1 << 20) {
    runner_ = std::make_unique<JobRunner>(
        JobRunnerOptions{"minilm", store_, false, max_queued, max_dataset_bytes},
        fine_tuning_.get(), TextCodec(), &metrics_);
    ASSERT_TRUE(runner_->Start().ok());
  }

  static JobSpec Spec(const Upload& upload, int epochs = 1) {
    JobSpec spec;
    spec.config.objective = Objective::kContrastive;
    spec.config.learning_rate = 1e-4;
    spec.config.disable_dropout = true;
    spec.epochs = epochs;
    spec.batch_size = 2;
    spec.dataset = upload.info;
    return spec;
  }

  // A job created through a whole upload (in two chunks).
  absl::StatusOr<JobView> Create(const Upload& upload, int epochs = 1) {
    absl::StatusOr<std::unique_ptr<JobUpload>> begun =
        runner_->BeginUpload(Spec(upload, epochs), "spec bytes");
    if (!begun.ok()) return begun.status();
    const size_t half = upload.bytes.size() / 2;
    if (absl::Status s = (*begun)->Add(0, upload.bytes.substr(0, half)); !s.ok()) return s;
    if (absl::Status s = (*begun)->Add(1, upload.bytes.substr(half)); !s.ok()) return s;
    EXPECT_TRUE((*begun)->complete());
    return (*begun)->Finish();
  }

  JobView WaitForState(const std::string& id, JobState state, double seconds = 60) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    absl::StatusOr<JobView> job = runner_->Get(id);
    while (job.ok() && job->record.state != state && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      job = runner_->Get(id);
    }
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->record.state, state)
        << JobStateName(job->record.state) << " " << job->record.error;
    return *job;
  }

  std::vector<std::string> Events(const std::string& id, int64_t from = 0) {
    absl::StatusOr<JobRunner::Events> events = runner_->ReadEvents(id, from, 100000, 1 << 30);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? events->encoded : std::vector<std::string>{};
  }

  size_t Versions() {
    std::string serving;
    return registry_->List(&serving).size();
  }

  std::unique_ptr<ModelRegistry> registry_;
  NullMetrics metrics_;
  std::string store_;
  std::unique_ptr<FineTuning> fine_tuning_;
  std::unique_ptr<JobRunner> runner_;
};

TEST_F(JobRunnerTest, TheQueueIsBoundedUploadsIncludedAndRunsInOrder) {
  StartRunner(/*max_queued=*/3);
  // An interactive job holds the slot: the queue fills without anything starting.
  FineTuneConfig interactive;
  interactive.objective = Objective::kContrastive;
  absl::StatusOr<std::unique_ptr<FineTuneJob>> holder = fine_tuning_->Begin(interactive);
  ASSERT_TRUE(holder.ok()) << holder.status();

  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JobView> job = Create(Pairs(4));
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->record.state, JobState::kPending);
    EXPECT_EQ(job->queue_position, i);
    EXPECT_EQ(job->record.total_steps, 2);
    ids.push_back(job->record.id);
  }
  EXPECT_EQ(metrics_.queued_, 3);
  const absl::StatusOr<JobView> refused = Create(Pairs(4));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "the job queue of model minilm is full: 3 jobs are waiting or "
                                "uploading, the limit is 3 (--max-queued-jobs)"))
      << refused.status();

  // Cancelling a queued job frees its place at once; an upload in progress holds one too.
  std::promise<absl::StatusOr<JobView>> cancelled;
  runner_->Cancel(ids[1], [&](absl::StatusOr<JobView> job) { cancelled.set_value(job); });
  absl::StatusOr<JobView> stopped = cancelled.get_future().get();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->record.state, JobState::kCancelled);
  EXPECT_TRUE(absl::StrContains(stopped->record.error, "cancelled while queued"));
  EXPECT_EQ(runner_->Get(ids[2])->queue_position, 1);
  {
    absl::StatusOr<std::unique_ptr<JobUpload>> uploading = runner_->BeginUpload(Spec(Pairs(4)), "");
    ASSERT_TRUE(uploading.ok()) << uploading.status();
    EXPECT_EQ(runner_->BeginUpload(Spec(Pairs(4)), "").status().code(),
              absl::StatusCode::kResourceExhausted);
  }  // abandoned: its place and its files are gone
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(store_ + "/jobs"),
                          std::filesystem::directory_iterator()),
            3);

  // The slot frees: the queued jobs run, oldest first, with no caller waiting on them.
  (*holder)->End("aborted", absl::OkStatus());
  const JobView first = WaitForState(ids[0], JobState::kSucceeded);
  const JobView third = WaitForState(ids[2], JobState::kSucceeded);
  EXPECT_LE(first.record.ended_utc, third.record.started_utc);
  EXPECT_EQ(Versions(), 3u);  // base and two commits
  const std::vector<std::string> events = Events(ids[0]);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_TRUE(absl::StartsWith(events[0],
                               "pending|-1||queued (next to run, after the running "
                               "job): 2 steps (1 epoch x 2), batches of 2"))
      << events[0];
  EXPECT_EQ(events[1], "running|-1||started from version base");
  EXPECT_EQ(events[2], "running|1||");
  EXPECT_EQ(events[3], "running|2||");
  EXPECT_TRUE(absl::StartsWith(
      events[4],
      absl::StrCat("succeeded|2|", first.record.committed_version, "|committed version ")))
      << events[4];
  // Resumable from any index; past the end is refused saying how far it goes.
  EXPECT_EQ(Events(ids[0], 3), std::vector<std::string>(events.begin() + 3, events.end()));
  EXPECT_EQ(runner_->ReadEvents(ids[0], 6, 10, 1 << 20).status().code(),
            absl::StatusCode::kOutOfRange);
  // Ended jobs keep their record and events, not their dataset.
  EXPECT_FALSE(std::filesystem::exists(store_ + "/jobs/" + ids[0] + "/dataset.bin"));
  EXPECT_TRUE(std::filesystem::exists(store_ + "/jobs/" + ids[0] + "/events.bin"));
  EXPECT_EQ(metrics_.queued_, 0);
}

TEST_F(JobRunnerTest, CancelStopsARunningJobBeforeItsNextStepWithNothingPublished) {
  StartRunner();
  absl::StatusOr<JobView> job = Create(Pairs(4), /*epochs=*/100);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->record.id;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (runner_->Get(id)->record.step < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int64_t step_at_cancel = runner_->Get(id)->record.step;
  std::promise<absl::StatusOr<JobView>> answered;
  runner_->Cancel(id, [&](absl::StatusOr<JobView> stopped) { answered.set_value(stopped); });
  absl::StatusOr<JobView> stopped = answered.get_future().get();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->record.state, JobState::kCancelled);
  // The step under way when the cancel came finishes; no other starts.
  EXPECT_LE(stopped->record.step, step_at_cancel + 1);
  EXPECT_EQ(stopped->record.error_code, "CANCELLED");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(runner_->Get(id)->record.step, stopped->record.step);
  EXPECT_EQ(Versions(), 1u);
  EXPECT_TRUE(absl::StartsWith(Events(id).back(), "cancelled|-1||cancelled at step "));
  // Cancelling again: it has ended.
  std::promise<absl::StatusOr<JobView>> again;
  runner_->Cancel(id, [&](absl::StatusOr<JobView> s) { again.set_value(s); });
  const absl::Status twice = again.get_future().get().status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(twice.message(), "has already ended (cancelled")) << twice;
}

TEST_F(JobRunnerTest, ChecksBeforeAnyUpload) {
  StartRunner(3, /*max_dataset_bytes=*/int64_t{1} << 62);
  JobSpec spec = Spec(Pairs(4));
  spec.config.base_version = "ft-000009-20261125T103000Z";
  EXPECT_EQ(runner_->BeginUpload(spec, "").status().code(), absl::StatusCode::kNotFound);
  spec = Spec(Pairs(4));
  spec.config.beta1 = 1;
  absl::Status bad = runner_->BeginUpload(spec, "").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "config")) << bad;
  spec = Spec(Pairs(4));
  spec.description = std::string(kMaxDescriptionBytes + 1, 'd');
  EXPECT_EQ(runner_->BeginUpload(spec, "").status().code(), absl::StatusCode::kInvalidArgument);
  // A dataset the store has no room for (an exabyte), refused from its declared size.
  spec = Spec(Pairs(4));
  spec.dataset.bytes = int64_t{1} << 60;
  const absl::Status no_room = runner_->BeginUpload(spec, "").status();
  EXPECT_EQ(no_room.code(), absl::StatusCode::kFailedPrecondition) << no_room;
  EXPECT_TRUE(absl::StrContains(no_room.message(),
                                "the job's dataset and a checkpoint of this "
                                "model need about"))
      << no_room;
  // An example that is not what the objective needs: named by its index, nothing kept.
  Upload upload = Pairs(2);
  AppendDelimited("no separator", &upload.bytes);
  Sha256 sha;
  sha.Update(upload.bytes);
  upload.info = {static_cast<int64_t>(upload.bytes.size()), 3, sha.HexDigest()};
  spec = Spec(upload);
  spec.batch_size = 3;
  absl::StatusOr<std::unique_ptr<JobUpload>> begun = runner_->BeginUpload(spec, "");
  ASSERT_TRUE(begun.ok()) << begun.status();
  const absl::Status example = (*begun)->Add(0, upload.bytes);
  EXPECT_EQ(example.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(example.message(), "dataset example 2: not 'anchor|positive'");
  begun->reset();
  EXPECT_TRUE(runner_->List().empty());
  // A store that stopped being a directory.
  runner_.reset();
  std::filesystem::remove_all(store_);
  { std::ofstream(store_) << "not a directory"; }
  runner_ = std::make_unique<JobRunner>(JobRunnerOptions{"minilm", store_, false, 3, 1 << 20},
                                        fine_tuning_.get(), TextCodec(), &metrics_);
  EXPECT_TRUE(runner_->Start().ok());  // nothing to read: the jobs directory comes with a job
  const absl::Status not_dir = runner_->BeginUpload(Spec(Pairs(4)), "").status();
  EXPECT_EQ(not_dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(not_dir.message(), "is not a directory")) << not_dir;
  std::filesystem::remove(store_);
  // No store, or another server's.
  runner_ = std::make_unique<JobRunner>(JobRunnerOptions{"minilm", "", false, 3, 1 << 20},
                                        fine_tuning_.get(), TextCodec(), &metrics_);
  EXPECT_TRUE(absl::StrContains(runner_->BeginUpload(Spec(Pairs(4)), "").status().message(),
                                "--model-store DIR"));
  runner_ = std::make_unique<JobRunner>(JobRunnerOptions{"minilm", store_, true, 3, 1 << 20},
                                        fine_tuning_.get(), TextCodec(), &metrics_);
  EXPECT_TRUE(absl::StrContains(runner_->Get("job-x").status().message(), "--watch-store"));
}

// What a restart finds: a job recorded running (its last event cut short by the stop), one
// pending, one whose commit had completed, an unfinished upload and a record that is not ours.
TEST_F(JobRunnerTest, ARestartRecordsWhatTheStopLeftBehind) {
  // A version committed by job "job-committed-1", as if the stop came right after its commit.
  FineTuneConfig config;
  config.objective = Objective::kContrastive;
  config.disable_dropout = true;
  absl::StatusOr<std::unique_ptr<FineTuneJob>> job = fine_tuning_->Begin(config, "job-committed-1");
  ASSERT_TRUE(job.ok()) << job.status();
  std::promise<absl::Status> prepared;
  (*job)->Prepare({}, [&](absl::Status s) { prepared.set_value(s); });
  ASSERT_TRUE(prepared.get_future().get().ok());
  TrainingBatchRequest batch;
  batch.examples.resize(2);
  batch.examples[0] = {"a cat", "a kitten", "", "", "", 0, "", 0};
  batch.examples[1] = {"a car", "a truck", "", "", "", 0, "", 0};
  std::promise<absl::StatusOr<FineTuneProgress>> stepped, committed;
  (*job)->Step(batch, {}, [&](absl::StatusOr<FineTuneProgress> p) { stepped.set_value(p); });
  ASSERT_TRUE(stepped.get_future().get().ok());
  (*job)->Commit({}, {}, [&](absl::StatusOr<FineTuneProgress> p) { committed.set_value(p); });
  absl::StatusOr<FineTuneProgress> commit = committed.get_future().get();
  ASSERT_TRUE(commit.ok()) << commit.status();
  (*job)->End("committed", absl::OkStatus());

  const std::string jobs = store_ + "/jobs";
  auto write_job = [&](const std::string& id, JobState state, int64_t step) {
    JobRecord r;
    r.id = id;
    r.model = "minilm";
    r.state = state;
    r.step = step;
    r.total_steps = 10;
    std::filesystem::create_directories(jobs + "/" + id);
    ASSERT_TRUE(WriteFileDurably(jobs + "/" + id + "/job.json", JobRecordJson(r)).ok());
    std::string events;
    AppendDelimited("pending|-1||queued", &events);
    AppendDelimited("running|-1||started", &events);
    events += std::string("\x20half an event", 14);  // declares 32 bytes, 13 follow
    ASSERT_TRUE(WriteFileDurably(jobs + "/" + id + "/events.bin", events).ok());
  };
  write_job("job-running-1", JobState::kRunning, 3);
  write_job("job-pending-1", JobState::kPending, 0);
  write_job("job-committed-1", JobState::kRunning, 1);
  std::filesystem::create_directories(jobs + "/.upload-job-x");
  std::filesystem::create_directories(jobs + "/job-garbled-1");
  { std::ofstream(jobs + "/job-garbled-1/job.json") << "{\"format_version\": 1"; }

  StartRunner();
  const JobView running = *runner_->Get("job-running-1");
  EXPECT_EQ(running.record.state, JobState::kFailed);
  EXPECT_EQ(running.record.error_code, "UNAVAILABLE");
  EXPECT_TRUE(absl::StrContains(running.record.error,
                                "the server stopped while the job was running, at step 3 of 10"))
      << running.record.error;
  EXPECT_TRUE(absl::StrContains(running.record.error, "Nothing of the job was published"));
  // The half-written event is gone; the failure is the last event.
  const std::vector<std::string> events = Events("job-running-1");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1], "running|-1||started");
  EXPECT_TRUE(absl::StartsWith(events[2], "failed|-1||the server stopped while")) << events[2];
  EXPECT_TRUE(absl::StrContains(runner_->Get("job-pending-1")->record.error,
                                "the server stopped before the job started"));
  const JobView recovered = *runner_->Get("job-committed-1");
  EXPECT_EQ(recovered.record.state, JobState::kSucceeded);
  EXPECT_EQ(recovered.record.committed_version, commit->committed_version);
  EXPECT_FALSE(std::filesystem::exists(jobs + "/.upload-job-x"));
  EXPECT_EQ(runner_->Get("job-garbled-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::exists(jobs + "/job-garbled-1"));  // left for a human to see
  // And the records say so on disk: the next start finds them ended.
  runner_.reset();
  StartRunner();
  EXPECT_EQ(Events("job-running-1").size(), 3u);
}

}  // namespace
}  // namespace attn::server::core
