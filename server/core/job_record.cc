#include "server/core/job_record.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "engine/json_file.h"
#include "engine/quote.h"
#include "engine/training/epoch_order.h"
#include "nlohmann/json.hpp"

namespace attn::server::core {

namespace {

using Json = nlohmann::json;

constexpr int kRecordFormat = 1;
constexpr size_t kMaxJobIdSuffix = 60;

JobState StateFromName(std::string_view name, bool* known) {
  *known = true;
  for (JobState state : {JobState::kPending, JobState::kRunning, JobState::kSucceeded,
                         JobState::kFailed, JobState::kCancelled}) {
    if (name == JobStateName(state)) return state;
  }
  *known = false;
  return JobState::kFailed;
}

}  // namespace

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "pending";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, int max_batch, int64_t max_dataset_bytes) {
  JobPlan plan;
  if (spec.epochs < 0 || spec.epochs > kMaxJobEpochs) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs is ", spec.epochs, "; give 1 to ", kMaxJobEpochs, " (0 = 1)"));
  }
  if (spec.epochs > 0) plan.epochs = spec.epochs;
  if (spec.batch_size < 0 || spec.batch_size > max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", spec.batch_size, "; give 1 to ", max_batch,
                     " (--max-inputs-per-request; 0 = ", kDefaultJobBatchSize, ")"));
  }
  if (spec.batch_size > 0) plan.batch_size = spec.batch_size;
  plan.batch_size = std::min(plan.batch_size, max_batch);
  const DatasetInfo& dataset = spec.dataset;
  if (dataset.bytes <= 0 || dataset.bytes > max_dataset_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.bytes is ", dataset.bytes, "; this server takes datasets of 1 to ",
        max_dataset_bytes, " bytes (--max-job-dataset-bytes)",
        dataset.bytes > max_dataset_bytes ? ": split the data into several jobs, or ask for a "
                                            "larger limit"
                                          : ""));
  }
  // An example takes at least 2 bytes: its size and one field tag.
  if (dataset.examples <= 0 || dataset.examples > dataset.bytes / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.examples is ", dataset.examples, " for ", dataset.bytes,
                     " bytes; give the number of TrainingExamples in the dataset (at least 1)"));
  }
  if (dataset.sha256.size() != 64 ||
      !std::all_of(dataset.sha256.begin(), dataset.sha256.end(), [](char c) {
        return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.sha256 is ", QuoteInput(dataset.sha256),
                     "; give the SHA-256 of the dataset's bytes as 64 hex digits"));
  }
  plan.steps_per_epoch = StepsPerEpoch(static_cast<size_t>(dataset.examples), plan.batch_size);
  plan.total_steps = plan.steps_per_epoch * plan.epochs;
  if (spec.config.objective == Objective::kContrastive) {
    if (dataset.examples < 2) {
      return absl::InvalidArgumentError(
          "the dataset has 1 example; the contrastive objective needs at least 2 (anchor, "
          "positive) pairs per batch (the other pairs are each anchor's negatives)");
    }
    if (EndsWithALonePair(static_cast<size_t>(dataset.examples), plan.batch_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "with ", dataset.examples, " examples in batches of ", plan.batch_size,
          ", each epoch would end with a batch of 1 pair, which the contrastive objective cannot "
          "learn from; use batches of 3 or more"));
    }
  }
  return plan;
}

std::string JobRecordJson(const JobRecord& r) {
  Json json = {
      {"format_version", kRecordFormat},
      {"id", r.id},
      {"model", r.model},
      {"state", JobStateName(r.state)},
      {"created_utc", r.created_utc},
      {"started_utc", r.started_utc},
      {"ended_utc", r.ended_utc},
      {"base_version", r.base_version},
      {"objective", r.objective},
      {"epochs", r.epochs},
      {"batch_size", r.batch_size},
      {"step", r.step},
      {"total_steps", r.total_steps},
      // JSON has no NaN: a diverged loss is recorded as null.
      {"loss", std::isfinite(r.loss) ? Json(r.loss) : Json(nullptr)},
      {"dataset",
       {{"bytes", r.dataset.bytes},
        {"examples", r.dataset.examples},
        {"sha256", r.dataset.sha256}}},
      {"description", r.description},
      {"promote", r.promote},
      {"committed_version", r.committed_version},
      {"promoted", r.promoted},
      {"promotion", r.promotion},
      {"error", r.error},
      {"error_code", r.error_code},
  };
  // Replace invalid UTF-8 (a message quoting client bytes) instead of throwing.
  return json.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

absl::StatusOr<JobRecord> ParseJobRecord(std::string_view text, std::string_view source) {
  absl::StatusOr<Json> parsed = ParseJsonObject(text, source);
  if (!parsed.ok()) return absl::FailedPreconditionError(parsed.status().message());
  const Json& json = *parsed;
  std::string problem;
  auto field = [&](const Json& object, const char* name, Json::value_t type) -> const Json* {
    if (!problem.empty()) return nullptr;
    auto it = object.find(name);
    const bool number_ok =
        type == Json::value_t::number_integer && it != object.end() && it->is_number_unsigned();
    if (it == object.end() || (it->type() != type && !number_ok)) {
      problem = absl::StrCat("\"", name, "\" is missing or not a ", Json(type).type_name());
      return nullptr;
    }
    return &*it;
  };
  auto text_field = [&](const Json& object, const char* name, std::string* out) {
    if (const Json* v = field(object, name, Json::value_t::string)) *out = v->get<std::string>();
  };
  auto int_field = [&](const Json& object, const char* name, auto* out) {
    if (const Json* v = field(object, name, Json::value_t::number_integer)) {
      *out = v->get<std::remove_pointer_t<decltype(out)>>();
    }
  };
  auto bool_field = [&](const Json& object, const char* name, bool* out) {
    if (const Json* v = field(object, name, Json::value_t::boolean)) *out = v->get<bool>();
  };
  JobRecord r;
  int format = 0;
  int_field(json, "format_version", &format);
  if (problem.empty() && format != kRecordFormat) {
    problem = absl::StrCat("format_version ", format, " is not ", kRecordFormat,
                           " (written by another attnserve version)");
  }
  text_field(json, "id", &r.id);
  text_field(json, "model", &r.model);
  std::string state;
  text_field(json, "state", &state);
  text_field(json, "created_utc", &r.created_utc);
  text_field(json, "started_utc", &r.started_utc);
  text_field(json, "ended_utc", &r.ended_utc);
  text_field(json, "base_version", &r.base_version);
  text_field(json, "objective", &r.objective);
  int_field(json, "epochs", &r.epochs);
  int_field(json, "batch_size", &r.batch_size);
  int_field(json, "step", &r.step);
  int_field(json, "total_steps", &r.total_steps);
  if (problem.empty()) {
    auto loss = json.find("loss");
    if (loss == json.end() || !(loss->is_number() || loss->is_null())) {
      problem = "\"loss\" is missing or not a number";
    } else {
      r.loss = loss->is_null() ? std::nan("") : loss->get<double>();
    }
  }
  if (const Json* dataset = field(json, "dataset", Json::value_t::object)) {
    int_field(*dataset, "bytes", &r.dataset.bytes);
    int_field(*dataset, "examples", &r.dataset.examples);
    text_field(*dataset, "sha256", &r.dataset.sha256);
  }
  text_field(json, "description", &r.description);
  bool_field(json, "promote", &r.promote);
  text_field(json, "committed_version", &r.committed_version);
  bool_field(json, "promoted", &r.promoted);
  text_field(json, "promotion", &r.promotion);
  text_field(json, "error", &r.error);
  text_field(json, "error_code", &r.error_code);
  bool known = false;
  if (problem.empty()) r.state = StateFromName(state, &known);
  if (problem.empty() && !known) problem = absl::StrCat("unknown state ", QuoteInput(state));
  if (problem.empty()) {
    if (absl::Status id = ValidateJobId(r.id); !id.ok()) problem = std::string(id.message());
  }
  if (!problem.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(source), " is not a job record this server can read: ", problem));
  }
  return r;
}

std::string NewJobId(std::time_t now, uint64_t random) {
  std::tm tm{};
  gmtime_r(&now, &tm);
  char time[32];
  std::strftime(time, sizeof(time), "%Y%m%dT%H%M%SZ", &tm);
  return absl::StrFormat("job-%s-%08x", time, static_cast<uint32_t>(random));
}

absl::Status ValidateJobId(std::string_view id) {
  absl::string_view suffix(id.data(), id.size());
  const bool valid = absl::ConsumePrefix(&suffix, "job-") && !suffix.empty() &&
                     suffix.size() <= kMaxJobIdSuffix &&
                     std::all_of(suffix.begin(), suffix.end(),
                                 [](char c) { return absl::ascii_isalnum(c) || c == '-'; });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job_id ", id.empty() ? std::string("is empty") : "is " + QuoteInput(id),
      "; a job id looks like job-20261125T103000Z-1a2b3c4d (CreateJob answers it; ListJobs or "
      "'attnctl jobs' lists them)"));
}

std::string UtcTimestamp(std::time_t now) {
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace attn::server::core
