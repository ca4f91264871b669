// Server-side fine-tuning jobs of one served model (the Trainer's CreateJob, GetJob, ListJobs,
// WatchJob and CancelJob): an upload checked into the model store, a bounded queue, and one
// runner thread that runs the queued jobs one at a time with no client attached, through the
// same FineTuning / FineTuneJob calls as an interactive FineTune stream (Prepare, Step per batch,
// Commit), so everything that path does holds here too: the checks before work, telemetry, the
// training report, the staged commit or promotion, the metrics. Each job's events (queued,
// started, every step's progress, how it ended) are kept for watchers to replay and follow.
//
// In the model store (one per served model):
//   <store>/jobs/<id>/job.json     the record (job_record.h), replaced atomically on each change
//                     spec.bin     the spec as the client sent it (GetJob returns it)
//                     dataset.bin  the uploaded examples (job_dataset.h); removed when the job ends
//                     events.bin   the events, each the front end's encoding, delimited
//   <store>/jobs/.upload-<id>/     an upload in progress (a crash leftover at start: removed)
//
// A job that was pending or running when the server stopped (kill -9, a crash, a shutdown) is
// recorded failed with the reason when the server starts again; it never resumes, and nothing of
// it is served (a checkpoint it was writing is a temp dir that start-up removes). A job whose
// commit completed just before the stop is recorded succeeded, with its version.
//
// Bounds: --max-queued-jobs pending jobs (uploads in progress included), --max-job-dataset-bytes
// per dataset, kMaxChunkBytes per chunk, at most kMaxJobEvents events (kMaxJobEventBytes) per
// job, and the last kMaxEndedJobs ended jobs kept (older ones are deleted from the store).
//
// The code: job_runner.cc runs the jobs (the runner thread, each run's steps, cancelling),
// job_store.cc keeps them in the store (start-up, records, events, the views), job_upload.cc
// takes CreateJob's upload; job_runner_internal.h is what the three share.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/fine_tune_job.h"
#include "server/core/fine_tuning.h"
#include "server/core/job_dataset.h"
#include "server/core/job_record.h"
#include "server/core/serving_metrics.h"

namespace attn::server::core {

inline constexpr int kMaxEndedJobs = 100;
// A job of more than kMaxStepEvents steps records every k-th step (and the first, the last, and
// those with telemetry or warnings); no job records more than kMaxJobEvents events or
// kMaxJobEventBytes bytes of them, its last event aside.
inline constexpr int64_t kMaxStepEvents = 10000;
inline constexpr int64_t kMaxJobEvents = 20000;
inline constexpr int64_t kMaxJobEventBytes = 32 << 20;

// Something that happened to a job (attnserve.v1.JobEvent).
struct JobEvent {
  int64_t index = 0;
  std::string time_utc;
  JobState state = JobState::kPending;
  std::string message;
  std::optional<FineTuneProgress> progress;  // steps, and the commit
};

// The front end's encodings, so the core stores and replays its messages without knowing them:
// a dataset example's bytes decoded (INVALID_ARGUMENT saying why not), and an event encoded as
// the bytes WatchJob sends.
struct JobCodec {
  std::function<absl::StatusOr<TrainingExample>(std::string_view bytes)> decode_example;
  std::function<std::string(const JobEvent& event)> encode_event;
};

struct JobRunnerOptions {
  std::string model;  // the served model's name
  std::string store;  // its model store ("" = jobs are refused, naming --model-store)
  // The store is another server's (--watch-store): jobs are refused, naming that server.
  bool follows_store = false;
  int max_queued_jobs = 16;
  int64_t max_dataset_bytes = 256 << 20;
};

// A job as GetJob and ListJobs show it.
struct JobView {
  JobRecord record;
  int32_t queue_position = 0;  // pending: jobs ahead of it
  int64_t events = 0;
};

class JobUpload;

class JobRunner {
 public:
  // `fine_tuning` (this model's jobs slot) and `metrics` must outlive the runner.
  JobRunner(JobRunnerOptions options, FineTuning* fine_tuning, JobCodec codec,
            TrainingMetrics* metrics);
  // Stop().
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Reads the store's jobs (recording what a stop left pending or running as failed, see above)
  // and starts the runner thread. Errors: the store's jobs directory cannot be used.
  absl::Status Start();
  // For a server shutdown: the running job stops before its next step (or after its commit, if
  // that began) and is recorded failed ("the server shut down ..."), like the queued ones; new
  // jobs are refused. Returns once the runner thread has ended; idempotent.
  void Stop();

  // CreateJob, before any upload: checks the spec (the batching and the declared dataset,
  // PlanJob; the config, its base version and the store's room for the dataset and a
  // checkpoint, FineTuning::Check; the description's size), pins the base version, and takes a
  // place in the queue (RESOURCE_EXHAUSTED naming --max-queued-jobs when there is none). The
  // upload holds the place until it is finished or destroyed. `spec_bytes` is kept for GetJob.
  absl::StatusOr<std::unique_ptr<JobUpload>> BeginUpload(JobSpec spec, std::string spec_bytes);

  // Whether this server keeps jobs for the model: FAILED_PRECONDITION saying why not (no model
  // store; a store another server writes). Every call below answers it first.
  absl::Status Usable() const;

  // NOT_FOUND naming the model when it has no such job.
  absl::StatusOr<JobView> Get(const std::string& id) const;
  absl::StatusOr<std::string> Spec(const std::string& id) const;
  // Newest first.
  std::vector<JobView> List() const;
  int queued() const;
  int max_queued_jobs() const { return options_.max_queued_jobs; }

  // Stops job `id`: a pending one at once, a running one before its next step; `stopped` gets
  // the job once it has stopped (on this thread or the runner's). FAILED_PRECONDITION (through
  // `stopped`, at once) for a job that has ended or is committing.
  using Stopped = std::function<void(absl::StatusOr<JobView>)>;
  void Cancel(const std::string& id, Stopped stopped);

  // Job `id`'s encoded events from `from` on, at most `max_events` of them and, beyond the
  // first, `max_bytes`; `ended` when the job has ended and these reach its last event.
  struct Events {
    std::vector<std::string> encoded;
    int64_t next = 0;  // the index after the last one returned
    bool ended = false;
  };
  absl::StatusOr<Events> ReadEvents(const std::string& id, int64_t from, int max_events,
                                    int64_t max_bytes) const;
  // Calls `*listener` after each new event of job `id` (from any thread, with no lock of this
  // runner held) for as long as the caller keeps it alive.
  void Listen(const std::string& id, std::weak_ptr<std::function<void()>> listener);

 private:
  friend class JobUpload;
  struct Job;

  std::string JobsDir() const;
  std::string JobDir(const std::string& id) const;
  JobView ViewLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Adds `event` to the job's events (its index and time filled in) and replaces its job.json
  // when `persist`; what to call once the lock is released goes to `after`.
  void AppendEventLocked(Job* job, JobEvent event, bool persist,
                         std::vector<std::function<void()>>* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status PersistLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Records the job's end (state, error, final event), removes its dataset, and answers the
  // cancellations waiting for it.
  void EndLocked(Job* job, JobState state, const absl::Status& error, std::string message,
                 std::optional<FineTuneProgress> progress,
                 std::vector<std::function<void()>>* after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void TrimEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status LoadJob(const std::string& id, std::vector<std::string>* recovered);
  absl::StatusOr<JobView> Enqueue(JobUpload* upload);

  void Loop();
  // Runs job `id` (the runner thread's, after Loop marked it running) and records how it ended.
  void Run(const std::string& id);
  class Execution;  // one Run's steps (job_runner.cc)

  const JobRunnerOptions options_;
  FineTuning* const fine_tuning_;
  const JobCodec codec_;
  TrainingMetrics* const metrics_;

  mutable absl::Mutex mutex_;
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mutex_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mutex_);  // pending ids, next first
  int uploads_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t jobs_created_ ABSL_GUARDED_BY(mutex_) = 0;
  bool started_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool wake_ ABSL_GUARDED_BY(mutex_) = false;  // the slot may have been freed
  std::thread thread_;
};

// One CreateJob's upload (JobRunner::BeginUpload): chunks checked (DatasetReceiver, and each
// example decoded and checked against the job's objective, CheckJobExample) and written to the
// upload's directory as they arrive.
class JobUpload {
 public:
  // Unless finished: removes what arrived and gives the queue place back.
  ~JobUpload();
  JobUpload(const JobUpload&) = delete;
  JobUpload& operator=(const JobUpload&) = delete;

  const std::string& id() const { return id_; }
  absl::Status Add(int64_t index, std::string_view data);
  // Every declared byte has arrived.
  bool complete() const { return receiver_.complete(); }
  // After the last chunk: checks the whole (example count, SHA-256), makes the upload durable
  // and queues the job.
  absl::StatusOr<JobView> Finish();

 private:
  friend class JobRunner;
  JobUpload(JobRunner* runner, std::string id, JobSpec spec, JobPlan plan, JobSettings settings);

  JobRunner* const runner_;
  const std::string id_;
  const std::string dir_;
  JobSpec spec_;
  const JobPlan plan_;
  const JobSettings settings_;
  std::optional<bool> has_negatives_;  // the first example's choice (contrastive)
  DatasetReceiver receiver_;
  int fd_ = -1;            // dataset.bin, being written
  bool finished_ = false;  // queued: the job's place is in the queue now, not the upload's
};

}  // namespace attn::server::core
