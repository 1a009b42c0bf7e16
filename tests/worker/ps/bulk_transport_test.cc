// The bulk transport (docs/protocol.md 17) on in-process shards: members on
// gRPC and on bulk connections average (or exchange sparse entries) in the
// same rounds; the shard's refusals of bad hellos and frames, spoken here
// with raw sockets from the documented frame layout (common/bulk_wire.h),
// name what is wrong, and the shard serves on; a shutdown answers a waiting
// member; a round in flight when its connection breaks lands after the
// client has connected anew.
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bulk_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/bulk_server.h"
#include "server/ps_server.h"
#include "server/sparse_aggregate.h"
#include "tests/worker/ps/bulk_test_support.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/sharded_average.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using bulk_test::BulkTransportTest;
using bulk_test::ExpectALoneRoundAnswered;
using bulk_test::ExpectTheEnd;
using bulk_test::kD;
using bulk_test::MakeConfig;
using bulk_test::Member;
using bulk_test::RawConnection;
using bulk_test::Values;

// gtopk-ssgd at density 0.01: k = k_s = 30 on the one shard.
constexpr char kGtopk[] = R"pb(name: "gtopk-ssgd" density: 0.01)pb";
constexpr uint32_t kK = 30;

// Member `rank`'s kK sparse entries: ascending indices, spread over the
// model, overlapping the other member's in part.
SparseVector Entries(int rank) {
  SparseVector e;
  for (uint32_t i = 0; i < kK; ++i) {
    e.indices.push_back(i * 97 + (i % 2 == 0 ? 0 : 13 * rank));
    e.values.push_back(0.5f * static_cast<float>(i % 7) - 1.25f * rank);
  }
  return e;
}

TEST_F(BulkTransportTest, MembersOnGrpcAndOnBulkAverageIntoTheSameRound) {
  StartJob(2);
  auto grpc_member = Member(config_, v1::ClusterConfig::GRPC, 0);
  auto bulk_member = Member(config_, v1::ClusterConfig::AUTO, 1);
  ASSERT_TRUE(grpc_member.ok()) << grpc_member.status();
  ASSERT_TRUE(bulk_member.ok()) << bulk_member.status();
  const std::vector<float> v0 = Values(0), v1 = Values(1);
  std::vector<float> mean0(kD), mean1(kD);
  absl::Status s0, s1;
  std::thread t0([&] {
    s0 = (*grpc_member)->AverageBlocks(v1::MODEL, 1, 1, v0, 1.0f, 0.0f, absl::MakeSpan(mean0));
  });
  std::thread t1([&] {
    s1 = (*bulk_member)->AverageBlocks(v1::MODEL, 1, 1, v1, 3.0f, 0.0f, absl::MakeSpan(mean1));
  });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  for (uint64_t i = 0; i < kD; ++i) {
    const float want = static_cast<float>((1.0 * v0[i] + 3.0 * v1[i]) / 4.0);
    ASSERT_EQ(mean0[i], want) << i;
    ASSERT_EQ(std::memcmp(&mean0[i], &mean1[i], sizeof(float)), 0) << i;
  }
  // The bulk member's round went over its connection: one frame each way,
  // a 48-byte request header and a 24-byte reply header.
  const TrafficCounts bulk = (*bulk_member)->traffic(v1::MODEL);
  EXPECT_EQ(bulk.request_bytes, bulk::Request::kBytes + kD * sizeof(float));
  EXPECT_EQ(bulk.reply_bytes, bulk::Reply::kBytes + kD * sizeof(float));
  EXPECT_NE((*grpc_member)->traffic(v1::MODEL).request_bytes, bulk.request_bytes);
}

// A connection cut while its push waits for the round: the member sends
// the push again over gRPC, the round counts it once, and the next round
// goes over a new connection.
TEST_F(BulkTransportTest, APushWhoseConnectionIsCutGoesOverGrpcAndIsCountedOnce) {
  ASSERT_NO_FATAL_FAILURE(StartBulkAndGrpcMembers());
  PsClient& cut_member = *bulk_member_;
  PsClient& other = *grpc_member_;
  const std::vector<float> v0 = Values(0), v1 = Values(1);
  std::vector<float> mean0(kD), mean1(kD);
  absl::Status s0, s1;
  ParameterServerService& service = servers_.shard(0).service();
  const bulk_test::Cut cut = bulk_test::CutWhileWaiting(
      servers_.shard(0).bulk_port(),
      [&](size_t n) { return service.WaitForWaitingCalls(n, bulk_test::kIo); },
      [&] {
        s0 = cut_member.AverageBlocks(v1::MODEL, 1, 1, v0, 1.0f, 0.0f, absl::MakeSpan(mean0));
      },
      [&] {
        s1 = other.AverageBlocks(v1::MODEL, 1, 1, v1, 3.0f, 0.0f, absl::MakeSpan(mean1));
      });
  ASSERT_TRUE(cut.waited);
  ASSERT_EQ(cut.connections, 1);
  ASSERT_TRUE(cut.resent);
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  for (uint64_t i = 0; i < kD; ++i) {
    ASSERT_EQ(mean0[i], static_cast<float>((1.0 * v0[i] + 3.0 * v1[i]) / 4.0)) << i;
    ASSERT_EQ(std::memcmp(&mean0[i], &mean1[i], sizeof(float)), 0) << i;
  }
  EXPECT_EQ(cut_member.retries(), 1u);
  EXPECT_EQ(service.counters().model_rounds_completed, 1u);

  const TrafficCounts before = cut_member.traffic(v1::MODEL);
  std::thread t1([&] {
    s1 = other.AverageBlocks(v1::MODEL, 2, 1, v1, 1.0f, 0.0f, absl::MakeSpan(mean1));
  });
  s0 = cut_member.AverageBlocks(v1::MODEL, 2, 1, v0, 1.0f, 0.0f, absl::MakeSpan(mean0));
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  const TrafficCounts after = cut_member.traffic(v1::MODEL);
  EXPECT_EQ(after.request_bytes - before.request_bytes,
            bulk::Request::kBytes + kD * sizeof(float));
  EXPECT_EQ(after.reply_bytes - before.reply_bytes, bulk::Reply::kBytes + kD * sizeof(float));
}

// Two rounds in flight on one connection when it is cut: the first is
// sent again over gRPC, the next round begun connects anew, and the second,
// waited for after that, is still answered through the channel it began on.
TEST_F(BulkTransportTest, ARoundInFlightOutlivesTheReplacementOfItsChannel) {
  ASSERT_NO_FATAL_FAILURE(StartBulkAndGrpcMembers());
  PsClient& cut_member = *bulk_member_;
  const std::vector<float> v0 = Values(0), v1 = Values(1);
  CutRounds rounds;
  ASSERT_TRUE(BeginAndCut(2, &rounds));
  auto& [first, second] = rounds.round;
  const std::vector<float>& first_mean = rounds.mean[0];
  const std::vector<float>& second_mean = rounds.mean[1];
  ParameterServerService& service = servers_.shard(0).service();

  absl::Status other_rounds;
  std::thread t = GrpcMemberRounds(&other_rounds);
  const absl::Status first_landed = first->WaitShard(0);
  // Finds the channel broken and replaces it.
  std::unique_ptr<ShardedAverage> third =
      cut_member.BeginShardedAverage(v1::MODEL, 3, 1, 1.0f, 0.0f);
  const absl::Status second_landed = second->WaitShard(0);
  t.join();
  ASSERT_TRUE(first_landed.ok()) << first_landed;
  ASSERT_TRUE(second_landed.ok()) << second_landed;
  ASSERT_TRUE(other_rounds.ok()) << other_rounds;
  for (uint64_t i = 0; i < kD; ++i) {
    const float want = static_cast<float>((1.0 * v0[i] + 1.0 * v1[i]) / 2.0);
    ASSERT_EQ(first_mean[i], want) << i;
    ASSERT_EQ(second_mean[i], want) << i;
  }
  EXPECT_EQ(cut_member.retries(), 2u);
  EXPECT_EQ(service.counters().model_rounds_completed, 2u);
}

// A round begun on a channel that broke before it sent anything sends its
// chunks over gRPC, and they are first sends: their floats count (the
// achieved compression reads them), and they are no retries.
TEST_F(BulkTransportTest, ChunksABrokenChannelNeverSentCountAsSent) {
  ASSERT_NO_FATAL_FAILURE(StartBulkAndGrpcMembers());
  PsClient& cut_member = *bulk_member_;
  CutRounds rounds;
  ASSERT_TRUE(BeginAndCut(1, &rounds));
  auto& [first, second] = rounds.round;
  absl::Status other_rounds;
  std::thread t = GrpcMemberRounds(&other_rounds);
  // Finds the channel broken; the second round still holds it.
  const absl::Status first_landed = first->WaitShard(0);
  const uint64_t retries = cut_member.retries();
  const TrafficCounts before = cut_member.traffic(v1::MODEL);
  absl::Status second_landed = second->StartShard(0, Values(0), absl::MakeSpan(rounds.mean[1]));
  if (second_landed.ok()) second_landed = second->WaitShard(0);
  t.join();
  ASSERT_TRUE(first_landed.ok()) << first_landed;
  ASSERT_TRUE(second_landed.ok()) << second_landed;
  ASSERT_TRUE(other_rounds.ok()) << other_rounds;
  EXPECT_EQ(cut_member.traffic(v1::MODEL).request_floats - before.request_floats, kD);
  EXPECT_EQ(cut_member.retries(), retries);
}

// A bulk push arrives by the shard's clock, as a gRPC one does: its round
// times out by that clock, and its rank is heard by it.
TEST_F(BulkTransportTest, ABulkPushIsTimedByTheShardsClock) {
  constexpr int kTimeoutS = 20;
  std::atomic<int64_t> now_s{1000};
  config_ = MakeConfig(2, kTimeoutS, R"pb(name: "ssgd")pb");
  ASSERT_TRUE(servers_
                  .Start(&config_, {.now = [&now_s] { return absl::FromUnixSeconds(now_s); },
                                    .expiry_thread = false})
                  .ok());
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  ParameterServerService& service = servers_.shard(0).service();
  ASSERT_TRUE(raw->SendWholePush(1, 1, Values(0), v1::MODEL).ok());
  ASSERT_TRUE(service.WaitForWaitingCalls(1, bulk_test::kIo));
  const absl::Time opened = absl::FromUnixSeconds(now_s);
  EXPECT_EQ(service.ExpireOverdueRounds(opened + absl::Seconds(kTimeoutS - 1)), 0);
  EXPECT_EQ(service.ExpireOverdueRounds(opened + absl::Seconds(kTimeoutS)), 1);
  auto failed = raw->Receive();
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->reply.code, static_cast<uint32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(failed->message, HasSubstr("missing ranks 1"));
}

TEST_F(BulkTransportTest, WithoutABulkPortMembersUseGrpc) {
  config_ = MakeConfig(1, 20);
  auto server = PsServer::Start(config_, 0, "127.0.0.1:0", {}, nullptr, /*bulk_port=*/-1);
  ASSERT_TRUE(server.ok()) << server.status();
  config_.mutable_cluster()->set_servers(0, (*server)->address());
  EXPECT_EQ((*server)->bulk_port(), 0);
  auto member = Member(config_, v1::ClusterConfig::AUTO, 0);
  ASSERT_TRUE(member.ok()) << member.status();
  const std::vector<float> v = Values(0);
  std::vector<float> mean(kD);
  ASSERT_TRUE((*member)->AverageBlocks(v1::MODEL, 1, 1, v, 1.0f, 0.0f, absl::MakeSpan(mean)).ok());
  EXPECT_EQ(mean, v);
  EXPECT_NE((*member)->traffic(v1::MODEL).request_bytes,
            bulk::Request::kBytes + kD * sizeof(float));
}

TEST_F(BulkTransportTest, HellosOfStrangersAreRefusedNamingWhatIsWrong) {
  StartJob(1);
  struct Case {
    uint32_t magic;
    uint64_t fingerprint;
    uint32_t rank;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {0x20544547, fingerprint(), 0, absl::StatusCode::kInvalidArgument,
       "not a cserps bulk connection"},
      {bulk::kMagic, fingerprint() + 1, 0, absl::StatusCode::kFailedPrecondition, "fingerprint"},
      // Rank 0 has not registered with the shard.
      {bulk::kMagic, fingerprint(), 0, absl::StatusCode::kFailedPrecondition, "rank 0"},
      {bulk::kMagic, fingerprint(), 7, absl::StatusCode::kInvalidArgument, "rank 7"},
  };
  for (const Case& c : cases) {
    auto raw = RawConnection::Open(servers_.shard(0));
    ASSERT_TRUE(raw.ok()) << raw.status();
    ASSERT_TRUE(raw->SendHello(c.fingerprint, c.rank, c.magic).ok());
    auto answer = raw->Receive();
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->reply.code, static_cast<uint32_t>(c.code)) << answer->message;
    EXPECT_EQ(answer->reply.request_id, 0u);
    EXPECT_THAT(answer->message, HasSubstr(c.says));
    EXPECT_TRUE(raw->Closed()) << c.says;
  }
}

TEST_F(BulkTransportTest, BadRequestsAreRefusedAndTheShardServesOn) {
  StartJob(1);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const uint64_t bad_input = servers_.shard(0).shard().bad_input();

  const std::vector<float> v = Values(0);
  // Too few floats for the chunk: refused, and the connection reads on.
  bulk::Request request{.request_id = 11, .step = 1, .stream = v1::MODEL};
  request.count = 10;
  ASSERT_TRUE(raw->SendRequest(request, absl::MakeConstSpan(v).first(10)).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->reply.request_id, 11u);
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(refused->message, HasSubstr(absl::StrCat("expected ", kD, " float32 values, got 10")));
  // An unknown stream: refused by the same checks as gRPC's.
  request = {.count = static_cast<uint32_t>(kD), .request_id = 12, .step = 1, .stream = 9};
  ASSERT_TRUE(raw->SendRequest(request, v).ok());
  refused = raw->Receive();
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->reply.request_id, 12u);
  EXPECT_THAT(refused->message, HasSubstr("unknown stream 9"));
  // A good one completes its round.
  request = {.count = static_cast<uint32_t>(kD), .request_id = 13, .step = 1,
             .stream = v1::MODEL};
  ASSERT_TRUE(raw->SendRequest(request, v).ok());
  auto answered = raw->Receive();
  ASSERT_TRUE(answered.ok());
  EXPECT_EQ(answered->reply.request_id, 13u);
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->floats, v);
  // More floats than a chunk holds cannot be read past: the shard says so
  // and ends the connection.
  char head[bulk::Request::kBytes];
  bulk::Encode(bulk::Request{.count = 1u << 30, .request_id = 14, .step = 2,
                             .stream = v1::MODEL},
               head);
  ExpectTheEnd(*raw, head, "a chunk holds at most");
  // Request id 0, which a reply to could not be told from the end.
  auto zero = Greeted(0);
  ASSERT_TRUE(zero.ok()) << zero.status();
  bulk::Encode(bulk::Request{.count = static_cast<uint32_t>(kD), .request_id = 0, .step = 2,
                             .stream = v1::MODEL},
               head);
  ExpectTheEnd(*zero, head, "request_id 0");
  // Each counted as bad input (cserps_server_refused_total), as over gRPC.
  EXPECT_EQ(servers_.shard(0).shard().bad_input(), bad_input + 4);

  ExpectALoneRoundServed(2);
}

// Connections that never say hello: those within the limit (the members'
// and the spare ones) wait for their hello, and past those the shard closes
// them unanswered, at no thread's cost; it serves on.
TEST_F(BulkTransportTest, AFloodOfSilentConnectionsIsClosedUnansweredAndTheShardServesOn) {
  StartJob(1);
  ASSERT_TRUE(Member(config_, v1::ClusterConfig::GRPC, 0).ok());
  const size_t answered =
      BulkServer::kConnectionsPerMember * 1 + BulkServer::kSpareConnections;
  std::vector<RawConnection> silent;
  for (size_t i = 0; i < answered; ++i) {
    auto raw = RawConnection::Open(servers_.shard(0));
    ASSERT_TRUE(raw.ok()) << raw.status();
    silent.push_back(*std::move(raw));
  }
  // Accepted after all of those, which wait for their hellos.
  auto flood = RawConnection::Open(servers_.shard(0));
  ASSERT_TRUE(flood.ok()) << flood.status();
  EXPECT_TRUE(flood->Closed());
  // The last one within the limit is served.
  ASSERT_TRUE(silent.back().SendHello(fingerprint(), 0).ok());
  auto greeted = silent.back().Receive();
  ASSERT_TRUE(greeted.ok()) << greeted.status();
  EXPECT_EQ(greeted->reply.code, 0u) << greeted->message;

  silent.clear();
  ExpectALoneRoundServed(1);
}

// One member's connections beyond its limit are refused at their hello;
// another member's are not, and a connection the member ends gives its
// slot back.
TEST_F(BulkTransportTest, AMemberHoldsAtMostItsLimitOfConnectionsAndLeavesTheOthersTheirs) {
  StartJob(2);
  ASSERT_TRUE(Member(config_, v1::ClusterConfig::GRPC, 0).ok());
  ASSERT_TRUE(Member(config_, v1::ClusterConfig::GRPC, 1).ok());
  std::vector<RawConnection> held;
  for (uint32_t i = 0; i < BulkServer::kConnectionsPerMember; ++i) {
    auto raw = Greeted(0);
    ASSERT_TRUE(raw.ok()) << raw.status();
    held.push_back(*std::move(raw));
  }
  auto over = RawConnection::Open(servers_.shard(0));
  ASSERT_TRUE(over.ok()) << over.status();
  ASSERT_TRUE(over->SendHello(fingerprint(), 0).ok());
  auto refused = over->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused->message,
              HasSubstr("rank 0 already holds 4 bulk connections to shard 0"));
  EXPECT_TRUE(over->Closed());

  auto other = Greeted(1);
  EXPECT_TRUE(other.ok()) << other.status();

  // Ended by the member: the shard ends its side once its reader is done.
  held.back().CloseSending();
  ASSERT_TRUE(held.back().Closed());
  auto again = Greeted(0);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A member idle between requests keeps its connection for as long as it
// likes; one that stops halfway through a request's head is ended after
// the round timeout, and the shard serves on.
TEST_F(BulkTransportTest, AHeadCutShortEndsItsConnectionAndAnIdleOneStays) {
  StartJob(1, /*round_timeout_s=*/1);
  auto idle = RegisteredAndGreeted();
  ASSERT_TRUE(idle.ok()) << idle.status();
  auto stalled = Greeted(0);
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  char head[bulk::Request::kBytes];
  bulk::Encode(bulk::Request{.count = static_cast<uint32_t>(kD), .request_id = 1, .step = 1,
                             .stream = v1::MODEL},
               head);
  ASSERT_TRUE(stalled->Send(head, 10).ok());
  EXPECT_TRUE(stalled->Closed());
  // Idle since before the other stalled.
  ExpectALoneRoundAnswered(*idle, 1);
}

// A port the resolver would take modulo 65536, or a negative one other
// than -1 (off), is refused, not bound as another.
TEST(BulkPortTest, APortOutOfRangeIsRefused) {
  const v1::JobConfig config = MakeConfig(1, 20, R"pb(name: "ssgd")pb");
  for (int port : {70000, 65536, -5}) {
    SCOPED_TRACE(port);
    auto server = PsServer::Start(config, 0, "127.0.0.1:0", {}, nullptr, port);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(server.status().message()),
                HasSubstr(absl::StrCat("bulk_port ", port, " is out of range")));
  }
}

// The peer's end of sending is not held open until the acceptor reaps the
// connection: its replies go out, then the shard ends it.
TEST_F(BulkTransportTest, APeerThatStopsSendingGetsItsRepliesAndTheEnd) {
  StartJob(1);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<float> v = Values(0);
  ASSERT_TRUE(raw->SendWholePush(1, 1, v, v1::MODEL).ok());
  raw->CloseSending();
  auto answered = raw->Receive();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->floats, v);
  EXPECT_TRUE(raw->Closed());
}

// ... also of a request whose round completes after the peer stopped
// sending: here rank 1 pushes once rank 0 has shut its side down.
TEST_F(BulkTransportTest, APeerThatStopsSendingGetsTheRepliesOfItsRoundsInFlight) {
  StartJob(2);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  auto member1 = Member(config_, v1::ClusterConfig::GRPC, 1);
  ASSERT_TRUE(member1.ok()) << member1.status();
  const std::vector<float> v0 = Values(0), v1 = Values(1);
  ASSERT_TRUE(raw->SendWholePush(1, 1, v0, v1::MODEL).ok());
  raw->CloseSending();
  std::vector<float> mean(kD);
  const absl::Status pushed =
      (*member1)->AverageBlocks(v1::MODEL, 1, 1, v1, 1.0f, 0.0f, absl::MakeSpan(mean));
  ASSERT_TRUE(pushed.ok()) << pushed;
  auto answered = raw->Receive();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->reply.request_id, 1u);
  EXPECT_EQ(answered->floats, mean);
  EXPECT_TRUE(raw->Closed());
}

// A reply could not be matched to one of two requests of one id.
TEST_F(BulkTransportTest, ARequestIdStillInFlightEndsTheConnection) {
  StartJob(2);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<float> v = Values(0);
  // Rank 1 never pushes: request 5 waits in its round.
  ASSERT_TRUE(raw->SendWholePush(5, 1, v, v1::MODEL).ok());
  ASSERT_TRUE(raw->SendWholePush(5, 2, v, v1::MODEL).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->reply.request_id, 0u);
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(refused->message, HasSubstr("bulk request_id 5 is already waiting for its reply"));
  EXPECT_TRUE(raw->Closed());
}

// An id is unique among the requests in flight only: once its reply is in,
// the next request may carry it again, at once, though the reply was sent
// by the other member's thread (which completed the round).
TEST_F(BulkTransportTest, AnIdMayBeUsedAgainOnceItsReplyIsIn) {
  constexpr int kRounds = 300;
  StartJob(2);
  std::vector<RawConnection> members;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(Member(config_, v1::ClusterConfig::GRPC, rank).ok());
    auto raw = Greeted(rank);
    ASSERT_TRUE(raw.ok()) << raw.status();
    members.push_back(*std::move(raw));
  }
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m) {
    threads.emplace_back([&, m] {
      const std::vector<float> v = Values(m);
      for (uint64_t step = 1; step <= kRounds && failures[m].empty(); ++step) {
        absl::Status sent = members[m].SendWholePush(1, step, v, v1::MODEL);
        auto answer = members[m].Receive();
        if (!sent.ok() || !answer.ok()) {
          failures[m] = absl::StrCat("step ", step, ": ", sent.ToString(), " ",
                                     answer.status().ToString());
        } else if (answer->reply.code != 0 || answer->reply.request_id != 1) {
          failures[m] = absl::StrCat("step ", step, ": request_id ", answer->reply.request_id,
                                     ": ", answer->message);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

// The most TCP's buffers of one connection may hold, both ways: the
// maxima of tcp_rmem and tcp_wmem, where the kernel's autotuning stops.
uint64_t MaxSocketBufferBytes() {
  uint64_t total = 0;
  for (const char* path : {"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"}) {
    std::ifstream in(path);
    uint64_t least = 0, initial = 0, most = 0;
    in >> least >> initial >> most;
    total += most;
  }
  return total;
}

// A peer that sends request after request and reads none of the replies:
// once the replies queued for it reach a bound, the shard stops reading its
// requests instead of queueing replies without end, so the peer's sends stall
// (here requests the shard refuses at once, three times as many bytes as the
// sockets' buffers can hold); the shard serves on.
// Requests refused as soon as they are read (a step far past the step
// window), more than both ends' socket buffers could hold of them.
std::string AFloodOfRefusedRequests() {
  const uint64_t count = 3 * MaxSocketBufferBytes() / bulk::Request::kBytes;
  std::string requests(count * bulk::Request::kBytes, '\0');
  for (uint64_t i = 0; i < count; ++i) {
    bulk::Encode(bulk::Request{.count = 0, .request_id = i + 1, .step = 1000000,
                               .stream = v1::MODEL},
                 requests.data() + i * bulk::Request::kBytes);
  }
  return requests;
}

TEST_F(BulkTransportTest, APeerThatReadsNoRepliesIsReadNoFurther) {
  StartJob(1);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::string requests = AFloodOfRefusedRequests();
  ASSERT_FALSE(requests.empty());
  const absl::Status sent = raw->SendFor(requests.data(), requests.size(), absl::Seconds(3));
  EXPECT_TRUE(absl::IsDeadlineExceeded(sent)) << sent;
  EXPECT_LT(servers_.shard(0).service().counters().other.request_bytes, requests.size());
  raw->Close();
  ExpectALoneRoundServed(1);
}

// Peers that read none of their replies each hold the shard's shutdown
// until its drain timeout (3 s): once for all of them, not once each.
TEST_F(BulkTransportTest, PeersThatReadNothingHoldTheShutdownOnceNotOnceEach) {
  StartJob(1);
  ASSERT_TRUE(Member(config_, v1::ClusterConfig::GRPC, 0).ok());
  constexpr int kPeers = BulkServer::kConnectionsPerMember;
  std::vector<RawConnection> peers;
  for (int i = 0; i < kPeers; ++i) {
    auto raw = Greeted(0);
    ASSERT_TRUE(raw.ok()) << raw.status();
    peers.push_back(*std::move(raw));
  }
  const std::string requests = AFloodOfRefusedRequests();
  ASSERT_FALSE(requests.empty());
  // A send that stops short: the shard reads no further, its replies to
  // this peer fill both sockets' buffers, and its writer waits to send.
  std::vector<absl::Status> sent(kPeers);
  std::vector<std::thread> flooding;
  for (int i = 0; i < kPeers; ++i) {
    flooding.emplace_back([&, i] {
      sent[i] = peers[i].SendFor(requests.data(), requests.size(), absl::Seconds(2));
    });
  }
  for (std::thread& t : flooding) t.join();
  for (const absl::Status& s : sent) ASSERT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  const absl::Time start = absl::Now();
  servers_.shard(0).Shutdown();
  // Once each would be 12 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(7));
}

TEST_F(BulkTransportTest, APushCutShortIsNotCounted) {
  StartJob(2);
  auto member0 = Member(config_, v1::ClusterConfig::AUTO, 0);
  auto member1 = Member(config_, v1::ClusterConfig::AUTO, 1);
  ASSERT_TRUE(member0.ok() && member1.ok());
  const std::vector<float> v0 = Values(0), v1 = Values(1);
  {
    // Rank 1's push of half its floats, then the connection drops.
    auto raw = Greeted(1);
    ASSERT_TRUE(raw.ok()) << raw.status();
    char head[bulk::Request::kBytes];
    bulk::Encode(bulk::Request{.count = static_cast<uint32_t>(kD), .request_id = 1, .step = 1,
                               .stream = v1::MODEL},
                 head);
    ASSERT_TRUE(raw->Send(head, sizeof(head)).ok());
    ASSERT_TRUE(raw->Send(v1.data(), kD / 2 * sizeof(float)).ok());
  }
  std::vector<float> mean0(kD), mean1(kD);
  absl::Status s0, s1;
  std::thread t0([&] {
    s0 = (*member0)->AverageBlocks(v1::MODEL, 1, 1, v0, 1.0f, 0.0f, absl::MakeSpan(mean0));
  });
  std::thread t1([&] {
    s1 = (*member1)->AverageBlocks(v1::MODEL, 1, 1, v0, 1.0f, 0.0f, absl::MakeSpan(mean1));
  });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  // Both members pushed v0: the cut push of v1 is not in the mean.
  EXPECT_EQ(mean0, v0);
  EXPECT_EQ(mean1, v0);
}

TEST_F(BulkTransportTest, ShutdownAnswersAWaitingPushWithUnavailable) {
  StartJob(2);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  // Rank 1 never pushes, so request 1 waits in its round. Requests are
  // read in order: once request 2's refusal is back, request 1 is in.
  const std::vector<float> v = Values(0);
  ASSERT_TRUE(raw->SendWholePush(1, 1, v, v1::MODEL).ok());
  ASSERT_TRUE(raw->SendWholePush(2, 1, v, 9).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->reply.request_id, 2u);
  servers_.shard(0).Shutdown();
  auto answer = raw->Receive();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->reply.request_id, 1u);
  EXPECT_EQ(answer->reply.code, static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(answer->message, HasSubstr("shutting down"));
}

// The broken bulk connection's chunk is sent again over gRPC, waiting for
// the shard to come back until the round's deadline, which then fails it
// naming the shard.
TEST_F(BulkTransportTest, AShardGoneFailsTheRoundAtItsDeadlineNamingIt) {
  StartJob(1, /*round_timeout_s=*/1);
  auto member = Member(config_, v1::ClusterConfig::AUTO, 0, {.rpc_slack = absl::Seconds(1)});
  ASSERT_TRUE(member.ok());
  servers_.shard(0).Shutdown();
  const std::vector<float> v = Values(0);
  std::vector<float> mean(kD);
  const absl::Status status =
      (*member)->AverageBlocks(v1::MODEL, 1, 1, v, 1.0f, 0.0f, absl::MakeSpan(mean));
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("PushPull to shard 0 at "));
  EXPECT_GE((*member)->retries(), 1u);
}

TEST_F(BulkTransportTest, SparseMembersOnGrpcAndOnBulkGetTheSameRoundsReply) {
  StartJob(2, 20, kGtopk);
  auto grpc_member = Member(config_, v1::ClusterConfig::GRPC, 0);
  auto bulk_member = Member(config_, v1::ClusterConfig::AUTO, 1);
  ASSERT_TRUE(grpc_member.ok()) << grpc_member.status();
  ASSERT_TRUE(bulk_member.ok()) << bulk_member.status();
  const SparseVector e0 = Entries(0), e1 = Entries(1);
  auto before = (*grpc_member)->GetStatus(0);
  ASSERT_TRUE(before.ok()) << before.status();
  SparseVector r0, r1;
  absl::Status s0, s1;
  std::thread t0([&] { s0 = (*grpc_member)->ExchangeSparse(1, e0, &r0); });
  std::thread t1([&] { s1 = (*bulk_member)->ExchangeSparse(1, e1, &r1); });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  const SparseVector want = AggregateSparse({e0, e1}, SparseSelection::kGlobalTopK, kK);
  ASSERT_EQ(want.indices.size(), kK);
  EXPECT_EQ(r0.indices, want.indices);
  EXPECT_EQ(r0.values, want.values);
  EXPECT_EQ(r1.indices, want.indices);
  EXPECT_EQ(r1.values, want.values);
  // The bulk member's exchange went over its connection: one frame each
  // way, headers of 48 and 24 bytes, 8 bytes an entry.
  const TrafficCounts bulk = (*bulk_member)->sparse_traffic();
  EXPECT_EQ(bulk.request_bytes, bulk::SparseRequest::kBytes + kK * 8);
  EXPECT_EQ(bulk.reply_bytes, bulk::Reply::kBytes + kK * 8);
  const TrafficCounts grpc = (*grpc_member)->sparse_traffic();
  EXPECT_NE(grpc.request_bytes, bulk.request_bytes);
  // The shard counts both members' bytes as they did.
  auto after = (*grpc_member)->GetStatus(0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->bytes_in() - before->bytes_in(), grpc.request_bytes + bulk.request_bytes);
  EXPECT_EQ(after->bytes_out() - before->bytes_out(), grpc.reply_bytes + bulk.reply_bytes);
}

TEST_F(BulkTransportTest, BadSparseRequestsAreRefusedAndTheShardServesOn) {
  StartJob(1, 20, kGtopk);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const SparseVector good = Entries(0);
  SparseVector unsorted = good;
  std::swap(unsorted.indices[3], unsorted.indices[4]);
  SparseVector short_push = good;
  short_push.indices.resize(2);
  short_push.values.resize(2);
  struct Case {
    uint32_t k;
    const SparseVector* entries;
    std::string says;
  };
  const std::vector<Case> cases = {
      {3, &good, "k 3 is not this shard's k_s 30"},
      {kK, &short_push, "push has 2 entries; k is 30"},
      {kK, &unsorted, "indices must be strictly ascending"},
  };
  uint64_t id = 20;
  for (const Case& c : cases) {
    ASSERT_TRUE(raw->SendSparse({.request_id = ++id, .step = 1, .k = c.k}, *c.entries).ok());
    auto refused = raw->Receive(/*sparse=*/true);
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->reply.request_id, id);
    EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(refused->message, HasSubstr("SparsePushPull (step 1) from rank 0 to shard 0"));
    EXPECT_THAT(refused->message, HasSubstr(c.says));
  }
  // A good one completes its round: one member's sum is its own entries.
  ASSERT_TRUE(raw->SendSparse({.request_id = 30, .step = 1, .k = kK}, good).ok());
  auto answered = raw->Receive(/*sparse=*/true);
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->reply.request_id, 30u);
  ASSERT_EQ(answered->reply.count, kK);
  EXPECT_EQ(std::memcmp(answered->floats.data(), good.indices.data(), kK * 4), 0);
  EXPECT_EQ(std::memcmp(answered->floats.data() + kK, good.values.data(), kK * 4), 0);
  // More entries than a message holds cannot be read past: the shard says
  // so and ends the connection.
  char head[bulk::SparseRequest::kBytes];
  bulk::Encode(bulk::SparseRequest{.count = 1u << 30, .request_id = 31, .step = 2, .k = kK},
               head);
  ExpectTheEnd(*raw, head, "sparse entries; a request holds at most");

  // The shard serves on: the member's next exchange over a fresh connection.
  auto again = Member(config_, v1::ClusterConfig::AUTO, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  SparseVector result;
  ASSERT_TRUE((*again)->ExchangeSparse(2, good, &result).ok());
  EXPECT_EQ(result.indices, good.indices);
  EXPECT_EQ((*again)->sparse_traffic().request_bytes, bulk::SparseRequest::kBytes + kK * 8);
}

TEST_F(BulkTransportTest, ADenseJobRefusesSparsePushesAndReadsOn) {
  StartJob(1);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(raw->SendSparse({.request_id = 5, .step = 1, .k = kK}, Entries(0)).ok());
  auto refused = raw->Receive(/*sparse=*/true);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->reply.request_id, 5u);
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(refused->message, HasSubstr("does not use the sparse exchange"));
  ExpectALoneRoundAnswered(*raw, 6);
}

// As for PushPull: a sparse push whose connection is cut goes again over
// gRPC, is counted once, and the next exchange goes over a new connection.
TEST_F(BulkTransportTest, ASparsePushWhoseConnectionIsCutGoesOverGrpcAndIsCountedOnce) {
  StartJob(2, 20, kGtopk);
  auto cut_member = Member(config_, v1::ClusterConfig::AUTO, 0);
  auto other = Member(config_, v1::ClusterConfig::GRPC, 1);
  ASSERT_TRUE(cut_member.ok()) << cut_member.status();
  ASSERT_TRUE(other.ok()) << other.status();
  const SparseVector e0 = Entries(0), e1 = Entries(1);
  SparseVector r0, r1;
  absl::Status s0, s1;
  SparseExchangeService& service = servers_.shard(0).sparse_service();
  const bulk_test::Cut cut = bulk_test::CutWhileWaiting(
      servers_.shard(0).bulk_port(),
      [&](size_t n) { return service.WaitForWaitingCalls(n, bulk_test::kIo); },
      [&] { s0 = (*cut_member)->ExchangeSparse(1, e0, &r0); },
      [&] { s1 = (*other)->ExchangeSparse(1, e1, &r1); });
  ASSERT_TRUE(cut.waited);
  ASSERT_EQ(cut.connections, 1);
  ASSERT_TRUE(cut.resent);
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  const SparseVector want = AggregateSparse({e0, e1}, SparseSelection::kGlobalTopK, kK);
  EXPECT_EQ(r0.indices, want.indices);
  EXPECT_EQ(r0.values, want.values);
  EXPECT_EQ(r1.indices, want.indices);
  EXPECT_EQ(r1.values, want.values);
  EXPECT_EQ((*cut_member)->retries(), 1u);
  EXPECT_EQ(service.counters().rounds_completed, 1u);
  // The retry's entries are traffic, not entries pushed again.
  EXPECT_EQ((*cut_member)->sparse_traffic().request_floats, e0.values.size());

  const TrafficCounts before = (*cut_member)->sparse_traffic();
  std::thread t1([&] { s1 = (*other)->ExchangeSparse(2, e1, &r1); });
  s0 = (*cut_member)->ExchangeSparse(2, e0, &r0);
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  const TrafficCounts after = (*cut_member)->sparse_traffic();
  EXPECT_EQ(after.request_bytes - before.request_bytes, bulk::SparseRequest::kBytes + kK * 8);
  EXPECT_EQ(after.reply_bytes - before.reply_bytes,
            bulk::Reply::kBytes + r0.indices.size() * 8);
}

// As for PushPull: the push goes again over gRPC, which fails at the
// round's deadline naming the shard.
TEST_F(BulkTransportTest, ASparseShardGoneFailsTheExchangeAtItsDeadlineNamingIt) {
  StartJob(1, /*round_timeout_s=*/1, kGtopk);
  auto member = Member(config_, v1::ClusterConfig::AUTO, 0, {.rpc_slack = absl::Seconds(1)});
  ASSERT_TRUE(member.ok());
  servers_.shard(0).Shutdown();
  SparseVector result;
  const absl::Status status = (*member)->ExchangeSparse(1, Entries(0), &result);
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("SparsePushPull to shard 0 at "));
  EXPECT_GE((*member)->retries(), 1u);
}

}  // namespace
}  // namespace cserps
