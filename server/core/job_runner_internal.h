// What the job runner's files share (job_runner.cc, job_store.cc, job_upload.cc): the names of
// the files a job keeps in the model store (layout in job_runner.h) and a job as the runner holds
// it in memory. Not for use outside them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/job_runner.h"

namespace attn::server::core {

namespace job_files {

inline constexpr char kUploadPrefix[] = ".upload-";
inline constexpr char kRecordFile[] = "job.json";
inline constexpr char kRecordTempFile[] = ".job.json.tmp";
inline constexpr char kSpecFile[] = "spec.bin";
inline constexpr char kDatasetFile[] = "dataset.bin";
inline constexpr char kEventsFile[] = "events.bin";
// job.json is a few KB; spec.bin at most a request.
inline constexpr size_t kMaxRecordBytes = 1 << 20;
inline constexpr size_t kMaxSpecBytes = size_t{256} << 20;

}  // namespace job_files

using JobClock = std::chrono::steady_clock;

// "1 step", "3 steps".
inline std::string Plural(int64_t n, const char* word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

struct JobRunner::Job {
  JobRecord record;
  FineTuneConfig config;  // pending: what to run (jobs never resume after a restart)
  std::vector<uint32_t> event_offsets = {0};  // each event's start in events.bin, then its end
  bool history_full = false;
  bool committing = false;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::vector<Stopped> on_stopped;
  std::vector<std::weak_ptr<std::function<void()>>> listeners;
  JobClock::time_point persisted;
  int64_t order = 0;  // creation order, for jobs created within the same second

  int64_t events() const { return static_cast<int64_t>(event_offsets.size()) - 1; }
};

}  // namespace attn::server::core
