#include "tools/bench/wire_limits.h"

#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/socket_io.h"
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

// A socket wait of the raw exchange gives up after this.
absl::Time SocketDeadline() { return absl::Now() + absl::Seconds(kSocketTimeoutS); }

absl::Status Send(const Socket& s, const void* p, size_t n) {
  iovec iov{const_cast<void*>(p), n};
  return SendAll(s.fd(), absl::MakeSpan(&iov, 1), SocketDeadline(), "raw TCP");
}

// A peer's side of one connection: the share's size first, then every
// share it receives sent back, until the member closes.
void Echo(Socket s) {
  uint64_t size = 0;
  if (!RecvAll(s.fd(), &size, sizeof(size), SocketDeadline(), "raw TCP").ok()) return;
  std::vector<char> buffer(size);
  while (size > 0 && RecvAll(s.fd(), buffer.data(), size, SocketDeadline(), "raw TCP").ok() &&
         Send(s, buffer.data(), size).ok()) {
  }
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
  int port = 0;
  ASSIGN_OR_RETURN(const Socket listener, ListenTcp("127.0.0.1", 0, &port));
  const int connections = shape.peers * shape.members;
  std::thread acceptor([&listener, connections] {
    std::vector<std::thread> echoes;
    for (int i = 0; i < connections; ++i) {
      absl::StatusOr<Socket> s = AcceptTcp(listener);
      if (!s.ok()) break;
      echoes.emplace_back(Echo, *std::move(s));
    }
    for (std::thread& t : echoes) t.join();
  });
  absl::StatusOr<absl::Duration> median =
      OnMembers(shape, [&](int, std::vector<absl::Duration>* rounds) -> absl::Status {
        std::vector<Socket> peers;
        for (int p = 0; p < shape.peers; ++p) {
          ASSIGN_OR_RETURN(Socket s, ConnectTcp("127.0.0.1", port, SocketDeadline(), "raw TCP"));
          const uint64_t size = Share(shape.payload_bytes, shape.peers, p);
          RETURN_IF_ERROR(Send(s, &size, sizeof(size)));
          peers.push_back(std::move(s));
        }
        std::vector<char> out(shape.payload_bytes, 1), in(shape.payload_bytes);
        for (int r = 0; r < shape.warmup + shape.rounds; ++r) {
          const absl::Time start = absl::Now();
          size_t offset = 0;
          for (int p = 0; p < shape.peers; ++p) {
            const size_t n = Share(shape.payload_bytes, shape.peers, p);
            RETURN_IF_ERROR(Send(peers[p], out.data() + offset, n));
            offset += n;
          }
          offset = 0;
          for (int p = 0; p < shape.peers; ++p) {
            const size_t n = Share(shape.payload_bytes, shape.peers, p);
            RETURN_IF_ERROR(RecvAll(peers[p].fd(), in.data() + offset, n, SocketDeadline(),
                                    "raw TCP"));
            offset += n;
          }
          if (r >= shape.warmup) rounds->push_back(absl::Now() - start);
        }
        return absl::OkStatus();
      });
  shutdown(listener.fd(), SHUT_RDWR);  // an acceptor still waiting gives up
  acceptor.join();
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
