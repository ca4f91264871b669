// The model versions this server can serve, and which one answers by default. Versions are
// immutable (shared_ptr<const Model>): swapping the served version is one pointer store under a
// mutex, and requests keep the version they started with until they finish.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model.h"

namespace attn::server {

struct ModelVersion {
  std::string version;  // "base", or a fine-tuned version's name
  std::string origin;   // where it came from, for GetModelInfo / ListVersions
  std::shared_ptr<const Model> model;
  int64_t sequence = 0;     // commit order (the base is 0); orders listings and Rollback
  std::string created_utc;  // "2026-11-22T04:19:00Z"; empty for the base
  std::string description;  // free text given at commit
};

class ModelRegistry {
 public:
  // Called with the newly served version whenever the default changes (also for the first
  // Add). Runs under the registry's lock, so calls arrive in the order of the changes; it must
  // not call back into the registry.
  using ServingListener = std::function<void(const ModelVersion&)>;
  void SetServingListener(ServingListener listener);

  // Adds (or replaces) a version; the first one added becomes the served version.
  void Add(ModelVersion version);
  // Adds a new version and, if `serve`, makes it the default in the same critical section, so
  // no request can see the new version without it being the default or vice versa.
  // AlreadyExists if the name is taken.
  absl::Status Publish(ModelVersion version, bool serve);
  // Makes `version` the default. NotFound if unknown.
  absl::Status SetServing(const std::string& version);
  // Serves the version before the served one in commit order (`version` empty), or `version`,
  // which must be older than the served one. Returns the newly served version.
  // FailedPrecondition if there is nothing older; NotFound if `version` is unknown.
  absl::StatusOr<ModelVersion> Rollback(const std::string& version);

  // Empty name = the served version. NotFound (naming the available versions) if unknown;
  // Unavailable if nothing is loaded yet.
  absl::StatusOr<ModelVersion> Get(const std::string& version) const;
  // Names in commit order (the base first).
  std::vector<std::string> Versions() const;
  // Every version in commit order, and the served one's name.
  std::vector<ModelVersion> List(std::string* serving) const;
  bool empty() const;

 private:
  std::vector<const ModelVersion*> OrderedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void SetServingLocked(const std::string& version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  mutable absl::Mutex mutex_;
  std::map<std::string, ModelVersion> versions_ ABSL_GUARDED_BY(mutex_);
  std::string serving_ ABSL_GUARDED_BY(mutex_);
  ServingListener listener_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace attn::server
