// Runs attnserve with validated options: metrics endpoint, model registry, batcher, serving core,
// the gRPC services, the HTTP front end, health and reflection; waits for SIGTERM/SIGINT and
// drains.
#pragma once

#include <optional>
#include <string>

#include "server/options.h"

namespace attn::server {

// Returns the process exit code: 0 after a drain, 1 if the server could not start.
// `api_key`: the bearer token inference calls need (gRPC Encoder and HTTP), nullopt = none.
int RunServer(const ServerOptions& options, std::optional<std::string> trainer_token,
              std::optional<std::string> api_key = std::nullopt);

// The shell command that moves what a one-model server keeps at the top of `store` (its
// versions, serving record and job history) to `store`/`model`/, the layout of a server of
// several models. Names only the entries the store has; quotes paths for the shell.
std::string MoveStoreUnderModelCommand(const std::string& store, const std::string& model);

}  // namespace attn::server
