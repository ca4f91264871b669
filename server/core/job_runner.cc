#include "server/core/job_runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "engine/durable_file.h"
#include "engine/json_file.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/epoch_order.h"
#include "engine/training/training_report.h"

namespace attn::server::core {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kUploadPrefix[] = ".upload-";
constexpr char kRecordFile[] = "job.json";
constexpr char kRecordTempFile[] = ".job.json.tmp";
constexpr char kSpecFile[] = "spec.bin";
constexpr char kDatasetFile[] = "dataset.bin";
constexpr char kEventsFile[] = "events.bin";
// job.json is a few KB; spec.bin at most a request.
constexpr size_t kMaxRecordBytes = 1 << 20;
constexpr size_t kMaxSpecBytes = size_t{256} << 20;
// A running job's record is rewritten (fsynced) at most this often between its state changes: a
// restart after a crash names the step it reached to within this.
constexpr auto kPersistInterval = std::chrono::seconds(1);

absl::Status AppendToFile(const std::string& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError(path, "open", errno);
  int err = WriteAll(fd, data.data(), data.size());
  if (::close(fd) != 0 && err == 0) err = errno;
  return err == 0 ? absl::OkStatus() : ErrnoError(path, "write", err);
}

uint64_t RandomBits() {
  static std::mt19937_64* generator = new std::mt19937_64(std::random_device{}());
  static absl::Mutex* mutex = new absl::Mutex();
  absl::MutexLock lock(mutex);
  return (*generator)();
}

std::string Plural(int64_t n, const char* word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

// Which step events a job records: all of a job of up to kMaxStepEvents steps, else every
// stride-th, and always the first, the last and those that carry more than numbers.
bool MustRecord(const FineTuneProgress& progress, int64_t total_steps) {
  const int64_t stride = std::max<int64_t>(1, (total_steps + kMaxStepEvents - 1) / kMaxStepEvents);
  return progress.step <= 1 || progress.step >= total_steps || progress.step % stride == 0 ||
         progress.telemetry.has_value() || !progress.warnings.empty() ||
         !progress.evaluations.empty();
}

// The version a job committed, from the training reports in the store (a job stopped between
// its commit and its record's update); "" when none names it.
std::string CommittedVersionOf(const std::string& store, const std::string& job_id) {
  absl::StatusOr<std::vector<StoredVersion>> versions = ListStore(store, nullptr);
  if (!versions.ok()) return "";
  for (auto version = versions->rbegin(); version != versions->rend(); ++version) {
    absl::StatusOr<TrainingReport> report = ReadTrainingReport(store, version->version);
    if (!report.ok()) continue;
    for (const auto& [name, value] : report->settings) {
      if (name == "job_id" && value == job_id) return version->version;
    }
  }
  return "";
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

struct JobRunner::Job {
  JobRecord record;
  FineTuneConfig config;  // pending: what to run (jobs never resume after a restart)
  std::vector<uint32_t> event_offsets = {0};  // each event's start in events.bin, then its end
  bool history_full = false;
  bool committing = false;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::vector<Stopped> on_stopped;
  std::vector<std::weak_ptr<std::function<void()>>> listeners;
  Clock::time_point persisted;
  int64_t order = 0;  // creation order, for jobs created within the same second

  int64_t events() const { return static_cast<int64_t>(event_offsets.size()) - 1; }
};

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

std::string JobRunner::JobsDir() const { return JoinPath(options_.store, kJobsDir); }
std::string JobRunner::JobDir(const std::string& id) const { return JoinPath(JobsDir(), id); }

absl::Status JobRunner::Usable() const {
  if (options_.store.empty()) {
    return absl::FailedPreconditionError(
        "this server keeps no model store, so it keeps no jobs and could not commit their "
        "versions; start it with --model-store DIR to run server-side jobs");
  }
  if (options_.follows_store) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server follows the model store ", options_.store,
        " (--watch-store) that another server writes; create, list and watch jobs on that one"));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::Start() {
  if (!Usable().ok()) return absl::OkStatus();  // every call says why
  // The jobs directory appears with the first job: a server that runs none leaves the store as
  // it was.
  const std::string dir = JobsDir();
  std::error_code error;
  std::vector<std::string> names;
  if (fs::exists(fs::symlink_status(dir, error))) {
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      names.push_back(it->path().filename().string());
    }
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot list ", dir, ": ", error.message()));
    }
  }
  std::sort(names.begin(), names.end());  // ids begin with their creation time
  std::vector<std::string> recovered;
  for (const std::string& name : names) {
    if (absl::StartsWith(name, kUploadPrefix)) {
      // An upload that a stop cut short: never a job.
      fs::remove_all(JoinPath(dir, name), error);
      Log(LogLevel::kWarning, "model %s: removed the unfinished job upload %s", options_.model,
          name);
      continue;
    }
    if (!ValidateJobId(name).ok()) continue;
    if (absl::Status loaded = LoadJob(name, &recovered); !loaded.ok()) {
      Log(LogLevel::kWarning, "model %s: job %s skipped: %s", options_.model, name,
          loaded.message());
    }
  }
  {
    absl::MutexLock lock(&mutex_);
    TrimEndedLocked();
    started_ = true;
    Log(LogLevel::kInfo,
        "model %s: %d job(s) in %s%s; at most %d queued (--max-queued-jobs), datasets up to %d "
        "bytes (--max-job-dataset-bytes)",
        options_.model, static_cast<int>(jobs_.size()), dir,
        recovered.empty() ? "" : absl::StrCat(", ", absl::StrJoin(recovered, "; ")),
        options_.max_queued_jobs, options_.max_dataset_bytes);
  }
  fine_tuning_->SetSlotFreedListener([this] {
    absl::MutexLock lock(&mutex_);
    wake_ = true;
  });
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::Status JobRunner::LoadJob(const std::string& id, std::vector<std::string>* recovered) {
  const std::string dir = JobDir(id);
  absl::StatusOr<std::string> text = ReadFileNoFollow(JoinPath(dir, kRecordFile), kMaxRecordBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<JobRecord> record = ParseJobRecord(*text, JoinPath(dir, kRecordFile));
  if (!record.ok()) return record.status();
  if (record->id != id) {
    return absl::FailedPreconditionError(
        absl::StrCat(JoinPath(dir, kRecordFile), " names job ", record->id));
  }
  auto job = std::make_unique<Job>();
  job->record = *std::move(record);
  // Events: those complete on disk (a stop may have cut the last one short: cut it off).
  const std::string events_path = JoinPath(dir, kEventsFile);
  absl::StatusOr<std::string> events = ReadFileNoFollow(events_path, kMaxJobEventBytes * 2);
  if (!events.ok() || !DelimitedOffsets(*events, kMaxJobEventBytes, &job->event_offsets)) {
    job->event_offsets = {0};
  }
  if (job->event_offsets.back() != (events.ok() ? events->size() : 0) &&
      ::truncate(events_path.c_str(), job->event_offsets.back()) != 0 && errno != ENOENT) {
    Log(LogLevel::kWarning, "%s: cannot cut off what follows its last complete event", events_path);
  }
  job->history_full = job->events() >= kMaxJobEvents - 1;

  absl::MutexLock lock(&mutex_);
  Job* loaded = job.get();
  loaded->order = ++jobs_created_;
  jobs_[id] = std::move(job);
  JobRecord& r = loaded->record;
  if (IsFinal(r.state)) return absl::OkStatus();
  // Pending or running when the server stopped.
  std::vector<std::function<void()>> ignored;
  const std::string version =
      r.state == JobState::kRunning ? CommittedVersionOf(options_.store, id) : "";
  if (!version.empty()) {
    r.committed_version = version;
    r.promotion =
        "committed just before the server stopped; the job's record was completed at the next "
        "start";
    EndLocked(loaded, JobState::kSucceeded, absl::OkStatus(),
              absl::StrCat("committed version ", version, " (recovered at start)"), std::nullopt,
              &ignored);
    recovered->push_back(absl::StrCat(id, " had committed ", version));
    return absl::OkStatus();
  }
  const std::string message =
      r.state == JobState::kRunning
          ? absl::StrCat("the server stopped while the job was running, at step ", r.step, " of ",
                         r.total_steps,
                         " (or up to a second later): it was killed, crashed or restarted. "
                         "Nothing of the job was published; create it again")
          : "the server stopped before the job started (it was killed, crashed or restarted); "
            "nothing was published; create it again";
  EndLocked(loaded, JobState::kFailed, absl::UnavailableError(message), message, std::nullopt,
            &ignored);
  recovered->push_back(absl::StrCat(id, " recorded failed (the server stopped during it)"));
  return absl::OkStatus();
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

absl::StatusOr<std::unique_ptr<JobUpload>> JobRunner::BeginUpload(JobSpec spec,
                                                                  std::string spec_bytes) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  absl::StatusOr<JobPlan> plan =
      PlanJob(spec, fine_tuning_->max_examples_per_batch(), options_.max_dataset_bytes);
  if (!plan.ok()) return plan.status();
  if (spec.config.total_steps == 0) spec.config.total_steps = plan->total_steps;
  if (spec.description.size() > kMaxDescriptionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("description is ", spec.description.size(),
                                                   " bytes; at most ", kMaxDescriptionBytes,
                                                   " are stored with a version"));
  }
  absl::StatusOr<FineTuning::CheckedConfig> checked = fine_tuning_->Check(spec.config);
  if (!checked.ok()) return checked.status();
  // The job trains the version served now even if another is promoted before it starts.
  spec.config.base_version = checked->base.version;
  if (absl::Status room = CheckStoreCanTakeCheckpoint(
          options_.store, checked->base.model->weights().ParameterCount() * int64_t{4},
          spec.dataset.bytes);
      !room.ok()) {
    return room;
  }
  std::string id;
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_ || !started_) {
      return absl::UnavailableError(
          "the server is shutting down; create the job after it restarts");
    }
    const int waiting = static_cast<int>(queue_.size()) + uploads_;
    if (waiting >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the job queue of model ", options_.model, " is full: ", waiting,
          " jobs are waiting or uploading, the limit is ", options_.max_queued_jobs,
          " (--max-queued-jobs); wait for one to start, or cancel one ('attnctl jobs', "
          "'attnctl job cancel ID')"));
    }
    do {
      id = NewJobId(std::time(nullptr), RandomBits());
    } while (jobs_.count(id) > 0 || fs::exists(JobDir(id)));
    ++uploads_;
  }
  auto upload = std::unique_ptr<JobUpload>(
      new JobUpload(this, id, std::move(spec), *plan, std::move(checked->settings)));
  std::error_code error;
  const bool first_job = !fs::exists(JobsDir(), error);
  fs::create_directories(upload->dir_, error);
  absl::Status ready =
      error       ? absl::Status(absl::ErrnoToStatusCode(error.value()),
                                 absl::StrCat("cannot create ", upload->dir_, ": ", error.message()))
      : first_job ? FsyncDir(options_.store)  // the jobs directory itself, made just now
                  : absl::OkStatus();
  if (ready.ok()) ready = WriteFileDurably(JoinPath(upload->dir_, kSpecFile), spec_bytes);
  if (ready.ok()) {
    const std::string path = JoinPath(upload->dir_, kDatasetFile);
    upload->fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (upload->fd_ < 0) ready = ErrnoError(path, "open", errno);
  }
  if (!ready.ok()) return ready;  // the upload's destructor cleans up
  return upload;
}

JobUpload::JobUpload(JobRunner* runner, std::string id, JobSpec spec, JobPlan plan,
                     JobSettings settings)
    : runner_(runner),
      id_(std::move(id)),
      dir_(JoinPath(runner->JobsDir(), absl::StrCat(kUploadPrefix, id_))),
      spec_(std::move(spec)),
      plan_(plan),
      settings_(std::move(settings)),
      receiver_(spec_.dataset, [this](std::string_view bytes, int64_t index) -> absl::Status {
        absl::StatusOr<TrainingExample> example = runner_->codec_.decode_example(bytes);
        if (!example.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("dataset example ", index, ": ", example.status().message()));
        }
        if (!has_negatives_.has_value()) has_negatives_ = !example->negative.empty();
        return CheckJobExample(*example, settings_, index, *has_negatives_);
      }) {}

JobUpload::~JobUpload() {
  if (fd_ >= 0) ::close(fd_);
  if (finished_) return;
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
  absl::MutexLock lock(&runner_->mutex_);
  --runner_->uploads_;
}

absl::Status JobUpload::Add(int64_t index, std::string_view data) {
  if (finished_) return absl::FailedPreconditionError("the upload is finished");
  if (absl::Status valid = receiver_.Add(index, data); !valid.ok()) return valid;
  if (const int err = WriteAll(fd_, data.data(), data.size()); err != 0) {
    return ErrnoError(JoinPath(dir_, kDatasetFile), "write", err);
  }
  return absl::OkStatus();
}

absl::StatusOr<JobView> JobUpload::Finish() {
  if (absl::Status valid = receiver_.Finish(); !valid.ok()) return valid;
  if (::fsync(fd_) != 0) return ErrnoError(JoinPath(dir_, kDatasetFile), "fsync", errno);
  ::close(fd_);
  fd_ = -1;
  return runner_->Enqueue(this);
}

absl::StatusOr<JobView> JobRunner::Enqueue(JobUpload* upload) {
  auto job = std::make_unique<Job>();
  JobRecord& r = job->record;
  r.id = upload->id_;
  r.model = options_.model;
  r.state = JobState::kPending;
  r.created_utc = UtcTimestamp();
  r.base_version = upload->spec_.config.base_version;
  r.objective = ObjectiveName(upload->settings_.trainer.objective);
  r.epochs = upload->plan_.epochs;
  r.batch_size = upload->plan_.batch_size;
  r.total_steps = upload->plan_.total_steps;
  r.dataset = upload->spec_.dataset;
  r.description = upload->spec_.description;
  r.promote = upload->spec_.promote;
  job->config = upload->spec_.config;

  absl::StatusOr<JobView> view;
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) {
      return absl::UnavailableError(
          "the server is shutting down; create the job after it restarts");
    }
    // The record and the first event go into the upload's directory, which then becomes the
    // job's in one rename: a job exists completely or not at all.
    const std::string final_dir = JobDir(r.id);
    const bool slot_taken = !fine_tuning_->RunningJob().empty();
    const std::string ahead =
        queue_.empty() ? (slot_taken ? "next to run, after the running job" : "next to run")
                       : absl::StrCat(Plural(static_cast<int64_t>(queue_.size()), "job"), " ahead",
                                      slot_taken ? " and one running" : "");
    JobEvent event;
    event.state = JobState::kPending;
    event.message = absl::StrCat(
        "queued (", ahead, "): ", Plural(r.total_steps, "step"), " (", Plural(r.epochs, "epoch"),
        " x ", upload->plan_.steps_per_epoch, "), batches of ", r.batch_size, ", ",
        Plural(r.dataset.examples, "example"), " (", r.dataset.bytes, " bytes, sha256 ",
        r.dataset.sha256.substr(0, 12), "...), from version ", r.base_version);
    event.time_utc = r.created_utc;
    std::string encoded;
    AppendDelimited(codec_.encode_event(event), &encoded);
    absl::Status made = WriteFileDurably(JoinPath(upload->dir_, kEventsFile), encoded);
    if (made.ok()) {
      made = WriteFileDurably(JoinPath(upload->dir_, kRecordFile), JobRecordJson(r));
    }
    if (made.ok() && ::rename(upload->dir_.c_str(), final_dir.c_str()) != 0) {
      made = ErrnoError(final_dir, "rename", errno);
    }
    if (made.ok()) made = FsyncDir(JobsDir());
    if (!made.ok()) {
      return absl::Status(made.code(), absl::StrCat("the job could not be stored: ", made.message(),
                                                    "; nothing was queued"));
    }
    upload->finished_ = true;
    --uploads_;
    job->event_offsets.push_back(static_cast<uint32_t>(encoded.size()));
    job->persisted = Clock::now();
    Job* queued = job.get();
    queued->order = ++jobs_created_;
    jobs_[r.id] = std::move(job);
    queue_.push_back(queued->record.id);
    wake_ = true;
    metrics_->SetQueuedJobs(static_cast<int64_t>(queue_.size()));
    Log(LogLevel::kInfo, "model %s: job %s %s", options_.model, queued->record.id, event.message);
    view = ViewLocked(*queued);
  }
  return view;
}

JobView JobRunner::ViewLocked(const Job& job) const {
  JobView view;
  view.record = job.record;
  view.events = job.events();
  if (job.record.state == JobState::kPending) {
    const auto at = std::find(queue_.begin(), queue_.end(), job.record.id);
    view.queue_position = static_cast<int32_t>(at - queue_.begin());
  }
  return view;
}

absl::StatusOr<JobView> JobRunner::Get(const std::string& id) const {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("model ", options_.model, " has no job ", id,
                                            " (see ListJobs or 'attnctl jobs'; the server keeps "
                                            "the last ",
                                            kMaxEndedJobs, " ended jobs)"));
  }
  return ViewLocked(*it->second);
}

absl::StatusOr<std::string> JobRunner::Spec(const std::string& id) const {
  absl::StatusOr<JobView> job = Get(id);
  if (!job.ok()) return job.status();
  return ReadFileNoFollow(JoinPath(JobDir(id), kSpecFile), kMaxSpecBytes);
}

std::vector<JobView> JobRunner::List() const {
  std::vector<JobView> views;
  if (!Usable().ok()) return views;
  absl::MutexLock lock(&mutex_);
  std::vector<const Job*> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  // Newest first; within one second (the records' resolution), in the order they were created.
  std::sort(jobs.begin(), jobs.end(), [](const Job* a, const Job* b) {
    return a->record.created_utc != b->record.created_utc
               ? a->record.created_utc > b->record.created_utc
               : a->order > b->order;
  });
  for (const Job* job : jobs) views.push_back(ViewLocked(*job));
  return views;
}

int JobRunner::queued() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(queue_.size());
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

absl::StatusOr<JobRunner::Events> JobRunner::ReadEvents(const std::string& id, int64_t from,
                                                        int max_events, int64_t max_bytes) const {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("model ", options_.model, " has no job ", id,
                                            " (an ended job is deleted once ", kMaxEndedJobs,
                                            " newer ones have ended)"));
  }
  const Job& job = *it->second;
  const int64_t count = job.events();
  if (from < 0 || from > count) {
    return absl::OutOfRangeError(absl::StrCat("from_index is ", from, "; job ", id, " has ",
                                              Plural(count, "event"), " so far: give 0 to ",
                                              count));
  }
  Events events;
  int64_t end = from;
  while (end < count && end - from < max_events &&
         (end == from || job.event_offsets[end + 1] - job.event_offsets[from] <=
                             static_cast<uint64_t>(max_bytes))) {
    ++end;
  }
  if (end > from) {
    const uint32_t begin_offset = job.event_offsets[from];
    const uint32_t end_offset = job.event_offsets[end];
    absl::StatusOr<std::string> read =
        ReadFileRange(JoinPath(JobDir(id), kEventsFile), begin_offset, end_offset - begin_offset);
    if (!read.ok()) return read.status();
    const std::string& bytes = *read;
    for (int64_t i = from; i < end; ++i) {
      std::string_view record(bytes.data() + (job.event_offsets[i] - begin_offset),
                              job.event_offsets[i + 1] - job.event_offsets[i]);
      uint64_t size = 0;
      bool malformed = false;
      const size_t header = ReadVarint(record, &size, &malformed);
      events.encoded.emplace_back(record.substr(header));
    }
  }
  events.next = end;
  events.ended = IsFinal(job.record.state) && end == count;
  return events;
}

void JobRunner::Listen(const std::string& id, std::weak_ptr<std::function<void()>> listener) {
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(id);
  if (it != jobs_.end()) it->second->listeners.push_back(std::move(listener));
}

absl::Status JobRunner::PersistLocked(const Job& job) const {
  const std::string dir = JobDir(job.record.id);
  return ReplaceFileDurably(JoinPath(dir, kRecordFile), JoinPath(dir, kRecordTempFile),
                            JobRecordJson(job.record));
}

void JobRunner::AppendEventLocked(Job* job, JobEvent event, bool persist,
                                  std::vector<std::function<void()>>* after) {
  const bool last = IsFinal(event.state);
  const uint32_t bytes_so_far = job->event_offsets.back();
  if (!last && (job->history_full || job->events() >= kMaxJobEvents - 2 ||
                bytes_so_far >= static_cast<uint64_t>(kMaxJobEventBytes))) {
    if (job->history_full) {
      event = {};
    } else {
      // Once: say so, then record nothing but the job's end.
      job->history_full = true;
      event.progress.reset();
      event.message = absl::StrCat("the job's event history is full (", kMaxJobEvents,
                                   " events or ", kMaxJobEventBytes >> 20,
                                   " MiB): later steps are not recorded, its end will be");
    }
  }
  if (!event.message.empty() || event.progress.has_value()) {
    event.index = job->events();
    if (event.time_utc.empty()) event.time_utc = UtcTimestamp();
    std::string encoded;
    AppendDelimited(codec_.encode_event(event), &encoded);
    const std::string path = JoinPath(JobDir(job->record.id), kEventsFile);
    if (absl::Status appended = AppendToFile(path, encoded); appended.ok()) {
      job->event_offsets.push_back(bytes_so_far + static_cast<uint32_t>(encoded.size()));
    } else {
      Log(LogLevel::kWarning, "job %s: event %d not recorded: %s", job->record.id, event.index,
          appended.message());
    }
  }
  if (persist || Clock::now() - job->persisted > kPersistInterval) {
    if (absl::Status persisted = PersistLocked(*job); !persisted.ok()) {
      Log(LogLevel::kWarning, "job %s: record not updated: %s", job->record.id,
          persisted.message());
    }
    job->persisted = Clock::now();
  }
  // Listeners are told without the lock; the ones gone are forgotten.
  auto& listeners = job->listeners;
  for (auto it = listeners.begin(); it != listeners.end();) {
    if (std::shared_ptr<std::function<void()>> listener = it->lock()) {
      after->push_back([listener] { (*listener)(); });
      ++it;
    } else {
      it = listeners.erase(it);
    }
  }
}

void JobRunner::EndLocked(Job* job, JobState state, const absl::Status& error, std::string message,
                          std::optional<FineTuneProgress> progress,
                          std::vector<std::function<void()>>* after) {
  JobRecord& r = job->record;
  r.state = state;
  r.ended_utc = UtcTimestamp();
  if (!error.ok()) {
    r.error = std::string(error.message());
    r.error_code = absl::StatusCodeToString(error.code());
  }
  JobEvent event;
  event.state = state;
  event.message = std::move(message);
  event.progress = std::move(progress);
  AppendEventLocked(job, std::move(event), /*persist=*/true, after);
  std::error_code ignored;
  fs::remove(JoinPath(JobDir(r.id), kDatasetFile), ignored);
  Log(LogLevel::kInfo, "model %s: job %s %s after %d of %d steps%s", options_.model, r.id,
      JobStateName(state), r.step, r.total_steps, error.ok() ? "" : ": " + r.error);
  JobView view = ViewLocked(*job);
  for (Stopped& stopped : job->on_stopped) {
    after->push_back([stopped = std::move(stopped), view] { stopped(view); });
  }
  job->on_stopped.clear();
  TrimEndedLocked();
}

void JobRunner::TrimEndedLocked() {
  std::vector<Job*> ended;
  for (auto& [id, job] : jobs_) {
    if (IsFinal(job->record.state)) ended.push_back(job.get());
  }
  if (static_cast<int>(ended.size()) <= kMaxEndedJobs) return;
  std::sort(ended.begin(), ended.end(), [](const Job* a, const Job* b) {
    return a->record.ended_utc != b->record.ended_utc ? a->record.ended_utc < b->record.ended_utc
                                                      : a->record.id < b->record.id;
  });
  for (size_t i = 0; i + kMaxEndedJobs < ended.size(); ++i) {
    const std::string id = ended[i]->record.id;
    std::error_code ignored;
    fs::remove_all(JobDir(id), ignored);
    jobs_.erase(id);
  }
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

void JobRunner::Run(const std::string& id) {
  Job* job;
  FineTuneConfig config;
  std::shared_ptr<std::atomic<bool>> cancel;
  JobRecord start;
  {
    absl::MutexLock lock(&mutex_);
    job = jobs_.at(id).get();  // a job that has not ended is never trimmed
    config = job->config;
    cancel = job->cancel;
    start = job->record;
  }
  CallControl control;
  control.is_cancelled = [cancel] { return cancel->load(); };

  // How the job ends: one of these is set before `finish` runs.
  JobState end_state = JobState::kFailed;
  absl::Status end_error;
  std::string end_message;
  std::optional<FineTuneProgress> end_progress;
  std::unique_ptr<FineTuneJob> run;
  auto stopped_by = [&](int64_t step) {
    bool stopping;
    {
      absl::MutexLock lock(&mutex_);
      stopping = stopping_;
    }
    if (stopping) {
      end_state = JobState::kFailed;
      end_message = absl::StrCat("the server shut down during the job, at step ", step, " of ",
                                 start.total_steps, "; nothing was published: create it again");
      end_error = absl::UnavailableError(end_message);
    } else {
      end_state = JobState::kCancelled;
      end_message = absl::StrCat("cancelled at step ", step, " of ", start.total_steps,
                                 " (CancelJob); nothing was published");
      end_error = absl::CancelledError(end_message);
    }
  };
  auto failed = [&](const absl::Status& status, int64_t step) {
    end_state = JobState::kFailed;
    end_error = status;
    end_message =
        absl::StrCat("failed at step ", step, " of ", start.total_steps, ": ", status.message());
  };

  absl::StatusOr<std::unique_ptr<FineTuneJob>> begun = fine_tuning_->Begin(config, id);
  if (begun.ok()) {
    run = *std::move(begun);
    std::vector<std::function<void()>> after;
    {
      absl::MutexLock lock(&mutex_);
      JobEvent event;
      event.state = JobState::kRunning;
      event.message = absl::StrCat("started from version ", start.base_version);
      AppendEventLocked(job, std::move(event), /*persist=*/true, &after);
    }
    for (auto& call : after) call();
  } else {
    // An interactive FineTune stream took the slot since the runner looked: wait for it.
    const std::string holder = fine_tuning_->RunningJob();
    if (begun.status().code() == absl::StatusCode::kFailedPrecondition && !holder.empty() &&
        holder != id) {
      absl::MutexLock lock(&mutex_);
      if (!cancel->load() && !stopping_) {
        job->record.state = JobState::kPending;
        job->record.started_utc.clear();
        queue_.push_front(id);
        metrics_->SetQueuedJobs(static_cast<int64_t>(queue_.size()));
        return;
      }
    }
    failed(begun.status(), 0);
  }
  absl::StatusOr<DatasetFile> dataset =
      run != nullptr ? DatasetFile::Open(JoinPath(JobDir(id), kDatasetFile), start.dataset)
                     : absl::StatusOr<DatasetFile>(absl::CancelledError());
  if (run != nullptr && !dataset.ok()) {
    failed(dataset.status(), 0);
    run.reset();
  }
  if (run != nullptr) {
    Answer<absl::Status> prepared;
    run->Prepare(control, prepared.Callback());
    if (absl::Status status = prepared.Wait(); !status.ok()) {
      if (cancel->load()) {
        stopped_by(0);
      } else {
        failed(status, 0);
      }
      run.reset();
    }
  }
  bool trained = run != nullptr;
  const int64_t examples = start.dataset.examples;
  for (int epoch = 0; trained && epoch < start.epochs; ++epoch) {
    const std::vector<size_t> order = EpochOrder(static_cast<size_t>(examples), config.seed, epoch);
    // A contrastive batch needs 2 pairs, as attnctl's interactive path sends them.
    const size_t min_batch = config.objective == Objective::kContrastive ? 2 : 1;
    for (const auto& [begin, end] :
         EpochBatches(static_cast<size_t>(examples), start.batch_size, min_batch)) {
      if (!trained) break;
      if (cancel->load()) {
        stopped_by(run->steps());
        trained = false;
        break;
      }
      TrainingBatchRequest batch;
      std::vector<int64_t> indices;
      absl::Status read;
      for (size_t i = begin; i < end && read.ok(); ++i) {
        indices.push_back(static_cast<int64_t>(order[i]));
        absl::StatusOr<std::string> bytes = dataset->Read(indices.back());
        absl::StatusOr<TrainingExample> example =
            bytes.ok() ? codec_.decode_example(*bytes)
                       : absl::StatusOr<TrainingExample>(bytes.status());
        if (example.ok()) {
          batch.examples.push_back(*std::move(example));
        } else {
          read = absl::DataLossError(
              absl::StrCat("dataset example ", indices.back(), ": ", example.status().message()));
        }
      }
      Answer<absl::StatusOr<FineTuneProgress>> answer;
      if (read.ok()) run->Step(std::move(batch), control, answer.Callback());
      absl::StatusOr<FineTuneProgress> progress = read.ok() ? answer.Wait() : read;
      if (!progress.ok()) {
        if (cancel->load() && progress.status().code() == absl::StatusCode::kCancelled) {
          stopped_by(run->steps());
        } else {
          // "batch 3, examples[1]..." is the job's 3rd step: say which dataset examples it held.
          failed(absl::Status(progress.status().code(),
                              absl::StrCat(progress.status().message(), " (the batch held dataset ",
                                           indices.size() == 1 ? "example " : "examples ",
                                           absl::StrJoin(indices, ", "), ")")),
                 run->steps());
        }
        trained = false;
        break;
      }
      std::vector<std::function<void()>> after;
      {
        absl::MutexLock lock(&mutex_);
        job->record.step = progress->step;
        job->record.loss = progress->loss;
        JobEvent event;
        event.state = JobState::kRunning;
        if (MustRecord(*progress, start.total_steps)) event.progress = *std::move(progress);
        AppendEventLocked(job, std::move(event), /*persist=*/false, &after);
      }
      for (auto& call : after) call();
    }
  }
  if (trained) {
    bool cancelled;
    {
      absl::MutexLock lock(&mutex_);
      cancelled = cancel->load();
      job->committing = !cancelled;
    }
    if (cancelled) {
      stopped_by(run->steps());
    } else {
      Answer<absl::StatusOr<FineTuneProgress>> answer;
      CommitRequest commit;
      commit.description = start.description;
      commit.promote = start.promote;
      run->Commit(std::move(commit), control, answer.Callback());
      absl::StatusOr<FineTuneProgress> committed = answer.Wait();
      if (committed.ok()) {
        end_state = JobState::kSucceeded;
        end_message = absl::StrCat("committed version ", committed->committed_version, ": ",
                                   committed->promotion);
        end_progress = *std::move(committed);
      } else if (cancel->load() && committed.status().code() == absl::StatusCode::kCancelled) {
        stopped_by(run->steps());
      } else {
        failed(committed.status(), run->steps());
      }
    }
  }
  if (run != nullptr) {
    run->End(end_state == JobState::kSucceeded   ? "committed"
             : end_state == JobState::kCancelled ? "cancelled"
                                                 : "failed",
             end_error);
  }
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&mutex_);
    JobRecord& r = job->record;
    job->committing = false;
    if (end_progress.has_value()) {
      r.committed_version = end_progress->committed_version;
      r.promoted = end_progress->promoted;
      r.promotion = end_progress->promotion;
    }
    EndLocked(job, end_state, end_error, end_message, std::move(end_progress), &after);
  }
  for (auto& call : after) call();
}

}  // namespace attn::server::core
