// A server shard that stops and restarts from the job's newest checkpoint
// at its address, on a real in-process cluster (2 shards, 2 workers), is
// followed by the running trainers without restarting them: every shard and
// trainer goes back to that checkpoint in place and the job trains on to the
// same learning curve, final models and accuracies, to the bit, as the job
// never interrupted. Two members keep the servers' sums independent of the
// order pushes arrive in.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/integration/checkpointed_job.h"
#include "tests/testing/test_support.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/random_dataset.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
namespace fs = std::filesystem;

constexpr int kWorkers = 2;
constexpr uint64_t kD = 20 * 16 + 16 + 16 * 4 + 4;  // MLP 20 -> 16 -> 4
// 160 examples, 8 per step and worker: 10 steps per epoch, 3 epochs; a
// checkpoint every 8 steps. Rank 0 restarts shard 1 after step 10, so the
// job goes back to step 8 and trains steps 8 to 10 again.
constexpr uint64_t kSteps = 30;
constexpr uint64_t kRestartAfter = 11;
constexpr uint64_t kCheckpoint = 8;

using Case = testing::AlgorithmCase;

v1::JobConfig MakeConfig(const Case& c, const fs::path& root) {
  return testing::CheckpointedJob(c, "shard-restart-test", (root / "ckpt").string(), kCheckpoint);
}

// Every step's loss by rank (those trained again replacing the first
// ones), and the end of training.
struct Outcome {
  std::vector<std::vector<float>> losses{kWorkers};
  std::vector<std::vector<float>> params{kWorkers};
  std::vector<FinalReport> reports{kWorkers};
  std::vector<uint32_t> roll_backs = std::vector<uint32_t>(kWorkers);
  std::vector<uint64_t> rolled_back_to = std::vector<uint64_t>(kWorkers);
};

class ShardRestartTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            absl::StrCat("shard_restart_test.", getpid(), ".", GetParam().name);
    fs::remove_all(root_);
    train_ = testing::RandomDataset(160, 20, 4, 17);
    test_ = testing::RandomDataset(100, 20, 4, 18);
  }
  void TearDown() override { fs::remove_all(root_); }

  // The whole job; with `restart`, rank 0 restarts shard 1 (with
  // checkpoint.resume) after step kRestartAfter, and a step or average
  // that fails goes to Trainer::RollBackIfAShardRestarted, as in Run.
  absl::StatusOr<Outcome> Run(const std::string& name, bool restart) {
    const v1::JobConfig config = MakeConfig(GetParam(), root_ / name);
    ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster,
                     InProcessCluster::Start(config, kD));
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Trainer>> trainers,
                     testing::TrainersOf(*cluster, train_, test_));
    Outcome outcome;
    RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) -> absl::Status {
      Trainer& trainer = *trainers[r];
      RETURN_IF_ERROR(trainer.InitializeModel());
      bool restarted = false;
      auto recover = [&](const absl::Status& failure) -> absl::Status {
        ASSIGN_OR_RETURN(const bool rolled_back, trainer.RollBackIfAShardRestarted(failure));
        if (!rolled_back) return failure;
        outcome.rolled_back_to[r] = trainer.step();
        outcome.losses[r].resize(trainer.step());
        return absl::OkStatus();
      };
      // Bounded: each round of the loop trains a step or rolls back, and a
      // trainer rolls back at most once here.
      for (uint64_t round = 0; trainer.step() < kSteps && round < 3 * kSteps; ++round) {
        const absl::StatusOr<float> loss = trainer.Step();
        if (!loss.ok()) {
          RETURN_IF_ERROR(recover(loss.status()));
          continue;
        }
        outcome.losses[r].push_back(*loss);
        if (const absl::Status averaged = trainer.FullAverageIfDue(); !averaged.ok()) {
          RETURN_IF_ERROR(recover(averaged));
          continue;
        }
        if (restart && r == 0 && !restarted && trainer.step() == kRestartAfter) {
          restarted = true;
          v1::JobConfig resumed = cluster->config();
          resumed.mutable_checkpoint()->set_resume(true);
          RETURN_IF_ERROR(cluster->RestartShard(1, resumed));
        }
      }
      RETURN_IF_ERROR(trainer.FinishTraining());
      ASSIGN_OR_RETURN(outcome.params[r], trainer.Params());
      outcome.reports[r] = trainer.final_report();
      outcome.roll_backs[r] = trainer.roll_backs();
      return absl::OkStatus();
    }));
    return outcome;
  }

  fs::path root_;
  Dataset train_;
  Dataset test_;
};

TEST_P(ShardRestartTest, TrainersRollBackInPlaceAndTrainAsTheUninterruptedJob) {
  const absl::StatusOr<Outcome> whole = Run("whole", /*restart=*/false);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const absl::StatusOr<Outcome> restarted = Run("restarted", /*restart=*/true);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(whole->roll_backs[r], 0u);
    EXPECT_EQ(restarted->roll_backs[r], 1u);
    EXPECT_EQ(restarted->rolled_back_to[r], kCheckpoint);
    ASSERT_EQ(restarted->losses[r].size(), kSteps);
    EXPECT_EQ(0, std::memcmp(restarted->losses[r].data(), whole->losses[r].data(),
                             kSteps * sizeof(float)))
        << "losses differ";
    const std::vector<float>& a = whole->params[r];
    const std::vector<float>& b = restarted->params[r];
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << "final models differ";
    EXPECT_EQ(restarted->reports[r].local_accuracy, whole->reports[r].local_accuracy);
    EXPECT_EQ(restarted->reports[r].global_accuracy, whole->reports[r].global_accuracy);
  }
}

// An elastic job that lost a member between the checkpoint and the
// restart: the rounds of the steps trained again still wait for one member
// fewer, and the trainers' membership says so (the roll back took back the
// change with its steps, and used to keep the count it had changed to, so
// the change was never seen again).
TEST(ElasticShardRestartTest, AMembershipChangeUndoneByTheRollBackIsSeenAgain) {
  const fs::path root = fs::path(::testing::TempDir()) /
                        absl::StrCat("shard_restart_test.", getpid(), ".elastic");
  fs::remove_all(root);
  v1::JobConfig config = testing::CheckpointedJob(
      {"ssgd", "", R"(name: "ssgd")"}, "shard-restart-elastic", (root / "ckpt").string(), 4);
  config.mutable_cluster()->set_num_workers(3);
  config.mutable_cluster()->set_elastic(true);
  config.mutable_cluster()->set_round_timeout_s(2);
  const Dataset train = testing::RandomDataset(160, 20, 4, 17);
  const Dataset test = testing::RandomDataset(100, 20, 4, 18);
  // 160 examples, 8 per step and worker: 6 steps per epoch, 18 in all.
  // Rank 2 stops after step 5; rank 0 restarts shard 1 after step 7, when
  // the newest complete checkpoint is step 4's.
  constexpr uint64_t kSteps = 18, kStopAfter = 5, kRestartAfter = 7;
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster = InProcessCluster::Start(config, kD);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::vector<std::unique_ptr<Trainer>>> trainers =
      testing::TrainersOf(**cluster, train, test);
  ASSERT_TRUE(trainers.ok()) << trainers.status();
  const absl::Status status = (*cluster)->OnEveryRank([&](int r) -> absl::Status {
    Trainer& trainer = *(*trainers)[r];
    RETURN_IF_ERROR(trainer.InitializeModel());
    bool restarted = false;
    for (uint64_t round = 0; trainer.step() < kSteps && round < 3 * kSteps; ++round) {
      if (r == 2 && trainer.step() == kStopAfter) return absl::OkStatus();
      absl::Status stepped = trainer.Step().status();
      if (stepped.ok()) stepped = trainer.FullAverageIfDue();
      if (!stepped.ok()) {
        ASSIGN_OR_RETURN(const bool rolled_back, trainer.RollBackIfAShardRestarted(stepped));
        if (!rolled_back) return stepped;
        continue;
      }
      if (r == 0 && !restarted && trainer.step() == kRestartAfter) {
        restarted = true;
        v1::JobConfig resumed = (*cluster)->config();
        resumed.mutable_checkpoint()->set_resume(true);
        RETURN_IF_ERROR((*cluster)->RestartShard(1, resumed));
      }
    }
    return trainer.FinishTraining();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const Trainer& trainer = *(*trainers)[r];
    EXPECT_EQ(trainer.roll_backs(), 1u);
    ASSERT_FALSE(trainer.membership().empty());
    EXPECT_LE(trainer.membership().back().step, kRestartAfter);
    EXPECT_EQ(trainer.membership().back().members, 2u);
  }
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ShardRestartTest,
    ::testing::Values(
        Case{"ssgd", "momentum_kind: HEAVY_BALL momentum: 0.9", R"(name: "ssgd")"},
        Case{"cser", "momentum_kind: NESTEROV momentum: 0.9",
             R"(name: "cser" period: 4 ratio_c1: 2 ratio_c2: 8)"},
        Case{"ef_sgd", "momentum_kind: NESTEROV momentum: 0.9", R"(name: "ef-sgd" ratio: 4)"},
        Case{"local_sgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "local-sgd" period: 3)"},
        Case{"cocod_sgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "cocod-sgd" period: 3)"},
        Case{"pipe_sgd", "", R"(name: "pipe-sgd")"},
        Case{"gtopk_ssgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "gtopk-ssgd" density: 0.05)"},
        Case{"topk_ssgd", "", R"(name: "topk-ssgd" density: 0.05)"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace cserps
