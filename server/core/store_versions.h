// Versions of the model store as registry entries: listed at start-up, loaded on demand.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_store.h"
#include "engine/precision.h"
#include "server/core/model_registry.h"

namespace attn::server {

// A stored version's registry entry, not loaded yet (the registry loads it when it is served
// or pinned).
ModelVersion UnloadedVersion(const StoredVersion& stored);

// Loads a version's model from disk at `precision`: "base" from `model_dir`, the others from
// `model_store` ("" = none: FAILED_PRECONDITION).
absl::StatusOr<std::shared_ptr<const Model>> LoadVersion(const std::string& model_dir,
                                                         const std::string& model_store,
                                                         Precision precision,
                                                         const ModelVersion& version);

// Registers every committed version of the model store, newest first: the newest one that
// loads is served, the others are listed and load when pinned. Returns the next commit's
// sequence number. A server that only watches the store leaves temp dirs alone (they may be a
// commit in progress by the trainer replica).
absl::StatusOr<int64_t> LoadModelStore(const std::string& store, bool clean_temp_dirs,
                                       ModelRegistry* registry);

// Records in the store (engine/serving_state.h) that the default version changed from `from`
// to `to` by `action` ("rollback", "set-serving", "commit", or "commit-staged" with `to` empty:
// a commit that leaves the default, recorded so that replicas do not serve it as the newest);
// `committed` names a commit's version. OK and nothing written when `store` is empty.
absl::Status RecordServing(const std::string& store, const std::string& action,
                           const std::string& from, const std::string& to,
                           const std::string& committed = "");

// Makes sure the store records which version is served (`serving`, as action "record") so
// that a version committed next is not served as the newest one by a server following the
// newest version; nothing written if the store already records one.
absl::Status RecordServingIfUnrecorded(const std::string& store, const std::string& serving);

// Rebuilds `registry`'s serving history (serving_history.h) from what the store records; left as
// it is when the record cannot be read.
void ReloadServingHistory(const std::string& store, ModelRegistry* registry);

// Serves what the store records (at start and on each --watch-store poll): once the store has a
// serving.json the registry stops following the newest version and serves the recorded one.
// Either way the registry's serving history is rebuilt from the record (without one: commit
// order). Returns whether the default changed. OK and nothing else done without a serving.json.
absl::StatusOr<bool> ApplyRecordedServing(const std::string& store, ModelRegistry* registry);

}  // namespace attn::server
