// A PushPull round over a bulk channel to a shard scripted by hand from the
// documented frames (common/bulk_wire.h): when the shard refuses one chunk
// and answers another later, the round is over only once that answer is in
// the caller's mean, so no reply lands in memory the caller has taken back.
// Over gRPC, to a shard that holds a call unanswered: the round sends it
// again once its attempt's deadline passes, and the answer counts; to one
// that refuses a call eleven times, it sends it until the round's deadline.
// Two waiters on one bulk channel each return once their own reply is in.
#include <sys/socket.h>
#include <sys/uio.h>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/socket_io.h"
#include "common/status.h"
#include "common/traffic_counter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/ps/bulk_channel.h"
#include "worker/ps/push_pull_round.h"

namespace cserps {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kChunkFloats = 4;
constexpr char kRefusal[] = "chunk 0 refused by the script";

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

absl::Status Send(int fd, const bulk::Reply& reply, const void* body, size_t body_bytes) {
  char head[bulk::Reply::kBytes];
  bulk::Encode(reply, head);
  iovec iov[2] = {{head, sizeof(head)}, {const_cast<void*>(body), body_bytes}};
  return SendAll(fd, absl::MakeSpan(iov), Deadline(), "scripted shard");
}

// The next request's head; its floats are read and dropped.
absl::StatusOr<bulk::Request> NextRequest(int fd) {
  char head[bulk::Request::kBytes];
  RETURN_IF_ERROR(RecvAll(fd, head, sizeof(head), Deadline(), "scripted shard"));
  const bulk::Request request = bulk::DecodeRequest(head);
  std::vector<float> values(request.count);
  RETURN_IF_ERROR(RecvAll(fd, values.data(), values.size() * sizeof(float), Deadline(),
                          "scripted shard"));
  return request;
}

absl::Status AnswerWith(int fd, const bulk::Request& request, float value) {
  const std::vector<float> mean(request.count, value);
  return Send(fd, {.count = request.count, .request_id = request.request_id, .members = 1},
              mean.data(), mean.size() * sizeof(float));
}

// Greets; refuses the first request and answers the second with 2s, both
// only once both have arrived; answers the third with 3s.
absl::Status Script(const Socket& listener) {
  ASSIGN_OR_RETURN(Socket s, AcceptTcp(listener));
  char hello[bulk::Hello::kBytes];
  RETURN_IF_ERROR(RecvAll(s.fd(), hello, sizeof(hello), Deadline(), "scripted shard"));
  RETURN_IF_ERROR(Send(s.fd(), bulk::Reply{}, nullptr, 0));
  ASSIGN_OR_RETURN(const bulk::Request first, NextRequest(s.fd()));
  ASSIGN_OR_RETURN(const bulk::Request second, NextRequest(s.fd()));
  RETURN_IF_ERROR(Send(s.fd(),
                       {.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument),
                        .request_id = first.request_id,
                        .message_bytes = sizeof(kRefusal) - 1},
                       kRefusal, sizeof(kRefusal) - 1));
  RETURN_IF_ERROR(AnswerWith(s.fd(), second, 2.0f));
  ASSIGN_OR_RETURN(const bulk::Request third, NextRequest(s.fd()));
  return AnswerWith(s.fd(), third, 3.0f);
}

TEST(PushPullRoundTest, ARefusedChunkEndsTheRoundOnlyOnceItsOtherChunksAreAnswered) {
  int port = 0;
  absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Status script;
  std::thread shard([&] { script = Script(*listener); });
  absl::StatusOr<std::shared_ptr<BulkChannel>> channel = absl::UnknownError("not connected");
  // Whatever the test got to, the script ends: its accept or its reads.
  absl::Cleanup end_script = [&] {
    if (channel.ok()) channel->reset();
    shutdown(listener->fd(), SHUT_RDWR);
    shard.join();
  };

  channel = BulkChannel::Connect("127.0.0.1", port, 7, 0, {}, Deadline(), "the scripted shard");
  ASSERT_TRUE(channel.ok()) << channel.status();
  TrafficCounter total, traffic;
  std::atomic<int64_t> waited{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint32_t> members[1] = {0};
  RoundSetup setup;
  setup.stream = v1::MODEL;
  setup.step = 1;
  setup.chunk_floats = kChunkFloats;
  setup.deadline = absl::Seconds(20);
  setup.bulk = {*channel};
  setup.total = &total;
  setup.traffic = &traffic;
  setup.waited_nanos = &waited;
  setup.retries = &retries;
  setup.members = members;

  const std::vector<float> payload(2 * kChunkFloats, 1.0f);
  std::vector<float> mean(2 * kChunkFloats, 0.0f);
  {
    std::unique_ptr<ShardedAverage> round = MakePushPullRound(setup, {2 * kChunkFloats});
    ASSERT_TRUE(round->StartShard(0, payload, absl::MakeSpan(mean)).ok());
    const absl::Status waited_shard = round->WaitShard(0);
    EXPECT_TRUE(absl::IsInvalidArgument(waited_shard)) << waited_shard;
    EXPECT_THAT(std::string(waited_shard.message()), HasSubstr(kRefusal));
  }
  // The answered chunk's mean arrived while the round still held the span.
  EXPECT_THAT(mean, ElementsAre(0, 0, 0, 0, 2, 2, 2, 2));

  // The caller takes its memory back; the channel's next request reads only
  // its own reply.
  std::fill(mean.begin(), mean.end(), -1.0f);
  std::vector<float> next(kChunkFloats);
  const absl::Span<const float> values[] = {absl::MakeConstSpan(payload).first(kChunkFloats)};
  absl::StatusOr<uint64_t> id = (*channel)->Send(
      bulk::Request{.step = 2, .stream = v1::MODEL}, values, {absl::MakeSpan(next)}, Deadline());
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Status answered = (*channel)->Wait(*id, Deadline());
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_THAT(next, Each(3.0f));
  EXPECT_THAT(mean, Each(-1.0f));

  std::move(end_script).Invoke();
  EXPECT_TRUE(script.ok()) << script;
}

// Two threads wait on one channel: the one reading for both reads the
// other's reply, and that one returns then, while the reader reads on for
// its own (it once woke only when the reader stopped reading).
TEST(PushPullRoundTest, AWaiterReturnsOnceAnotherWaiterHasReadItsReply) {
  constexpr uint32_t kProbeMembers = 5;
  int port = 0;
  absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Notification second_returned;
  absl::Status script;
  // Greets; answers a probe, saying kProbeMembers members; answers the
  // third request with 2s, and the second with 1s once the third's waiter
  // has returned.
  std::thread shard([&] {
    script = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(Socket s, AcceptTcp(*listener));
      char hello[bulk::Hello::kBytes];
      RETURN_IF_ERROR(RecvAll(s.fd(), hello, sizeof(hello), Deadline(), "scripted shard"));
      RETURN_IF_ERROR(Send(s.fd(), bulk::Reply{}, nullptr, 0));
      ASSIGN_OR_RETURN(const bulk::Request probe, NextRequest(s.fd()));
      const std::vector<float> mean(probe.count, 0.0f);
      RETURN_IF_ERROR(Send(s.fd(),
                           {.count = probe.count, .request_id = probe.request_id,
                            .members = kProbeMembers},
                           mean.data(), mean.size() * sizeof(float)));
      ASSIGN_OR_RETURN(const bulk::Request first, NextRequest(s.fd()));
      ASSIGN_OR_RETURN(const bulk::Request second, NextRequest(s.fd()));
      RETURN_IF_ERROR(AnswerWith(s.fd(), second, 2.0f));
      second_returned.WaitForNotificationWithTimeout(absl::Seconds(20));
      RETURN_IF_ERROR(AnswerWith(s.fd(), first, 1.0f));
      // Until the channel closes.
      char byte;
      return RecvAll(s.fd(), &byte, 1, Deadline(), "scripted shard").ok()
                 ? absl::InternalError("a byte after the requests")
                 : absl::OkStatus();
    }();
  });
  absl::StatusOr<std::unique_ptr<BulkChannel>> channel =
      BulkChannel::Connect("127.0.0.1", port, 7, 0, {}, Deadline(), "the scripted shard");
  absl::Cleanup end_script = [&] {
    if (channel.ok()) channel->reset();
    shutdown(listener->fd(), SHUT_RDWR);
    if (!second_returned.HasBeenNotified()) second_returned.Notify();
    shard.join();
  };
  ASSERT_TRUE(channel.ok()) << channel.status();
  const std::vector<float> payload(kChunkFloats, 0.0f);
  const absl::Span<const float> values[] = {payload};
  std::vector<float> probe_mean(kChunkFloats), first_mean(kChunkFloats),
      second_mean(kChunkFloats);
  auto send = [&](uint64_t step, std::vector<float>& mean) {
    return (*channel)->Send(bulk::Request{.step = step, .stream = v1::MODEL}, values,
                            {absl::MakeSpan(mean)}, Deadline());
  };
  absl::StatusOr<uint64_t> probe = send(1, probe_mean);
  absl::StatusOr<uint64_t> first = send(2, first_mean);
  ASSERT_TRUE(probe.ok()) << probe.status();
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status first_waited;
  std::thread first_waiter(
      [&] { first_waited = (*channel)->Wait(*first, absl::Now() + absl::Seconds(5)); });
  // The probe's reply read (its members seen) means the first waiter reads
  // for the channel, as it is the only one waiting.
  for (int i = 0; i < 20'000 && (*channel)->members() != kProbeMembers; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const bool first_reads = (*channel)->members() == kProbeMembers;
  absl::StatusOr<uint64_t> second = send(3, second_mean);
  absl::Status second_waited = second.status();
  if (first_reads && second.ok()) second_waited = (*channel)->Wait(*second, Deadline());
  second_returned.Notify();
  first_waiter.join();
  ASSERT_TRUE(first_reads);
  EXPECT_TRUE(second_waited.ok()) << second_waited;
  EXPECT_THAT(second_mean, Each(2.0f));
  EXPECT_TRUE(first_waited.ok()) << first_waited << " (the second waiter returned only then)";
  EXPECT_THAT(first_mean, Each(1.0f));
  EXPECT_TRUE((*channel)->Wait(*probe, Deadline()).ok());
  std::move(end_script).Invoke();
  EXPECT_TRUE(script.ok()) << script;
}

// A shard that, when told to, holds its first PushPull unanswered, as a
// call stuck in its connection looks to the client, until the client sends
// it again (having given it up) or the case ends; then answers `refusals`
// calls UNAVAILABLE, as a reset connection ends them, and every later one
// with the values pushed, times 2.
class ScriptedShard final : public v1::ParameterServer::CallbackService {
 public:
  ScriptedShard(bool hold_first, int refusals) : hold_first_(hold_first), refusals_(refusals) {}

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const v1::PushPullRequest* request,
                                     v1::PushPullResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    int call = 0;
    {
      absl::MutexLock lock(&mu_);
      call = calls_++;
      if (hold_first_ && call == 0) {
        held_ = reactor;
        return reactor;
      }
    }
    ReleaseHeld();
    if (call < (hold_first_ ? 1 : 0) + refusals_) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused by the script"));
      return reactor;
    }
    std::vector<float> mean(request->values().size() / sizeof(float));
    std::memcpy(mean.data(), request->values().data(), mean.size() * sizeof(float));
    for (float& v : mean) v *= 2;
    response->set_step(request->step());
    response->set_stream(request->stream());
    response->set_chunk(request->chunk());
    response->set_mean(mean.data(), mean.size() * sizeof(float));
    response->set_members(1);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Ends the held call, which its client has given up by then.
  void ReleaseHeld() {
    grpc::ServerUnaryReactor* held = nullptr;
    {
      absl::MutexLock lock(&mu_);
      std::swap(held, held_);
    }
    if (held != nullptr) held->Finish(grpc::Status::CANCELLED);
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  const bool hold_first_;
  const int refusals_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ServerUnaryReactor* held_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct GrpcShard {
  GrpcShard(bool hold_first, int refusals) : service(hold_first, refusals) {}
  ~GrpcShard() {
    service.ReleaseHeld();
    if (server != nullptr) server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }
  ScriptedShard service;
  std::unique_ptr<grpc::Server> server;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs;
  std::vector<std::string> addresses;
};

void StartGrpcShard(GrpcShard& shard) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&shard.service);
  shard.server = builder.BuildAndStart();
  ASSERT_NE(shard.server, nullptr);
  shard.addresses = {absl::StrCat("127.0.0.1:", port)};
  auto channel = grpc::CreateChannel(shard.addresses[0], grpc::InsecureChannelCredentials());
  // Connected before the round, so that no attempt's deadline is spent on it.
  ASSERT_TRUE(channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(20))));
  shard.stubs.push_back(v1::ParameterServer::NewStub(channel));
}

// A round of one chunk to `shard` over gRPC, each attempt limited to
// `attempt_timeout`, the round to `timeout`.
absl::Status GrpcRound(GrpcShard& shard, absl::Duration timeout, absl::Duration attempt_timeout,
                       std::vector<float>& mean, uint64_t* retries) {
  TrafficCounter total, traffic;
  std::atomic<int64_t> waited{0};
  std::atomic<uint64_t> sent_again{0};
  std::atomic<uint32_t> members[1] = {0};
  RoundSetup setup;
  setup.stubs = &shard.stubs;
  setup.addresses = &shard.addresses;
  setup.stream = v1::MODEL;
  setup.step = 1;
  setup.chunk_floats = kChunkFloats;
  setup.deadline = timeout;
  setup.attempt_timeout = attempt_timeout;
  setup.total = &total;
  setup.traffic = &traffic;
  setup.waited_nanos = &waited;
  setup.retries = &sent_again;
  setup.members = members;
  const std::vector<float> payload = {1, 2, 3, 4};
  std::unique_ptr<ShardedAverage> round = MakePushPullRound(setup, {kChunkFloats});
  RETURN_IF_ERROR(round->StartShard(0, payload, absl::MakeSpan(mean)));
  const absl::Status status = round->WaitShard(0);
  *retries = sent_again.load();
  return status;
}

TEST(PushPullRoundTest, ACallHeldPastItsAttemptsDeadlineIsSentAgainWithinTheRounds) {
  GrpcShard shard(/*hold_first=*/true, /*refusals=*/0);
  ASSERT_NO_FATAL_FAILURE(StartGrpcShard(shard));
  std::vector<float> mean(kChunkFloats, 0.0f);
  uint64_t retries = 0;
  const absl::Status status = GrpcRound(shard, absl::Seconds(10), absl::Seconds(1), mean, &retries);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(mean, ElementsAre(2, 4, 6, 8));
  EXPECT_EQ(retries, 1u);
  EXPECT_EQ(shard.service.calls(), 2);
}

// Without an attempt's own deadline the held call ends the round at the
// round's deadline, as it did before attempts had one.
TEST(PushPullRoundTest, ACallHeldWithoutAnAttemptDeadlineEndsTheRoundAtItsDeadline) {
  GrpcShard shard(/*hold_first=*/true, /*refusals=*/0);
  ASSERT_NO_FATAL_FAILURE(StartGrpcShard(shard));
  std::vector<float> mean(kChunkFloats, 0.0f);
  uint64_t retries = 0;
  const absl::Status status = GrpcRound(shard, absl::Seconds(2), absl::InfiniteDuration(), mean, &retries);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(mean, Each(0.0f));
  EXPECT_EQ(retries, 0u);
  EXPECT_EQ(shard.service.calls(), 1);
}

// A call whose connection is reset again and again is sent as often as the
// round's deadline allows: more than ten times, which used to be the most.
TEST(PushPullRoundTest, ACallRefusedElevenTimesIsSentAgainWithinTheRoundsDeadline) {
  GrpcShard shard(/*hold_first=*/false, /*refusals=*/11);
  ASSERT_NO_FATAL_FAILURE(StartGrpcShard(shard));
  std::vector<float> mean(kChunkFloats, 0.0f);
  uint64_t retries = 0;
  const absl::Status status =
      GrpcRound(shard, absl::Seconds(20), absl::Seconds(5), mean, &retries);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(mean, ElementsAre(2, 4, 6, 8));
  EXPECT_EQ(retries, 11u);
  EXPECT_EQ(shard.service.calls(), 12);
}

}  // namespace
}  // namespace cserps
