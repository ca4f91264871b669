#include "engine/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attn {

absl::Status ErrnoError(const std::string& path, std::string_view what, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrFormat("%s: %s failed: %s", path, what, std::strerror(err)));
}

int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(dir, "open", errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(dir, "fsync", err);
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileNoFollow(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is a symlink (not followed)"));
    }
    return ErrnoError(path, "open", err);
  }
  std::string data;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(path, "read", err);
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
    if (data.size() > max_bytes) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, " is larger than ", max_bytes, " bytes"));
    }
  }
  ::close(fd);
  return data;
}

absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset, size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError(path, "open", errno);
  std::string data(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, data.data() + done, size - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;  // 0: the file ends before the range does
      ::close(fd);
      return ErrnoError(path, "read", err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

absl::Status WriteFileDurably(const std::string& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError(path, "open", errno);
  int err = WriteAll(fd, data.data(), data.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (err != 0) {
    ::close(fd);
    return ErrnoError(path, "write", err);
  }
  if (::close(fd) != 0) return ErrnoError(path, "close", errno);
  return absl::OkStatus();
}

absl::Status ReplaceFileDurably(const std::string& path, const std::string& temp_path,
                                std::string_view data) {
  const int fd =
      ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError(temp_path, "open", errno);
  int err = WriteAll(fd, data.data(), data.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp_path.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp_path.c_str());
    return ErrnoError(path, "replace", err);
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return FsyncDir(dir.empty() ? "." : dir);
}

}  // namespace attn
