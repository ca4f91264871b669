// Versions of the model store as registry entries: listed at start-up, loaded on demand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_store.h"
#include "server/core/model_registry.h"
#include "server/options.h"

namespace attn::server {

// A stored version's registry entry, not loaded yet (the registry loads it when it is served
// or pinned).
ModelVersion UnloadedVersion(const StoredVersion& stored);

// Loads a version's model from disk: "base" from --model-dir, the others from the store.
absl::StatusOr<std::shared_ptr<const Model>> LoadVersion(const ServerOptions& options,
                                                         const ModelVersion& version);

// Registers every committed version of the model store, newest first: the newest one that
// loads is served, the others are listed and load when pinned. Returns the next commit's
// sequence number. A server that only watches the store leaves temp dirs alone (they may be a
// commit in progress by the trainer replica).
absl::StatusOr<int64_t> LoadModelStore(const std::string& store, bool clean_temp_dirs,
                                       ModelRegistry* registry);

}  // namespace attn::server
