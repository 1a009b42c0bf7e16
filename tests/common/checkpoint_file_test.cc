// Checkpoint files: what is written is read back bit for bit, and every
// damaged, foreign or misplaced file is refused naming the file and what is
// wrong.
#include "common/checkpoint_file.h"

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr CheckpointId kId{0x1234abcd5678ef00ull, 300, CheckpointRole::kRank, 2};

// The header's CRC (at byte 48, over the header before it and the payload
// from byte 56) made right again for `bytes`, which a test has altered.
void Recrc(std::string& bytes) {
  uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), 48));
  crc = static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()) + 56,
                                    static_cast<uInt>(bytes.size() - 56)));
  std::memcpy(&bytes[48], &crc, sizeof(crc));
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("checkpoint_file_test.", getpid(), ".",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "rank-2.ckpt").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::Status WriteSample() {
    const std::vector<CheckpointSectionView> sections = {{"model", model_}, {"momentum", momentum_},
                                                         {"empty", {}}};
    return WriteCheckpointFile(path_, kId, sections);
  }
  std::string Bytes() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void SetBytes(const std::string& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  fs::path dir_;
  std::string path_;
  const std::vector<float> model_ = {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::infinity(), 3e-39f};
  const std::vector<float> momentum_ = {0.25f, -7.0f};
};

TEST_F(CheckpointFileTest, WhatIsWrittenIsReadBackBitForBit) {
  ASSERT_TRUE(WriteSample().ok());
  auto sections = ReadCheckpointFile(path_, kId);
  ASSERT_TRUE(sections.ok()) << sections.status();
  ASSERT_EQ(sections->size(), 3u);
  EXPECT_EQ((*sections)[0].name, "model");
  ASSERT_EQ((*sections)[0].values.size(), model_.size());
  EXPECT_EQ(std::memcmp((*sections)[0].values.data(), model_.data(), model_.size() * 4), 0);
  EXPECT_EQ((*sections)[1].name, "momentum");
  EXPECT_EQ((*sections)[1].values, momentum_);
  EXPECT_EQ((*sections)[2].name, "empty");
  EXPECT_TRUE((*sections)[2].values.empty());
  // Only the file itself is left: the temporary one was renamed.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "rank-2.ckpt");
    ++files;
  }
  EXPECT_EQ(files, 1);
}

// Two writers of one process (local ranks completing a step together)
// write the same manifest at once: both succeed, and one whole copy is left.
TEST_F(CheckpointFileTest, ThreadsWritingOneFileAtOnceBothSucceed) {
  const std::string path = (dir_ / "MANIFEST").string();
  const std::string text(1 << 16, 'm');
  absl::Status status[2];
  std::thread writers[2];
  for (int i = 0; i < 2; ++i) {
    writers[i] = std::thread([&, i] {
      for (int n = 0; n < 50 && status[i].ok(); ++n) status[i] = WriteFileAtomically(path, {text});
    });
  }
  for (std::thread& t : writers) t.join();
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(fs::file_size(path), text.size());
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST_F(CheckpointFileTest, DamagedFilesAreRefusedNamingTheFileAndTheDamage) {
  ASSERT_TRUE(WriteSample().ok());
  const std::string good = Bytes();
  struct Case {
    std::string what;
    std::string bytes;
    std::string says;
  };
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;  // inside the momentum's floats
  std::string table = good;
  table[56 + 1] ^= 0x01;  // the first section name's length
  std::string step = good;
  step[16] ^= 0x01;  // the header's step
  const std::vector<Case> cases = {
      {"truncated", good.substr(0, good.size() - 5), "truncated"},
      {"appended to", good + "x", "too long"},
      {"one byte flipped", flipped, "CRC32"},
      {"section table damaged", table, "CRC32"},
      {"header's step damaged", step, "CRC32"},
      {"not a checkpoint", "step 300 of rank 2, honest", "not a cserps checkpoint file"},
      {"empty", "", "not a cserps checkpoint file"},
  };
  for (const Case& c : cases) {
    SetBytes(c.bytes);
    auto read = ReadCheckpointFile(path_, kId);
    ASSERT_FALSE(read.ok()) << c.what;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << c.what;
    EXPECT_THAT(read.status().message(), HasSubstr(path_)) << c.what;
    EXPECT_THAT(read.status().message(), HasSubstr(c.says)) << c.what << ": " << read.status();
  }
}

// A file whose CRC matches but whose header claims more sections than its
// bytes can hold (made on purpose, or by a bug in another writer) is
// refused before anything is allocated for them.
TEST_F(CheckpointFileTest, ASectionCountTheFileCannotHoldIsRefused) {
  ASSERT_TRUE(WriteSample().ok());
  std::string bytes = Bytes();
  const uint32_t sections = 0xffffffffu;
  std::memcpy(&bytes[32], &sections, sizeof(sections));
  Recrc(bytes);
  absl::StatusOr<std::vector<CheckpointSection>> read = ParseCheckpointFile(bytes, "crafted", kId);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr("crafted"), HasSubstr("4294967295 sections")));
}

// Sections that each fit in the file but together would not (made on
// purpose: each would be allocated before their sum is known) are refused
// at the first that does not fit.
TEST_F(CheckpointFileTest, SectionsTheFileCannotHoldTogetherAreRefusedAtTheFirst) {
  const std::vector<float> model(1000, 1.0f);
  const std::vector<CheckpointSectionView> sections = {
      {"a", {}}, {"b", {}}, {"c", {}}, {"d", {}}, {"model", model}};
  ASSERT_TRUE(WriteCheckpointFile(path_, kId, sections).ok());
  std::string bytes = Bytes();
  // The table follows the 56-byte header: per section its name's length,
  // the name, then its count of floats.
  const uint64_t claimed = model.size();
  for (size_t i = 0; i < 4; ++i) std::memcpy(&bytes[56 + 13 * i + 5], &claimed, sizeof(claimed));
  Recrc(bytes);
  absl::StatusOr<std::vector<CheckpointSection>> read = ParseCheckpointFile(bytes, "crafted", kId);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr("crafted"), HasSubstr("section 'b' claims 1000 floats after 1000")));
}

TEST_F(CheckpointFileTest, AnotherJobsStepsOrWritersFileIsRefused) {
  ASSERT_TRUE(WriteSample().ok());
  CheckpointId other = kId;
  other.fingerprint ^= 1;
  auto read = ReadCheckpointFile(path_, other);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("fingerprint 0x1234abcd5678ef00"));
  EXPECT_THAT(read.status().message(), HasSubstr("this job's is 0x1234abcd5678ef01"));
  other = kId;
  other.step = 299;
  read = ReadCheckpointFile(path_, other);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("holds step 300 of rank 2; expected step 299"));
  other = kId;
  other.role = CheckpointRole::kShard;
  read = ReadCheckpointFile(path_, other);
  EXPECT_THAT(read.status().message(), HasSubstr("expected step 300 of shard 2"));
  read = ReadCheckpointFile((dir_ / "absent.ckpt").string(), kId);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr("absent.ckpt"));
}

TEST_F(CheckpointFileTest, ARewriteReplacesAndAFailedWriteLeavesNothing) {
  ASSERT_TRUE(WriteSample().ok());
  const std::vector<float> newer = {9.0f};
  ASSERT_TRUE(WriteCheckpointFile(path_, kId, {{"model", newer}}).ok());
  auto read = ReadCheckpointFile(path_, kId);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0].values, newer);

  const std::string nowhere = (dir_ / "missing-folder" / "rank-2.ckpt").string();
  EXPECT_FALSE(WriteCheckpointFile(nowhere, kId, {{"model", newer}}).ok());
  EXPECT_FALSE(fs::exists(dir_ / "missing-folder"));
  const absl::Status twice = WriteCheckpointFile(path_, kId, {{"a", newer}, {"a", newer}});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("not unique"));
  // The refused write changed nothing.
  read = ReadCheckpointFile(path_, kId);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ((*read)[0].name, "model");
}

}  // namespace
}  // namespace cserps
