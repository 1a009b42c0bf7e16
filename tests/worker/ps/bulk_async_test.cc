// AsyncPushPull over the bulk transport (docs/protocol.md 15, 17) on
// in-process shards: members on gRPC and on bulk connections update the
// same model, a retry is answered without being applied again, the shard's
// refusals name what is wrong and it serves on, a parked push is answered
// at shutdown, and a shard gone fails the push at its deadline.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bulk_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/worker/ps/bulk_test_support.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using bulk_test::BulkTransportTest;
using bulk_test::ExpectALoneRoundAnswered;
using bulk_test::ExpectTheEnd;
using bulk_test::kD;
using bulk_test::Member;
using bulk_test::Values;

constexpr char kAsync[] = R"pb(name: "async-sgd")pb";
// With Values' quarters, x - lr g is exact.
constexpr float kLr = 0.5f;

std::vector<float> Stepped(std::vector<float> x, const std::vector<float>& g) {
  for (uint64_t i = 0; i < kD; ++i) x[i] -= kLr * g[i];
  return x;
}

TEST_F(BulkTransportTest, AsyncMembersOnGrpcAndOnBulkUpdateTheSameModel) {
  StartJob(2, 20, kAsync);
  auto grpc_member = Member(config_, v1::ClusterConfig::GRPC, 0);
  auto bulk_member = Member(config_, v1::ClusterConfig::AUTO, 1);
  ASSERT_TRUE(grpc_member.ok()) << grpc_member.status();
  ASSERT_TRUE(bulk_member.ok()) << bulk_member.status();
  const std::vector<float> x0 = Values(2), g0 = Values(0), g1 = Values(1);
  ASSERT_TRUE((*grpc_member)->PushModel(x0).ok());
  auto before = (*grpc_member)->GetStatus(0);
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<float> model0(kD), model1(kD), again(kD);
  ASSERT_TRUE((*grpc_member)->AsyncPushPull(0, kLr, g0, absl::MakeSpan(model0)).ok());
  const absl::Status pushed = (*bulk_member)->AsyncPushPull(0, kLr, g1, absl::MakeSpan(model1));
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_EQ(model0, Stepped(x0, g0));
  EXPECT_EQ(model1, Stepped(Stepped(x0, g0), g1));
  // The same step again is a retry: answered with the model, not applied.
  ASSERT_TRUE((*bulk_member)->AsyncPushPull(0, kLr, g1, absl::MakeSpan(again)).ok());
  EXPECT_EQ(again, model1);

  // The bulk member's pushes went over its connection: one frame each way
  // a push, headers of 48 and 24 bytes.
  const TrafficCounts bulk = (*bulk_member)->async_traffic();
  EXPECT_EQ(bulk.request_bytes, 2 * (bulk::AsyncRequest::kBytes + kD * sizeof(float)));
  EXPECT_EQ(bulk.reply_bytes, 2 * (bulk::Reply::kBytes + kD * sizeof(float)));
  const TrafficCounts grpc = (*grpc_member)->async_traffic();
  EXPECT_NE(grpc.request_bytes * 2, bulk.request_bytes);
  // The shard counts both members' bytes as they did.
  auto after = (*grpc_member)->GetStatus(0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->bytes_in() - before->bytes_in(), grpc.request_bytes + bulk.request_bytes);
  EXPECT_EQ(after->bytes_out() - before->bytes_out(), grpc.reply_bytes + bulk.reply_bytes);
}

TEST_F(BulkTransportTest, BadAsyncRequestsAreRefusedAndTheShardServesOn) {
  StartJob(1, 20, kAsync);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<float> x0 = Values(2), g = Values(0);

  ASSERT_TRUE(raw->SendAsync({.request_id = 1, .step = 0, .lr = kLr}, g).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->reply.request_id, 1u);
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(refused->message, HasSubstr("AsyncPushPull (step 0, offset 0) from rank 0"));
  EXPECT_THAT(refused->message, HasSubstr("has no model yet"));

  auto member = Member(config_, v1::ClusterConfig::GRPC, 0);
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->PushModel(x0).ok());
  struct Case {
    bulk::AsyncRequest request;
    std::vector<float> gradient;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{.request_id = 2, .step = 0, .lr = -1}, g, absl::StatusCode::kInvalidArgument,
       "lr -1 must be finite and >= 0"},
      {{.request_id = 3, .step = 0, .offset = 10, .lr = kLr}, g, absl::StatusCode::kOutOfRange,
       "floats [10, 3010) are not inside shard 0's [0, 3000)"},
      {{.request_id = 4, .step = 0, .lr = kLr}, {}, absl::StatusCode::kInvalidArgument,
       "gradient is empty"},
      // Not the shard's one chunk: a cut of the client's own.
      {{.request_id = 5, .step = 0, .offset = 10, .lr = kLr}, std::vector<float>(5, 1.0f),
       absl::StatusCode::kInvalidArgument,
       "floats [10, 15) are not one of shard 0's chunks, which start at 0 + i x "},
      {{.request_id = 6, .step = 0, .lr = kLr}, std::vector<float>(5, 1.0f),
       absl::StatusCode::kInvalidArgument, "floats [0, 5) are not one of shard 0's chunks"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(raw->SendAsync(c.request, c.gradient).ok());
    refused = raw->Receive();
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->reply.request_id, c.request.request_id);
    EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(c.code)) << refused->message;
    EXPECT_THAT(refused->message, HasSubstr(c.says));
  }
  // None of them was applied: a good one steps from the model rank 0 set.
  ASSERT_TRUE(raw->SendAsync({.request_id = 7, .step = 0, .lr = kLr}, g).ok());
  auto answered = raw->Receive();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  EXPECT_EQ(answered->reply.request_id, 7u);
  EXPECT_EQ(answered->floats, Stepped(x0, g));
  // More floats than a chunk holds cannot be read past: the shard says so
  // and ends the connection.
  char head[bulk::AsyncRequest::kBytes];
  bulk::Encode(bulk::AsyncRequest{.count = 1u << 30, .request_id = 6, .step = 1, .lr = kLr},
               head);
  ExpectTheEnd(*raw, head, "a chunk holds at most");

  // The shard serves on: the member's next push over a fresh connection.
  auto again = Member(config_, v1::ClusterConfig::AUTO, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<float> model(kD);
  ASSERT_TRUE((*again)->AsyncPushPull(1, kLr, g, absl::MakeSpan(model)).ok());
  EXPECT_EQ(model, Stepped(Stepped(x0, g), g));
  EXPECT_EQ((*again)->async_traffic().request_bytes,
            bulk::AsyncRequest::kBytes + kD * sizeof(float));
}

TEST_F(BulkTransportTest, ADenseJobRefusesAsyncPushesAndReadsOn) {
  StartJob(1);
  auto raw = RegisteredAndGreeted();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<float> v = Values(0);
  ASSERT_TRUE(raw->SendAsync({.request_id = 5, .step = 0, .lr = kLr}, v).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->reply.request_id, 5u);
  EXPECT_EQ(refused->reply.code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(refused->message, HasSubstr("does not push asynchronously"));
  ExpectALoneRoundAnswered(*raw, 6);
}

TEST_F(BulkTransportTest, ShutdownAnswersAParkedAsyncPushWithUnavailable) {
  StartJob(2, 20, R"pb(name: "async-sgd" staleness: 1)pb");
  auto member = Member(config_, v1::ClusterConfig::GRPC, 0);
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->PushModel(Values(2)).ok());
  auto raw = Greeted(0);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<float> g = Values(0);
  // Rank 1 has pushed nothing: step 0 is admitted (0 <= -1 + 1), step 1
  // waits for it. Requests are read in order: once request 3's refusal is
  // back, request 2 is parked.
  ASSERT_TRUE(raw->SendAsync({.request_id = 1, .step = 0, .lr = kLr}, g).ok());
  auto answered = raw->Receive();
  ASSERT_TRUE(answered.ok()) << answered.status();
  ASSERT_EQ(answered->reply.code, 0u) << answered->message;
  ASSERT_TRUE(raw->SendAsync({.request_id = 2, .step = 1, .lr = kLr}, g).ok());
  ASSERT_TRUE(raw->SendAsync({.request_id = 3, .step = 1, .lr = -1}, g).ok());
  auto refused = raw->Receive();
  ASSERT_TRUE(refused.ok()) << refused.status();
  ASSERT_EQ(refused->reply.request_id, 3u);
  servers_.shard(0).Shutdown();
  auto answer = raw->Receive();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->reply.request_id, 2u);
  EXPECT_EQ(answer->reply.code, static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(answer->message, HasSubstr("AsyncPushPull (step 1, offset 0) from rank 0"));
  EXPECT_THAT(answer->message, HasSubstr("shutting down"));
}

// A connection cut while its push is parked: the member sends the push
// again over gRPC, the shard applies it once, and the next push goes over
// a new connection.
TEST_F(BulkTransportTest, AnAsyncPushWhoseConnectionIsCutGoesOverGrpcAndIsAppliedOnce) {
  StartJob(2, 20, R"pb(name: "async-sgd" staleness: 1)pb");
  auto fast = Member(config_, v1::ClusterConfig::AUTO, 0);
  auto slow = Member(config_, v1::ClusterConfig::GRPC, 1);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_TRUE(slow.ok()) << slow.status();
  const std::vector<float> x0 = Values(2), g = Values(0), zeros(kD, 0.0f);
  ASSERT_TRUE((*fast)->PushModel(x0).ok());
  std::vector<float> model(kD);
  ASSERT_TRUE((*fast)->AsyncPushPull(0, kLr, g, absl::MakeSpan(model)).ok());

  // Step 1 waits for rank 1's first push, which releases it.
  AsyncService& async = servers_.shard(0).async_service();
  absl::Status held, released;
  std::vector<float> slow_model(kD);
  const bulk_test::Cut cut = bulk_test::CutWhileWaiting(
      servers_.shard(0).bulk_port(),
      [&](size_t n) { return async.WaitForParkedPushes(n, bulk_test::kIo); },
      [&] { held = (*fast)->AsyncPushPull(1, kLr, g, absl::MakeSpan(model)); },
      [&] { released = (*slow)->AsyncPushPull(0, kLr, zeros, absl::MakeSpan(slow_model)); });
  ASSERT_TRUE(cut.waited);
  ASSERT_EQ(cut.connections, 1);
  ASSERT_TRUE(cut.resent);
  ASSERT_TRUE(released.ok()) << released;
  ASSERT_TRUE(held.ok()) << held;
  EXPECT_EQ(model, Stepped(Stepped(x0, g), g));
  EXPECT_EQ((*fast)->retries(), 1u);
  EXPECT_EQ(async.counters().pushes_applied, 3u);
  // Two steps' gradients pushed: the retry's floats are traffic only.
  EXPECT_EQ((*fast)->async_traffic().request_floats, 2 * kD);

  // Rank 1 catches up; rank 0's next push goes over a new bulk connection:
  // one frame each way.
  ASSERT_TRUE((*slow)->AsyncPushPull(1, kLr, zeros, absl::MakeSpan(slow_model)).ok());
  const TrafficCounts before = (*fast)->async_traffic();
  ASSERT_TRUE((*fast)->AsyncPushPull(2, kLr, g, absl::MakeSpan(model)).ok());
  const TrafficCounts after = (*fast)->async_traffic();
  EXPECT_EQ(after.request_bytes - before.request_bytes,
            bulk::AsyncRequest::kBytes + kD * sizeof(float));
  EXPECT_EQ(after.reply_bytes - before.reply_bytes, bulk::Reply::kBytes + kD * sizeof(float));
  EXPECT_EQ(model, Stepped(Stepped(Stepped(x0, g), g), g));
}

// As for PushPull: the push goes again over gRPC, which fails at its
// deadline naming the shard.
TEST_F(BulkTransportTest, AnAsyncShardGoneFailsThePushAtItsDeadlineNamingIt) {
  StartJob(1, /*round_timeout_s=*/1, kAsync);
  auto member = Member(config_, v1::ClusterConfig::AUTO, 0, {.rpc_slack = absl::Seconds(1)});
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->PushModel(Values(2)).ok());
  servers_.shard(0).Shutdown();
  std::vector<float> model(kD);
  const absl::Status status = (*member)->AsyncPushPull(0, kLr, Values(0), absl::MakeSpan(model));
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("AsyncPushPull to shard 0 at "));
  EXPECT_GE((*member)->retries(), 1u);
}

}  // namespace
}  // namespace cserps
