#include "server/store_versions.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/log.h"

namespace attn::server {

ModelVersion UnloadedVersion(const StoredVersion& stored) {
  ModelVersion version;
  version.version = stored.version;
  version.origin = absl::StrCat("fine-tuned from ", stored.base_version, " (", stored.objective,
                                ", ", stored.steps, stored.steps == 1 ? " step)" : " steps)");
  version.sequence = stored.sequence;
  version.created_utc = stored.created_utc;
  version.description = stored.description;
  version.notes = stored.notes;
  return version;
}

absl::StatusOr<std::shared_ptr<const Model>> LoadVersion(const ServerOptions& options,
                                                         const ModelVersion& version) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<const Model>> model;
  if (version.version == "base") {
    model = Model::Load(options.model_dir, ModelOptions{options.precision});
  } else if (options.model_store.empty()) {
    model = absl::FailedPreconditionError("the server has no --model-store to load it from");
  } else {
    absl::StatusOr<StoredVersion> stored = ReadStoredVersion(options.model_store, version.version);
    absl::StatusOr<LoadedVersion> loaded =
        stored.ok() ? LoadStoredVersion(*stored, ModelOptions{options.precision})
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
  int64_t next_sequence = 1;
  for (auto stored = versions->rbegin(); stored != versions->rend(); ++stored) {
    next_sequence = std::max(next_sequence, stored->sequence + 1);
    absl::StatusOr<bool> served = registry->Discover(UnloadedVersion(*stored));
    if (!served.ok()) {
      Log(LogLevel::kWarning, "model store %s: version %s: %s", store, stored->version,
          served.status().message());
    }
  }
  if (!versions->empty()) {
    Log(LogLevel::kInfo, "model store %s: %d version(s) listed, loaded: %s", store,
        static_cast<int>(versions->size()), absl::StrJoin(registry->LoadedVersions(), ", "));
  }
  return next_sequence;
}

}  // namespace attn::server
