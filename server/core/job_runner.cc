// The job runner's running side (job_runner.h): the runner thread's loop, each job's run from
// FineTuning::Begin to its recorded end, stopping and cancelling. The store side is in
// job_store.cc, CreateJob's upload in job_upload.cc.
#include "server/core/job_runner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "engine/json_file.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/epoch_order.h"
#include "server/core/job_runner_internal.h"

namespace attn::server::core {

namespace {

using namespace job_files;

// Which step events a job records: all of a job of up to kMaxStepEvents steps, else every
// stride-th, and always the first, the last and those that carry more than numbers.
bool MustRecord(const FineTuneProgress& progress, int64_t total_steps) {
  const int64_t stride = std::max<int64_t>(1, (total_steps + kMaxStepEvents - 1) / kMaxStepEvents);
  return progress.step <= 1 || progress.step >= total_steps || progress.step % stride == 0 ||
         progress.telemetry.has_value() || !progress.warnings.empty() ||
         !progress.evaluations.empty();
}

// Waits for one FineTuneJob call's answer (they come on the training thread).
template <typename Result>
class Answer {
 public:
  std::function<void(Result)> Callback() {
    return [this](Result result) {
      result_.emplace(std::move(result));
      done_.Notify();
    };
  }
  Result Wait() {
    done_.WaitForNotification();
    return *std::move(result_);
  }

 private:
  absl::Notification done_;
  std::optional<Result> result_;
};

}  // namespace

JobRunner::JobRunner(JobRunnerOptions options, FineTuning* fine_tuning, JobCodec codec,
                     TrainingMetrics* metrics)
    : options_(std::move(options)),
      fine_tuning_(fine_tuning),
      codec_(std::move(codec)),
      metrics_(metrics) {}

JobRunner::~JobRunner() {
  Stop();
  fine_tuning_->SetSlotFreedListener(nullptr);
}

void JobRunner::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [id, job] : jobs_) {
      if (job->record.state == JobState::kRunning) job->cancel->store(true);
    }
  }
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Cancel(const std::string& id, Stopped stopped) {
  absl::StatusOr<JobView> found = Get(id);
  if (!found.ok()) return stopped(found.status());
  std::vector<std::function<void()>> after;
  absl::StatusOr<JobView> answer;
  {
    absl::MutexLock lock(&mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      answer = absl::NotFoundError(absl::StrCat("model ", options_.model, " has no job ", id));
    } else {
      Job* job = it->second.get();
      const JobRecord& r = job->record;
      if (IsFinal(r.state)) {
        answer = absl::FailedPreconditionError(absl::StrCat(
            "job ", id, " has already ended (", JobStateName(r.state),
            r.state == JobState::kSucceeded
                ? absl::StrCat(": committed version ", r.committed_version)
                : "",
            ", ", r.ended_utc, "); there is nothing to cancel",
            r.state == JobState::kSucceeded
                ? " (to stop serving its version, roll back; a staged version is not served)"
                : ""));
      } else if (job->committing) {
        answer = absl::FailedPreconditionError(absl::StrCat(
            "job ", id, " has finished its ", r.total_steps,
            " steps and is committing its version; it can no longer be cancelled (a staged "
            "version is not served; roll back a promoted one)"));
      } else if (r.state == JobState::kPending) {
        queue_.erase(std::find(queue_.begin(), queue_.end(), id));
        metrics_->SetQueuedJobs(static_cast<int64_t>(queue_.size()));
        const std::string message = "cancelled while queued (CancelJob); nothing was trained";
        EndLocked(job, JobState::kCancelled, absl::CancelledError(message), message, std::nullopt,
                  &after);
        answer = ViewLocked(*job);
      } else {
        job->cancel->store(true);
        job->on_stopped.push_back(std::move(stopped));
        Log(LogLevel::kInfo, "model %s: job %s: cancel requested at step %d", options_.model, id,
            r.step);
      }
    }
  }
  for (auto& call : after) call();
  if (stopped) stopped(answer);
}

void JobRunner::Loop() {
  while (true) {
    std::string next;
    {
      absl::MutexLock lock(&mutex_);
      // Woken when a job is queued or the slot is freed; the timeout covers a stream that
      // freed the slot between our look and our wait.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return stopping_ || (wake_ && !queue_.empty());
      };
      mutex_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      wake_ = false;
      if (stopping_) break;
      if (queue_.empty()) continue;
      // One job at a time per model: an interactive FineTune stream may hold the slot.
      if (!fine_tuning_->RunningJob().empty()) continue;
      next = queue_.front();
      queue_.pop_front();
      metrics_->SetQueuedJobs(static_cast<int64_t>(queue_.size()));
      Job* job = jobs_.at(next).get();
      job->record.state = JobState::kRunning;
      job->record.started_utc = UtcTimestamp();
    }
    Run(next);
    absl::MutexLock lock(&mutex_);
    wake_ = true;
  }
  // Shutting down: nothing queued will run.
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&mutex_);
    while (!queue_.empty()) {
      Job* job = jobs_.at(queue_.front()).get();
      queue_.pop_front();
      const std::string message =
          "the server shut down before the job started; nothing was trained: create it again";
      EndLocked(job, JobState::kFailed, absl::UnavailableError(message), message, std::nullopt,
                &after);
    }
    metrics_->SetQueuedJobs(0);
  }
  for (auto& call : after) call();
}

// One job's run (JobRunner::Run) in named steps: Begin, OpenDataset, Prepare, Train, Commit,
// End. A step that ends the job early says how (StoppedBy, Failed) and the later ones are
// skipped: all of them after run_ is released, Train and Commit once trained_ is false.
class JobRunner::Execution {
 public:
  Execution(JobRunner* runner, const std::string& id);

  // FineTuning::Begin. False: an interactive FineTune stream took the slot since the runner
  // looked, and the job is queued again (at the front) to wait for it.
  bool Begin();
  void OpenDataset();
  void Prepare();
  // Every epoch's batches, one step each.
  void Train();
  void Commit();
  // Ends the FineTuneJob and records how the job ended.
  void End();

 private:
  // One step on dataset examples order[begin, end); false once the job stops.
  bool TrainBatch(const std::vector<size_t>& order, size_t begin, size_t end);
  // The examples of one batch, their dataset indices in `indices` (up to the one that failed).
  absl::StatusOr<TrainingBatchRequest> ReadBatch(const std::vector<size_t>& order, size_t begin,
                                                 size_t end, std::vector<int64_t>* indices);
  void RecordStep(FineTuneProgress progress);
  // Adds an event of the running job, telling its listeners.
  void RecordRunning(JobEvent event, bool persist);
  // Ends the job at `step`: cancelled (CancelJob), or failed when the server is shutting down.
  void StoppedBy(int64_t step);
  void Failed(const absl::Status& status, int64_t step);

  JobRunner* const runner_;
  const std::string id_;
  Job* job_;
  FineTuneConfig config_;
  std::shared_ptr<std::atomic<bool>> cancel_;
  JobRecord start_;  // the record as the run began
  CallControl control_;
  std::unique_ptr<FineTuneJob> run_;
  std::optional<DatasetFile> dataset_;
  bool trained_ = false;
  // How the job ends: one of these is set before End runs.
  JobState end_state_ = JobState::kFailed;
  absl::Status end_error_;
  std::string end_message_;
  std::optional<FineTuneProgress> end_progress_;
};

JobRunner::Execution::Execution(JobRunner* runner, const std::string& id)
    : runner_(runner), id_(id) {
  absl::MutexLock lock(&runner_->mutex_);
  job_ = runner_->jobs_.at(id).get();  // a job that has not ended is never trimmed
  config_ = job_->config;
  cancel_ = job_->cancel;
  start_ = job_->record;
  control_.is_cancelled = [cancel = cancel_] { return cancel->load(); };
}

void JobRunner::Run(const std::string& id) {
  Execution execution(this, id);
  if (!execution.Begin()) return;
  execution.OpenDataset();
  execution.Prepare();
  execution.Train();
  execution.Commit();
  execution.End();
}

bool JobRunner::Execution::Begin() {
  absl::StatusOr<std::unique_ptr<FineTuneJob>> begun = runner_->fine_tuning_->Begin(config_, id_);
  if (begun.ok()) {
    run_ = *std::move(begun);
    JobEvent event;
    event.state = JobState::kRunning;
    event.message = absl::StrCat("started from version ", start_.base_version);
    RecordRunning(std::move(event), /*persist=*/true);
    return true;
  }
  const std::string holder = runner_->fine_tuning_->RunningJob();
  if (begun.status().code() == absl::StatusCode::kFailedPrecondition && !holder.empty() &&
      holder != id_) {
    absl::MutexLock lock(&runner_->mutex_);
    if (!cancel_->load() && !runner_->stopping_) {
      job_->record.state = JobState::kPending;
      job_->record.started_utc.clear();
      runner_->queue_.push_front(id_);
      runner_->metrics_->SetQueuedJobs(static_cast<int64_t>(runner_->queue_.size()));
      return false;
    }
  }
  Failed(begun.status(), 0);
  return true;
}

void JobRunner::Execution::OpenDataset() {
  if (run_ == nullptr) return;
  absl::StatusOr<DatasetFile> dataset =
      DatasetFile::Open(JoinPath(runner_->JobDir(id_), kDatasetFile), start_.dataset);
  if (!dataset.ok()) {
    Failed(dataset.status(), 0);
    run_.reset();
    return;
  }
  dataset_.emplace(*std::move(dataset));
}

void JobRunner::Execution::Prepare() {
  if (run_ == nullptr) return;
  Answer<absl::Status> prepared;
  run_->Prepare(control_, prepared.Callback());
  if (absl::Status status = prepared.Wait(); !status.ok()) {
    if (cancel_->load()) {
      StoppedBy(0);
    } else {
      Failed(status, 0);
    }
    run_.reset();
  }
}

void JobRunner::Execution::Train() {
  trained_ = run_ != nullptr;
  const auto examples = static_cast<size_t>(start_.dataset.examples);
  for (int epoch = 0; trained_ && epoch < start_.epochs; ++epoch) {
    const std::vector<size_t> order = EpochOrder(examples, config_.seed, epoch);
    // A contrastive batch needs 2 pairs, as attnctl's interactive path sends them.
    const size_t min_batch = config_.objective == Objective::kContrastive ? 2 : 1;
    for (const auto& [begin, end] : EpochBatches(examples, start_.batch_size, min_batch)) {
      if (!TrainBatch(order, begin, end)) {
        trained_ = false;
        break;
      }
    }
  }
}

bool JobRunner::Execution::TrainBatch(const std::vector<size_t>& order, size_t begin, size_t end) {
  if (cancel_->load()) {
    StoppedBy(run_->steps());
    return false;
  }
  std::vector<int64_t> indices;
  absl::StatusOr<TrainingBatchRequest> batch = ReadBatch(order, begin, end, &indices);
  Answer<absl::StatusOr<FineTuneProgress>> answer;
  if (batch.ok()) run_->Step(*std::move(batch), control_, answer.Callback());
  absl::StatusOr<FineTuneProgress> progress = batch.ok() ? answer.Wait() : batch.status();
  if (!progress.ok()) {
    if (cancel_->load() && progress.status().code() == absl::StatusCode::kCancelled) {
      StoppedBy(run_->steps());
    } else {
      // "batch 3, examples[1]..." is the job's 3rd step: say which dataset examples it held.
      Failed(absl::Status(progress.status().code(),
                          absl::StrCat(progress.status().message(), " (the batch held dataset ",
                                       indices.size() == 1 ? "example " : "examples ",
                                       absl::StrJoin(indices, ", "), ")")),
             run_->steps());
    }
    return false;
  }
  RecordStep(*std::move(progress));
  return true;
}

absl::StatusOr<TrainingBatchRequest> JobRunner::Execution::ReadBatch(
    const std::vector<size_t>& order, size_t begin, size_t end, std::vector<int64_t>* indices) {
  TrainingBatchRequest batch;
  for (size_t i = begin; i < end; ++i) {
    indices->push_back(static_cast<int64_t>(order[i]));
    absl::StatusOr<std::string> bytes = dataset_->Read(indices->back());
    absl::StatusOr<TrainingExample> example = bytes.ok()
                                                  ? runner_->codec_.decode_example(*bytes)
                                                  : absl::StatusOr<TrainingExample>(bytes.status());
    if (!example.ok()) {
      return absl::DataLossError(
          absl::StrCat("dataset example ", indices->back(), ": ", example.status().message()));
    }
    batch.examples.push_back(*std::move(example));
  }
  return batch;
}

void JobRunner::Execution::RecordStep(FineTuneProgress progress) {
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&runner_->mutex_);
    job_->record.step = progress.step;
    job_->record.loss = progress.loss;
    JobEvent event;
    event.state = JobState::kRunning;
    if (MustRecord(progress, start_.total_steps)) event.progress = std::move(progress);
    runner_->AppendEventLocked(job_, std::move(event), /*persist=*/false, &after);
  }
  for (auto& call : after) call();
}

void JobRunner::Execution::RecordRunning(JobEvent event, bool persist) {
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&runner_->mutex_);
    runner_->AppendEventLocked(job_, std::move(event), persist, &after);
  }
  for (auto& call : after) call();
}

void JobRunner::Execution::Commit() {
  if (!trained_) return;
  bool cancelled;
  {
    absl::MutexLock lock(&runner_->mutex_);
    cancelled = cancel_->load();
    job_->committing = !cancelled;
  }
  if (cancelled) return StoppedBy(run_->steps());
  Answer<absl::StatusOr<FineTuneProgress>> answer;
  CommitRequest commit;
  commit.description = start_.description;
  commit.promote = start_.promote;
  run_->Commit(std::move(commit), control_, answer.Callback());
  absl::StatusOr<FineTuneProgress> committed = answer.Wait();
  if (committed.ok()) {
    end_state_ = JobState::kSucceeded;
    end_message_ = absl::StrCat("committed version ", committed->committed_version, ": ",
                                committed->promotion);
    end_progress_ = *std::move(committed);
  } else if (cancel_->load() && committed.status().code() == absl::StatusCode::kCancelled) {
    StoppedBy(run_->steps());
  } else {
    Failed(committed.status(), run_->steps());
  }
}

void JobRunner::Execution::End() {
  if (run_ != nullptr) {
    run_->End(end_state_ == JobState::kSucceeded   ? "committed"
              : end_state_ == JobState::kCancelled ? "cancelled"
                                                   : "failed",
              end_error_);
  }
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&runner_->mutex_);
    JobRecord& r = job_->record;
    job_->committing = false;
    if (end_progress_.has_value()) {
      r.committed_version = end_progress_->committed_version;
      r.promoted = end_progress_->promoted;
      r.promotion = end_progress_->promotion;
    }
    runner_->EndLocked(job_, end_state_, end_error_, end_message_, std::move(end_progress_),
                       &after);
  }
  for (auto& call : after) call();
}

void JobRunner::Execution::StoppedBy(int64_t step) {
  bool stopping;
  {
    absl::MutexLock lock(&runner_->mutex_);
    stopping = runner_->stopping_;
  }
  if (stopping) {
    end_state_ = JobState::kFailed;
    end_message_ = absl::StrCat("the server shut down during the job, at step ", step, " of ",
                                start_.total_steps, "; nothing was published: create it again");
    end_error_ = absl::UnavailableError(end_message_);
  } else {
    end_state_ = JobState::kCancelled;
    end_message_ = absl::StrCat("cancelled at step ", step, " of ", start_.total_steps,
                                " (CancelJob); nothing was published");
    end_error_ = absl::CancelledError(end_message_);
  }
}

void JobRunner::Execution::Failed(const absl::Status& status, int64_t step) {
  end_state_ = JobState::kFailed;
  end_error_ = status;
  end_message_ =
      absl::StrCat("failed at step ", step, " of ", start_.total_steps, ": ", status.message());
}

}  // namespace attn::server::core
