#include "worker/group/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/private_directory.h"
#include "common/status.h"

namespace cserps {
namespace {

absl::Status Errno(int error, absl::string_view what) {
  return absl::ErrnoToStatus(error, what);
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path \"", path, "\" is ", path.size(), " bytes; a Unix socket's must be 1 to ",
        sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// Waits until `fd` has one of `events`; DEADLINE_EXCEEDED at `deadline`.
absl::StatusOr<short> Await(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    pollfd p{fd, events, 0};
    const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, absl::StrCat(what, ": poll"));
    }
    if (n > 0) return p.revents;
  }
}

int NewSocket() { return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); }

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Errno(errno, "fcntl(O_NONBLOCK)");
  }
  return absl::OkStatus();
}

}  // namespace

UnixSocket::UnixSocket(UnixSocket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

UnixSocket& UnixSocket::operator=(UnixSocket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

UnixSocket::~UnixSocket() { Close(); }

void UnixSocket::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<UnixSocket> UnixSocket::Connect(const std::string& path, absl::Time deadline) {
  ASSIGN_OR_RETURN(const sockaddr_un address, Address(path));
  // The listener may not be there yet: look again every few milliseconds.
  constexpr absl::Duration kRetry = absl::Milliseconds(10);
  while (true) {
    UnixSocket s(NewSocket());
    if (!s.valid()) return Errno(errno, "socket(AF_UNIX)");
    if (connect(s.fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
      RETURN_IF_ERROR(SetNonBlocking(s.fd_));
      return s;
    }
    const int error = errno;
    if (error != ENOENT && error != ECONNREFUSED && error != EAGAIN && error != EINTR) {
      return Errno(error, absl::StrCat("connect(", path, ")"));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("connect(", path, "): no listener there: ", std::strerror(error)));
    }
    absl::SleepFor(std::min(left, kRetry));
  }
}

absl::Status UnixSocket::Send(const void* data, size_t size, absl::Time deadline,
                              bool stop_if_readable, bool* stopped) {
  if (stopped != nullptr) *stopped = false;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const short events = POLLOUT | (stop_if_readable ? POLLIN : 0);
    ASSIGN_OR_RETURN(const short ready, Await(fd_, events, deadline, "send"));
    if (stop_if_readable && (ready & POLLIN) != 0) {
      if (stopped != nullptr) *stopped = true;
      return absl::OkStatus();
    }
    const ssize_t n = send(fd_, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        // The peer may have answered and closed since the poll: its answer
        // is still there to read, and says more than the close.
        pollfd p{fd_, POLLIN, 0};
        if (stop_if_readable && poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0) {
          if (stopped != nullptr) *stopped = true;
          return absl::OkStatus();
        }
        return absl::UnavailableError("send: the peer closed its end");
      }
      return Errno(errno, "send");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status UnixSocket::Receive(void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = recv(fd_, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("receive: the peer closed its end");
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return absl::UnavailableError("receive: the peer closed its end");
    if (errno != EAGAIN) return Errno(errno, "recv");
    RETURN_IF_ERROR(Await(fd_, POLLIN, deadline, "receive").status());
  }
  return absl::OkStatus();
}

UnixListener::UnixListener(UnixListener&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
  other.path_.clear();
}

UnixListener::~UnixListener() {
  if (fd_ < 0) return;
  close(fd_);
  if (!path_.empty()) unlink(path_.c_str());
}

absl::StatusOr<UnixListener> UnixListener::Listen(const std::string& path, int backlog) {
  ASSIGN_OR_RETURN(const sockaddr_un address, Address(path));
  RETURN_IF_ERROR(CreateParentDirectory(path));
  {
    UnixSocket probe(NewSocket());
    if (!probe.valid()) return Errno(errno, "socket(AF_UNIX)");
    if (connect(probe.fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, ": another process listens there already"));
    }
    if (errno == ECONNREFUSED) unlink(path.c_str());  // a crashed run's
  }
  const int fd = NewSocket();
  if (fd < 0) return Errno(errno, "socket(AF_UNIX)");
  UnixListener listener(fd, path);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    listener.path_.clear();  // not ours to remove
    return Errno(error, absl::StrCat("bind(", path, ")"));
  }
  if (listen(fd, backlog) != 0) return Errno(errno, absl::StrCat("listen(", path, ")"));
  RETURN_IF_ERROR(SetNonBlocking(fd));
  return listener;
}

absl::StatusOr<UnixSocket> UnixListener::Accept(absl::Time deadline) {
  while (true) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return UnixSocket(fd);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN) return Errno(errno, absl::StrCat("accept(", path_, ")"));
    RETURN_IF_ERROR(Await(fd_, POLLIN, deadline, absl::StrCat("accept(", path_, ")")).status());
  }
}

}  // namespace cserps
