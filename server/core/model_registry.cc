#include "server/core/model_registry.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/quote.h"

namespace attn::server {

ModelRegistry::ModelRegistry(int max_loaded, Loader loader)
    : max_loaded_(std::max(1, max_loaded)), loader_(std::move(loader)) {}

void ModelRegistry::SetServingListener(ServingListener listener) {
  absl::MutexLock lock(&mutex_);
  listener_ = std::move(listener);
}

void ModelRegistry::SetEvictionListener(EvictionListener listener) {
  absl::MutexLock lock(&mutex_);
  eviction_listener_ = std::move(listener);
}

void ModelRegistry::SetServingLocked(const std::string& version, bool rollback) {
  std::vector<std::string>& before = history_.served_before;
  auto found = std::find(before.rbegin(), before.rend(), version);
  if (rollback && found != before.rend()) {
    before.erase(std::next(found).base(), before.end());
  } else if (!serving_.empty() && serving_ != version) {
    // A change forward, or a rollback to a version rolled back from earlier (served, but not
    // before this one): what is served now is what the next rollback returns to.
    before.push_back(serving_);
  }
  history_.served_ever.insert(version);
  serving_ = version;
  Entry& entry = versions_.at(version);
  entry.last_used = ++use_clock_;
  if (listener_) listener_(entry.version);
}

bool ModelRegistry::IsNewestLocked(const std::string& version) const {
  const std::vector<const ModelVersion*> ordered = OrderedLocked();
  return !ordered.empty() && ordered.back()->version == version;
}

absl::Status ModelRegistry::NotFoundLocked(const std::string& version) const {
  std::vector<std::string> names;
  for (const ModelVersion* v : OrderedLocked()) names.push_back(v->version);
  return absl::NotFoundError(absl::StrCat("model version ", QuoteInput(version),
                                          " not found; available: ", absl::StrJoin(names, ", ")));
}

void ModelRegistry::EvictLocked(std::vector<std::shared_ptr<const Model>>* released) {
  if (!loader_) return;
  int loaded = 0;
  for (const auto& [name, entry] : versions_) loaded += entry.version.model != nullptr;
  while (loaded > max_loaded_) {
    Entry* oldest = nullptr;
    for (auto& [name, entry] : versions_) {
      if (entry.version.model == nullptr || name == serving_) continue;
      if (oldest == nullptr || entry.last_used < oldest->last_used) oldest = &entry;
    }
    if (oldest == nullptr) return;
    released->push_back(std::move(oldest->version.model));
    oldest->version.model = nullptr;
    --loaded;
    if (eviction_listener_) eviction_listener_(oldest->version.version);
  }
}

absl::StatusOr<ModelVersion> ModelRegistry::EnsureLoaded(const std::string& name) {
  ModelVersion unloaded;
  {
    absl::MutexLock lock(&mutex_);
    auto it = versions_.find(name);
    if (it == versions_.end()) return NotFoundLocked(name);
    it->second.last_used = ++use_clock_;
    if (it->second.version.model != nullptr) return it->second.version;
    unloaded = it->second.version;
  }
  if (!loader_) {
    return absl::InternalError(absl::StrCat("model version ", QuoteInput(name),
                                            " is not in memory and this server cannot load it"));
  }
  // The load (~1 s for MiniLM) runs without the main lock: requests for loaded versions go on.
  absl::StatusOr<std::shared_ptr<const Model>> model = loader_(unloaded);
  if (!model.ok()) {
    // The version is known (listed), so the request is fine; what is wrong is the version's
    // files (corrupted, truncated, removed): FailedPrecondition, or DataLoss if the loader
    // already said so. The loader's own code (InvalidArgument for a malformed file, NotFound
    // for a missing one) would blame the request or deny the version exists.
    const absl::StatusCode code = model.status().code() == absl::StatusCode::kDataLoss
                                      ? absl::StatusCode::kDataLoss
                                      : absl::StatusCode::kFailedPrecondition;
    return absl::Status(code, absl::StrCat("model version ", QuoteInput(name),
                                           " is not in memory and loading it from the store "
                                           "failed: ",
                                           model.status().message()));
  }
  std::vector<std::shared_ptr<const Model>> released;
  ModelVersion loaded;
  {
    absl::MutexLock lock(&mutex_);
    Entry& entry = versions_.at(name);  // entries are never removed
    entry.version.model = std::move(*model);
    entry.last_used = ++use_clock_;
    loaded = entry.version;
    EvictLocked(&released);
  }
  return loaded;
}

void ModelRegistry::Add(ModelVersion version) {
  absl::MutexLock load_lock(&load_mutex_);
  std::vector<std::shared_ptr<const Model>> released;
  absl::MutexLock lock(&mutex_);
  const std::string name = version.version;
  Entry& entry = versions_[name];
  entry.version = std::move(version);
  entry.discovered = false;
  entry.last_used = ++use_clock_;
  if (serving_.empty() || serving_ == name) SetServingLocked(name);
  EvictLocked(&released);
}

absl::Status ModelRegistry::Publish(ModelVersion version, bool serve) {
  absl::MutexLock load_lock(&load_mutex_);
  std::vector<std::shared_ptr<const Model>> released;
  absl::MutexLock lock(&mutex_);
  const std::string name = version.version;
  auto existing = versions_.find(name);
  if (existing != versions_.end() && !existing->second.discovered) {
    return absl::AlreadyExistsError(
        absl::StrCat("model version ", QuoteInput(name), " already exists"));
  }
  Entry& entry = versions_[name];
  entry.version = std::move(version);
  entry.discovered = false;
  entry.last_used = ++use_clock_;
  if (serve || serving_.empty()) {
    SetServingLocked(name);
    follow_latest_ = !store_decides_ && IsNewestLocked(name);
  }
  EvictLocked(&released);
  return absl::OkStatus();
}

absl::StatusOr<bool> ModelRegistry::Discover(ModelVersion version) {
  absl::MutexLock load_lock(&load_mutex_);
  const std::string name = version.version;
  {
    absl::MutexLock lock(&mutex_);
    if (versions_.count(name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("model version ", QuoteInput(name), " already exists"));
    }
    Entry& entry = versions_[name];
    entry.version = std::move(version);
    entry.discovered = true;
    auto served = versions_.find(serving_);
    const bool newer =
        served == versions_.end() || entry.version.sequence > served->second.version.sequence;
    if (!follow_latest_ || !newer) return false;
  }
  absl::StatusOr<ModelVersion> loaded = EnsureLoaded(name);
  if (!loaded.ok()) return loaded.status();
  std::vector<std::shared_ptr<const Model>> released;
  absl::MutexLock lock(&mutex_);
  SetServingLocked(name);
  EvictLocked(&released);
  return true;
}

absl::Status ModelRegistry::SetServing(const std::string& version) {
  absl::MutexLock load_lock(&load_mutex_);
  absl::StatusOr<ModelVersion> loaded = EnsureLoaded(version);
  if (!loaded.ok()) return loaded.status();
  std::vector<std::shared_ptr<const Model>> released;
  absl::MutexLock lock(&mutex_);
  SetServingLocked(version);
  follow_latest_ = !store_decides_ && IsNewestLocked(version);
  EvictLocked(&released);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModelRegistry::RollbackTargetLocked(const std::string& version) const {
  if (serving_.empty()) return absl::UnavailableError("no version is served yet");
  if (version.empty()) {
    if (history_.served_before.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("nothing to roll back to: no version was served by default before ",
                       QuoteInput(serving_)));
    }
    return history_.served_before.back();
  }
  if (versions_.count(version) == 0) {
    return absl::NotFoundError(absl::StrCat("model version ", QuoteInput(version), " not found"));
  }
  if (version == serving_) {
    return absl::FailedPreconditionError(absl::StrCat(QuoteInput(version), " is already served"));
  }
  if (history_.served_ever.count(version) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", QuoteInput(version),
        " was never served by default (committed staged, never promoted), so there is nothing "
        "to roll back to; to serve it, promote it (Promote)"));
  }
  return version;
}

absl::StatusOr<ModelVersion> ModelRegistry::Rollback(const std::string& version) {
  absl::MutexLock load_lock(&load_mutex_);
  std::string target;
  {
    // Every change of the version set holds load_mutex_, so the target stays valid below.
    absl::MutexLock lock(&mutex_);
    absl::StatusOr<std::string> found = RollbackTargetLocked(version);
    if (!found.ok()) return found.status();
    target = *found;
  }
  absl::StatusOr<ModelVersion> loaded = EnsureLoaded(target);
  if (!loaded.ok()) return loaded.status();
  std::vector<std::shared_ptr<const Model>> released;
  absl::MutexLock lock(&mutex_);
  SetServingLocked(target, /*rollback=*/true);
  follow_latest_ = false;  // the registry serves what it was told from now on
  EvictLocked(&released);
  return versions_.at(target).version;
}

void ModelRegistry::RestoreServingHistory(ServingHistory history) {
  absl::MutexLock lock(&mutex_);
  history_ = std::move(history);
  if (!serving_.empty()) history_.served_ever.insert(serving_);
}

ServingHistory ModelRegistry::serving_history() const {
  absl::MutexLock lock(&mutex_);
  return history_;
}

absl::StatusOr<ModelVersion> ModelRegistry::Get(const std::string& version) {
  std::string name;
  {
    absl::MutexLock lock(&mutex_);
    if (serving_.empty()) {
      return absl::UnavailableError("the model is still loading; retry shortly");
    }
    name = version.empty() ? serving_ : version;
    auto it = versions_.find(name);
    if (it == versions_.end()) return NotFoundLocked(version);
    it->second.last_used = ++use_clock_;
    if (it->second.version.model != nullptr) return it->second.version;
  }
  // Known but unloaded (never the served version, which always stays loaded).
  absl::MutexLock load_lock(&load_mutex_);
  return EnsureLoaded(name);
}

std::vector<const ModelVersion*> ModelRegistry::OrderedLocked() const {
  std::vector<const ModelVersion*> ordered;
  for (const auto& [name, entry] : versions_) ordered.push_back(&entry.version);
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

bool ModelRegistry::Contains(const std::string& version) const {
  absl::MutexLock lock(&mutex_);
  return versions_.count(version) > 0;
}

std::vector<std::string> ModelRegistry::LoadedVersions() const {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> names;
  for (const ModelVersion* v : OrderedLocked()) {
    if (v->model != nullptr) names.push_back(v->version);
  }
  return names;
}

void ModelRegistry::LetStoreDecide() {
  absl::MutexLock lock(&mutex_);
  store_decides_ = true;
  follow_latest_ = false;
}

bool ModelRegistry::follows_latest() const {
  absl::MutexLock lock(&mutex_);
  return follow_latest_;
}

bool ModelRegistry::empty() const {
  absl::MutexLock lock(&mutex_);
  return versions_.empty();
}

}  // namespace attn::server
