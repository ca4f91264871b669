// attnserve.v1 Trainer messages <-> the serving core's fine-tuning structs
// (server/core/fine_tune_job.h). What only the protocol can get wrong (an enum value this server
// does not know) is reported here; everything else is the core's to check.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/trainer.pb.h"
#include "server/core/fine_tune_job.h"

namespace attn::server {

// INVALID_ARGUMENT naming the field for an unknown objective or parameter selection;
// OBJECTIVE_UNSPECIFIED becomes an unset objective (the core says what to set).
absl::StatusOr<core::FineTuneConfig> ToCore(const attnserve::v1::FineTuneConfig& config);
// INVALID_ARGUMENT naming `field` for an unknown task.
absl::StatusOr<core::EvaluationSetRequest> ToCore(const attnserve::v1::EvaluationSet& set,
                                                  absl::string_view field);
// `step`: the job's steps before the evaluation (0 for Evaluate).
void ToProto(const EvaluationResult& result, int64_t step, attnserve::v1::EvaluationResult* out);
core::TrainingBatchRequest ToCore(const attnserve::v1::TrainingBatch& batch);
core::TrainingExample ToCore(const attnserve::v1::TrainingExample& example);
core::CommitRequest ToCore(const attnserve::v1::CommitRequest& commit);

void ToProto(const core::FineTuneProgress& progress, attnserve::v1::FineTuneProgress* out);

}  // namespace attn::server
