#include "common/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace cserps {
namespace {

// What a new connection's receive buffer holds at once: a request or reply
// of a whole chunk (1 MiB by default) and its header.
constexpr int kFrameWindowBytes = 2 << 20;

absl::Status Errno(absl::string_view what, absl::string_view call) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", call, ": ", std::strerror(errno)));
}

// Readable, for poll, once `bytes` are (or the peer has ended).
void SetLowWaterMark(int fd, int bytes) {
  setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
}

absl::Status Configure(int fd, absl::string_view what) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Errno(what, "fcntl");
  }
  int one = 1;
  // Frames are written whole (one sendmsg each); Nagle would only hold back
  // the last segment of every one.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Linux starts a receive buffer at 128 KiB and grows it as it learns the
  // rate: until then a frame near that size closed the window on every
  // round, and waited for its reader to open it again. A low-water mark
  // raises the buffer to hold that many bytes while leaving it free to grow
  // (SO_RCVBUF would fix its size); the mark itself goes back to 1.
  SetLowWaterMark(fd, kFrameWindowBytes);
  SetLowWaterMark(fd, 1);
  // A peer whose host vanishes without closing (power, cable, a dropped
  // route) would hold an idle reader forever: keep-alive probes end such a
  // connection within about two minutes.
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepAliveIdleS, sizeof(kKeepAliveIdleS));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepAliveIntervalS, sizeof(kKeepAliveIntervalS));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepAliveProbes, sizeof(kKeepAliveProbes));
  return absl::OkStatus();
}

}  // namespace

absl::Span<iovec> SkipBytes(absl::Span<iovec> iov, size_t n) {
  while (!iov.empty() && n >= iov.front().iov_len) {
    n -= iov.front().iov_len;
    iov.remove_prefix(1);
  }
  if (n > 0) {
    iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + n;
    iov.front().iov_len -= n;
  }
  // Empty entries would make a later call move 0 bytes and look like EOF.
  while (!iov.empty() && iov.front().iov_len == 0) iov.remove_prefix(1);
  return iov;
}

namespace {

size_t TotalBytes(absl::Span<const iovec> iov) {
  size_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  return total;
}

msghdr Message(absl::Span<iovec> iov) {
  msghdr m{};
  m.msg_iov = iov.data();
  m.msg_iovlen = std::min<size_t>(iov.size(), IOV_MAX);
  return m;
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

absl::Status Resolve(const std::string& host, int port, bool passive, AddrInfoList* out,
                     absl::string_view what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                             &hints, &out->head);
  if (rc != 0) {
    // A name to listen on that does not resolve is a bad argument; one to
    // connect to may come back.
    return absl::Status(
        passive ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnavailable,
        absl::StrCat(what, ": cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return absl::OkStatus();
}

// Tries the addresses of host:port in turn, each on a fresh socket of its
// family, with use(socket, address); the first socket it accepts, else the
// last error.
template <typename Use>
absl::StatusOr<Socket> OnFirstAddress(const std::string& host, int port, bool passive,
                                      absl::string_view what, Use use) {
  AddrInfoList list;
  if (absl::Status s = Resolve(host, port, passive, &list, what); !s.ok()) return s;
  absl::Status last = absl::UnavailableError(absl::StrCat(what, ": no address"));
  for (addrinfo* a = list.head; a != nullptr; a = a->ai_next) {
    Socket s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    last = s.valid() ? use(s, *a) : Errno(what, "socket");
    if (last.ok()) return s;
  }
  return last;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

absl::Status SplitHostPort(absl::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int parsed = -1;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &parsed) || parsed < 0 ||
      parsed > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  *port = parsed;
  return absl::OkStatus();
}

absl::StatusOr<Socket> ListenTcp(const std::string& host, int port, int* bound_port) {
  const std::string what = absl::StrCat("listen on ", host, ":", port);
  return OnFirstAddress(host, port, /*passive=*/true, what, [&](const Socket& s,
                                                                const addrinfo& a) {
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s.fd(), a.ai_addr, a.ai_addrlen) != 0) return Errno(what, "bind");
    if (listen(s.fd(), SOMAXCONN) != 0) return Errno(what, "listen");
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &len);
    *bound_port = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return absl::OkStatus();
  });
}

absl::StatusOr<Socket> AcceptTcp(const Socket& listener) {
  for (;;) {
    const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket s(fd);
      if (absl::Status ok = Configure(fd, "accepted connection"); !ok.ok()) return ok;
      return s;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return Errno("bulk listener", "accept");
  }
}

absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": deadline exceeded waiting for the peer"));
      }
      // A deadline centuries away is finite, and its milliseconds saturate
      // at INT64_MAX, to which one more must not be added.
      timeout_ms = left >= absl::Milliseconds(INT_MAX)
                       ? INT_MAX
                       : static_cast<int>(absl::ToInt64Milliseconds(left) + 1);
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, timeout_ms);
    if (r > 0) return absl::OkStatus();  // errors show in the next call
    if (r < 0 && errno != EINTR) return Errno(what, "poll");
  }
}

absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, absl::Time deadline,
                                  absl::string_view what) {
  return OnFirstAddress(host, port, /*passive=*/false, what, [&](const Socket& s,
                                                                 const addrinfo& a) {
    if (absl::Status ok = Configure(s.fd(), what); !ok.ok()) return ok;
    if (connect(s.fd(), a.ai_addr, a.ai_addrlen) == 0) return absl::OkStatus();
    if (errno != EINPROGRESS) return Errno(what, "connect");
    if (absl::Status ready = WaitFor(s.fd(), POLLOUT, deadline, what); !ready.ok()) {
      return ready;
    }
    int error = 0;
    socklen_t len = sizeof(error);
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error == 0) return absl::OkStatus();
    errno = error;
    return Errno(what, "connect");
  });
}

absl::Status SendAll(int fd, absl::Span<iovec> iov, absl::Time deadline,
                     absl::string_view what) {
  iov = SkipBytes(iov, 0);
  while (!iov.empty()) {
    msghdr m = Message(iov);
    const ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      iov = SkipBytes(iov, static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status ok = WaitFor(fd, POLLOUT, deadline, what); !ok.ok()) return ok;
    } else if (errno != EINTR) {
      return Errno(what, "send");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> SendSome(int fd, absl::Span<iovec> iov, absl::string_view what) {
  size_t total = 0;
  iov = SkipBytes(iov, 0);
  while (!iov.empty()) {
    msghdr m = Message(iov);
    const ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      total += static_cast<size_t>(n);
      iov = SkipBytes(iov, static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else if (errno != EINTR) {
      return Errno(what, "send");
    }
  }
  return total;
}

namespace {

// RecvAll's loop; once some bytes came, the rest are due `once_begun` after
// the first wait for them.
absl::Status Recv(int fd, absl::Span<iovec> iov, absl::Time deadline,
                  absl::Duration once_begun, absl::string_view what) {
  iov = SkipBytes(iov, 0);
  const size_t want = TotalBytes(iov);
  size_t got = 0;
  while (!iov.empty()) {
    msghdr m = Message(iov);
    const ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      iov = SkipBytes(iov, static_cast<size_t>(n));
    } else if (n == 0) {
      return absl::UnavailableError(
          got == 0 ? absl::StrCat(what, ": connection closed by the peer")
                   : absl::StrCat(what, ": connection closed by the peer after ", got,
                                  " of ", want, " bytes"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (got > 0 && once_begun != absl::InfiniteDuration()) {
        deadline = std::min(deadline, absl::Now() + once_begun);
        once_begun = absl::InfiniteDuration();
      }
      if (absl::Status ok = WaitFor(fd, POLLIN, deadline, what); !ok.ok()) {
        if (got == 0 || !absl::IsDeadlineExceeded(ok)) return ok;
        return absl::DeadlineExceededError(absl::StrCat(
            what, ": deadline exceeded waiting for the peer after ", got, " of ", want,
            " bytes"));
      }
    } else if (errno != EINTR) {
      return Errno(what, "recv");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RecvAll(int fd, absl::Span<iovec> iov, absl::Time deadline,
                     absl::string_view what) {
  return Recv(fd, iov, deadline, absl::InfiniteDuration(), what);
}

absl::Status RecvNext(int fd, absl::Span<iovec> iov, absl::Duration rest,
                      absl::string_view what) {
  return Recv(fd, iov, absl::InfiniteFuture(), rest, what);
}

absl::Status PeekAll(int fd, void* data, size_t size, absl::Time deadline,
                     absl::string_view what) {
  ssize_t before_wait = -1;
  for (;;) {
    const ssize_t n = recv(fd, data, size, MSG_PEEK | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat(what, ": connection closed by the peer"));
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Errno(what, "recv");
    }
    // Woken with no more bytes than before: only the peer's end does that.
    if (n > 0 && n == before_wait) {
      return absl::UnavailableError(absl::StrCat(what, ": connection closed by the peer after ",
                                                 n, " of ", size, " bytes"));
    }
    before_wait = n;
    // Fewer bytes than asked keep the socket readable: a low-water mark of
    // `size` makes poll wait for the rest (or the peer's end).
    const bool some = n > 0;
    if (some) SetLowWaterMark(fd, static_cast<int>(size));
    const absl::Status ready = WaitFor(fd, POLLIN, deadline, what);
    if (some) SetLowWaterMark(fd, 1);
    RETURN_IF_ERROR(ready);
  }
}

}  // namespace cserps
