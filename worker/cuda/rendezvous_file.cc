#include "worker/cuda/rendezvous_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/private_directory.h"
#include "common/status.h"

namespace cserps {
namespace {

absl::Status ErrnoError(int error, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

// Reads the whole of `fd`.
absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  std::string bytes;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "read");
    }
    if (n == 0) return bytes;
    bytes.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

absl::Status PublishRendezvousFile(const std::string& path, absl::string_view bytes) {
  RETURN_IF_ERROR(CreateParentDirectory(path));
  // A temporary name of this process, in the same directory, so that the
  // rename is atomic and two writers cannot interleave.
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, tmp, "open");
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError(error, tmp, "write");
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int error = errno;
    unlink(tmp.c_str());
    return ErrnoError(error, tmp, "close");
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(tmp.c_str());
    return ErrnoError(error, path, absl::StrCat("rename from ", tmp));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> AwaitRendezvousFile(const std::string& path, size_t size,
                                                RendezvousWaitOptions options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  while (true) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      absl::StatusOr<std::string> bytes = ReadAll(fd, path);
      close(fd);
      if (!bytes.ok()) return bytes.status();
      if (bytes->size() != size) {
        return absl::DataLossError(absl::StrCat(
            path, ": holds ", bytes->size(), " bytes, expected ", size,
            " (not written by this job's local rank 0? remove it)"));
      }
      return bytes;
    }
    if (errno != ENOENT) return ErrnoError(errno, path, "open");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          path, ": did not appear within ", absl::FormatDuration(options.timeout),
          " (has local rank 0 of this node started, with the same group directory?)"));
    }
    absl::SleepFor(options.poll_interval);
  }
}

absl::Status RemoveRendezvousFile(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, path, "unlink");
  }
  return absl::OkStatus();
}

}  // namespace cserps
