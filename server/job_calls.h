// The Trainer's server-side job calls over gRPC, adapters over the core's JobRunner
// (server/core/job_runner.h): CreateJob (a bidirectional stream: spec, then the dataset's chunks)
// and WatchJob (a server stream of a job's events, replayed then followed) as reactors; GetJob,
// ListJobs and CancelJob as TrainerService's unary handlers (defined in job_calls.cc).
#pragma once

#include "server/raw_method.h"

namespace attn::server {

class TrainerService;

// Each reactor deletes itself when its call is done.
RawMethods::BidiReactor* NewCreateJobReactor(TrainerService* service,
                                             grpc::CallbackServerContext* context);
RawMethods::WriteReactor* NewWatchJobReactor(TrainerService* service,
                                             grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request);

}  // namespace attn::server
