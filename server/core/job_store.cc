// The job runner's store side (job_runner.h): the jobs read back at start (and what a stop left
// pending or running recorded as ended), each job's record and events in the model store, and
// the views GetJob, ListJobs and WatchJob read.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/durable_file.h"
#include "engine/json_file.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/training/training_report.h"
#include "server/core/job_runner.h"
#include "server/core/job_runner_internal.h"

namespace attn::server::core {

namespace {

namespace fs = std::filesystem;
using namespace job_files;

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

}  // namespace

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
  if (persist || JobClock::now() - job->persisted > kPersistInterval) {
    if (absl::Status persisted = PersistLocked(*job); !persisted.ok()) {
      Log(LogLevel::kWarning, "job %s: record not updated: %s", job->record.id,
          persisted.message());
    }
    job->persisted = JobClock::now();
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

}  // namespace attn::server::core
