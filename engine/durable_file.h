// File writes that survive a crash or power loss, for the model store: data fsynced before it
// is renamed into place, directories fsynced after the entries in them change; and the store's
// reads that never follow a symlink out of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attn {

// The errno's status code, with a message naming the file, the operation and strerror.
absl::Status ErrnoError(const std::string& path, std::string_view what, int err);

// Writes all of `data` to `fd` (retrying short writes and EINTR); 0 or the errno.
int WriteAll(int fd, const char* data, size_t size);

// fsync on a directory makes the entries created in it (files, renames) durable.
absl::Status FsyncDir(const std::string& dir);

// A file of at most `max_bytes` (DATA_LOSS beyond), read whole without following a symlink at
// its last component (FAILED_PRECONDITION naming it).
absl::StatusOr<std::string> ReadFileNoFollow(const std::string& path, size_t max_bytes);
// `size` bytes of `path` from `offset` (never following a symlink); a file that ends first is
// an error naming it.
absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size);

// Writes a new file (O_EXCL: fails if it exists; never follows a symlink) and fsyncs it.
absl::Status WriteFileDurably(const std::string& path, std::string_view data);

// Replaces `path` with `data` atomically: writes `temp_path` (same directory; truncated if it
// exists), fsyncs it, renames it over `path`, fsyncs the directory. Readers see the old file or
// the new one. On error `path` is untouched and `temp_path` removed.
absl::Status ReplaceFileDurably(const std::string& path, const std::string& temp_path,
                                std::string_view data);

}  // namespace attn
