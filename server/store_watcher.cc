#include "server/store_watcher.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/log.h"
#include "engine/model_store.h"
#include "engine/serving_state.h"
#include "server/core/store_versions.h"

namespace attn::server {

StoreWatcher::StoreWatcher(std::string store, double interval_s, ModelRegistry* registry)
    : store_(std::move(store)), interval_s_(interval_s), registry_(registry) {
  thread_ = std::thread([this] { Loop(); });
}

StoreWatcher::~StoreWatcher() { Stop(); }

void StoreWatcher::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StoreWatcher::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      mutex_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(interval_s_));
      if (stopping_) return;
    }
    Poll();
  }
}

void StoreWatcher::Poll() {
  std::vector<std::string> skipped;
  absl::StatusOr<std::vector<StoredVersion>> versions = ListStore(store_, &skipped);
  if (!versions.ok()) {
    Warn(absl::StrCat("cannot list: ", versions.status().message()));
    return;
  }
  for (const std::string& reason : skipped) Warn(reason);  // "'name' skipped: why"
  // Before any new version is discovered: a store that records what it serves decides (a
  // staged commit records it before its directory appears, so the listing above saw either
  // both or the record alone), and a staged version is never served as the newest one.
  if (ReadServingState(store_).ok()) registry_->LetStoreDecide();
  for (const StoredVersion& stored : *versions) {
    if (registry_->Contains(stored.version)) continue;
    absl::StatusOr<bool> served = registry_->Discover(UnloadedVersion(stored));
    if (!served.ok()) {
      if (served.status().code() != absl::StatusCode::kAlreadyExists) {
        Warn(absl::StrCat("version ", stored.version, ": ", served.status().message()));
      }
      continue;
    }
    Log(LogLevel::kInfo, "model store %s: found new version %s%s", store_, stored.version,
        *served ? "; now served by default"
                : (registry_->follows_latest() ? "" : " (not served by default)"));
    // A version staged on the trainer is usually promoted next: load it now, so that the
    // promotion this replica sees on a later poll swaps a pointer instead of waiting seconds for
    // the weights (at most --max-loaded-versions stay in memory; the served one is never
    // unloaded).
    if (!*served) {
      if (absl::StatusOr<ModelVersion> loaded = registry_->Get(stored.version); !loaded.ok()) {
        Warn(absl::StrCat("version ", stored.version, ": ", loaded.status().message()));
      }
    }
  }
  // Promotions and rollbacks made by the replica that trains, as the store records them.
  if (absl::StatusOr<bool> applied = ApplyRecordedServing(store_, registry_); !applied.ok()) {
    Warn(std::string(applied.status().message()));
  }
}

void StoreWatcher::Warn(const std::string& message) {
  if (warned_.insert(message).second) {
    Log(LogLevel::kWarning, "model store %s: %s", store_, message);
  }
}

}  // namespace attn::server
