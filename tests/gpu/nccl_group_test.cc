// NcclGroup on one GPU: a group of one, whose collectives are identities
// through the whole path (agreement, staging, NCCL, copy back), and the
// errors that come before NCCL. The id's hand-over between processes is
// tested without a GPU in tests/worker/group/rendezvous_file_test.cc.
#include "worker/group/nccl_group.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

std::string IdPath(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return (dir / "nccl_id").string();
}

// Values whose bits a sum with anything but zero, or a copy through the
// wrong offset, would change.
std::vector<float> Values(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1e-3f * static_cast<float>(i) - 1e8f * (i % 3 == 0);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(NcclGroupTest, AGroupOfOneHasIdentityCollectives) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_one");
  options.device = 0;
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group,
                              NcclGroup::Create(0, 1, options));
  EXPECT_EQ(group->local_rank(), 0u);
  EXPECT_EQ(group->size(), 1u);
  EXPECT_EQ(group->device(), 0);
  // A group of one needs no hand-over: no file is left.
  EXPECT_FALSE(std::filesystem::exists(options.id_path));

  // Growing, shrinking and growing again reuses and grows the staging.
  for (size_t n : {size_t{5}, size_t{100000}, size_t{7}, size_t{300001}}) {
    SCOPED_TRACE(n);
    const std::vector<float> expected = Values(n);
    std::vector<float> data = expected;
    CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(data)));
    EXPECT_TRUE(SameBits(data, expected));
    CSERPS_ASSERT_OK(group->Broadcast(0, absl::MakeSpan(data)));
    EXPECT_TRUE(SameBits(data, expected));
  }
  std::vector<float> empty;
  CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(empty)));
  CSERPS_ASSERT_OK(group->Broadcast(0, absl::MakeSpan(empty)));
}

TEST(NcclGroupTest, ABadRootIsRefusedBeforeJoiningAndLeavesTheGroupUsable) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_root");
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group,
                              NcclGroup::Create(0, 1, options));
  std::vector<float> data = Values(10);
  const absl::Status bad = group->Broadcast(1, absl::MakeSpan(data));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("root 1"));
  CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(data)));
  EXPECT_TRUE(SameBits(data, Values(10)));
}

TEST(NcclGroupTest, BadLocalRanksAndDevicesAreRefused) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_bad");
  EXPECT_EQ(NcclGroup::Create(2, 2, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create(0, 0, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.device = CudaDeviceCount();  // one past the last
  const absl::Status no_device = NcclGroup::Create(0, 1, options).status();
  EXPECT_EQ(no_device.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_device.message(), HasSubstr("does not exist"));
}

TEST(NcclGroupTest, ALocalRankWhoseRootNeverPublishesTimesOutNamingTheFile) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_no_root");
  options.device = 0;
  options.setup_timeout = absl::Milliseconds(100);
  const absl::Status status = NcclGroup::Create(1, 2, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr(options.id_path));
}

}  // namespace
}  // namespace cserps
