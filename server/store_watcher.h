// Polls the model store for versions another process committed and registers them (the
// registry serves the newest unless an operator pinned an older one). Commits appear in the
// store with one rename of a complete directory, and ListStore ignores temp dirs, so a poll
// never sees half a version.
#pragma once

#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "server/core/model_registry.h"

namespace attn::server {

class StoreWatcher {
 public:
  // Starts polling `store` every `interval_s` seconds.
  StoreWatcher(std::string store, double interval_s, ModelRegistry* registry);
  ~StoreWatcher();

  // Stops and joins the polling thread. Idempotent.
  void Stop();

 private:
  void Loop();
  void Poll();
  // Each distinct problem is logged once, not at every poll.
  void Warn(const std::string& message);

  const std::string store_;
  const double interval_s_;
  ModelRegistry* const registry_;
  std::set<std::string> warned_;  // used by the watcher thread only
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace attn::server
