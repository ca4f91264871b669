// FineTune: the stream of one fine-tuning job (config, batches, commit or abort) as a gRPC
// bidirectional reactor, a state machine whose engine work runs on the training thread. See the
// comment on FineTuneReactor in the .cc for the turn-taking between threads.
#pragma once

#include "server/raw_method.h"

namespace attn::server {

class TrainerService;

// A new stream's reactor; it deletes itself when the stream is done.
RawMethods::BidiReactor* NewFineTuneReactor(TrainerService* service,
                                            grpc::CallbackServerContext* context);

}  // namespace attn::server
