// A shard rolling back in place to a checkpoint (docs/protocol.md 7.12)
// while a sparse round is open: the round is aborted, the other member's
// push that would have completed it, sent as the rounds stop or once the
// model is loaded, is refused, and the shard ends with exactly the checkpoint's model and
// servers' momentum. (With the sparse rounds still taken while the model
// loaded and the roll back recorded last, as before, that push completed
// the round on the loaded model.) A roll back that fails shuts the shard
// down: the next member's call is refused, not taken for done, and so is
// every push, the sparse exchange's too.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "common/config_fingerprint.h"
#include "common/float_bytes.h"
#include "common/sparse_vector.h"
#include "common/status.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "server/shard_checkpoint.h"
#include "server/sparse_exchange_service.h"
#include "tests/testing/test_support.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;
using ::testing::Each;

constexpr uint64_t kD = 200;
constexpr uint64_t kCheckpointStep = 4;
constexpr float kCheckpointModel = 0.5f;
constexpr float kCheckpointMomentum = 0.25f;
// Not this shard's incarnation: another shard restarted.
constexpr uint64_t kRestarted = 77;

v1::JobConfig MakeConfig(const fs::path& dir) {
  return testing::TestConfig(absl::StrCat(R"pb(
    name: "roll-back-test"
    seed: 5
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 20 }
    model { kind: FLAT num_params: )pb", kD, R"pb( }
    data { batch_size: 1 }
    optimizer { lr: 0.1 momentum_kind: HEAVY_BALL momentum: 0.9 }
    algorithm { name: "gtopk-ssgd" density: 0.05 }
    epochs: 1
    checkpoint { dir: ")pb", dir.string(), R"pb(" every_steps: 4 keep: 2 }
  )pb"));
}

// Ten entries of the gTop-k exchange (k = 0.05 x 200).
SparseVector Entries() {
  SparseVector e;
  for (uint32_t i = 0; i < 10; ++i) {
    e.indices.push_back(i * 20);
    e.values.push_back(1.0f + static_cast<float>(i));
  }
  return e;
}

absl::StatusOr<std::unique_ptr<PsClient>> Member(const v1::JobConfig& config, int rank) {
  v1::JobConfig grpc = config;
  grpc.mutable_cluster()->set_transport(v1::ClusterConfig::GRPC);
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(grpc, kD));
  RETURN_IF_ERROR(client->Register(rank, absl::StrCat("member-", rank)).status());
  return client;
}

// The complete checkpoint of kCheckpointStep: the shard's model and, when
// asked, servers' momentum, and a file of each rank.
absl::Status WriteCheckpoint(const v1::JobConfig& config, bool with_momentum = true) {
  const CheckpointJob job = CheckpointJob::Of(config);
  const std::vector<float> model(kD, kCheckpointModel), momentum(kD, kCheckpointMomentum);
  const std::vector<float> state = {1.0f};
  const CheckpointSectionView shard[] = {{"model", model},
                                         {SparseExchangeService::kMomentumSection, momentum}};
  RETURN_IF_ERROR(WriteCheckpointPart(job, CheckpointRole::kShard, 0, kCheckpointStep,
                                      absl::MakeConstSpan(shard, with_momentum ? 2 : 1))
                      .status());
  const CheckpointSectionView rank[] = {{"state", state}};
  for (uint32_t r = 0; r < 2; ++r) {
    RETURN_IF_ERROR(
        WriteCheckpointPart(job, CheckpointRole::kRank, r, kCheckpointStep, rank).status());
  }
  return absl::OkStatus();
}

// One shard of the job in a folder of its own, both ranks registered over
// gRPC, the model pushed.
class RollBackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("roll_back_test.", getpid(), ".",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    config_ = MakeConfig(dir_);
    ASSERT_TRUE(servers_.Start(&config_).ok());
    for (int r = 0; r < 2; ++r) {
      auto member = Member(config_, r);
      ASSERT_TRUE(member.ok()) << member.status();
      ranks_[r] = *std::move(member);
    }
    ASSERT_TRUE(ranks_[0]->PushModel(std::vector<float>(kD, 1.0f)).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  v1::JobConfig config_;
  testing::ServerSet servers_;
  std::unique_ptr<PsClient> ranks_[2];
};

TEST_F(RollBackTest, NoRoundCompletesOrOpensWhileTheShardLoadsItsCheckpoint) {
  ASSERT_TRUE(WriteCheckpoint(config_).ok());
  SparseExchangeService& sparse = servers_.shard(0).sparse_service();
  // Rank 1 pushes its half of the open round as the sparse rounds stop,
  // before the shard has loaded its model or recorded the roll back (so
  // only the round table can refuse it), and again once the model is
  // loaded, before the shard's services take pushes again.
  auto pushed_while_stopping = std::make_shared<absl::Status>(absl::InternalError("not answered"));
  absl::Status pushed_while_loading;
  servers_.shard(0).service().set_on_roll_back(
      [&](uint64_t step, const std::string& reason, const CheckpointReload& reload) {
        return sparse.RollBack(step, reason,
                               [&]() -> absl::StatusOr<std::vector<CheckpointSection>> {
                                 sparse.Push({.fingerprint = JobFingerprint(config_),
                                              .rank = 1,
                                              .step = kCheckpointStep + 1,
                                              .k = Entries().indices.size()},
                                             Entries(), 0, 0,
                                             [pushed_while_stopping](
                                                 absl::StatusOr<SparseRoundReply> reply) {
                                               *pushed_while_stopping = reply.status();
                                             });
                                 auto sections = reload();
                                 SparseVector mean;
                                 pushed_while_loading = ranks_[1]->ExchangeSparse(
                                     kCheckpointStep + 1, Entries(), &mean);
                                 return sections;
                               });
      });

  absl::Status waited;
  std::thread open_round([&] {
    SparseVector mean;
    waited = ranks_[0]->ExchangeSparse(kCheckpointStep + 1, Entries(), &mean);
  });
  const bool opened = sparse.WaitForWaitingCalls(1, absl::Seconds(20));
  // Rank 0's other process asks for the roll back (its first is waiting).
  auto asking = Member(config_, 0);
  const absl::Status rolled_back =
      asking.ok() ? (*asking)->RollBack(0, kCheckpointStep, kRestarted) : asking.status();
  open_round.join();
  ASSERT_TRUE(opened);
  ASSERT_TRUE(rolled_back.ok()) << rolled_back;
  EXPECT_TRUE(absl::IsAborted(waited)) << waited;
  EXPECT_TRUE(absl::IsAborted(*pushed_while_stopping)) << *pushed_while_stopping;
  EXPECT_THAT(std::string(pushed_while_stopping->message()),
              ::testing::HasSubstr("the shard is rolling back"));
  EXPECT_TRUE(absl::IsAborted(pushed_while_loading)) << pushed_while_loading;
  EXPECT_EQ(sparse.counters().open_rounds, 0u);

  std::vector<float> model(kD);
  ASSERT_TRUE(servers_.shard(0).shard().store().Read(0, absl::MakeSpan(model)).ok());
  EXPECT_THAT(model, Each(kCheckpointModel));
  EXPECT_THAT(sparse.MomentumForCheckpoint(), Each(kCheckpointMomentum));
  EXPECT_EQ(sparse.counters().rounds_completed, 0u);
}

// 0 is no shard's incarnation: before any roll back it matched "the roll
// back already done", which answered OK for the step the shard started from.
TEST_F(RollBackTest, ARollBackForIncarnationZeroIsRefused) {
  for (uint64_t step : {uint64_t{0}, kCheckpointStep}) {
    const absl::Status refused = ranks_[0]->RollBack(0, step, /*restarted=*/0);
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("restarted must be"));
  }
  EXPECT_EQ(servers_.shard(0).shard().rolled_back_for(), 0u);
}

// A push admitted before a roll back that reaches the round table after it
// (its handler thread held up meanwhile) is refused there, as it would be
// at its admission now: it would join a round of the new timeline with
// the old one's values.
TEST_F(RollBackTest, APushAdmittedBeforeARollBackJoinsNoRoundAfterIt) {
  ASSERT_TRUE(WriteCheckpoint(config_).ok());
  ParameterServerService& service = servers_.shard(0).service();
  const ParameterServerService::PushPullHead head{
      .fingerprint = JobFingerprint(config_), .rank = 0, .step = kCheckpointStep + 1,
      .stream = v1::MODEL};
  const absl::StatusOr<size_t> count = service.AdmitPushPull(head, service.Now());
  ASSERT_TRUE(count.ok()) << count.status();
  ASSERT_TRUE(ranks_[1]->RollBack(0, kCheckpointStep, kRestarted).ok());
  const std::vector<float> values(*count, 2.0f);
  // Shared with the callback, which a round left open would run at the
  // shard's shutdown.
  auto joined = std::make_shared<absl::Status>(absl::InternalError("not answered"));
  service.JoinRound(head, values, 0, service.Now(),
                    [joined](absl::StatusOr<RoundMean> mean) { *joined = mean.status(); });
  EXPECT_TRUE(absl::IsAborted(*joined)) << *joined;
  EXPECT_THAT(joined->message(), ::testing::HasSubstr("roll back to it too"));
}

// The checkpoint holds no servers' momentum: the first roll back fails and
// shuts the shard down; the next member's, for the same restarted shard,
// must not find it done.
TEST_F(RollBackTest, AFailedRollBackIsNotTakenForDoneByTheNextMember) {
  ASSERT_TRUE(WriteCheckpoint(config_, /*with_momentum=*/false).ok());
  const absl::Status first = ranks_[0]->RollBack(0, kCheckpointStep, kRestarted);
  EXPECT_TRUE(absl::IsDataLoss(first)) << first;
  const absl::Status second = ranks_[1]->RollBack(0, kCheckpointStep, kRestarted);
  EXPECT_TRUE(absl::IsUnavailable(second)) << second;
  EXPECT_THAT(second.message(), ::testing::HasSubstr("shutting down"));
  EXPECT_TRUE(servers_.shard(0).roll_back_failed());

  // The sparse exchange, whose rounds the roll back had stopped, takes no
  // push again either (once acknowledged by a Register, a push of the
  // step after the checkpoint would open a round on the reloaded model).
  (void)ranks_[0]->Reregister();
  auto sparse = v1::SparseExchange::NewStub(
      grpc::CreateChannel(config_.cluster().servers(0), grpc::InsecureChannelCredentials()));
  v1::SparsePushPullRequest push;
  push.set_fingerprint(JobFingerprint(config_));
  push.set_rank(0);
  push.set_step(kCheckpointStep + 1);
  const SparseVector entries = Entries();
  push.set_k(entries.indices.size());
  push.set_indices(std::string(reinterpret_cast<const char*>(entries.indices.data()),
                               entries.indices.size() * sizeof(uint32_t)));
  push.set_values(FloatsToBytes(entries.values));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SparsePushPullResponse reply;
  const grpc::Status pushed = sparse->SparsePushPull(&context, push, &reply);
  EXPECT_EQ(pushed.error_code(), grpc::StatusCode::UNAVAILABLE) << pushed.error_message();
  EXPECT_THAT(pushed.error_message(), ::testing::HasSubstr("roll back failed"));
}

}  // namespace
}  // namespace cserps
