#include "tools/bench/wire_limits.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
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

// Every socket wait of a raw round is bounded by this.
constexpr int kSocketTimeoutS = 30;
// A raw peer waits this long for the next slice (cserps' rounds run between).
constexpr int kIdleTimeoutS = 600;

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

absl::Time SocketDeadline() { return absl::Now() + absl::Seconds(kSocketTimeoutS); }

absl::Status Send(const Socket& s, const void* p, size_t n) {
  iovec iov{const_cast<void*>(p), n};
  return SendAll(s.fd(), absl::MakeSpan(&iov, 1), SocketDeadline(), "raw TCP");
}

// What a member tells its peer before a slice's rounds.
struct SliceHeader {
  uint64_t share = 0;   // bytes per round
  uint64_t rounds = 0;  // warmup ones included
};

// A peer's side of one connection: per slice, the share and the rounds,
// then every share it receives sent back; until the member closes.
void Echo(Socket s) {
  std::vector<char> buffer;
  for (;;) {
    SliceHeader slice;
    if (!RecvAll(s.fd(), &slice, sizeof(slice), absl::Now() + absl::Seconds(kIdleTimeoutS),
                 "raw TCP")
             .ok()) {
      return;
    }
    buffer.resize(slice.share);
    for (uint64_t r = 0; r < slice.rounds; ++r) {
      if (!RecvAll(s.fd(), buffer.data(), slice.share, SocketDeadline(), "raw TCP").ok() ||
          !Send(s, buffer.data(), slice.share).ok()) {
        return;
      }
    }
  }
}

// Runs member(m, &rounds) on `members` threads; the first error, or every
// member's measured rounds.
template <typename Member>
absl::StatusOr<std::vector<absl::Duration>> OnMembers(int members, Member member) {
  std::vector<absl::Status> status(members);
  std::vector<std::vector<absl::Duration>> rounds(members);
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] { status[m] = member(m, &rounds[m]); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<absl::Duration> all;
  for (int m = 0; m < members; ++m) {
    RETURN_IF_ERROR(status[m]);
    all.insert(all.end(), rounds[m].begin(), rounds[m].end());
  }
  return all;
}

class RawTcp final : public LimitExchange {
 public:
  RawTcp(int peers, int members)
      : peers_(peers), members_(members), sockets_(members), out_(members), in_(members) {}
  // The members' sockets close first, which ends the peers' threads.
  ~RawTcp() override {
    sockets_.clear();
    for (std::thread& t : echoes_) t.join();
  }

  absl::Status Open() {
    int port = 0;
    ASSIGN_OR_RETURN(const Socket listener, ListenTcp("127.0.0.1", 0, &port));
    const int connections = peers_ * members_;
    std::thread acceptor([&listener, connections, this] {
      for (int i = 0; i < connections; ++i) {
        absl::StatusOr<Socket> s = AcceptTcp(listener);
        if (!s.ok()) break;
        echoes_.emplace_back(Echo, *std::move(s));
      }
    });
    absl::Status status;
    for (int m = 0; m < members_ && status.ok(); ++m) {
      for (int p = 0; p < peers_ && status.ok(); ++p) {
        absl::StatusOr<Socket> s = ConnectTcp("127.0.0.1", port, SocketDeadline(), "raw TCP");
        status = s.status();
        if (s.ok()) sockets_[m].push_back(*std::move(s));
      }
    }
    if (!status.ok()) shutdown(listener.fd(), SHUT_RDWR);  // the acceptor gives up
    acceptor.join();
    return status;
  }

  absl::StatusOr<std::vector<absl::Duration>> Rounds(size_t payload_bytes, int warmup,
                                                     int rounds) override {
    return OnMembers(members_, [&](int m, std::vector<absl::Duration>* times) -> absl::Status {
      const std::vector<Socket>& peers = sockets_[m];
      for (int p = 0; p < peers_; ++p) {
        const SliceHeader slice{Share(payload_bytes, peers_, p),
                                static_cast<uint64_t>(warmup + rounds)};
        RETURN_IF_ERROR(Send(peers[p], &slice, sizeof(slice)));
      }
      // Kept across calls, as cserps' members keep theirs: the first touch
      // of fresh pages would count in the exchange's CPU.
      std::vector<char>& out = out_[m];
      std::vector<char>& in = in_[m];
      if (out.size() < payload_bytes) {
        out.assign(payload_bytes, 1);
        in.assign(payload_bytes, 0);
      }
      for (int r = 0; r < warmup + rounds; ++r) {
        const absl::Time start = absl::Now();
        size_t offset = 0;
        for (int p = 0; p < peers_; ++p) {
          const size_t n = Share(payload_bytes, peers_, p);
          RETURN_IF_ERROR(Send(peers[p], out.data() + offset, n));
          offset += n;
        }
        offset = 0;
        for (int p = 0; p < peers_; ++p) {
          const size_t n = Share(payload_bytes, peers_, p);
          RETURN_IF_ERROR(
              RecvAll(peers[p].fd(), in.data() + offset, n, SocketDeadline(), "raw TCP"));
          offset += n;
        }
        if (r >= warmup) times->push_back(absl::Now() - start);
      }
      return absl::OkStatus();
    });
  }

 private:
  const int peers_, members_;
  std::vector<std::vector<Socket>> sockets_;  // [member][peer]
  std::vector<std::vector<char>> out_, in_;   // [member]
  std::vector<std::thread> echoes_;           // one per connection
};

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

class PlainGrpc final : public LimitExchange {
 public:
  PlainGrpc(int peers, int members) : peers_(peers), members_(members), stubs_(members) {}
  ~PlainGrpc() override {
    stubs_.clear();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    }
  }

  absl::Status Open() {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service_);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) return absl::InternalError("plain gRPC: no server");
    for (int m = 0; m < members_; ++m) {
      for (int p = 0; p < peers_; ++p) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(-1);
        args.SetMaxSendMessageSize(-1);
        // A connection of its own per (member, peer), as cserps has.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        args.SetString("cserps.bench.peer", absl::StrCat(m, ".", p));
        stubs_[m].push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
            absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<absl::Duration>> Rounds(size_t payload_bytes, int warmup,
                                                     int rounds) override {
    return OnMembers(members_, [&](int m, std::vector<absl::Duration>* times) -> absl::Status {
      // Each peer's share copied into a slice once, which every round's
      // request refers to: a copy per round allocated tens of MiB afresh
      // (mapped and unmapped by malloc), and the page faults of that fresh
      // memory were most of the limit's time at 64 MiB.
      const std::vector<char> out(payload_bytes, 1);
      std::vector<char> in(payload_bytes);
      std::vector<grpc::Slice> shares;
      size_t offset = 0;
      for (int p = 0; p < peers_; ++p) {
        const size_t n = Share(out.size(), peers_, p);
        shares.emplace_back(out.data() + offset, n);
        offset += n;
      }
      for (int r = 0; r < warmup + rounds; ++r) {
        const absl::Time start = absl::Now();
        RETURN_IF_ERROR(Round(stubs_[m], shares, &in));
        if (r >= warmup) times->push_back(absl::Now() - start);
      }
      return absl::OkStatus();
    });
  }

 private:
  // One unary call per peer with its share, in parallel; the replies'
  // bytes into `in`.
  absl::Status Round(const std::vector<std::unique_ptr<grpc::GenericStub>>& stubs,
                     const std::vector<grpc::Slice>& shares, std::vector<char>* in) const {
    std::vector<grpc::ClientContext> contexts(peers_);
    std::vector<grpc::ByteBuffer> requests(peers_), replies(peers_);
    absl::Mutex mu;
    int pending = peers_;
    grpc::Status failure;
    for (int p = 0; p < peers_; ++p) {
      requests[p] = grpc::ByteBuffer(&shares[p], 1);  // a reference, not a copy
      contexts[p].set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(kSocketTimeoutS));
      // As cserps' client's calls: a connection still being made (64 at
      // once, on a loaded machine) is waited for, not a failed case.
      contexts[p].set_wait_for_ready(true);
      stubs[p]->UnaryCall(&contexts[p], "/cserps.bench.Echo/Echo", grpc::StubOptions(),
                          &requests[p], &replies[p], [&](grpc::Status status) {
                            absl::MutexLock lock(&mu);
                            if (!status.ok()) failure = status;
                            --pending;
                          });
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* left) { return *left == 0; }, &pending));
    }
    if (!failure.ok()) {
      return absl::UnavailableError(absl::StrCat("plain gRPC: ", failure.error_message()));
    }
    size_t offset = 0;
    for (int p = 0; p < peers_; ++p) {
      std::vector<grpc::Slice> slices;
      if (!replies[p].Dump(&slices).ok()) return absl::InternalError("plain gRPC: Dump");
      for (const grpc::Slice& s : slices) {
        std::memcpy(in->data() + offset, s.begin(), s.size());
        offset += s.size();
      }
    }
    return absl::OkStatus();
  }

  const int peers_, members_;
  EchoService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::vector<std::unique_ptr<grpc::GenericStub>>> stubs_;  // [member][peer]
};

template <typename Exchange>
absl::StatusOr<std::unique_ptr<LimitExchange>> Open(int peers, int members) {
  auto exchange = std::make_unique<Exchange>(peers, members);
  RETURN_IF_ERROR(exchange->Open());
  return exchange;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LimitExchange>> OpenRawTcp(int peers, int members) {
  return Open<RawTcp>(peers, members);
}

absl::StatusOr<std::unique_ptr<LimitExchange>> OpenPlainGrpc(int peers, int members) {
  return Open<PlainGrpc>(peers, members);
}

absl::Duration MemcpyTime(size_t bytes, int rounds) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  // Small copies are timed in batches of about 16 MiB: the clock's own
  // cost would otherwise be most of a copy of a few KiB.
  const size_t batch = std::max<size_t>(1, (size_t{16} << 20) / bytes);
  std::vector<absl::Duration> times;
  for (int r = 0; r < rounds; ++r) {
    const absl::Time start = absl::Now();
    for (size_t i = 0; i < batch; ++i) {
      std::memcpy(to.data(), from.data(), bytes);
      from[i % bytes] = to[(i + 1) % bytes];  // keeps the copies observable
    }
    times.push_back((absl::Now() - start) / static_cast<double>(batch));
  }
  return Median(times);
}

}  // namespace cserps
