#include "tools/cluster/fault_proxy.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/time/clock.h"
#include "common/prng.h"

namespace cserps {
namespace {

constexpr int kTickMs = 50;
constexpr size_t kPiece = 64 << 10;

// Closes `socket` with a reset instead of an orderly end.
void Reset(Socket& socket) {
  const linger abort = {.l_onoff = 1, .l_linger = 0};
  setsockopt(socket.fd(), SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  socket = Socket();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(const std::string& target_host,
                                                              int target_port, Options options) {
  int port = 0;
  absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<FaultProxy> proxy(
      new FaultProxy(target_host, target_port, options, *std::move(listener), port));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

FaultProxy::FaultProxy(std::string target_host, int target_port, Options options,
                       Socket listener, int port)
    : target_host_(std::move(target_host)),
      target_port_(target_port),
      options_(options),
      listener_(std::move(listener)),
      port_(port) {}

FaultProxy::~FaultProxy() { Stop(); }

void FaultProxy::Stop() {
  if (stopping_.exchange(true)) return;
  // Wakes the blocked accept.
  shutdown(listener_.fd(), SHUT_RDWR);
  acceptor_.join();
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& t : pumps) t.join();
}

void FaultProxy::AcceptLoop() {
  while (!stopping_.load()) {
    absl::StatusOr<Socket> client = AcceptTcp(listener_);
    if (!client.ok()) return;
    absl::StatusOr<Socket> server = ConnectTcp(target_host_, target_port_,
                                               absl::Now() + absl::Seconds(5), "proxy target");
    if (!server.ok()) continue;  // the client sees its connection end
    const uint64_t index = connections_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    pumps_.emplace_back([this, c = *std::move(client), s = *std::move(server), index]() mutable {
      Pump(std::move(c), std::move(s), index);
    });
  }
}

void FaultProxy::Pump(Socket client, Socket server, uint64_t index) {
  CounterRng rng(DeriveKey(options_.seed, index));
  auto draw = [&rng] { return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53; };
  std::vector<char> piece(kPiece);
  while (!stopping_.load()) {
    pollfd fds[2] = {{client.fd(), POLLIN, 0}, {server.fd(), POLLIN, 0}};
    if (poll(fds, 2, kTickMs) <= 0) continue;
    for (int from = 0; from < 2; ++from) {
      if (fds[from].revents == 0) continue;
      Socket& in = from == 0 ? client : server;
      Socket& out = from == 0 ? server : client;
      const ssize_t n = read(in.fd(), piece.data(), piece.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return;  // an end or an error: both sockets close
      if (draw() < options_.reset_probability) {
        resets_.fetch_add(1);
        Reset(client);
        Reset(server);
        return;
      }
      if (draw() < options_.delay_probability) {
        absl::SleepFor(absl::Milliseconds(1 + static_cast<int>(rng.Below(4))));
      }
      iovec iov = {piece.data(), static_cast<size_t>(n)};
      if (!SendAll(out.fd(), absl::MakeSpan(&iov, 1), absl::Now() + absl::Seconds(10), "proxy")
               .ok()) {
        return;
      }
    }
  }
}

}  // namespace cserps
