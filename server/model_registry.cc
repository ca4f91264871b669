#include "server/model_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn::server {

void ModelRegistry::SetServingListener(ServingListener listener) {
  absl::MutexLock lock(&mutex_);
  listener_ = std::move(listener);
}

void ModelRegistry::SetServingLocked(const std::string& version) {
  serving_ = version;
  if (listener_) listener_(versions_.at(version));
}

void ModelRegistry::Add(ModelVersion version) {
  absl::MutexLock lock(&mutex_);
  const std::string name = version.version;
  versions_[name] = std::move(version);
  if (serving_.empty() || serving_ == name) SetServingLocked(name);
}

absl::Status ModelRegistry::Publish(ModelVersion version, bool serve) {
  absl::MutexLock lock(&mutex_);
  const std::string name = version.version;
  if (versions_.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("model version '", name, "' already exists"));
  }
  versions_[name] = std::move(version);
  if (serve || serving_.empty()) SetServingLocked(name);
  return absl::OkStatus();
}

absl::Status ModelRegistry::SetServing(const std::string& version) {
  absl::MutexLock lock(&mutex_);
  if (!versions_.count(version)) {
    std::vector<std::string> names;
    for (const ModelVersion* v : OrderedLocked()) names.push_back(v->version);
    return absl::NotFoundError(absl::StrCat(
        "model version '", version, "' not found; available: ", absl::StrJoin(names, ", ")));
  }
  SetServingLocked(version);
  return absl::OkStatus();
}

absl::StatusOr<ModelVersion> ModelRegistry::Rollback(const std::string& version) {
  absl::MutexLock lock(&mutex_);
  const std::vector<const ModelVersion*> ordered = OrderedLocked();
  auto current = std::find_if(ordered.begin(), ordered.end(),
                              [&](const ModelVersion* v) { return v->version == serving_; });
  if (current == ordered.end()) return absl::UnavailableError("no version is served yet");
  if (version.empty()) {
    if (current == ordered.begin()) {
      return absl::FailedPreconditionError(
          absl::StrCat("nothing to roll back to: '", serving_, "' is the oldest version"));
    }
    SetServingLocked((*(current - 1))->version);
    return versions_.at(serving_);
  }
  auto target = versions_.find(version);
  if (target == versions_.end()) {
    return absl::NotFoundError(absl::StrCat("model version '", version, "' not found"));
  }
  if (version == serving_) {
    return absl::FailedPreconditionError(absl::StrCat("'", version, "' is already served"));
  }
  auto position = std::find(ordered.begin(), ordered.end(), &target->second);
  if (position > current) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", version, "' is newer than the served '", serving_,
                     "'; Rollback only goes back (use SetServingVersion to go forward)"));
  }
  SetServingLocked(version);
  return target->second;
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
    for (const ModelVersion* v : OrderedLocked()) names.push_back(v->version);
    return absl::NotFoundError(absl::StrCat(
        "model version '", version, "' not found; available: ", absl::StrJoin(names, ", ")));
  }
  return it->second;
}

std::vector<const ModelVersion*> ModelRegistry::OrderedLocked() const {
  std::vector<const ModelVersion*> ordered;
  for (const auto& [name, version] : versions_) ordered.push_back(&version);
  std::stable_sort(
      ordered.begin(), ordered.end(),
      [](const ModelVersion* a, const ModelVersion* b) { return a->sequence < b->sequence; });
  return ordered;
}

std::vector<std::string> ModelRegistry::Versions() const {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> names;
  for (const ModelVersion* v : OrderedLocked()) names.push_back(v->version);
  return names;
}

std::vector<ModelVersion> ModelRegistry::List(std::string* serving) const {
  absl::MutexLock lock(&mutex_);
  std::vector<ModelVersion> out;
  for (const ModelVersion* v : OrderedLocked()) out.push_back(*v);
  if (serving != nullptr) *serving = serving_;
  return out;
}

bool ModelRegistry::empty() const {
  absl::MutexLock lock(&mutex_);
  return versions_.empty();
}

}  // namespace attn::server
