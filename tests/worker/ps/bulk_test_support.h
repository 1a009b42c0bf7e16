// What the bulk transport's tests share (docs/protocol.md 17): in-process
// shards of a one-chunk FLAT job, members on either transport, and a raw
// connection that speaks the frames by hand from the documented layout
// (common/bulk_wire.h).
#ifndef CSERPS_TESTS_WORKER_PS_BULK_TEST_SUPPORT_H_
#define CSERPS_TESTS_WORKER_PS_BULK_TEST_SUPPORT_H_

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/config_fingerprint.h"
#include "common/socket_io.h"
#include "common/sparse_vector.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/testing/test_support.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/ps/ps_client.h"

namespace cserps::bulk_test {

inline constexpr uint64_t kD = 3000;  // FLAT: one chunk on one shard
inline constexpr absl::Duration kIo = absl::Seconds(20);

inline v1::JobConfig MakeConfig(uint32_t workers, int round_timeout_s,
                                const std::string& algorithm = R"pb(name: "ssgd")pb") {
  return testing::TestConfig(absl::StrCat(R"pb(
    name: "bulk-test"
    seed: 5
    cluster { servers: "127.0.0.1:0" num_workers: )pb", workers, R"pb( round_timeout_s: )pb",
                                          round_timeout_s, R"pb( }
    model { kind: FLAT num_params: )pb", kD, R"pb( }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { )pb", algorithm, R"pb( }
    epochs: 1
  )pb"));
}

inline std::vector<float> Values(int rank) {
  std::vector<float> v(kD);
  for (uint64_t i = 0; i < kD; ++i) v[i] = 0.25f * static_cast<float>(i % 97) - rank * 1.5f;
  return v;
}

inline absl::StatusOr<std::unique_ptr<PsClient>> Member(v1::JobConfig config,
                                                        v1::ClusterConfig::Transport transport,
                                                        int rank, PsClientOptions options = {}) {
  config.mutable_cluster()->set_transport(transport);
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(config, kD, options));
  RETURN_IF_ERROR(client->Register(rank, absl::StrCat("member-", rank)).status());
  return client;
}

// A connection speaking the frames by hand.
class RawConnection {
 public:
  static absl::StatusOr<RawConnection> Open(const PsServer& server) {
    ASSIGN_OR_RETURN(Socket socket, ConnectTcp("127.0.0.1", server.bulk_port(),
                                               absl::Now() + kIo, "raw bulk connection"));
    return RawConnection(std::move(socket));
  }

  absl::Status Send(const void* data, size_t size) { return SendFor(data, size, kIo); }
  absl::Status SendFor(const void* data, size_t size, absl::Duration timeout) {
    iovec iov{const_cast<void*>(data), size};
    return SendAll(socket_.fd(), absl::MakeSpan(&iov, 1), absl::Now() + timeout, "raw send");
  }
  absl::Status SendHello(uint64_t fingerprint, uint32_t rank, uint32_t magic = bulk::kMagic) {
    char bytes[bulk::Hello::kBytes];
    bulk::Encode(bulk::Hello{.magic = magic, .fingerprint = fingerprint, .rank = rank}, bytes);
    return Send(bytes, sizeof(bytes));
  }
  absl::Status SendRequest(const bulk::Request& request, absl::Span<const float> values) {
    char bytes[bulk::Request::kBytes];
    bulk::Encode(request, bytes);
    RETURN_IF_ERROR(Send(bytes, sizeof(bytes)));
    return Send(values.data(), values.size() * sizeof(float));
  }
  // A PushPull of the whole model (one chunk, kD floats) on `stream`.
  absl::Status SendWholePush(uint64_t request_id, uint64_t step, absl::Span<const float> values,
                             uint32_t stream) {
    return SendRequest({.count = static_cast<uint32_t>(kD), .request_id = request_id,
                        .step = step, .stream = stream},
                       values);
  }
  // A SparsePushPull whose count is that of `entries`.
  absl::Status SendSparse(bulk::SparseRequest request, const SparseVector& entries) {
    request.count = static_cast<uint32_t>(entries.indices.size());
    char bytes[bulk::SparseRequest::kBytes];
    bulk::Encode(request, bytes);
    RETURN_IF_ERROR(Send(bytes, sizeof(bytes)));
    RETURN_IF_ERROR(Send(entries.indices.data(), entries.indices.size() * sizeof(uint32_t)));
    return Send(entries.values.data(), entries.values.size() * sizeof(float));
  }

  // An AsyncPushPull whose count is that of `gradient`.
  absl::Status SendAsync(bulk::AsyncRequest request, absl::Span<const float> gradient) {
    request.count = static_cast<uint32_t>(gradient.size());
    char bytes[bulk::AsyncRequest::kBytes];
    bulk::Encode(request, bytes);
    RETURN_IF_ERROR(Send(bytes, sizeof(bytes)));
    return Send(gradient.data(), gradient.size() * sizeof(float));
  }

  // A reply: its header, and its message or floats (a sparse reply's:
  // its indices' bytes, then its values).
  struct Answer {
    bulk::Reply reply;
    std::string message;
    std::vector<float> floats;
  };
  absl::StatusOr<Answer> Receive(bool sparse = false) {
    char head[bulk::Reply::kBytes];
    RETURN_IF_ERROR(RecvAll(socket_.fd(), head, sizeof(head), absl::Now() + kIo, "raw recv"));
    Answer a;
    a.reply = bulk::DecodeReply(head);
    a.message.resize(a.reply.code != 0 ? a.reply.message_bytes : 0);
    RETURN_IF_ERROR(
        RecvAll(socket_.fd(), a.message.data(), a.message.size(), absl::Now() + kIo, "raw recv"));
    a.floats.resize(a.reply.code == 0 ? (sparse ? 2 : 1) * a.reply.count : 0);
    RETURN_IF_ERROR(RecvAll(socket_.fd(), a.floats.data(), a.floats.size() * sizeof(float),
                            absl::Now() + kIo, "raw recv"));
    return a;
  }
  // Says no more requests will come.
  void CloseSending() { shutdown(socket_.fd(), SHUT_WR); }
  void Close() { socket_ = Socket(); }
  // True when the shard has closed the connection (within kIo).
  bool Closed() {
    char byte;
    const absl::Status read = RecvAll(socket_.fd(), &byte, 1, absl::Now() + kIo, "raw recv");
    return !read.ok() && !absl::IsDeadlineExceeded(read);
  }

 private:
  explicit RawConnection(Socket socket) : socket_(std::move(socket)) {}
  Socket socket_;
};

// Cuts this process's accepted connections to bulk `port` as a failing
// network would: both directions shut down under the shard's threads, which
// then see the connection end. Returns how many it cut.
inline int CutBulkConnections(int port) {
  int cut = 0;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return 0;
  while (const dirent* entry = readdir(fds)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd)) continue;  // "." and ".."
    sockaddr_in local{}, peer{};
    socklen_t local_size = sizeof(local), peer_size = sizeof(peer);
    // The listener has no peer; the members' ends have another local port.
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != port ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) {
      continue;
    }
    if (shutdown(fd, SHUT_RDWR) == 0) ++cut;
  }
  closedir(fds);
  return cut;
}

// A member's call cut off mid-flight: runs `call` in a thread; once it
// waits at the shard (`waiting(1)`: true once one call waits), cuts the
// shard's bulk connections, waits for the call sent again over gRPC
// (`waiting(2)`), then runs `release`, which lets both go on, and joins.
struct Cut {
  bool waited = false;  // the call waited before the cut
  int connections = 0;  // cut
  bool resent = false;  // the call waited again after the cut
};
inline Cut CutWhileWaiting(int bulk_port, const std::function<bool(size_t)>& waiting,
                           const std::function<void()>& call,
                           const std::function<void()>& release) {
  std::thread thread(call);
  Cut cut;
  cut.waited = waiting(1);
  if (cut.waited) cut.connections = CutBulkConnections(bulk_port);
  cut.resent = cut.connections == 1 && waiting(2);
  // Run either way, so that the thread ends.
  release();
  thread.join();
  return cut;
}

// A round of one member over `raw` (Values(0), weight 1, step 1, as
// `request_id`): its mean is the member's values.
inline void ExpectALoneRoundAnswered(RawConnection& raw, uint64_t request_id) {
  const std::vector<float> v = Values(0);
  ASSERT_TRUE(raw.SendWholePush(request_id, 1, v, v1::MODEL).ok());
  auto answered = raw.Receive();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->floats, v);
}

// Sends a request's head whose count the shard cannot read past: it must
// say so (`says`, request_id 0) and end the connection.
template <size_t N>
inline void ExpectTheEnd(RawConnection& raw, const char (&head)[N], const std::string& says) {
  ASSERT_TRUE(raw.Send(head, N).ok());
  auto fatal = raw.Receive();
  ASSERT_TRUE(fatal.ok()) << fatal.status();
  EXPECT_EQ(fatal->reply.request_id, 0u);
  EXPECT_THAT(fatal->message, ::testing::HasSubstr(says));
  EXPECT_TRUE(raw.Closed());
}

class BulkTransportTest : public ::testing::Test {
 protected:
  void StartJob(uint32_t workers, int round_timeout_s = 20,
                const std::string& algorithm = R"pb(name: "ssgd")pb") {
    config_ = MakeConfig(workers, round_timeout_s, algorithm);
    ASSERT_TRUE(servers_.Start(&config_).ok());
    ASSERT_NE(servers_.shard(0).bulk_port(), 0);
  }
  // StartJob(2), and rank 0 registered on the bulk transport (AUTO), rank 1
  // on gRPC.
  void StartBulkAndGrpcMembers() {
    StartJob(2);
    auto bulk = Member(config_, v1::ClusterConfig::AUTO, 0);
    auto grpc = Member(config_, v1::ClusterConfig::GRPC, 1);
    ASSERT_TRUE(bulk.ok()) << bulk.status();
    ASSERT_TRUE(grpc.ok()) << grpc.status();
    bulk_member_ = *std::move(bulk);
    grpc_member_ = *std::move(grpc);
  }
  // The bulk member's MODEL rounds of steps 1 and 2 (Values(0), weight 1)
  // begun, the first `started` of them started, and its bulk connection cut
  // once they wait at the shard; false when that did not happen.
  struct CutRounds {
    std::unique_ptr<ShardedAverage> round[2];
    std::vector<float> mean[2] = {std::vector<float>(kD), std::vector<float>(kD)};
  };
  bool BeginAndCut(int started, CutRounds* rounds) {
    const std::vector<float> v0 = Values(0);
    for (int i = 0; i < 2; ++i) {
      rounds->round[i] = bulk_member_->BeginShardedAverage(v1::MODEL, i + 1, 1, 1.0f, 0.0f);
    }
    for (int i = 0; i < started; ++i) {
      if (!rounds->round[i]->StartShard(0, v0, absl::MakeSpan(rounds->mean[i])).ok()) return false;
    }
    return servers_.shard(0).service().WaitForWaitingCalls(started, kIo) &&
           CutBulkConnections(servers_.shard(0).bulk_port()) == 1;
  }
  // The gRPC member's MODEL rounds of steps 1 and 2 with Values(1), weight
  // 1, on a thread of its own: join it before reading `*status`.
  std::thread GrpcMemberRounds(absl::Status* status) {
    return std::thread([this, status] {
      const std::vector<float> v = Values(1);
      std::vector<float> mean(kD);
      for (uint64_t step : {1, 2}) {
        *status =
            grpc_member_->AverageBlocks(v1::MODEL, step, 1, v, 1.0f, 0.0f, absl::MakeSpan(mean));
        if (!status->ok()) return;
      }
    });
  }
  uint64_t fingerprint() const { return JobFingerprint(config_); }
  // Rank 0 registered (over gRPC), and a raw connection greeted as it.
  absl::StatusOr<RawConnection> RegisteredAndGreeted() {
    RETURN_IF_ERROR(Member(config_, v1::ClusterConfig::GRPC, 0).status());
    return Greeted(0);
  }
  // A raw connection to shard 0 whose hello as `rank` was accepted.
  absl::StatusOr<RawConnection> Greeted(uint32_t rank) {
    ASSIGN_OR_RETURN(RawConnection raw, RawConnection::Open(servers_.shard(0)));
    RETURN_IF_ERROR(raw.SendHello(fingerprint(), rank));
    ASSIGN_OR_RETURN(RawConnection::Answer hello, raw.Receive());
    if (hello.reply.code != 0) return absl::InternalError(hello.message);
    return raw;
  }

  // Rank 0's round of `step` alone, over a fresh connection: the shard
  // serves on, and the mean is the member's values.
  void ExpectALoneRoundServed(uint64_t step) {
    auto member = Member(config_, v1::ClusterConfig::AUTO, 0);
    ASSERT_TRUE(member.ok()) << member.status();
    const std::vector<float> v = Values(0);
    std::vector<float> mean(kD);
    const absl::Status round =
        (*member)->AverageBlocks(v1::MODEL, step, 1, v, 1.0f, 0.0f, absl::MakeSpan(mean));
    ASSERT_TRUE(round.ok()) << round;
    EXPECT_EQ(mean, v);
  }

  v1::JobConfig config_;
  testing::ServerSet servers_;
  std::unique_ptr<PsClient> bulk_member_, grpc_member_;  // StartBulkAndGrpcMembers
};

}  // namespace cserps::bulk_test

#endif  // CSERPS_TESTS_WORKER_PS_BULK_TEST_SUPPORT_H_
