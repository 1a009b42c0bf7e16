// Elastic membership on a real in-process cluster (2 shards, 4 CSER
// workers, cluster.elastic): rank 3 stops after a few steps; at the next
// round's timeout both shards drop it and complete the round with the
// other three, reweighted, and the job trains on with them to the end.
// The three then hold the servers' model, every shard names rank 3 as
// dropped, and rank 3's next push is refused saying so. With
// cluster.admit_every_steps, a replacement worker (a new worker id) takes
// rank 3 back at the next admission step and finishes the job with them;
// with QSparse-local-SGD it syncs to the same common model as they do.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/checkpoint_dir.h"
#include "common/config_fingerprint.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/random_dataset.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kD = 20 * 16 + 16 + 16 * 4 + 4;  // MLP 20 -> 16 -> 4
constexpr uint64_t kStopsAfter = 5;

constexpr char kCser[] = R"(name: "cser" block_size: 8 period: 4 ratio_c1: 2 ratio_c2: 8)";
constexpr char kElasticCser[] = R"pb(
    name: "elastic-test"
    seed: 9
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: 4
      round_timeout_s: 2
      elastic: true
    }
    model { kind: MLP hidden: 16 input_dim: 20 num_classes: 4 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 momentum_kind: NESTEROV momentum: 0.9 }
    algorithm { name: "cser" block_size: 8 period: 4 ratio_c1: 2 ratio_c2: 8 }
    epochs: 2
  )pb";

// The job's cluster, its data and one trainer per rank.
struct ElasticJob {
  absl::Status Start(const v1::JobConfig& config) {
    ASSIGN_OR_RETURN(cluster, InProcessCluster::Start(config, kD));
    ASSIGN_OR_RETURN(trainers, testing::TrainersOf(*cluster, train, test));
    return absl::OkStatus();
  }

  std::unique_ptr<InProcessCluster> cluster;
  const Dataset train = testing::RandomDataset(320, 20, 4, 5);
  const Dataset test = testing::RandomDataset(100, 20, 4, 6);
  std::vector<std::unique_ptr<Trainer>> trainers;
};

TEST(ElasticTest, AStoppedWorkerIsDroppedAndTheOthersFinishTheJob) {
  ElasticJob job;
  const absl::Status started = job.Start(testing::TestConfig(kElasticCser));
  ASSERT_TRUE(started.ok()) << started;
  // Named references, not a structured binding: the lambdas capture them.
  std::unique_ptr<InProcessCluster>& cluster = job.cluster;
  std::vector<std::unique_ptr<Trainer>>& trainers = job.trainers;
  const uint64_t steps = 2 * trainers[0]->steps_per_epoch();
  ASSERT_GT(steps, kStopsAfter + 4);
  const absl::Status run = cluster->OnEveryRank([&](int r) -> absl::Status {
    Trainer& trainer = *trainers[r];
    RETURN_IF_ERROR(trainer.InitializeModel());
    const uint64_t stop = r == 3 ? kStopsAfter : steps;
    while (trainer.step() < stop) RETURN_IF_ERROR(trainer.Step().status());
    if (r == 3) return absl::OkStatus();
    return trainer.FinishTraining();
  });
  ASSERT_TRUE(run.ok()) << run;

  std::vector<float> servers(kD);
  ASSERT_TRUE(cluster->client(0).PullModel(absl::MakeSpan(servers), false).ok());
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(trainers[r]->step(), steps);
    ASSERT_EQ(trainers[r]->membership().size(), 1u);
    EXPECT_EQ(trainers[r]->membership()[0].members, 3u);
    EXPECT_GT(trainers[r]->membership()[0].step, kStopsAfter);
    const absl::StatusOr<std::vector<float>> params = trainers[r]->Params();
    ASSERT_TRUE(params.ok());
    EXPECT_EQ(0, std::memcmp(params->data(), servers.data(), kD * sizeof(float)))
        << "after the final average every remaining worker holds the servers' model";
  }
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<v1::GetStatusResponse> status = cluster->client(0).GetStatus(s);
    ASSERT_TRUE(status.ok());
    EXPECT_THAT(status->dropped_ranks(), ElementsAre(3u)) << "shard " << s;
    EXPECT_EQ(status->rounds_failed(), 0u);
  }
  const absl::StatusOr<float> refused = trainers[3]->Step();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("rank 3 was dropped"));
}

// Whether every shard has admitted a rank back.
absl::StatusOr<bool> Admitted(PsClient& client, int shards) {
  for (int s = 0; s < shards; ++s) {
    ASSIGN_OR_RETURN(const v1::GetStatusResponse status, client.GetStatus(s));
    if (status.admitted_ranks_size() == 0) return false;
  }
  return true;
}

// The replacement's algorithm: CSER, and QSparse-local-SGD, whose common
// model x̂ the replacement must take from the servers' model. With period 3
// a round after rank 3's last step times out before the others wait for
// the replacement, and the admission's full average (step 8) falls inside
// a period, where it changes the models and x̂ must follow.
struct Replaced {
  const char* name;
  const char* algorithm;
  // Every worker holds x̂ after a sync (QSparse): the models right after the
  // first sync past the admission are the same on all four.
  bool synced_models_equal;
  // The step whose round first tells the others of the admission (step 8):
  // the first with a round from there on.
  uint64_t admission_seen_by;
};

class ElasticReplacementTest : public ::testing::TestWithParam<Replaced> {};

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ElasticReplacementTest,
    ::testing::Values(Replaced{"cser", kCser, false, 8},
                      Replaced{"qsparse",
                               R"(name: "qsparse-local-sgd" block_size: 8 period: 3 ratio: 2)",
                               true, 9}),
    [](const ::testing::TestParamInfo<Replaced>& info) { return info.param.name; });

TEST_P(ElasticReplacementTest, AReplacementTakesTheDroppedRankAtTheNextAdmissionStep) {
  v1::JobConfig config = testing::TestConfig(
      absl::StrReplaceAll(kElasticCser, {{kCser, GetParam().algorithm}}));
  config.mutable_cluster()->set_admit_every_steps(4);
  // Checkpoints at the admission steps too (4, 8, ...).
  const std::string checkpoints = absl::StrCat(::testing::TempDir(), "/elastic_checkpoints.",
                                               getpid(), ".", GetParam().name);
  std::filesystem::remove_all(checkpoints);
  config.mutable_checkpoint()->set_dir(checkpoints);
  config.mutable_checkpoint()->set_every_steps(4);
  config.mutable_checkpoint()->set_keep(10);
  ElasticJob job;
  const absl::Status started = job.Start(config);
  ASSERT_TRUE(started.ok()) << started;
  // Named references, not a structured binding: the lambdas capture them.
  std::unique_ptr<InProcessCluster>& cluster = job.cluster;
  std::vector<std::unique_ptr<Trainer>>& trainers = job.trainers;
  const Dataset& train = job.train;
  const Dataset& test = job.test;
  const uint64_t steps = 2 * trainers[0]->steps_per_epoch();
  // The others wait after this step until the replacement is admitted, so
  // that they do not finish the job first.
  constexpr uint64_t kPauseAt = 7;
  ASSERT_GT(steps, 12u);
  std::unique_ptr<PsClient> replacement_client;
  std::unique_ptr<Trainer> replacement;
  // By rank: the model right after step kSynced, before its full average.
  constexpr uint64_t kSynced = 12;
  std::vector<std::vector<float>> synced(4);
  auto keep_if_synced = [&synced](int r, Trainer& trainer) -> absl::Status {
    if (trainer.step() != kSynced) return absl::OkStatus();
    ASSIGN_OR_RETURN(synced[r], trainer.Params());
    return absl::OkStatus();
  };
  const absl::Status run = cluster->OnEveryRank([&](int r) -> absl::Status {
    Trainer& trainer = *trainers[r];
    RETURN_IF_ERROR(trainer.InitializeModel());
    if (r == 3) {
      while (trainer.step() < kStopsAfter) {
        RETURN_IF_ERROR(trainer.Step().status());
        RETURN_IF_ERROR(trainer.FullAverageIfDue());
      }
      // A new process: a new client and worker id, given the dropped rank
      // once the shards drop it.
      ASSIGN_OR_RETURN(replacement_client, PsClient::Connect(cluster->config(), kD));
      ASSIGN_OR_RETURN(const uint32_t rank, replacement_client->Register(-1, "replacement"));
      if (rank != 3) return absl::InternalError(absl::StrCat("replacement got rank ", rank));
      ASSIGN_OR_RETURN(replacement, Trainer::Create(cluster->config(),
                                                    replacement_client.get(), &train, &test));
      RETURN_IF_ERROR(replacement->InitializeModel());
      while (replacement->step() < steps) {
        RETURN_IF_ERROR(replacement->Step().status());
        RETURN_IF_ERROR(keep_if_synced(r, *replacement));
        RETURN_IF_ERROR(replacement->FullAverageIfDue());
      }
      return replacement->FinishTraining();
    }
    while (trainer.step() < steps) {
      RETURN_IF_ERROR(trainer.Step().status());
      RETURN_IF_ERROR(keep_if_synced(r, trainer));
      if (trainer.step() == kPauseAt) {
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        bool admitted = false;
        while (!admitted && absl::Now() < deadline) {
          ASSIGN_OR_RETURN(admitted, Admitted(cluster->client(r), cluster->num_shards()));
          if (!admitted) absl::SleepFor(absl::Milliseconds(10));
        }
        if (!admitted) return absl::DeadlineExceededError("the replacement was never admitted");
      }
      RETURN_IF_ERROR(trainer.FullAverageIfDue());
    }
    return trainer.FinishTraining();
  });
  ASSERT_TRUE(run.ok()) << run;
  ASSERT_NE(replacement, nullptr);

  EXPECT_EQ(replacement->rank(), 3u);
  EXPECT_EQ(replacement->joined_at_step(), 8u)
      << "the first admission step two steps past the newest completed";
  EXPECT_EQ(replacement->step(), steps);
  std::vector<float> servers(kD);
  ASSERT_TRUE(cluster->client(0).PullModel(absl::MakeSpan(servers), false).ok());
  std::vector<Trainer*> finished = {trainers[0].get(), trainers[1].get(), trainers[2].get(),
                                    replacement.get()};
  for (Trainer* trainer : finished) {
    SCOPED_TRACE(absl::StrCat("rank ", trainer->rank()));
    const absl::StatusOr<std::vector<float>> params = trainer->Params();
    ASSERT_TRUE(params.ok());
    EXPECT_EQ(0, std::memcmp(params->data(), servers.data(), kD * sizeof(float)))
        << "after the final average every worker holds the servers' model";
  }
  if (GetParam().synced_models_equal) {
    for (int r = 1; r < 4; ++r) {
      ASSERT_EQ(synced[r].size(), kD) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(synced[r].data(), synced[0].data(), kD * sizeof(float)))
          << "rank " << r << " after the sync of step " << kSynced;
    }
  }
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<MembershipChange>& changes = trainers[r]->membership();
    ASSERT_EQ(changes.size(), 2u);
    EXPECT_EQ(changes[0].members, 3u);
    EXPECT_EQ(changes[1].members, 4u);
    EXPECT_LE(changes[1].step, GetParam().admission_seen_by);
  }
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<v1::GetStatusResponse> status = cluster->client(0).GetStatus(s);
    ASSERT_TRUE(status.ok());
    EXPECT_THAT(status->dropped_ranks(), ElementsAre(3u)) << "shard " << s;
    EXPECT_THAT(status->admitted_ranks(), ElementsAre(3u)) << "shard " << s;
    EXPECT_EQ(status->members(), 4u);
    EXPECT_EQ(status->rounds_failed(), 0u);
  }
  // The admission's checkpoint (step 8) is complete: the replacement wrote
  // its part. Without the later steps, it is the newest.
  for (uint64_t later = 12; later < steps; later += 4) {
    std::filesystem::remove_all(CheckpointStepDir(checkpoints, later));
  }
  std::vector<std::string> passed_over;
  const absl::StatusOr<LoadedCheckpoint> newest =
      LoadNewestCheckpoint(checkpoints, JobFingerprint(cluster->config()), &passed_over);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 8u);
  std::filesystem::remove_all(checkpoints);
}

}  // namespace
}  // namespace cserps
