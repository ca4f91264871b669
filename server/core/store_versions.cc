#include "server/core/store_versions.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/log.h"
#include "engine/serving_state.h"
#include "server/core/fine_tune_job.h"
#include "server/core/serving_history.h"

namespace attn::server {

ModelVersion UnloadedVersion(const StoredVersion& stored) {
  ModelVersion version;
  version.version = stored.version;
  version.origin = core::FineTunedOrigin(stored.base_version, stored.objective, stored.steps);
  version.sequence = stored.sequence;
  version.created_utc = stored.created_utc;
  version.description = stored.description;
  version.notes = stored.notes;
  return version;
}

absl::StatusOr<std::shared_ptr<const Model>> LoadVersion(const std::string& model_dir,
                                                         const std::string& model_store,
                                                         Precision precision,
                                                         const ModelVersion& version) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const Model>> model;
  if (version.version == "base") {
    model = Model::Load(model_dir, ModelOptions{precision});
  } else if (model_store.empty()) {
    model = absl::FailedPreconditionError("the server has no --model-store to load it from");
  } else {
    absl::StatusOr<StoredVersion> stored = ReadStoredVersion(model_store, version.version);
    absl::StatusOr<LoadedVersion> loaded = stored.ok()
                                               ? LoadStoredVersion(*stored, ModelOptions{precision})
                                               : absl::StatusOr<LoadedVersion>(stored.status());
    if (loaded.ok()) {
      model = loaded->model;
    } else {
      model = loaded.status();
    }
  }
  if (model.ok()) {
    Log(LogLevel::kInfo, "loaded version %s in %.2f s", version.version,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } else {
    Log(LogLevel::kWarning, "cannot load version %s: %s", version.version,
        model.status().message());
  }
  return model;
}

absl::StatusOr<int64_t> LoadModelStore(const std::string& store, bool clean_temp_dirs,
                                       ModelRegistry* registry) {
  std::error_code error;
  std::filesystem::create_directories(store, error);
  if (error || !std::filesystem::is_directory(store)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--model-store ", store, " is not a usable directory",
                     error ? absl::StrCat(": ", error.message()) : std::string()));
  }
  if (clean_temp_dirs) {
    absl::StatusOr<int> removed = RemoveStaleTempDirs(store);
    if (!removed.ok()) return removed.status();
    if (*removed > 0) {
      Log(LogLevel::kWarning, "model store %s: removed %d unfinished checkpoint(s) left by a crash",
          store, *removed);
    }
  }
  std::vector<std::string> skipped;
  absl::StatusOr<std::vector<StoredVersion>> versions = ListStore(store, &skipped);
  if (!versions.ok()) return versions.status();
  for (const std::string& reason : skipped) {
    Log(LogLevel::kWarning, "model store %s: skipped %s", store, reason);
  }
  // Start-up tries the newest versions first even when the store records what it serves (then
  // applied below, before the server is ready): a version that does not load is reported here.
  int64_t next_sequence = 1;
  for (auto stored = versions->rbegin(); stored != versions->rend(); ++stored) {
    next_sequence = std::max(next_sequence, stored->sequence + 1);
    absl::StatusOr<bool> served = registry->Discover(UnloadedVersion(*stored));
    if (!served.ok()) {
      Log(LogLevel::kWarning, "model store %s: version %s: %s", store, stored->version,
          served.status().message());
    }
  }
  if (absl::StatusOr<bool> applied = ApplyRecordedServing(store, registry); !applied.ok()) {
    // A damaged serving.json must not keep the server down: it serves the newest version,
    // as a store without one does, and says so.
    Log(LogLevel::kWarning, "model store %s: %s; serving the newest version instead", store,
        applied.status().message());
  }
  if (!versions->empty()) {
    Log(LogLevel::kInfo, "model store %s: %d version(s) listed, loaded: %s", store,
        static_cast<int>(versions->size()), absl::StrJoin(registry->LoadedVersions(), ", "));
  }
  return next_sequence;
}

namespace {

std::string ServerIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat("attnserve on ", host[0] != '\0' ? host : "?", " pid ", getpid());
}

std::string ServedVersion(ModelRegistry* registry) {
  std::string serving;
  registry->List(&serving);
  return serving;
}

}  // namespace

absl::Status RecordServing(const std::string& store, const std::string& action,
                           const std::string& from, const std::string& to,
                           const std::string& committed) {
  if (store.empty()) return absl::OkStatus();
  ServingChange change;
  change.action = action;
  change.from = from;
  change.to = to;
  change.committed = committed;
  change.by = ServerIdentity();
  absl::StatusOr<ServingState> recorded = RecordServingChange(store, std::move(change));
  if (!recorded.ok()) {
    return absl::Status(recorded.status().code(),
                        absl::StrCat("cannot record the served version in the model store: ",
                                     recorded.status().message()));
  }
  return absl::OkStatus();
}

absl::Status RecordServingIfUnrecorded(const std::string& store, const std::string& serving) {
  absl::StatusOr<ServingState> state = ReadServingState(store);
  if (state.ok()) return absl::OkStatus();
  if (state.status().code() != absl::StatusCode::kNotFound) return state.status();
  return RecordServing(store, "record", serving, serving);
}

void ReloadServingHistory(const std::string& store, ModelRegistry* registry) {
  if (store.empty()) return;
  absl::StatusOr<ServingState> state = ReadServingState(store);
  if (state.ok()) {
    registry->RestoreServingHistory(ReplayServingHistory(*state, registry->Versions()));
  } else if (state.status().code() == absl::StatusCode::kNotFound) {
    registry->RestoreServingHistory(
        CommitOrderHistory(registry->Versions(), ServedVersion(registry)));
  }
}

absl::StatusOr<bool> ApplyRecordedServing(const std::string& store, ModelRegistry* registry) {
  absl::StatusOr<ServingState> state = ReadServingState(store);
  if (!state.ok()) {
    if (state.status().code() != absl::StatusCode::kNotFound) return state.status();
    // Nothing recorded: every commit was served when it was made.
    registry->RestoreServingHistory(
        CommitOrderHistory(registry->Versions(), ServedVersion(registry)));
    return false;
  }
  registry->LetStoreDecide();
  const bool changed = ServedVersion(registry) != state->serving;
  if (changed) {
    if (absl::Status served = registry->SetServing(state->serving); !served.ok()) {
      return absl::Status(served.code(),
                          absl::StrCat("the recorded serving version ", state->serving,
                                       " cannot be served: ", served.message()));
    }
  }
  // What Rollback returns to: the record's history (also after a change made by a replica).
  registry->RestoreServingHistory(ReplayServingHistory(*state, registry->Versions()));
  if (!changed) return false;
  const ServingChange* last = state->history.empty() ? nullptr : &state->history.back();
  Log(LogLevel::kInfo, "model store %s: serving %s as recorded%s", store, state->serving,
      last == nullptr ? ""
                      : absl::StrCat(" (", last->action, " at ", last->at, " by ", last->by, ")"));
  return true;
}

}  // namespace attn::server
