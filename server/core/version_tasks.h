// What the read-only version calls (CompareVersions, Neighbors, Evaluate) share: finding a
// version a request names, reading a stored version's head, and running engine work as one task
// job on the model's batcher thread (off the gRPC threads, yielding to queued Encode batches).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/encoder.h"
#include "server/core/batcher.h"
#include "server/core/calls.h"
#include "server/core/model_set.h"
#include "server/core/serving_core.h"
#include "server/core/version_heads.h"

namespace attn::server::core {

// A version named by request field `field`: INVALID_ARGUMENT when empty or malformed, NOT_FOUND
// (naming the model's versions) when unknown; loads it if it is known but not in memory.
absl::StatusOr<ModelVersion> FindVersion(const ServedModel& served, const std::string& version,
                                         const char* field);

// A stored version's classification head, or nullopt ("base", no store, no head).
absl::StatusOr<std::optional<VersionHead>> StoredHead(const ServedModel& served,
                                                      const ModelVersion& version, int64_t hidden);

// Runs `work` as a task job on `served`'s batcher, costing `tokens` token-forwards; `done` gets
// its status or `result`, on the batcher thread (or on the caller's when the queue refuses it).
template <typename Response>
void SubmitTask(const ServedModel& served, std::shared_ptr<const Model> model, int64_t tokens,
                const CallControl& control,
                std::function<absl::Status(const std::function<bool()>&, Response*)> work,
                std::function<void(absl::StatusOr<Response>)> done) {
  auto result = std::make_shared<Response>();
  auto job = std::make_shared<Job>();
  job->model = std::move(model);
  job->task_tokens = tokens;
  job->task = [work = std::move(work), result](const std::function<bool()>& yield) {
    return work(yield, result.get());
  };
  job->deadline = control.deadline;
  job->is_cancelled = control.is_cancelled;
  auto shared_done =
      std::make_shared<std::function<void(absl::StatusOr<Response>)>>(std::move(done));
  ServingMetrics* const metrics = served.metrics;
  job->done = [shared_done, result, control, metrics](absl::Status status, JobOutput) {
    if (!status.ok()) {
      return (*shared_done)(UnlessDropped(control, std::move(status), "compute", metrics));
    }
    (*shared_done)(std::move(*result));
  };
  if (absl::Status submitted = served.batcher->Submit(job); !submitted.ok()) {
    (*shared_done)(UnlessDropped(control, std::move(submitted), "queue", metrics));
  }
}

}  // namespace attn::server::core
