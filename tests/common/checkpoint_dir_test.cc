// A checkpoint folder: the newest complete step is loaded; newer steps that
// are incomplete, damaged or another job's are passed over, each with its
// reason; pruning keeps the newest complete ones and what is not the job's;
// a folder or manifest that cannot be read is never taken for an absent one;
// a process that resumes forgets its files of the later steps; folders and
// files are private to the user.
#include "common/checkpoint_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr uint64_t kJob = 0xfeedfacecafe0001ull;

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) /
            absl::StrCat("checkpoint_dir_test.", getpid(), ".",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Shard 0's and rank 0's files of `step` (their floats: the step), and
  // the manifest when `complete`.
  void WriteStep(uint64_t step, bool complete, uint64_t job = kJob) {
    ASSERT_TRUE(MakeCheckpointStepDir(dir_, step).ok());
    std::vector<CheckpointId> ids = {{job, step, CheckpointRole::kShard, 0},
                                     {job, step, CheckpointRole::kRank, 0}};
    const std::vector<float> values = {static_cast<float>(step)};
    for (const CheckpointId& id : ids) {
      ASSERT_TRUE(WriteCheckpointFile(FilePath(step, id), id, {{"model", values}}).ok());
    }
    if (complete) {
      ASSERT_TRUE(WriteCheckpointManifest(dir_, job, step, ids).ok());
    }
  }
  std::string FilePath(uint64_t step, const CheckpointId& id) const {
    return (fs::path(CheckpointStepDir(dir_, step)) / CheckpointFileName(id.role, id.index))
        .string();
  }
  bool StepExists(uint64_t step) const { return fs::exists(CheckpointStepDir(dir_, step)); }

  std::string dir_;
};

TEST_F(CheckpointDirTest, TheNewestCompleteStepIsLoadedAndNewerIncompleteOnesPassedOver) {
  WriteStep(100, true);
  WriteStep(200, true);
  WriteStep(300, false);
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 200u);
  ASSERT_EQ(loaded->files.size(), 2u);
  EXPECT_EQ(loaded->ids[0].role, CheckpointRole::kShard);
  EXPECT_EQ(loaded->files[1][0].values, std::vector<float>{200.0f});
  ASSERT_EQ(passed_over.size(), 1u);
  EXPECT_THAT(passed_over[0], HasSubstr("step 300"));
  EXPECT_THAT(passed_over[0], HasSubstr("not complete"));
}

// A checkpoint holds the model: its folders and files are the user's alone,
// whatever the umask (the folders this process made; a folder that was
// there keeps its mode).
TEST_F(CheckpointDirTest, FoldersAndFilesArePrivateToTheUser) {
  const mode_t umask_was = umask(022);
  WriteStep(100, true);
  umask(umask_was);
  auto mode = [](const fs::path& p) { return fs::status(p).permissions(); };
  EXPECT_EQ(mode(dir_), fs::perms::owner_all);
  EXPECT_EQ(mode(CheckpointStepDir(dir_, 100)), fs::perms::owner_all);
  for (const auto& entry : fs::directory_iterator(CheckpointStepDir(dir_, 100))) {
    EXPECT_EQ(mode(entry.path()), fs::perms::owner_read | fs::perms::owner_write)
        << entry.path();
  }
}

TEST_F(CheckpointDirTest, ADamagedOrForeignStepFallsBackToThePreviousOne) {
  WriteStep(100, true);
  WriteStep(200, true);
  WriteStep(300, true, kJob + 1);  // another job's, in the same folder
  const std::string rank_file = FilePath(200, {kJob, 200, CheckpointRole::kRank, 0});
  fs::resize_file(rank_file, fs::file_size(rank_file) - 2);
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100u);
  ASSERT_EQ(passed_over.size(), 2u) << absl::StrJoin(passed_over, "\n");
  EXPECT_THAT(passed_over[0], HasSubstr("written by the job with fingerprint 0xfeedfacecafe0002"));
  EXPECT_THAT(passed_over[1], HasSubstr(rank_file));
  EXPECT_THAT(passed_over[1], HasSubstr("truncated"));
}

// A manifest cut short, with a flipped bit, or listing a file twice would
// otherwise read as complete and list fewer or other files than the step
// has: each is passed over for the step before, naming what is wrong.
TEST_F(CheckpointDirTest, ADamagedManifestFallsBackToThePreviousStep) {
  const fs::path manifest = fs::path(CheckpointStepDir(dir_, 200)) / "MANIFEST";
  auto read = [&] {
    std::ifstream in(manifest);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const struct {
    const char* name;
    std::function<std::string(const std::string&)> damage;
    const char* reason;
  } cases[] = {
      {"its last line dropped",
       [](const std::string& t) { return t.substr(0, t.rfind('\n', t.size() - 2) + 1); },
       "does not end with its CRC32 line"},
      {"rank 0 read as rank 1",
       [](std::string t) {
         t[t.find("rank 0") + 5] ^= 0x01;
         return t;
       },
       "CRC32 does not match"},
      {"cut in the middle", [](const std::string& t) { return t.substr(0, t.size() / 2); },
       "does not end with its CRC32 line"},
  };
  WriteStep(100, true);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    WriteStep(200, true);
    const std::string damaged = c.damage(read());
    std::ofstream(manifest, std::ios::trunc) << damaged;
    std::vector<std::string> passed_over;
    auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 100u);
    ASSERT_EQ(passed_over.size(), 1u);
    EXPECT_THAT(passed_over[0], HasSubstr(manifest.string()));
    EXPECT_THAT(passed_over[0], HasSubstr(c.reason));
  }
  // Listed twice, with a CRC that matches: refused all the same.
  const CheckpointId shard{kJob, 200, CheckpointRole::kShard, 0};
  ASSERT_TRUE(WriteCheckpointManifest(dir_, kJob, 200, {shard, shard}).ok());
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100u);
  ASSERT_EQ(passed_over.size(), 1u);
  EXPECT_THAT(passed_over[0], HasSubstr("malformed line 'shard 0'"));
}

// Only folders named as CheckpointStepDir names them are steps: step-300
// beside step-00000000000000000300 would be step 300 twice, and with keep
// 1 pruning would count it twice and remove the only complete step.
TEST_F(CheckpointDirTest, OnlyCanonicallyNamedFoldersAreSteps) {
  WriteStep(200, true);
  WriteStep(300, true);
  for (const char* name : {"step-300", "step-0300", "step-+0000000000000000300"}) {
    fs::copy(CheckpointStepDir(dir_, 300), fs::path(dir_) / name);
  }
  ASSERT_TRUE(PruneCheckpoints(dir_, kJob, 1).ok());
  EXPECT_TRUE(StepExists(300));
  EXPECT_FALSE(StepExists(200));
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 300u);
  EXPECT_TRUE(passed_over.empty());
}

TEST_F(CheckpointDirTest, NoCompleteStepIsNotFound) {
  WriteStep(100, false);
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr("no complete checkpoint of job 0xfeedfacecafe0001"));
  EXPECT_EQ(passed_over.size(), 1u);
  passed_over.clear();
  EXPECT_FALSE(LoadNewestCheckpoint(dir_ + "/absent", kJob, &passed_over).ok());
}

TEST_F(CheckpointDirTest, AFolderThatCannotBeListedIsAnErrorNotAnEmptyFolder) {
  fs::create_directories(fs::path(dir_).parent_path());
  std::ofstream(dir_) << "not a folder";
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(loaded.status().message(),
              HasSubstr(absl::StrCat("checkpoint folder ", dir_, " cannot be listed")));
  const absl::StatusOr<bool> has = HasManifestOf(dir_, kJob);
  EXPECT_EQ(has.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(has.status().message(), HasSubstr("cannot be listed: Not a directory"));
  EXPECT_EQ(PruneCheckpoints(dir_, kJob, 1).code(), absl::StatusCode::kUnavailable);
}

// Step 100 loads, step 200 (whose `manifest` cannot be read) is passed
// over saying so.
void ExpectTheStepPassedOverAsUnreadable(const std::string& dir, const fs::path& manifest) {
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100u);
  ASSERT_EQ(passed_over.size(), 1u);
  EXPECT_THAT(passed_over[0], HasSubstr(absl::StrCat(manifest.string(), " cannot be read")));
}

TEST_F(CheckpointDirTest, AManifestThatCannotBeOpenedIsNotAnIncompleteStep) {
  WriteStep(100, true);
  WriteStep(200, false);
  // A link to itself: open fails with ELOOP, whoever runs the test.
  const fs::path manifest = fs::path(CheckpointStepDir(dir_, 200)) / "MANIFEST";
  fs::create_symlink(manifest, manifest);
  ExpectTheStepPassedOverAsUnreadable(dir_, manifest);
  // Whether step 200 was completed is unknown: it is neither pruned nor
  // taken for a folder without this job's checkpoints.
  ASSERT_TRUE(PruneCheckpoints(dir_, kJob, 1).ok());
  EXPECT_TRUE(StepExists(200));
  fs::remove_all(CheckpointStepDir(dir_, 100));
  EXPECT_TRUE(HasManifestOf(dir_, kJob).value_or(false));
}

// A manifest that opens but cannot be read (a folder here; EIO on a shared
// volume alike): libstdc++ throws from the read, which must not escape.
TEST_F(CheckpointDirTest, AManifestThatCannotBeReadIsPassedOver) {
  WriteStep(100, true);
  WriteStep(200, false);
  const fs::path manifest = fs::path(CheckpointStepDir(dir_, 200)) / "MANIFEST";
  fs::create_directories(manifest);
  ExpectTheStepPassedOverAsUnreadable(dir_, manifest);
  fs::remove_all(CheckpointStepDir(dir_, 100));
  EXPECT_TRUE(HasManifestOf(dir_, kJob).value_or(false));
}

TEST_F(CheckpointDirTest, PruningKeepsTheNewestCompleteStepsAndWhatIsNotTheJobs) {
  WriteStep(50, true, kJob + 1);
  for (uint64_t step : {100, 200, 300, 400, 500}) WriteStep(step, true);
  WriteStep(250, false);
  WriteStep(600, false);  // perhaps still being written
  ASSERT_TRUE(PruneCheckpoints(dir_, kJob, 2).ok());
  for (uint64_t step : {50, 400, 500, 600}) EXPECT_TRUE(StepExists(step)) << step;
  for (uint64_t step : {100, 200, 250, 300}) EXPECT_FALSE(StepExists(step)) << step;
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 500u);
}

// A run that died after some processes wrote their files of step 4 left
// them there; the run that resumes from step 2 writes step 4 again. Each of
// its processes forgets its own files after step 2 when it starts, so step 4
// is complete only once every file of the new run is written.
// A rank dropped from an elastic job writes no more parts: every later step
// stays incomplete. A part written prunes the older ones that can no
// longer complete (all but the newest below it), where the folder grew by
// a step at every checkpoint.
TEST_F(CheckpointDirTest, StepsThatCanNoLongerCompleteArePruned) {
  WriteStep(100, true);
  const CheckpointJob job{.dir = dir_, .fingerprint = kJob, .num_shards = 1, .num_ranks = 2,
                          .keep = 1};
  const std::vector<float> values = {1.0f};
  for (uint64_t step = 200; step <= 700; step += 100) {
    for (CheckpointRole role : {CheckpointRole::kShard, CheckpointRole::kRank}) {
      absl::StatusOr<bool> complete = WriteCheckpointPart(job, role, 0, step, {{"model", values}});
      ASSERT_TRUE(complete.ok()) << complete.status();
      EXPECT_FALSE(*complete);
    }
  }
  for (uint64_t step : {100, 600, 700}) EXPECT_TRUE(StepExists(step)) << step;
  for (uint64_t step : {200, 300, 400, 500}) EXPECT_FALSE(StepExists(step)) << step;
  std::vector<std::string> passed_over;
  auto loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100u);
}

TEST_F(CheckpointDirTest, AStepIsCompletedOnlyByTheFilesOfTheRunThatResumedBeforeIt) {
  const CheckpointJob job{.dir = dir_, .fingerprint = kJob, .num_shards = 1, .num_ranks = 2};
  auto write = [&](CheckpointRole role, uint32_t index, uint64_t step, float value) {
    const std::vector<float> values = {value};
    return WriteCheckpointPart(job, role, index, step, {{"model", values}});
  };
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(write(CheckpointRole::kRank, rank, 2, 2).ok());
  }
  absl::StatusOr<bool> complete = write(CheckpointRole::kShard, 0, 2, 2);
  ASSERT_TRUE(complete.ok() && *complete) << complete.status();
  // The run that died: the shard's and rank 1's files of step 4.
  ASSERT_TRUE(write(CheckpointRole::kShard, 0, 4, -1).ok());
  ASSERT_TRUE(write(CheckpointRole::kRank, 1, 4, -1).ok());
  // Another job's file of step 6 in the same folder stays.
  const CheckpointId foreign{kJob + 1, 6, CheckpointRole::kRank, 1};
  ASSERT_TRUE(MakeCheckpointStepDir(dir_, 6).ok());
  ASSERT_TRUE(WriteCheckpointFile(FilePath(6, foreign), foreign, {{"model", {}}}).ok());

  ASSERT_TRUE(ForgetPartsAfter(job, CheckpointRole::kShard, 0, 2).ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(ForgetPartsAfter(job, CheckpointRole::kRank, rank, 2).ok());
  }
  EXPECT_FALSE(fs::exists(FilePath(4, {kJob, 4, CheckpointRole::kRank, 1})));
  EXPECT_TRUE(fs::exists(FilePath(6, foreign)));

  complete = write(CheckpointRole::kShard, 0, 4, 4);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_FALSE(*complete);
  complete = write(CheckpointRole::kRank, 0, 4, 4);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_FALSE(*complete);
  std::vector<std::string> passed_over;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 2u);
  complete = write(CheckpointRole::kRank, 1, 4, 4);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_TRUE(*complete);
  loaded = LoadNewestCheckpoint(dir_, kJob, &passed_over);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 4u);
  for (const auto& file : loaded->files) EXPECT_EQ(file[0].values, std::vector<float>{4.0f});
}

}  // namespace
}  // namespace cserps
