// TCP sockets for the bulk transport (common/bulk_wire.h): connect, listen
// and whole-message I/O, every wait bounded by a deadline. Sockets are
// non-blocking with TCP_NODELAY and keep-alive probes (kKeepAliveIdleS),
// and start with a receive buffer that holds a whole frame of a chunk; each
// call moves all its bytes or fails:
//   UNAVAILABLE        the peer closed the connection, or a socket error;
//   DEADLINE_EXCEEDED  the deadline passed first.
// Messages name `what` (e.g. "bulk connection to shard 1 at host:port").
#ifndef CSERPS_COMMON_SOCKET_IO_H_
#define CSERPS_COMMON_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cserps {

// Keep-alive: probes after this long idle, every kKeepAliveIntervalS, and
// the connection ends after kKeepAliveProbes unanswered ones.
inline constexpr int kKeepAliveIdleS = 60;
inline constexpr int kKeepAliveIntervalS = 10;
inline constexpr int kKeepAliveProbes = 6;

// An owned socket descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();

 private:
  int fd_ = -1;
};

// Listens on host:port (an address or a name; port 0 picks a free port);
// `*bound_port` receives the port. INVALID_ARGUMENT for a host that does
// not resolve.
absl::StatusOr<Socket> ListenTcp(const std::string& host, int port, int* bound_port);
// Accepts one connection; UNAVAILABLE when the listener was shut down.
absl::StatusOr<Socket> AcceptTcp(const Socket& listener);
absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, absl::Time deadline,
                                  absl::string_view what);

// Waits until `fd` is ready for `events` (poll's) or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what);

// Sends every byte of `iov` (modified: consumed as it is sent).
absl::Status SendAll(int fd, absl::Span<iovec> iov, absl::Time deadline,
                     absl::string_view what);
// Sends what the socket takes now, without waiting; returns the bytes sent.
absl::StatusOr<size_t> SendSome(int fd, absl::Span<iovec> iov, absl::string_view what);
// Fills every byte of `iov` (modified likewise).
absl::Status RecvAll(int fd, absl::Span<iovec> iov, absl::Time deadline,
                     absl::string_view what);
inline absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline,
                            absl::string_view what) {
  iovec one{data, size};
  return RecvAll(fd, absl::MakeSpan(&one, 1), deadline, what);
}
// As RecvAll, for a message that may be long in coming (the next request of
// a peer idle between them): no deadline until its first bytes come, then
// `rest` for the others, so a peer that stops halfway holds no reader.
absl::Status RecvNext(int fd, absl::Span<iovec> iov, absl::Duration rest,
                      absl::string_view what);

// Waits until the first `size` bytes the peer sent can be read, and copies
// them to `data`, leaving them to be read.
absl::Status PeekAll(int fd, void* data, size_t size, absl::Time deadline,
                     absl::string_view what);

// `iov` less its first `n` bytes (entries dropped or shortened in place).
absl::Span<iovec> SkipBytes(absl::Span<iovec> iov, size_t n);

// Splits "host:port" (the port a number in 0..65535); INVALID_ARGUMENT
// otherwise.
absl::Status SplitHostPort(absl::string_view address, std::string* host, int* port);

}  // namespace cserps

#endif  // CSERPS_COMMON_SOCKET_IO_H_
