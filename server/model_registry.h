// The model versions this server can serve, and which one answers by default. Versions are
// immutable (shared_ptr<const Model>): swapping the served version is one pointer store under a
// mutex, and requests keep the version they started with until they finish.
#pragma once

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
  std::string origin;   // where it came from, for GetModelInfo
  std::shared_ptr<const Model> model;
};

class ModelRegistry {
 public:
  // Adds (or replaces) a version; the first one added becomes the served version.
  void Add(ModelVersion version);
  // Makes `version` the default. NotFound if unknown.
  absl::Status SetServing(const std::string& version);

  // Empty name = the served version. NotFound (naming the available versions) if unknown;
  // Unavailable if nothing is loaded yet.
  absl::StatusOr<ModelVersion> Get(const std::string& version) const;
  std::vector<std::string> Versions() const;
  bool empty() const;

 private:
  mutable absl::Mutex mutex_;
  std::map<std::string, ModelVersion> versions_ ABSL_GUARDED_BY(mutex_);
  std::string serving_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace attn::server
