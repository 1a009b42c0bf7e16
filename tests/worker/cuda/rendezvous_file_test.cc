// The file through which local rank 0 of an NCCL group hands its id to the
// other local ranks, exercised on the CPU (no NCCL involved).
#include "worker/cuda/rendezvous_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

// A fresh directory of this test under TempDir (mkdtemp).
std::filesystem::path TempDir() {
  std::string pattern = std::string(::testing::TempDir()) + "/rendezvous_XXXXXX";
  const char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return made == nullptr ? std::filesystem::path(::testing::TempDir()) : made;
}

// 128 bytes, like an ncclUniqueId, with every byte value NUL included.
std::string IdBytes(char salt) {
  std::string bytes(128, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + salt);
  return bytes;
}

TEST(RendezvousFileTest, PublishedBytesAreReadBackExactly) {
  const std::filesystem::path dir = TempDir();
  // The group directory does not exist yet: publishing creates it.
  const std::string path = (dir / "group" / "nccl_id").string();
  const std::string id = IdBytes(3);
  ASSERT_TRUE(PublishRendezvousFile(path, id).ok());
  absl::StatusOr<std::string> read = AwaitRendezvousFile(path, id.size());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, id);
  // Made for this user only.
  struct stat info;
  ASSERT_EQ(stat((dir / "group").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  // Nothing but the file is left behind (the temporary was renamed).
  size_t entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "group")) {
    static_cast<void>(entry);
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

TEST(RendezvousFileTest, AReaderThatStartsFirstGetsTheBytesOncePublished) {
  const std::string path = (TempDir() / "later" / "nccl_id").string();
  const std::string id = IdBytes(9);
  absl::StatusOr<std::string> read = absl::UnknownError("not read");
  // The reader polls until the writer publishes, whichever runs first.
  std::thread reader([&] {
    read = AwaitRendezvousFile(path, id.size(), {.timeout = absl::Seconds(30)});
  });
  ASSERT_TRUE(PublishRendezvousFile(path, id).ok());
  reader.join();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, id);
}

TEST(RendezvousFileTest, RepublishingReplacesTheFile) {
  const std::string path = (TempDir() / "nccl_id").string();
  ASSERT_TRUE(PublishRendezvousFile(path, IdBytes(1)).ok());
  ASSERT_TRUE(PublishRendezvousFile(path, IdBytes(2)).ok());
  absl::StatusOr<std::string> read = AwaitRendezvousFile(path, 128);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, IdBytes(2));
}

TEST(RendezvousFileTest, AMissingFileTimesOutNamingThePath) {
  const std::string path = (TempDir() / "never" / "nccl_id").string();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> read =
      AwaitRendezvousFile(path, 128, {.timeout = absl::Milliseconds(50)});
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
}

TEST(RendezvousFileTest, AFileOfTheWrongSizeIsDataLossNamingThePath) {
  const std::filesystem::path dir = TempDir();
  const std::string path = (dir / "nccl_id").string();
  ASSERT_TRUE(PublishRendezvousFile(path, "short").ok());
  absl::StatusOr<std::string> read = AwaitRendezvousFile(path, 128);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("holds 5 bytes, expected 128"));
}

TEST(RendezvousFileTest, RemoveDeletesAndToleratesAMissingFile) {
  const std::string path = (TempDir() / "nccl_id").string();
  ASSERT_TRUE(PublishRendezvousFile(path, IdBytes(4)).ok());
  ASSERT_TRUE(RemoveRendezvousFile(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(RemoveRendezvousFile(path).ok());
}

TEST(RendezvousFileTest, AnUnwritableDirectoryIsAnErrorNamingThePath) {
  const std::filesystem::path dir = TempDir();
  // A regular file where the directory should be.
  std::ofstream(dir / "blocker") << "x";
  const std::string path = (dir / "blocker" / "nccl_id").string();
  const absl::Status published = PublishRendezvousFile(path, IdBytes(5));
  EXPECT_FALSE(published.ok());
  EXPECT_THAT(published.message(), HasSubstr(path));
}

}  // namespace
}  // namespace cserps
