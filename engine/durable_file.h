// File writes that survive a crash or power loss, for the model store: data fsynced before it
// is renamed into place, directories fsynced after the entries in them change.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace attn {

// The errno's status code, with a message naming the file, the operation and strerror.
absl::Status ErrnoError(const std::string& path, std::string_view what, int err);

// Writes all of `data` to `fd` (retrying short writes and EINTR); 0 or the errno.
int WriteAll(int fd, const char* data, size_t size);

// fsync on a directory makes the entries created in it (files, renames) durable.
absl::Status FsyncDir(const std::string& dir);

// Writes a new file (O_EXCL: fails if it exists; never follows a symlink) and fsyncs it.
absl::Status WriteFileDurably(const std::string& path, std::string_view data);

// Replaces `path` with `data` atomically: writes `temp_path` (same directory; truncated if it
// exists), fsyncs it, renames it over `path`, fsyncs the directory. Readers see the old file or
// the new one. On error `path` is untouched and `temp_path` removed.
absl::Status ReplaceFileDurably(const std::string& path, const std::string& temp_path,
                                std::string_view data);

}  // namespace attn
