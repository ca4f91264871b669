// Which version a model store serves by default, recorded in the store so that it survives
// restarts and replicas sharing the store (--watch-store) follow it:
//
//   <store>/serving.json   {"format_version": 1, "serving": "ft-000002-...",
//                           "history": [{"at": "2026-11-24T21:00:00Z", "action": "rollback",
//                                        "from": "ft-000002-...", "to": "ft-000001-...",
//                                        "by": "host pid 123, client ipv4:127.0.0.1:5555"}, ...]}
//   <store>/.serving.lock  flock(2) held while serving.json is read, changed and replaced
//
// serving.json is replaced in one rename() of a complete, fsynced file (then the store directory
// is fsynced), so a reader sees the old state or the new one, also after kill -9 or power loss.
// A store without serving.json (one nobody has promoted or rolled back in) has no recorded
// choice: servers then serve the newest committed version, as before the file existed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attn {

inline constexpr char kServingStateFile[] = "serving.json";
inline constexpr char kServingLockFile[] = ".serving.lock";
inline constexpr char kServingTempFile[] = ".serving.json.tmp";
// History entries kept (the oldest are dropped beyond it): a year of hourly promotions fits,
// and the file stays small enough to read on every watcher poll.
inline constexpr size_t kMaxServingHistory = 10000;

struct ServingChange {
  std::string at;         // UTC, "2026-11-24T21:00:00Z" (filled in when recorded if empty)
  std::string action;     // "promote", "rollback", "set-serving", "commit", "commit-staged"
  std::string from;       // the version the store served before (recorded: the caller's guess is
                          // replaced by the store's state when it has one)
  std::string to;         // the version served after; "" = unchanged (a commit that does not serve)
  std::string committed;  // the version a commit published ("" for other actions)
  std::string by;         // who asked: the server's host and pid, the client's address
};

struct ServingState {
  std::string serving;
  std::vector<ServingChange> history;  // oldest first
};

// NotFound if the store has no serving.json; DataLoss naming the problem if it is not ours
// (malformed JSON, missing fields, a serving name that is not a valid version name).
absl::StatusOr<ServingState> ReadServingState(const std::string& store_dir);

// Records `change` (change.to becomes the serving version; change.from is set to what the store
// served, so each entry's `from` is the `to` before it) under the store's lock: reads the
// current state, appends, writes a temp file, fsyncs it, renames it over serving.json and
// fsyncs the store directory. On any error serving.json is as before. Returns the new state.
absl::StatusOr<ServingState> RecordServingChange(const std::string& store_dir,
                                                 ServingChange change);

}  // namespace attn
