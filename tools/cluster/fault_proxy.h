// A TCP proxy on 127.0.0.1 that breaks what passes through it, for the
// fault-injection test and benchmark: between the clients and one server, each piece it
// forwards (one read, either way) is, with probability reset_probability,
// the end of its connection: both sides are reset (RST, as a crashed peer
// or a dropped connection leaves them), the piece undelivered; with
// probability delay_probability it is held back 1 to 4 ms first. Every
// piece is otherwise forwarded whole and in order.
//
// One thread accepts, one per connection pumps both ways (poll with a
// 50 ms tick, so that Stop ends every loop); all are joined by Stop, which
// the destructor calls.
#ifndef CSERPS_TOOLS_CLUSTER_FAULT_PROXY_H_
#define CSERPS_TOOLS_CLUSTER_FAULT_PROXY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/socket_io.h"

namespace cserps {

class FaultProxy {
 public:
  struct Options {
    double reset_probability = 0.01;
    double delay_probability = 0.05;
    uint64_t seed = 1;
  };

  // Listens on 127.0.0.1 (a free port) and forwards to target_host:target_port.
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(const std::string& target_host,
                                                           int target_port, Options options);
  ~FaultProxy();

  int port() const { return port_; }
  // Connections accepted, and those it reset.
  uint64_t connections() const { return connections_.load(); }
  uint64_t resets() const { return resets_.load(); }
  // Closes the listener and every connection; joins every thread.
  void Stop();

 private:
  FaultProxy(std::string target_host, int target_port, Options options, Socket listener,
             int port);
  void AcceptLoop();
  void Pump(Socket client, Socket server, uint64_t index);

  const std::string target_host_;
  const int target_port_;
  const Options options_;
  Socket listener_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> resets_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_TOOLS_CLUSTER_FAULT_PROXY_H_
