// A worker's checkpoint file: what is written is read back, and a file
// that does not fit the worker (another count of state buffers, another
// model size, another epoch position) is refused naming the file and what
// does not fit.
#include "worker/trainer/rank_checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "common/config_fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class RankCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("rank_checkpoint_test.", getpid());
    fs::remove_all(dir_);
    config_ = testing::TestConfig(absl::StrCat(R"pb(
      name: "rank-checkpoint-test"
      cluster { servers: "127.0.0.1:0" num_workers: 1 }
      model { kind: FLAT num_params: 4 }
      data { batch_size: 1 }
      optimizer { lr: 0.1 }
      algorithm { name: "ssgd" block_size: 2 }
      epochs: 2
      checkpoint { dir: ")pb", dir_.string(), R"pb(" every_steps: 3 }
    )pb"));
    // Step 7 of 5 per epoch: 2 losses of epoch 2.
    ASSERT_TRUE(WriteCheckpointPart(CheckpointJob::Of(config_), CheckpointRole::kShard, 0, 7,
                                    {{"model", model_}})
                    .ok());
    const absl::StatusOr<bool> completed =
        WriteRankCheckpoint(config_, 0, 7, {momentum_}, losses_);
    ASSERT_TRUE(completed.ok()) << completed.status();
    ASSERT_TRUE(*completed) << "the rank's file was the step's last";
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<RankCheckpoint> Load(size_t buffers, uint64_t d, uint64_t steps_per_epoch) {
    std::vector<std::string> passed_over;
    return LoadRankCheckpoint(config_, 0, buffers, d, steps_per_epoch, &passed_over);
  }

  fs::path dir_;
  v1::JobConfig config_;
  const std::vector<float> model_ = {1, 2, 3, 4};
  const std::vector<float> momentum_ = {0.5f, -0.25f, 0, 8};
  const std::vector<float> losses_ = {2.5f, 2.25f};
};

TEST_F(RankCheckpointTest, WhatIsWrittenIsReadBack) {
  const absl::StatusOr<RankCheckpoint> loaded = Load(1, 4, 5);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 7u);
  ASSERT_EQ(loaded->state.size(), 1u);
  EXPECT_EQ(loaded->state[0], momentum_);
  EXPECT_EQ(loaded->epoch_losses, losses_);
  EXPECT_THAT(loaded->file, HasSubstr("rank-0.ckpt"));
}

TEST_F(RankCheckpointTest, AFileThatDoesNotFitTheWorkerIsRefusedNamingIt) {
  const struct {
    size_t buffers;
    uint64_t d;
    uint64_t steps_per_epoch;
    const char* says;
  } cases[] = {
      {2, 4, 5, "no section 'state-1'"},
      {0, 4, 5, "more state buffers"},
      {1, 6, 5, "section 'state-0' holds 4 floats, not 6"},
      {1, 4, 7, "section 'epoch_losses' holds 2 losses, more than the 0 steps done of epoch 2"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    const absl::StatusOr<RankCheckpoint> loaded = Load(c.buffers, c.d, c.steps_per_epoch);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.says));
    EXPECT_THAT(loaded.status().message(), HasSubstr("rank-0.ckpt"));
  }
}

// Step 7 is past the end of 2 epochs of 3 steps, where no checkpoint is
// written: the job's training data differs from the writer's.
TEST_F(RankCheckpointTest, AStepNotBeforeTheJobsEndIsRefused) {
  const absl::StatusOr<RankCheckpoint> loaded = Load(1, 4, 3);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("rank 0 cannot resume from the checkpoint of step 7 in "));
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("this job ends at step 6 (2 epochs of 3 steps); did the training data "
                        "or a batch size change"));
}

// A process that rejoined the job (elastic) at step 6 trained one step of
// the epoch before the checkpoint of step 7.
TEST_F(RankCheckpointTest, ARejoinedProcessesFileHoldsTheLossesOfTheStepsItTrained) {
  const std::vector<float> trained = {2.25f};
  ASSERT_TRUE(WriteRankCheckpoint(config_, 0, 7, {momentum_}, trained).ok());
  const absl::StatusOr<RankCheckpoint> loaded = Load(1, 4, 5);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->epoch_losses, trained);
}

TEST_F(RankCheckpointTest, NoCompleteCheckpointNamesTheRankAndTheFolder) {
  fs::remove(fs::path(CheckpointStepDir(dir_.string(), 7)) / "MANIFEST");
  const absl::StatusOr<RankCheckpoint> loaded = Load(1, 4, 5);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr("rank 0 cannot resume"));
  EXPECT_THAT(loaded.status().message(), HasSubstr(dir_.string()));
  EXPECT_THAT(loaded.status().message(), HasSubstr("passed over"));
}

}  // namespace
}  // namespace cserps
