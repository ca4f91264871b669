// A server-side fine-tuning job's record (job_runner.h runs the jobs): what was asked, where the
// job stands and how it ended, kept in the model store as <store>/jobs/<id>/job.json. Pure:
// the record's JSON both ways, job ids, the job's plan from its spec. Tested without a server.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/core/fine_tune_job.h"

namespace attn::server::core {

// The protocol's JobState numbers.
enum class JobState : int {
  kPending = 1,
  kRunning = 2,
  kSucceeded = 3,
  kFailed = 4,
  kCancelled = 5
};

// "pending", "running", "succeeded", "failed", "cancelled" (job.json, logs, messages).
const char* JobStateName(JobState state);
// Succeeded, failed or cancelled: nothing more will happen to the job.
inline bool IsFinal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

// The uploaded dataset as declared (and then checked): size, examples and SHA-256 (64 lowercase
// hex digits).
struct DatasetInfo {
  int64_t bytes = 0;
  int64_t examples = 0;
  std::string sha256;
};

// What CreateJob asks for. 0 = the default for epochs (1) and batch_size (16).
struct JobSpec {
  FineTuneConfig config;
  int32_t epochs = 0;
  int32_t batch_size = 0;
  std::string description;
  bool promote = false;
  DatasetInfo dataset;
};

inline constexpr int32_t kDefaultJobBatchSize = 16;
// Bounds a job's length (and keeps every step count far from overflow).
inline constexpr int32_t kMaxJobEpochs = 100000;

// The batching a spec asks for, checked and with defaults filled in: INVALID_ARGUMENT naming the
// field for epochs, batch size (1 to `max_batch`, the server's --max-inputs-per-request) and the
// declared dataset (1 byte to `max_dataset_bytes`, at least one example, a 64-hex-digit sha256),
// and for a contrastive dataset whose epochs would end with a batch of one pair (it has no
// negatives to learn from: the engine refuses it).
struct JobPlan {
  int32_t epochs = 1;
  int32_t batch_size = kDefaultJobBatchSize;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};
absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, int max_batch, int64_t max_dataset_bytes);

// Everything about a job that outlives its run.
struct JobRecord {
  std::string id;
  std::string model;
  JobState state = JobState::kPending;
  std::string created_utc, started_utc, ended_utc;
  std::string base_version;
  std::string objective;  // ObjectiveName
  int32_t epochs = 1;
  int32_t batch_size = kDefaultJobBatchSize;
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  DatasetInfo dataset;
  std::string description;
  bool promote = false;
  // Succeeded: the version it committed, whether that is served by default and why.
  std::string committed_version;
  bool promoted = false;
  std::string promotion;
  // Failed or cancelled: why, and the status code's name ("ABORTED", "FAILED_PRECONDITION").
  std::string error;
  std::string error_code;
};

// job.json's text: one JSON object with every field above and "format_version": 1.
std::string JobRecordJson(const JobRecord& record);
// job.json back: FAILED_PRECONDITION naming `source` and the field when it is not a record this
// server wrote (malformed JSON, a missing or mistyped field, an unknown state or format, an id
// that is not a job id).
absl::StatusOr<JobRecord> ParseJobRecord(std::string_view json, std::string_view source);

// A new job id: "job-<UTC time>-<8 hex digits of `random`>", e.g. "job-20261125T103000Z-1a2b3c4d".
std::string NewJobId(std::time_t now, uint64_t random);
// "job-" then 1 to 60 characters of [A-Za-z0-9-]: what every job id looks like (and nothing
// that could leave the jobs directory). INVALID_ARGUMENT quoting (shortly) what it got.
absl::Status ValidateJobId(std::string_view id);

// "2026-11-25T10:30:00Z".
std::string UtcTimestamp(std::time_t now = std::time(nullptr));

}  // namespace attn::server::core
