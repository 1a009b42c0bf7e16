// A connected Unix-domain stream socket between processes of one machine,
// non-blocking underneath, with every wait bounded by a deadline: the
// transport of SocketGroup (socket_group.h). Errors are statuses that name
// the operation: UNAVAILABLE when the peer has closed its end,
// DEADLINE_EXCEEDED when the deadline passes, the errno's code otherwise.
// Writes never raise SIGPIPE.
#ifndef CSERPS_WORKER_GROUP_UNIX_SOCKET_H_
#define CSERPS_WORKER_GROUP_UNIX_SOCKET_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cserps {

class UnixSocket {
 public:
  UnixSocket() = default;
  UnixSocket(UnixSocket&& other) noexcept;
  UnixSocket& operator=(UnixSocket&& other) noexcept;
  ~UnixSocket();

  // Connects to the listener at `path`, retrying while there is none yet
  // (no file, or a file no process listens on) until `deadline`.
  static absl::StatusOr<UnixSocket> Connect(const std::string& path, absl::Time deadline);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // for poll()
  void Close();

  // Sends all `size` bytes. With `stop_if_readable`, stops early, and
  // returns OK with *stopped set, once the peer has sent something: a reply
  // that makes the rest pointless (an error), also when the peer closed its
  // end after it.
  absl::Status Send(const void* data, size_t size, absl::Time deadline,
                    bool stop_if_readable = false, bool* stopped = nullptr);
  // Receives exactly `size` bytes.
  absl::Status Receive(void* data, size_t size, absl::Time deadline);

 private:
  friend class UnixListener;
  explicit UnixSocket(int fd) : fd_(fd) {}

  int fd_ = -1;
};

// A listening socket at a path. Binding removes a leftover file there that
// no process listens on (a crashed run's), but not a live listener's.
class UnixListener {
 public:
  UnixListener(UnixListener&& other) noexcept;
  UnixListener& operator=(UnixListener&& other) = delete;
  ~UnixListener();  // closes and removes the path

  // ALREADY_EXISTS when a process listens at `path` already;
  // INVALID_ARGUMENT for a path too long for a socket address.
  static absl::StatusOr<UnixListener> Listen(const std::string& path, int backlog);

  // The next connection; DEADLINE_EXCEEDED when none comes by `deadline`.
  absl::StatusOr<UnixSocket> Accept(absl::Time deadline);

 private:
  UnixListener(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_UNIX_SOCKET_H_
