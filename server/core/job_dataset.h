// A server-side job's dataset: bytes uploaded in chunks, checked while they arrive, stored in the
// model store and read back example by example when the job runs.
//
// The bytes are examples (the front end's encoded TrainingExample, opaque here), each preceded
// by its size as a base-128 varint: protobuf's "delimited" format, which any protobuf library
// writes. The same framing holds a job's events (job_runner.h). Pure and tested without a
// server: chunk order, declared size and example count, the per-example size limit, the SHA-256.
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/fine_tune_job.h"
#include "server/core/job_record.h"

namespace attn::server::core {

// The largest chunk a client may send (CreateJobResponse.max_chunk_bytes) and the largest
// example a dataset may hold: what one upload holds in memory at most, twice.
inline constexpr int64_t kMaxChunkBytes = 1 << 20;
inline constexpr int64_t kMaxExampleBytes = 1 << 20;

// Appends `message` with its varint size in front.
void AppendDelimited(std::string_view message, std::string* out);
// Reads a varint at `data`; its value and length in bytes, or 0 bytes when `data` ends first (or
// the varint is longer than 10 bytes: *malformed).
size_t ReadVarint(std::string_view data, uint64_t* value, bool* malformed);

// Incremental SHA-256 (OpenSSL).
class Sha256 {
 public:
  Sha256();
  void Update(std::string_view data);
  // 64 lowercase hex digits; call once.
  std::string HexDigest();

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context_;
};

// Checks an upload as it arrives against what its spec declared (DatasetInfo): chunks numbered
// 0, 1, 2, ... each of 1 to kMaxChunkBytes bytes, never more bytes than declared, every example
// within kMaxExampleBytes and accepted by `check_example` (which gets its bytes and 0-based
// index); at the end, exactly the declared bytes and examples with the declared SHA-256.
// Errors are INVALID_ARGUMENT saying what to fix, e.g. "chunk 3 arrived where chunk 2 was
// expected". Holds at most one unfinished example's bytes.
class DatasetReceiver {
 public:
  using CheckExample = std::function<absl::Status(std::string_view example, int64_t index)>;
  DatasetReceiver(DatasetInfo declared, CheckExample check_example);

  absl::Status Add(int64_t index, std::string_view data);
  // All declared bytes arrived.
  bool complete() const { return received_ == declared_.bytes; }
  // After the last chunk: the example count and the SHA-256.
  absl::Status Finish();

  int64_t received() const { return received_; }
  int64_t chunks() const { return next_chunk_; }

 private:
  const DatasetInfo declared_;
  const CheckExample check_example_;
  Sha256 sha256_;
  int64_t next_chunk_ = 0;
  int64_t received_ = 0;
  int64_t examples_ = 0;
  std::string partial_;  // the start of an example whose end has not arrived yet
};

// The examples of a stored dataset file: its SHA-256 checked against `expected` and each
// example's place found (DATA_LOSS naming the file when it does not match, so a damaged dataset
// never trains anything). Holds 4 bytes per example; reads one at a time.
class DatasetFile {
 public:
  static absl::StatusOr<DatasetFile> Open(const std::string& path, const DatasetInfo& expected);

  int64_t size() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  // Example `index`'s bytes (without its size).
  absl::StatusOr<std::string> Read(int64_t index) const;

 private:
  std::string path_;
  std::vector<uint32_t> offsets_;  // each example's start, then the file's end
};

// Reads the delimited records of `data` from its start: the offset of each one that is complete
// (and the end of the last), so a file cut short by a crash can be truncated there. False when
// `data` is malformed before its end.
bool DelimitedOffsets(std::string_view data, int64_t max_record_bytes,
                      std::vector<uint32_t>* offsets);

// What a dataset example must be for a job of `settings`, checked at upload (before any work):
// the texts its objective uses present, the fields of other objectives unset, a label in
// [0, num_labels), a gold score in [-1, 1]; a contrastive dataset's hard negatives on every
// example or none (`has_negatives`: the first example's choice). INVALID_ARGUMENT "dataset
// example 12: anchor is empty".
absl::Status CheckJobExample(const TrainingExample& example, const JobSettings& settings,
                             int64_t index, bool has_negatives);

}  // namespace attn::server::core
