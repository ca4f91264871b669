#include "server/model_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn::server {

void ModelRegistry::Add(ModelVersion version) {
  absl::MutexLock lock(&mutex_);
  if (serving_.empty()) serving_ = version.version;
  const std::string name = version.version;
  versions_[name] = std::move(version);
}

absl::Status ModelRegistry::SetServing(const std::string& version) {
  absl::MutexLock lock(&mutex_);
  if (!versions_.count(version)) {
    return absl::NotFoundError(absl::StrCat("model version '", version, "' not found"));
  }
  serving_ = version;
  return absl::OkStatus();
}

absl::StatusOr<ModelVersion> ModelRegistry::Get(const std::string& version) const {
  absl::MutexLock lock(&mutex_);
  if (versions_.empty()) {
    return absl::UnavailableError("the model is still loading; retry shortly");
  }
  const std::string& name = version.empty() ? serving_ : version;
  auto it = versions_.find(name);
  if (it == versions_.end()) {
    std::vector<std::string> names;
    for (const auto& [key, unused] : versions_) names.push_back(key);
    return absl::NotFoundError(absl::StrCat(
        "model version '", version, "' not found; available: ", absl::StrJoin(names, ", ")));
  }
  return it->second;
}

std::vector<std::string> ModelRegistry::Versions() const {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> names;
  for (const auto& [key, unused] : versions_) names.push_back(key);
  return names;
}

bool ModelRegistry::empty() const {
  absl::MutexLock lock(&mutex_);
  return versions_.empty();
}

}  // namespace attn::server
