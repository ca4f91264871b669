// The job runner's upload side (job_runner.h): CreateJob's checks before any work, the dataset
// checked and written as its chunks arrive, and the finished upload made a queued job in one
// rename.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/durable_file.h"
#include "engine/json_file.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "server/core/job_runner.h"
#include "server/core/job_runner_internal.h"

namespace attn::server::core {

namespace {

namespace fs = std::filesystem;
using namespace job_files;

uint64_t RandomBits() {
  static std::mt19937_64* generator = new std::mt19937_64(std::random_device{}());
  static absl::Mutex* mutex = new absl::Mutex();
  absl::MutexLock lock(mutex);
  return (*generator)();
}

}  // namespace

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
    job->persisted = JobClock::now();
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

}  // namespace attn::server::core
