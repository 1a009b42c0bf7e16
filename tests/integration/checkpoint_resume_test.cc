// Checkpoints on a real in-process cluster (2 shards, 2 workers): a job
// stopped after a checkpoint and resumed from it by fresh servers and
// trainers trains on exactly as the same job run without interruption:
// every later step's loss, the final models and the reported accuracies
// agree to the bit. Two members keep the servers' sums independent of the
// order pushes arrive in. A damaged newest checkpoint is passed over, with
// its reason, for the one before it; resuming without any is an error.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "common/config_fingerprint.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/checkpointed_job.h"
#include "tests/testing/test_support.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/random_dataset.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr int kWorkers = 2;
// 160 examples, 8 per step and worker: 10 steps per epoch, 3 epochs.
constexpr uint64_t kSteps = 30;
constexpr uint32_t kEvery = 4;
// The interrupted run stops a few steps after the checkpoint of step 12.
constexpr uint64_t kStopAt = 14;
constexpr uint64_t kResumeStep = 12;
// MLP 20 -> 16 -> 4.
constexpr uint64_t kD = 20 * 16 + 16 + 16 * 4 + 4;

using Case = testing::AlgorithmCase;

v1::JobConfig MakeConfig(const Case& c, const std::string& dir) {
  return testing::CheckpointedJob(c, "checkpoint-resume-test", dir, kEvery);
}

// What a run leaves: every step's loss by rank, and the end of training.
struct Outcome {
  std::vector<std::vector<float>> losses{kWorkers};  // steps from the first run here
  std::vector<std::vector<float>> params{kWorkers};  // after FinishTraining
  std::vector<FinalReport> reports{kWorkers};
  std::vector<float> servers;  // the servers' model at the end
};

class CheckpointResumeTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            absl::StrCat("checkpoint_resume_test.", getpid(), ".", GetParam().name);
    fs::remove_all(root_);
    train_ = testing::RandomDataset(160, 20, 4, 17);
    test_ = testing::RandomDataset(100, 20, 4, 18);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Trains from the start (or, with resume, from the newest checkpoint)
  // until step `stop`; finishes the job when stop is its last step.
  // How a run starts: fresh, with checkpoint.resume, or with
  // checkpoint.restart_on_failure (resuming when there is a checkpoint).
  enum class Start { kFresh, kResume, kRestartable };

  absl::StatusOr<Outcome> Run(const std::string& dir, bool resume, uint64_t stop) {
    return Run(dir, resume ? Start::kResume : Start::kFresh, stop);
  }
  absl::StatusOr<Outcome> Run(const std::string& dir, Start start, uint64_t stop) {
    v1::JobConfig config = MakeConfig(GetParam(), (root_ / dir).string());
    config.mutable_checkpoint()->set_resume(start == Start::kResume);
    config.mutable_checkpoint()->set_restart_on_failure(start == Start::kRestartable);
    const bool resume = start == Start::kResume ||
                        (start == Start::kRestartable && fs::exists(root_ / dir));
    ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster,
                     InProcessCluster::Start(config, kD));
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Trainer>> trainers,
                     testing::TrainersOf(*cluster, train_, test_));
    Outcome outcome;
    RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) -> absl::Status {
      Trainer& trainer = *trainers[r];
      RETURN_IF_ERROR(trainer.InitializeModel());
      if (trainer.step() != (resume ? kResumeStep : 0)) {
        return absl::InternalError(absl::StrCat("started at step ", trainer.step()));
      }
      while (trainer.step() < stop) {
        ASSIGN_OR_RETURN(const float loss, trainer.Step());
        outcome.losses[r].push_back(loss);
        RETURN_IF_ERROR(trainer.FullAverageIfDue());
      }
      if (stop < kSteps) return absl::OkStatus();
      RETURN_IF_ERROR(trainer.FinishTraining());
      outcome.reports[r] = trainer.final_report();
      ASSIGN_OR_RETURN(outcome.params[r], trainer.Params());
      return absl::OkStatus();
    }));
    if (stop == kSteps) {
      outcome.servers.resize(kD);
      RETURN_IF_ERROR(cluster->client(0).PullModel(absl::MakeSpan(outcome.servers), false));
    }
    return outcome;
  }

  fs::path root_;
  Dataset train_;
  Dataset test_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameEnd(const Outcome& whole, const Outcome& resumed) {
  EXPECT_TRUE(SameBits(resumed.servers, whole.servers)) << "the servers' final models differ";
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<float> tail(whole.losses[r].begin() + kResumeStep, whole.losses[r].end());
    EXPECT_TRUE(SameBits(resumed.losses[r], tail)) << "losses after the resume differ";
    EXPECT_TRUE(SameBits(resumed.params[r], whole.params[r])) << "final models differ";
    EXPECT_EQ(resumed.reports[r].local_accuracy, whole.reports[r].local_accuracy);
    EXPECT_EQ(resumed.reports[r].global_accuracy, whole.reports[r].global_accuracy);
  }
}

TEST_P(CheckpointResumeTest, ResumedJobTrainsAsTheUninterruptedOne) {
  absl::StatusOr<Outcome> whole = Run("whole", /*resume=*/false, kSteps);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->losses[0].size(), kSteps);
  // The checkpoints' averages leave no worker apart from the servers.
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(SameBits(whole->params[r], whole->servers))
        << "rank " << r << " ends apart from the servers' model";
  }

  ASSERT_TRUE(Run("cut", /*resume=*/false, kStopAt).status().ok());
  absl::StatusOr<Outcome> resumed = Run("cut", /*resume=*/true, kSteps);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ExpectSameEnd(*whole, *resumed);

  // The uninterrupted run kept its two newest complete checkpoints.
  const uint64_t fingerprint = JobFingerprint(MakeConfig(GetParam(), ""));
  std::vector<std::string> passed_over;
  absl::StatusOr<LoadedCheckpoint> newest =
      LoadNewestCheckpoint((root_ / "whole").string(), fingerprint, &passed_over);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 28u);
  EXPECT_EQ(newest->ids.size(), 2u + kWorkers);
  EXPECT_TRUE(passed_over.empty());
  EXPECT_TRUE(fs::exists(fs::path(CheckpointStepDir((root_ / "whole").string(), 24)) / "MANIFEST"));
  EXPECT_FALSE(fs::exists(CheckpointStepDir((root_ / "whole").string(), 20)));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, CheckpointResumeTest,
    ::testing::Values(
        Case{"ssgd", "momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.0001",
             R"(name: "ssgd")"},
        Case{"cser", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "cser" period: 3 ratio_c1: 2 ratio_c2: 8 cser_variant: MODEL_BLOCKS)"},
        Case{"m_cser_gradient_blocks", "momentum_kind: NESTEROV momentum: 0.9",
             R"(name: "m-cser" period: 3 ratio_c1: 2 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)"},
        Case{"ef_sgd", "momentum_kind: NESTEROV momentum: 0.9", R"(name: "ef-sgd" ratio: 4)"},
        Case{"gtopk_ssgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "gtopk-ssgd" density: 0.05)"},
        Case{"topk_ssgd", "", R"(name: "topk-ssgd" density: 0.05)"},
        Case{"local_sgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "local-sgd" period: 3)"},
        Case{"qsparse_local_sgd", "", R"(name: "qsparse-local-sgd" period: 3 ratio: 4)"},
        Case{"csea", "", R"(name: "csea" ratio_c1: 4)"},
        Case{"cser_pl", "", R"(name: "cser-pl" period: 3 ratio_c1: 4)"},
        Case{"cocod_sgd", "momentum_kind: HEAVY_BALL momentum: 0.9",
             R"(name: "cocod-sgd" period: 3)"},
        Case{"pipe_sgd", "", R"(name: "pipe-sgd")"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Flips one byte in the middle of `path`.
void FlipByte(const fs::path& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(fs::file_size(path) / 2));
  const char byte = static_cast<char>(file.get());
  file.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
  file.put(static_cast<char>(byte ^ 0x40));
}

class DamagedCheckpointTest : public CheckpointResumeTest {};

// checkpoint.restart_on_failure: the first start finds no checkpoint and
// starts fresh, a restart resumes from the newest one, to the bit.
TEST_P(DamagedCheckpointTest, RestartableJobStartsFreshThenResumes) {
  absl::StatusOr<Outcome> whole = Run("whole", Start::kFresh, kSteps);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_FALSE(fs::exists(root_ / "cut"));
  ASSERT_TRUE(Run("cut", Start::kRestartable, kStopAt).status().ok());
  absl::StatusOr<Outcome> resumed = Run("cut", Start::kRestartable, kSteps);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ExpectSameEnd(*whole, *resumed);
}

// ... but a folder whose checkpoints of the job are all damaged is not a
// fresh start.
TEST_P(DamagedCheckpointTest, RestartableJobRefusesAFolderOfDamagedCheckpoints) {
  ASSERT_TRUE(Run("cut", Start::kFresh, kStopAt).status().ok());
  for (uint64_t step : {8, 12}) {
    FlipByte(fs::path(CheckpointStepDir((root_ / "cut").string(), step)) / "shard-0.ckpt");
  }
  const absl::StatusOr<Outcome> refused = Run("cut", Start::kRestartable, kSteps);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("shard 0 cannot resume"));
  EXPECT_THAT(refused.status().message(), HasSubstr("CRC32"));
}

// A fresh run in a folder that holds the job's checkpoints would write its
// own among them, and pruning would keep the earlier run's higher steps.
TEST_P(DamagedCheckpointTest, FreshRunRefusesAFolderHoldingTheJobsCheckpoints) {
  ASSERT_TRUE(Run("cut", Start::kFresh, kStopAt).status().ok());
  const absl::StatusOr<Outcome> refused = Run("cut", Start::kFresh, kSteps);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("checkpoint.dir ", (root_ / "cut").string(),
                                     " already holds a checkpoint of this job")));
  EXPECT_TRUE(fs::exists(fs::path(CheckpointStepDir((root_ / "cut").string(), kResumeStep)) /
                         "MANIFEST"));
}

// A worker restarted on its own finds servers in the middle of the job,
// which it cannot join: it says so instead of initialising a new model.
TEST_P(DamagedCheckpointTest, RestartedWorkerRefusesServersInTheMiddleOfTheJob) {
  v1::JobConfig config = MakeConfig(GetParam(), (root_ / "alone").string());
  config.mutable_checkpoint()->set_restart_on_failure(true);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(config, kD);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < kWorkers; ++r) {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create((*cluster)->config(), &(*cluster)->client(r), &train_, &test_);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    trainers.push_back(*std::move(trainer));
  }
  ASSERT_TRUE((*cluster)->OnEveryRank([&](int r) -> absl::Status {
                          RETURN_IF_ERROR(trainers[r]->InitializeModel());
                          return trainers[r]->Step().status();
                        }).ok());
  // Rank 1 again, as a restarted process: a new client under its id.
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect((*cluster)->config(), kD);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Register(1, "test-worker-1").ok());
  absl::StatusOr<std::unique_ptr<Trainer>> restarted =
      Trainer::Create((*cluster)->config(), client->get(), &train_, &test_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const absl::Status refused = (*restarted)->InitializeModel();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("in the middle of the job"));
}

// A worker started without --resume beside servers that resumed would
// train a fresh start on the checkpoint's model, and first remove its own
// files from every step, the checkpoints the servers resumed from included.
TEST_P(DamagedCheckpointTest, WorkerStartedAfreshRefusesResumedServers) {
  ASSERT_TRUE(Run("cut", Start::kFresh, kStopAt).status().ok());
  v1::JobConfig config = MakeConfig(GetParam(), (root_ / "cut").string());
  config.mutable_checkpoint()->set_resume(true);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(config, kD);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::JobConfig afresh = (*cluster)->config();
  afresh.mutable_checkpoint()->set_resume(false);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(afresh, &(*cluster)->client(1), &train_, &test_);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const absl::Status refused = (*trainer)->InitializeModel();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("resumed from the checkpoint of step 12"));
  for (uint64_t step : {8, 12}) {
    EXPECT_TRUE(fs::exists(fs::path(CheckpointStepDir((root_ / "cut").string(), step)) /
                           "rank-1.ckpt"))
        << "step " << step;
  }
}

TEST_P(DamagedCheckpointTest, DamagedNewestIsPassedOverForThePreviousOne) {
  absl::StatusOr<Outcome> whole = Run("whole", /*resume=*/false, kSteps);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // Stopped after the checkpoint of step 16, whose rank 1 file is then
  // damaged: every process resumes from step 12 instead.
  ASSERT_TRUE(Run("cut", /*resume=*/false, 17).status().ok());
  const fs::path damaged =
      fs::path(CheckpointStepDir((root_ / "cut").string(), 16)) / "rank-1.ckpt";
  ASSERT_TRUE(fs::exists(damaged));
  FlipByte(damaged);
  const uint64_t fingerprint = JobFingerprint(MakeConfig(GetParam(), ""));
  std::vector<std::string> passed_over;
  absl::StatusOr<LoadedCheckpoint> newest =
      LoadNewestCheckpoint((root_ / "cut").string(), fingerprint, &passed_over);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, kResumeStep);
  ASSERT_EQ(passed_over.size(), 1u);
  EXPECT_THAT(passed_over[0], HasSubstr(damaged.string()));
  EXPECT_THAT(passed_over[0], HasSubstr("CRC32"));

  absl::StatusOr<Outcome> resumed = Run("cut", /*resume=*/true, kSteps);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ExpectSameEnd(*whole, *resumed);
}

// A run that died may have left files of a step after its newest complete
// checkpoint (or, before any was complete, of any step); the run that
// resumes, or starts fresh, forgets each process's own before it writes any
// (checkpoint_dir.h, ForgetPartsAfter), and leaves another job's.
class LeftFilesTest : public DamagedCheckpointTest {
 protected:
  // Files of step kLeft, past the job's end (so that no run writes it
  // again): shard 1's and rank 1's of this job, rank 0's of another.
  static constexpr uint64_t kLeft = 40;
  void LeaveFiles(const std::string& dir) {
    const uint64_t fingerprint = JobFingerprint(MakeConfig(GetParam(), ""));
    left_ = {{fingerprint, kLeft, CheckpointRole::kShard, 1},
             {fingerprint, kLeft, CheckpointRole::kRank, 1},
             {fingerprint + 1, kLeft, CheckpointRole::kRank, 0}};
    ASSERT_TRUE(MakeCheckpointStepDir(dir, kLeft).ok());
    const std::vector<float> values = {1.0f};
    for (const CheckpointId& id : left_) {
      ASSERT_TRUE(WriteCheckpointFile(Path(dir, id).string(), id, {{"model", values}}).ok());
    }
  }
  void ExpectOnlyTheOtherJobsLeft(const std::string& dir) {
    EXPECT_FALSE(fs::exists(Path(dir, left_[0])));
    EXPECT_FALSE(fs::exists(Path(dir, left_[1])));
    EXPECT_TRUE(fs::exists(Path(dir, left_[2])));
  }
  static fs::path Path(const std::string& dir, const CheckpointId& id) {
    return fs::path(CheckpointStepDir(dir, kLeft)) / CheckpointFileName(id.role, id.index);
  }
  std::vector<CheckpointId> left_;
};

TEST_P(LeftFilesTest, AResumedRunForgetsItsProcessesFilesOfLaterSteps) {
  ASSERT_TRUE(Run("cut", Start::kFresh, kStopAt).status().ok());
  const std::string dir = (root_ / "cut").string();
  ASSERT_NO_FATAL_FAILURE(LeaveFiles(dir));
  ASSERT_TRUE(Run("cut", Start::kResume, kSteps).status().ok());
  ExpectOnlyTheOtherJobsLeft(dir);
}

TEST_P(LeftFilesTest, AFreshRunForgetsItsProcessesFilesOfEveryStep) {
  const std::string dir = (root_ / "fresh").string();
  ASSERT_NO_FATAL_FAILURE(LeaveFiles(dir));
  ASSERT_TRUE(Run("fresh", Start::kFresh, kStopAt).status().ok());
  ExpectOnlyTheOtherJobsLeft(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Ssgd, LeftFilesTest,
    ::testing::Values(Case{"left", "momentum_kind: NESTEROV momentum: 0.9", R"(name: "ssgd")"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Ssgd, DamagedCheckpointTest,
    ::testing::Values(Case{"damaged", "momentum_kind: NESTEROV momentum: 0.9",
                           R"(name: "ssgd")"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(CheckpointResumeErrors, ResumingWithoutACheckpointFailsNamingTheFolder) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("checkpoint_resume_test.", getpid(), ".none");
  fs::remove_all(dir);
  v1::JobConfig config =
      MakeConfig(Case{"none", "", R"(name: "ssgd")"}, dir.string());
  config.mutable_checkpoint()->set_resume(true);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(config, kD);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cluster.status().message(), HasSubstr("shard 0 cannot resume"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("no complete checkpoint"));
  EXPECT_THAT(cluster.status().message(), HasSubstr(dir.string()));
}

}  // namespace
}  // namespace cserps
