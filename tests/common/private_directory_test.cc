// The directory of a node's socket or rendezvous file: made private when
// missing, and refused, naming it, when it exists but another user could
// have put or may replace what is in it.
#include "common/private_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PrivateDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            absl::StrCat("private_directory_test.", getpid(), ".",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::replace);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
};

TEST_F(PrivateDirectoryTest, AMissingDirectoryIsMadeForThisUserAlone) {
  const fs::path dir = root_ / "a" / "b";
  ASSERT_TRUE(CreateParentDirectory((dir / "group.sock").string()).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  // Made once, it is this user's and private: taken as it is.
  EXPECT_TRUE(CreateParentDirectory((dir / "nccl_id").string()).ok());
}

TEST_F(PrivateDirectoryTest, OneOthersMayWriteToIsRefusedNamingIt) {
  const fs::path dir = root_ / "shared";
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all, fs::perm_options::replace);  // 0777
  const absl::Status status = CreateParentDirectory((dir / "group.sock").string());
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir.string()));
  EXPECT_THAT(status.message(), HasSubstr("mode 0777"));
}

TEST_F(PrivateDirectoryTest, ASymbolicLinkIsRefusedNamingIt) {
  const fs::path target = root_ / "elsewhere";
  fs::create_directories(target);
  fs::permissions(target, fs::perms::owner_all, fs::perm_options::replace);
  const fs::path link = root_ / "link";
  fs::create_directory_symlink(target, link);
  const absl::Status status = CreateParentDirectory((link / "group.sock").string());
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("symbolic link"));
}

}  // namespace
}  // namespace cserps
