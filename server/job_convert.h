// attnserve.v1 server-side job messages <-> the core's job structs (server/core/job_runner.h),
// and the codec the core keeps datasets and events with: it stores the protocol's own bytes, so
// a field added to FineTuneProgress reaches watchers of a replayed job as it reached the
// interactive stream.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "attnserve/v1/trainer.pb.h"
#include "server/core/job_runner.h"

namespace attn::server {

// INVALID_ARGUMENT naming the field for what only the protocol can get wrong (an unknown enum
// value in the config); the core checks the rest.
absl::StatusOr<core::JobSpec> ToCore(const attnserve::v1::JobSpec& spec);

attnserve::v1::JobState ToProto(core::JobState state);
// The job as GetJob and ListJobs answer (the spec is the caller's to add).
void ToProto(const core::JobView& view, attnserve::v1::Job* out);

// Decodes a dataset example (an attnserve.v1.TrainingExample's bytes; INVALID_ARGUMENT naming
// what is wrong, e.g. invalid UTF-8 in a text) and encodes an event as attnserve.v1.JobEvent.
core::JobCodec JobProtoCodec();

}  // namespace attn::server
