// The model versions this server can serve, and which one answers by default. Versions are
// immutable (shared_ptr<const Model>): swapping the served version is one pointer store under a
// mutex, and requests keep the version they started with until they finish.
//
// Memory: each loaded version of the default model holds ~175 MB of weights (raw + packed for
// inference), so at most `max_loaded` versions stay in memory. A version can be *known* (listed,
// pinnable) without being *loaded*: versions found in the model store are registered lazily, and
// when more than `max_loaded` are loaded the least recently used one that is not served by default
// is unloaded (requests still running on it keep their shared_ptr). A request that pins an unloaded
// version loads it again through the Loader, on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model.h"
#include "server/core/serving_history.h"

namespace attn::server {

struct ModelVersion {
  std::string version;  // "base", or a fine-tuned version's name
  std::string origin;   // where it came from, for GetModelInfo / ListVersions
  // Null while the version is known but not in memory (only in List() results: Get() and the
  // serving listener always see a loaded version).
  std::shared_ptr<const Model> model;
  int64_t sequence = 0;            // commit order (the base is 0); orders listings and Rollback
  std::string created_utc;         // "2026-11-22T04:19:00Z"; empty for the base
  std::string description;         // free text given at commit
  std::vector<std::string> notes;  // the server's warnings about the fine-tuning job
};

class ModelRegistry {
 public:
  // Loads a known version's model (again). Called without the registry's main lock held, one
  // call at a time.
  using Loader =
      std::function<absl::StatusOr<std::shared_ptr<const Model>>(const ModelVersion& version)>;
  // max_loaded >= 1: versions kept in memory at once (the served one always is). Without a
  // loader nothing is ever unloaded (there would be no way back).
  explicit ModelRegistry(int max_loaded, Loader loader = nullptr);

  // Called with the newly served version whenever the default changes (also for the first
  // Add). Runs under the registry's lock, so calls arrive in the order of the changes; it must
  // not call back into the registry.
  using ServingListener = std::function<void(const ModelVersion&)>;
  void SetServingListener(ServingListener listener);
  // Called (under the lock, same rules) with each version's name when it is unloaded.
  using EvictionListener = std::function<void(const std::string& version)>;
  void SetEvictionListener(EvictionListener listener);

  // Adds (or replaces) a loaded version; the first one added becomes the served version.
  void Add(ModelVersion version);
  // Adds a new loaded version and, if `serve`, makes it the default in the same critical
  // section, so no request can see the new version without it being the default or vice
  // versa. AlreadyExists if the name is taken, except by a version that Discover() found in
  // the store (the same commit, seen by the store watcher first): that entry is replaced.
  absl::Status Publish(ModelVersion version, bool serve);
  // Registers a version committed to the model store (by this or another process) without
  // loading it (`version.model` may be null). If the registry follows the latest version (no
  // operator pinned an older one with SetServing/Rollback) and this one is newer than the
  // served one, it is loaded and served. Returns whether it is now served; AlreadyExists if the
  // name is known; the failed load (see below) if it had to be served and could not be loaded (it
  // stays registered, and a request pinning it retries the load).
  absl::StatusOr<bool> Discover(ModelVersion version);

  // Loading a known version that is not in memory can fail (its files are corrupted or gone);
  // every method that loads then returns FailedPrecondition (DataLoss if the loader says so)
  // naming the version and the loader's reason.
  //
  // Makes `version` the default, loading it if needed. NotFound if unknown. The registry then
  // follows the latest version again only if `version` is the newest.
  absl::Status SetServing(const std::string& version);
  // Serves again the version served by default before the served one (`version` empty: the top
  // of the serving history, serving_history.h), or `version`, which must have been served by
  // default before; a version committed staged and never promoted never was. Returns the newly
  // served version. FailedPrecondition if the history is empty or `version` was never served
  // (or is served now); NotFound if `version` is unknown. Afterwards the registry no longer
  // follows the latest version (newly discovered versions are listed, not served) until
  // SetServing picks the newest or Publish serves a new one.
  absl::StatusOr<ModelVersion> Rollback(const std::string& version);
  // Replaces the serving history with one rebuilt from the model store's record.
  void RestoreServingHistory(ServingHistory history);
  // The serving history now (the served version is in served_ever, not in served_before).
  ServingHistory serving_history() const;

  // Empty name = the served version. Loads the version if it is known but unloaded (see above
  // for a failed load). NotFound (naming the available versions) if unknown; Unavailable if
  // nothing is loaded yet.
  absl::StatusOr<ModelVersion> Get(const std::string& version);
  // Names in commit order (the base first).
  std::vector<std::string> Versions() const;
  // Every version in commit order (model null where unloaded), and the served one's name.
  std::vector<ModelVersion> List(std::string* serving) const;
  bool Contains(const std::string& version) const;
  // Names of the versions in memory now, in commit order.
  std::vector<std::string> LoadedVersions() const;
  bool follows_latest() const;
  // From now on the default changes only when told (SetServing, Rollback, Publish with serve):
  // the model store records which version is served (engine/serving_state.h), so a newly
  // discovered version, however new, is listed, never served on its own.
  void LetStoreDecide();
  bool empty() const;

 private:
  struct Entry {
    ModelVersion version;
    uint64_t last_used = 0;   // use_clock_ at the last Get/Add/Publish; orders eviction
    bool discovered = false;  // registered by Discover() from the store
  };

  std::vector<const ModelVersion*> OrderedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status NotFoundLocked(const std::string& version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool IsNewestLocked(const std::string& version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Makes `version` the default; the one served until then goes on top of the history unless
  // this is a rollback (which takes versions off it).
  void SetServingLocked(const std::string& version, bool rollback = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The version Rollback(`version`) serves, or why there is none.
  absl::StatusOr<std::string> RollbackTargetLocked(const std::string& version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Unloads least recently used versions (never the served one) until at most max_loaded_
  // remain; the unloaded models go to *released so they are freed after the lock is dropped.
  void EvictLocked(std::vector<std::shared_ptr<const Model>>* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Makes sure `version` is loaded and returns it (marked as just used).
  absl::StatusOr<ModelVersion> EnsureLoaded(const std::string& version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mutex_) ABSL_LOCKS_EXCLUDED(mutex_);

  const int max_loaded_;
  const Loader loader_;
  // Held across every change of which versions exist or are loaded (loads, evictions, adds,
  // serving changes), so a version loaded for serving cannot be evicted before it is served.
  // Taken before mutex_. Get() of a loaded version never takes it.
  absl::Mutex load_mutex_ ABSL_ACQUIRED_BEFORE(mutex_);
  mutable absl::Mutex mutex_;
  std::map<std::string, Entry> versions_ ABSL_GUARDED_BY(mutex_);
  std::string serving_ ABSL_GUARDED_BY(mutex_);
  ServingHistory history_ ABSL_GUARDED_BY(mutex_);
  bool follow_latest_ ABSL_GUARDED_BY(mutex_) = true;
  bool store_decides_ ABSL_GUARDED_BY(mutex_) = false;
  uint64_t use_clock_ ABSL_GUARDED_BY(mutex_) = 0;
  ServingListener listener_ ABSL_GUARDED_BY(mutex_);
  EvictionListener eviction_listener_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace attn::server
