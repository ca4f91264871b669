#include "server/core/version_tasks.h"

#include "absl/strings/str_cat.h"
#include "engine/model_store.h"

namespace attn::server::core {

absl::StatusOr<ModelVersion> FindVersion(const ServedModel& served, const std::string& version,
                                         const char* field) {
  if (version.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is empty; name a version of model ", served.name,
                     " (\"base\" or a committed version: ListVersions)"));
  }
  if (absl::Status valid = ValidateVersionName(version); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", valid.message()));
  }
  return served.registry->Get(version);
}

absl::StatusOr<std::optional<VersionHead>> StoredHead(const ServedModel& served,
                                                      const ModelVersion& version, int64_t hidden) {
  if (served.store.empty() || version.version == "base") return std::nullopt;
  absl::StatusOr<StoredVersion> stored = ReadStoredVersion(served.store, version.version);
  if (!stored.ok()) {
    // A version the registry knows but the store does not (added in memory only) has no head.
    if (absl::IsNotFound(stored.status())) return std::nullopt;
    return stored.status();
  }
  if (stored->num_labels <= 0) return std::nullopt;
  absl::StatusOr<ClassificationHead> head = LoadStoredHead(*stored, hidden);
  if (!head.ok()) return head.status();
  VersionHead out;
  out.head = *std::move(head);
  out.objective = stored->objective;
  out.pairs = stored->objective == "pair_classification";
  out.label_names = stored->label_names;
  return std::optional<VersionHead>(std::move(out));
}

}  // namespace attn::server::core
