// Fine-tuning jobs, free of any transport: one job at a time, its engine work (trainer set-up,
// tokenization of batches, Step, checkpoint writing) on the one training thread
// (training_thread.h), its commit published to the model store and the registry. A front end
// (the gRPC FineTune stream, server/fine_tune_reactor.cc) translates its messages to the structs
// of fine_tune_job.h and drives a FineTuneJob: Prepare, then Step per batch, then Commit or
// Abort, one call at a time, each answered through its callback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/training/training_report.h"
#include "server/core/calls.h"
#include "server/core/fine_tune_job.h"
#include "server/core/model_registry.h"
#include "server/core/serving_metrics.h"
#include "server/core/training_thread.h"

namespace attn::server::core {

// The fine-tuning share of the server options (server/options.h has the defaults).
struct FineTuningOptions {
  int max_examples_per_batch = 0;  // --max-inputs-per-request
  std::string model_store;         // "" = commits fail with FAILED_PRECONDITION
  int trainer_threads = 1;         // OpenMP threads of the training thread (0 = the default)
  int trainer_nice = 10;           // niceness added to the training thread
};

class FineTuneJob;

// What a commit to `store` needs, checked before a job starts rather than after its training:
// a store at all, a directory this process may write, and free space for a checkpoint of
// `checkpoint_bytes` (with a margin). FAILED_PRECONDITION saying which and how to fix it.
// `dataset_bytes` > 0: room for a job's uploaded dataset besides (job_runner.h).
absl::Status CheckStoreCanTakeCheckpoint(const std::string& store, int64_t checkpoint_bytes,
                                         int64_t dataset_bytes = 0);

class FineTuning {
 public:
  // Starts the training thread; destroying this stops it after the tasks still queued, so
  // destroy it after the front ends have shut down.
  FineTuning(FineTuningOptions options, ModelRegistry* registry, TrainingMetrics* metrics);

  // The sequence number the next commit gets (1 + the highest one in the model store).
  void SetNextSequence(int64_t sequence);

  // A new job on `config`'s base version (empty = the served one): the config checked against
  // that model (INVALID_ARGUMENT naming the field), the version looked up (NOT_FOUND), the model
  // store checked for a commit of it (CheckStoreCanTakeCheckpoint), and the single job slot
  // claimed (FAILED_PRECONDITION naming the running job). The job holds the slot until it ends
  // or is destroyed.
  // `job_id` names the job (a server-side job's id, job_runner.h); empty = a new one.
  absl::StatusOr<std::unique_ptr<FineTuneJob>> Begin(const FineTuneConfig& config,
                                                     const std::string& job_id = "");

  // What Begin checks before it claims the slot (config, base version, store), without claiming
  // it: the base version and the settings the job would run with.
  struct CheckedConfig {
    ModelVersion base;
    JobSettings settings;
  };
  absl::StatusOr<CheckedConfig> Check(const FineTuneConfig& config) const;

  // The job holding the slot ("" = none), and a function called (outside any lock) each time
  // a job frees it: how queued server-side jobs learn that their turn may have come.
  std::string RunningJob() const;
  void SetSlotFreedListener(std::function<void()> listener);
  // The most examples one step may take (--max-inputs-per-request).
  int max_examples_per_batch() const { return options_.max_examples_per_batch; }

  // The version served by default now.
  std::string ServedVersion() const;
  // Records in the store that the default version changed from `from` to `to` by `action`
  // (store_versions.h RecordServing); if that fails, serves `from` again (what a restart would
  // serve) and returns the error.
  absl::Status RecordOrRevert(const std::string& action, const std::string& from,
                              const std::string& to, const std::string& committed = "");

 private:
  friend class FineTuneJob;

  void EndJob(const std::string& job_id);
  int64_t TakeSequence();

  const FineTuningOptions options_;
  ModelRegistry* const registry_;
  TrainingMetrics* const metrics_;

  mutable absl::Mutex mutex_;
  std::string running_job_ ABSL_GUARDED_BY(mutex_);
  int64_t jobs_started_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t next_sequence_ ABSL_GUARDED_BY(mutex_) = 1;
  std::function<void()> slot_freed_ ABSL_GUARDED_BY(mutex_);
  // Last: destroyed first, running the tasks still queued while the members they use live.
  TrainingThread training_thread_;
};

// One job. Its calls must not overlap: each one answers (through `done`, on the training
// thread, or on the calling thread when it fails before any engine work) before the next one is
// made. A call whose `control` says nobody waits any more answers CANCELLED without its work.
class FineTuneJob {
 public:
  using Done = std::function<void(absl::Status)>;
  using ProgressDone = std::function<void(absl::StatusOr<FineTuneProgress>)>;

  // Ends the job as "" (no outcome recorded) if End was not called.
  ~FineTuneJob();
  FineTuneJob(const FineTuneJob&) = delete;
  FineTuneJob& operator=(const FineTuneJob&) = delete;

  const std::string& id() const { return id_; }
  int64_t steps() const { return steps_; }

  // Copies the base version's weights into a trainer.
  void Prepare(const CallControl& control, Done done);
  // Checks the batch's size (against --max-inputs-per-request), converts and tokenizes it,
  // runs one training step and answers with the progress, warnings included. A diverged step
  // ends the job ABORTED with nothing published.
  void Step(TrainingBatchRequest batch, const CallControl& control, ProgressDone done);
  // FAILED_PRECONDITION when no step has run or the server keeps no model store; else writes the
  // checkpoint (atomically) and publishes the version: staged (listed, pinnable, not the
  // default) unless `request.promote`. The progress names it and says which.
  void Commit(CommitRequest request, const CallControl& control, ProgressDone done);
  // Drops the trainer; the job's final progress.
  FineTuneProgress Abort();

  // Records the job's outcome ("committed", "aborted", "failed", "cancelled"; "" = none) with
  // `status` in the log, drops the trainer and frees the job slot. Only the first call counts.
  void End(std::string_view outcome, const absl::Status& status);

 private:
  friend class FineTuning;
  FineTuneJob(FineTuning* owner, std::string id, ModelVersion base, JobSettings settings);

  FineTuneProgress Progress();
  // Scores the job's evaluation set on the trainer's weights after `steps_` steps (0: the
  // base) and keeps the result for the next progress and the report; OK without a set.
  absl::Status Evaluate(const CallControl& control);
  // What a commit does about promotion: whether it serves the version by default, and why
  // (the gate's numbers when the job has one).
  std::pair<bool, std::string> PromotionDecision(const CommitRequest& request) const;
  // Adds `warnings` to `progress` and keeps them as the job's notes (stored with the version if
  // it is committed).
  void Warn(const std::vector<std::string>& warnings, FineTuneProgress* progress);
  absl::StatusOr<ModelVersion> Publish(const CommitRequest& request, bool promote);
  TrainingReport Report() const;

  FineTuning* const owner_;
  const std::string id_;
  const ModelVersion base_;
  const JobSettings settings_;
  bool ended_ = false;
  std::unique_ptr<Trainer> trainer_;
  int64_t steps_ = 0;
  int64_t examples_seen_ = 0;
  StepResult last_;
  bool sent_base_version_ = false;
  // Degenerate batches: a loss of exactly 0 this many steps in a row is worth a warning.
  static constexpr int kZeroLossSteps = 3;
  static constexpr size_t kMaxNotes = 16;
  int zero_loss_steps_ = 0;
  std::vector<std::string> notes_;
  std::vector<LossPoint> loss_curve_;        // for the training report stored with the version
  std::vector<StepEvaluation> evaluations_;  // every evaluation so far, for the report
  size_t evaluations_sent_ = 0;              // how many went out with a progress already
  std::string promotion_;                    // the commit's decision, for the report
};

}  // namespace attn::server::core
