#include "engine/serving_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/durable_file.h"
#include "engine/model_store.h"
#include "engine/quote.h"
#include "nlohmann/json.hpp"

namespace attn {
namespace {

using Json = nlohmann::json;
constexpr int kFormatVersion = 1;
// A history of kMaxServingHistory entries is ~2 MB; anything far larger is not ours.
constexpr std::uintmax_t kMaxStateBytes = 16 << 20;

std::string Path(const std::string& store_dir, const char* name) {
  return (std::filesystem::path(store_dir) / name).string();
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

absl::StatusOr<ServingState> Parse(const std::string& path, const std::string& text) {
  auto malformed = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return malformed("not a JSON object");
  if (!json.contains("serving") || !json["serving"].is_string()) {
    return malformed("no \"serving\" string");
  }
  ServingState state;
  state.serving = json["serving"].get<std::string>();
  if (state.serving != "base") {
    if (absl::Status valid = ValidateVersionName(state.serving); !valid.ok()) {
      return malformed(
          absl::StrCat("\"serving\" ", QuoteInput(state.serving), ": ", valid.message()));
    }
  }
  if (json.contains("history")) {
    if (!json["history"].is_array()) return malformed("\"history\" is not a list");
    for (const Json& entry : json["history"]) {
      if (!entry.is_object()) return malformed("a \"history\" entry is not an object");
      ServingChange change;
      for (auto [key, field] : {std::pair{"at", &change.at},
                                {"action", &change.action},
                                {"from", &change.from},
                                {"to", &change.to},
                                {"by", &change.by},
                                {"committed", &change.committed}}) {
        if (entry.contains(key) && entry[key].is_string()) *field = entry[key].get<std::string>();
      }
      state.history.push_back(std::move(change));
    }
  }
  return state;
}

std::string Serialize(const ServingState& state) {
  Json history = Json::array();
  for (const ServingChange& c : state.history) {
    Json entry = {{"at", c.at}, {"action", c.action}, {"from", c.from}, {"to", c.to}, {"by", c.by}};
    if (!c.committed.empty()) entry["committed"] = c.committed;
    history.push_back(std::move(entry));
  }
  return Json{{"format_version", kFormatVersion},
              {"serving", state.serving},
              {"history", std::move(history)}}
             .dump(2) +
         "\n";
}

// flock(2) on <store>/.serving.lock for as long as it lives.
class StoreLock {
 public:
  explicit StoreLock(const std::string& store_dir) : path_(Path(store_dir, kServingLockFile)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) {
      status_ = ErrnoError(path_, "open", errno);
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        status_ = ErrnoError(path_, "flock", errno);
        return;
      }
    }
  }
  ~StoreLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  std::string path_;
  int fd_ = -1;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<ServingState> ReadServingState(const std::string& store_dir) {
  const std::string path = Path(store_dir, kServingStateFile);
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return ErrnoError(path, "stat", ec.value());
  }
  if (size > kMaxStateBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes, more than the ",
                                            kMaxStateBytes, " a serving state can take"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return ErrnoError(path, "read", errno);
  return Parse(path, text.str());
}

absl::StatusOr<ServingState> RecordServingChange(const std::string& store_dir,
                                                 ServingChange change) {
  StoreLock lock(store_dir);
  if (!lock.status().ok()) return lock.status();
  absl::StatusOr<ServingState> state = ReadServingState(store_dir);
  if (!state.ok() && state.status().code() != absl::StatusCode::kNotFound) return state.status();
  if (state.ok()) {
    change.from = state->serving;
  } else {
    state = ServingState{};
  }
  if (change.to.empty()) change.to = change.from;
  if (change.at.empty()) change.at = UtcNow();
  state->serving = change.to;
  state->history.push_back(std::move(change));
  if (state->history.size() > kMaxServingHistory) {
    state->history.erase(state->history.begin(),
                         state->history.end() - static_cast<std::ptrdiff_t>(kMaxServingHistory));
  }
  if (absl::Status written = ReplaceFileDurably(
          Path(store_dir, kServingStateFile), Path(store_dir, kServingTempFile), Serialize(*state));
      !written.ok()) {
    return written;
  }
  return state;
}

}  // namespace attn
