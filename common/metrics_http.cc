#include "common/metrics_http.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/socket_io.h"

namespace cserps {
namespace {

// A request line and headers larger than this are refused (a scrape's are
// a few hundred bytes).
constexpr size_t kMaxRequestBytes = 16 * 1024;
// A client that stops sending or reading must not hold the endpoint.
constexpr int kIoTimeoutSeconds = 5;

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     const std::string& body, bool head) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", head ? "" : body);
}

}  // namespace

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
  for (;;) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void MetricsHttpServer::Answer(int connection) {
  const timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) {
      SendAll(connection, Response("431 Request Header Fields Too Large", "text/plain",
                                   "request too large\n", false));
      return;
    }
    const ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or silent past the timeout
    request.append(buffer, static_cast<size_t>(n));
  }
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
    SendAll(connection, Response("405 Method Not Allowed", "text/plain",
                                 "only GET /metrics\n", false));
  } else if (target != "/metrics") {
    SendAll(connection, Response("404 Not Found", "text/plain",
                                 "metrics are at /metrics\n", head));
  } else {
    SendAll(connection, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                                 body_(), head));
  }
}

}  // namespace cserps
