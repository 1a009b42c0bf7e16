// The HTTP endpoint of MetricsRegistry: GET /metrics answered with a body
// made at request time, on one thread of our own that serves up to 16
// connections at once, each within 5 s of its accept.
//
// Not prometheus-cpp's Exposer: its web server (civetweb) starts threads
// with a fixed 100 KiB stack, which cannot hold the static thread-local
// storage of cuBLASLt (about 92 KiB), so every metrics endpoint of a worker
// linked with CUDA failed to start. A scrape is one short request, which a
// single thread with a default stack serves well.
#ifndef CSERPS_COMMON_METRICS_HTTP_H_
#define CSERPS_COMMON_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace cserps {

class MetricsHttpServer {
 public:
  // Listens on `address` ("host:port", "[v6]:port"; port 0 picks a free
  // port) and answers GET (and HEAD) /metrics with body(); other paths get
  // 404, other methods 405. INVALID_ARGUMENT for an address without a port
  // or an unknown host, UNAVAILABLE when it cannot be bound; both name the
  // address. `body` is called on the server's thread.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::function<std::string()> body);
  // Stops listening and closes the connections in progress.
  ~MetricsHttpServer();

  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }

 private:
  struct Connection;

  MetricsHttpServer() = default;
  void Serve();
  // Reads `c`'s request, or sends its reply; closes it (fd -1) when done.
  void Progress(Connection& c);
  // The whole response to a complete `request`.
  std::string Reply(const std::string& request) const;

  std::function<std::string()> body_;
  std::string address_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: written to stop Serve
  std::thread thread_;
};

}  // namespace cserps

#endif  // CSERPS_COMMON_METRICS_HTTP_H_
