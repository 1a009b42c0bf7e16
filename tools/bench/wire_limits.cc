#include "tools/bench/wire_limits.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace cserps {
namespace {

// Every socket wait of the raw exchange is bounded by this.
constexpr int kSocketTimeoutS = 30;

absl::Duration Median(std::vector<absl::Duration> v) {
  if (v.empty()) return absl::ZeroDuration();
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Peer p's share of a payload of `bytes` split over `peers`.
size_t Share(size_t bytes, int peers, int p) {
  const size_t base = bytes / peers;
  return p + 1 == peers ? bytes - base * (peers - 1) : base;
}

absl::Status Errno(absl::string_view what) {
  return absl::ErrnoToStatus(errno, absl::StrCat("raw TCP: ", what));
}

void Tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval timeout{kSocketTimeoutS, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
}

absl::Status SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return Errno("send");
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

// false at the peer's end of stream before the first byte.
absl::StatusOr<bool> ReceiveAll(int fd, char* p, size_t n) {
  const size_t wanted = n;
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0 && n == wanted) return false;
    if (got <= 0) return Errno("recv");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A peer's side of one connection: the share's size first, then every
// share it receives sent back, until the member closes.
void Echo(int fd) {
  uint64_t size = 0;
  absl::StatusOr<bool> got = ReceiveAll(fd, reinterpret_cast<char*>(&size), sizeof(size));
  std::vector<char> buffer(got.ok() && *got ? size : 0);
  while (got.ok() && *got && size > 0) {
    got = ReceiveAll(fd, buffer.data(), size);
    if (!got.ok() || !*got || !SendAll(fd, buffer.data(), size).ok()) break;
  }
  close(fd);
}

// Runs member(m, &rounds) on M threads; the first error, or the median of
// every member's measured rounds.
template <typename Member>
absl::StatusOr<absl::Duration> OnMembers(const ExchangeShape& shape, Member member) {
  std::vector<absl::Status> status(shape.members);
  std::vector<std::vector<absl::Duration>> rounds(shape.members);
  std::vector<std::thread> threads;
  for (int m = 0; m < shape.members; ++m) {
    threads.emplace_back([&, m] { status[m] = member(m, &rounds[m]); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<absl::Duration> all;
  for (int m = 0; m < shape.members; ++m) {
    RETURN_IF_ERROR(status[m]);
    all.insert(all.end(), rounds[m].begin(), rounds[m].end());
  }
  return Median(all);
}

}  // namespace

absl::StatusOr<absl::Duration> RawTcpRound(const ExchangeShape& shape) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return Errno("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, shape.peers * shape.members) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const absl::Status error = Errno("bind/listen");
    close(listener);
    return error;
  }
  Tune(listener);  // accept's timeout too
  const int connections = shape.peers * shape.members;
  std::thread acceptor([listener, connections] {
    std::vector<std::thread> echoes;
    for (int i = 0; i < connections; ++i) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      Tune(fd);
      echoes.emplace_back(Echo, fd);
    }
    for (std::thread& t : echoes) t.join();
  });
  absl::StatusOr<absl::Duration> median =
      OnMembers(shape, [&](int, std::vector<absl::Duration>* rounds) -> absl::Status {
        std::vector<int> fds;
        absl::Status status;
        for (int p = 0; p < shape.peers && status.ok(); ++p) {
          const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) {
            status = Errno("socket");
            break;
          }
          fds.push_back(fd);
          Tune(fd);
          const uint64_t size = Share(shape.payload_bytes, shape.peers, p);
          if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
            status = Errno("connect");
          } else {
            status = SendAll(fd, reinterpret_cast<const char*>(&size), sizeof(size));
          }
        }
        std::vector<char> out(shape.payload_bytes, 1), in(shape.payload_bytes);
        for (int r = 0; r < shape.warmup + shape.rounds && status.ok(); ++r) {
          const absl::Time start = absl::Now();
          size_t offset = 0;
          for (int p = 0; p < shape.peers && status.ok(); ++p) {
            status = SendAll(fds[p], out.data() + offset, Share(shape.payload_bytes, shape.peers, p));
            offset += Share(shape.payload_bytes, shape.peers, p);
          }
          offset = 0;
          for (int p = 0; p < shape.peers && status.ok(); ++p) {
            const size_t n = Share(shape.payload_bytes, shape.peers, p);
            absl::StatusOr<bool> got = ReceiveAll(fds[p], in.data() + offset, n);
            status = got.ok() && !*got && n > 0
                         ? absl::UnavailableError("raw TCP: the peer closed")
                         : got.status();
            offset += n;
          }
          if (r >= shape.warmup) rounds->push_back(absl::Now() - start);
        }
        for (int fd : fds) close(fd);
        return status;
      });
  shutdown(listener, SHUT_RDWR);  // an acceptor still waiting gives up
  acceptor.join();
  close(listener);
  return median;
}

namespace {

// Answers every call with its request's bytes.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoReactor;
  }
};

}  // namespace

absl::StatusOr<absl::Duration> PlainGrpcRound(const ExchangeShape& shape) {
  EchoService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::InternalError("plain gRPC: no server");
  absl::StatusOr<absl::Duration> median =
      OnMembers(shape, [&](int m, std::vector<absl::Duration>* rounds) -> absl::Status {
        std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
        for (int p = 0; p < shape.peers; ++p) {
          grpc::ChannelArguments args;
          args.SetMaxReceiveMessageSize(-1);
          args.SetMaxSendMessageSize(-1);
          // A connection of its own per (member, peer), as cserps has.
          args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
          args.SetString("cserps.bench.peer", absl::StrCat(m, ".", p));
          stubs.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
              absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
        }
        std::vector<char> out(shape.payload_bytes, 1), in(shape.payload_bytes);
        for (int r = 0; r < shape.warmup + shape.rounds; ++r) {
          const absl::Time start = absl::Now();
          std::vector<grpc::ClientContext> contexts(shape.peers);
          std::vector<grpc::ByteBuffer> requests(shape.peers), replies(shape.peers);
          absl::Mutex mu;
          int pending = shape.peers;
          grpc::Status failure;
          size_t offset = 0;
          for (int p = 0; p < shape.peers; ++p) {
            const size_t n = Share(shape.payload_bytes, shape.peers, p);
            grpc::Slice slice(out.data() + offset, n);  // the request's copy
            requests[p] = grpc::ByteBuffer(&slice, 1);
            contexts[p].set_deadline(std::chrono::system_clock::now() +
                                     std::chrono::seconds(kSocketTimeoutS));
            stubs[p]->UnaryCall(&contexts[p], "/cserps.bench.Echo/Echo", grpc::StubOptions(),
                                &requests[p], &replies[p], [&](grpc::Status status) {
                                  absl::MutexLock lock(&mu);
                                  if (!status.ok()) failure = status;
                                  --pending;
                                });
            offset += n;
          }
          {
            absl::MutexLock lock(&mu);
            mu.Await(absl::Condition(+[](int* left) { return *left == 0; }, &pending));
          }
          if (!failure.ok()) {
            return absl::UnavailableError(
                absl::StrCat("plain gRPC: ", failure.error_message()));
          }
          offset = 0;
          for (int p = 0; p < shape.peers; ++p) {
            std::vector<grpc::Slice> slices;
            if (!replies[p].Dump(&slices).ok()) return absl::InternalError("plain gRPC: Dump");
            for (const grpc::Slice& s : slices) {
              std::memcpy(in.data() + offset, s.begin(), s.size());
              offset += s.size();
            }
          }
          if (r >= shape.warmup) rounds->push_back(absl::Now() - start);
        }
        return absl::OkStatus();
      });
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return median;
}

absl::Duration MemcpyTime(size_t bytes, int rounds) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<absl::Duration> times;
  for (int r = 0; r < rounds; ++r) {
    const absl::Time start = absl::Now();
    std::memcpy(to.data(), from.data(), bytes);
    times.push_back(absl::Now() - start);
    from[r % bytes] = to[(r + 1) % bytes];  // keeps the copies observable
  }
  return Median(times);
}

}  // namespace cserps
