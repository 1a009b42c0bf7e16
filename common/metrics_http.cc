#include "common/metrics_http.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/socket_io.h"

namespace cserps {
namespace {

// A request line and headers larger than this are refused (a scrape's are
// a few hundred bytes).
constexpr size_t kMaxRequestBytes = 16 * 1024;
// A client's whole exchange, however it trickles: one that stops sending
// or reading must not hold a slot.
constexpr absl::Duration kExchangeTimeout = absl::Seconds(5);
// Connections served at once; more wait in the listen queue for a slot, so
// a few slow clients cannot keep a scrape waiting.
constexpr size_t kMaxConnections = 16;
// How long accepting pauses when it fails (out of descriptors): the
// connection stays queued, and polling again at once would spin.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);

std::string Response(absl::string_view status, absl::string_view content_type,
                     const std::string& body, bool head) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", head ? "" : body);
}

int PollTimeoutMs(absl::Time until, absl::Time now) {
  if (until == absl::InfiniteFuture()) return -1;
  return static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(until - now, absl::Milliseconds(1))), 0, 60'000));
}

}  // namespace

struct MetricsHttpServer::Connection {
  int fd = -1;
  absl::Time deadline;
  std::string request;
  std::string reply;  // empty while the request is read
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::function<std::string()> body) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port).ok() || host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not host:port (e.g. 127.0.0.1:9100)"));
  }
  int bound_port = 0;
  absl::StatusOr<Socket> listener = ListenTcp(host, port, &bound_port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("cannot serve metrics on ", address, ": ",
                                     listener.status().message()));
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->listener_ = listener->release();
  server->address_ = absl::StrCat(address.substr(0, address.rfind(':')), ":", bound_port);
  if (pipe2(server->wake_, O_CLOEXEC) != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics on ", address, ": pipe: ", std::strerror(errno)));
  }
  server->body_ = std::move(body);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const char stop = 0;
    while (write(wake_[1], &stop, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : {listener_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsHttpServer::Serve() {
  std::vector<Connection> connections;
  absl::Time accept_after = absl::InfinitePast();
  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time wake_at = absl::InfiniteFuture();
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {-1, POLLIN, 0}};
    if (connections.size() < kMaxConnections) {
      if (now >= accept_after) {
        fds[1].fd = listener_;
      } else {
        wake_at = accept_after;
      }
    }
    for (const Connection& c : connections) {
      fds.push_back({c.fd, static_cast<int16_t>(c.reply.empty() ? POLLIN : POLLOUT), 0});
      wake_at = std::min(wake_at, c.deadline);
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(wake_at, now)) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;
    for (size_t k = 2; k < fds.size(); ++k) {
      if (fds[k].revents != 0) Progress(connections[k - 2]);
    }
    const absl::Time after = absl::Now();
    for (Connection& c : connections) {
      if (c.fd >= 0 && after >= c.deadline) {
        close(c.fd);
        c.fd = -1;
      }
    }
    connections.erase(std::remove_if(connections.begin(), connections.end(),
                                     [](const Connection& c) { return c.fd < 0; }),
                      connections.end());
    if ((fds[1].revents & POLLIN) != 0) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        Connection& c = connections.emplace_back();
        c.fd = fd;
        c.deadline = after + kExchangeTimeout;
      } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        accept_after = after + kAcceptBackoff;
      }
    }
  }
  for (const Connection& c : connections) close(c.fd);
}

void MetricsHttpServer::Progress(Connection& c) {
  if (c.reply.empty()) {
    char buffer[4096];
    const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {  // closed before a whole request
      close(c.fd);
      c.fd = -1;
      return;
    }
    c.request.append(buffer, static_cast<size_t>(n));
    if (c.request.find("\r\n\r\n") != std::string::npos) {
      c.reply = Reply(c.request);
    } else if (c.request.size() > kMaxRequestBytes) {
      c.reply = Response("431 Request Header Fields Too Large", "text/plain",
                         "request too large\n", false);
    } else {
      return;
    }
  }
  const ssize_t n =
      send(c.fd, c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) c.sent += static_cast<size_t>(n);
  if (n <= 0 || c.sent == c.reply.size()) {
    close(c.fd);
    c.fd = -1;
  }
}

std::string MetricsHttpServer::Reply(const std::string& request) const {
  // "METHOD TARGET HTTP/x.y"
  const absl::string_view line = absl::string_view(request).substr(0, request.find("\r\n"));
  const size_t space = line.find(' ');
  const absl::string_view method = line.substr(0, space);
  absl::string_view target =
      space == absl::string_view::npos ? "" : line.substr(space + 1);
  target = target.substr(0, target.find(' '));
  target = target.substr(0, target.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n", false);
  }
  if (target != "/metrics") {
    return Response("404 Not Found", "text/plain", "metrics are at /metrics\n", head);
  }
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body_(), head);
}

}  // namespace cserps
