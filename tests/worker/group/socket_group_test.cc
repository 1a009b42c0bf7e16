#include "worker/group/socket_group.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using Members = std::vector<std::unique_ptr<SocketGroup>>;

// A socket path of this test's own, in a directory that does not exist yet.
std::string NewPath() {
  static std::atomic<int> next{0};
  return absl::StrCat(::testing::TempDir(), "socket_group_", getpid(), "_", next++,
                      "/group.sock");
}

SocketGroupOptions Options(absl::Duration timeout = absl::Seconds(120)) {
  SocketGroupOptions options;
  options.path = NewPath();
  options.setup_timeout = absl::Seconds(120);
  options.timeout = timeout;
  return options;
}

// Every local rank's Create, each on a thread of its own, as processes call it.
std::vector<absl::StatusOr<std::unique_ptr<SocketGroup>>> CreateAll(
    const std::vector<uint32_t>& ranks, uint32_t size, const SocketGroupOptions& options) {
  std::vector<absl::StatusOr<std::unique_ptr<SocketGroup>>> created(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back(
        [&, i] { created[i] = SocketGroup::Create(ranks[i], size, options); });
  }
  for (std::thread& t : threads) t.join();
  return created;
}

Members Join(uint32_t size, const SocketGroupOptions& options) {
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < size; ++r) ranks.push_back(r);
  Members members;
  for (auto& created : CreateAll(ranks, size, options)) {
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) members.push_back(*std::move(created));
  }
  return members;
}

TEST(SocketGroupTest, NothingIsLeftAtThePathOnceAllHaveJoined) {
  const SocketGroupOptions options = Options();
  EXPECT_EQ(Join(3, options).size(), 3u);
  EXPECT_FALSE(std::filesystem::exists(options.path));
}

// The timeout is long: a failure reported before it can only come from the
// closed socket, which is what the test asserts (UNAVAILABLE, not
// DEADLINE_EXCEEDED).
TEST(SocketGroupTest, AMemberThatGoesAwayFailsLocalRankZeroAtOnceNamingIt) {
  Members members = Join(3, Options(absl::Minutes(10)));
  ASSERT_EQ(members.size(), 3u);
  members[2].reset();
  std::vector<absl::Status> results(2);
  std::thread t1([&] {
    std::vector<float> data(5, 1.0f);
    results[1] = members[1]->AllReduceSum(absl::MakeSpan(data));
  });
  std::vector<float> data(5, 1.0f);
  results[0] = members[0]->AllReduceSum(absl::MakeSpan(data));
  t1.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("local rank 2 (did its process end?)"));
  }
}

TEST(SocketGroupTest, LocalRankZeroGoingAwayFailsTheOthersAtOnce) {
  Members members = Join(2, Options(absl::Minutes(10)));
  ASSERT_EQ(members.size(), 2u);
  members[0].reset();
  std::vector<float> data(100000, 1.0f);
  const absl::Status s = members[1]->AllReduceSum(absl::MakeSpan(data));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("local rank 0 (did its process end?)"));
}

TEST(SocketGroupTest, MembersMissingAtSetUpAreNamed) {
  SocketGroupOptions options = Options();
  options.setup_timeout = absl::Seconds(2);
  auto created = CreateAll({0, 2}, 4, options);
  ASSERT_EQ(created[0].status().code(), absl::StatusCode::kDeadlineExceeded)
      << created[0].status();
  EXPECT_THAT(created[0].status().message(), HasSubstr("local rank(s) 1, 3 did not join"));
  EXPECT_THAT(created[0].status().message(), HasSubstr(options.path));
  // Local rank 2 was told.
  EXPECT_EQ(created[1].status().code(), absl::StatusCode::kDeadlineExceeded)
      << created[1].status();
  EXPECT_THAT(created[1].status().message(), HasSubstr("did not join"));
}

TEST(SocketGroupTest, TwoProcessesClaimingOneLocalRankAreRefused) {
  auto created = CreateAll({0, 1, 1}, 3, Options());
  EXPECT_EQ(created[0].status().code(), absl::StatusCode::kFailedPrecondition)
      << created[0].status();
  EXPECT_THAT(created[0].status().message(), HasSubstr("two processes claim local rank 1"));
}

TEST(SocketGroupTest, MembersDisagreeingOnTheSizeAreRefused) {
  const SocketGroupOptions options = Options();
  std::vector<absl::StatusOr<std::unique_ptr<SocketGroup>>> created(2);
  std::thread t([&] { created[1] = SocketGroup::Create(1, 3, options); });
  created[0] = SocketGroup::Create(0, 2, options);
  t.join();
  for (const auto& c : created) {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr("says it has 3 members"));
  }
}

TEST(SocketGroupTest, ALiveListenerAtThePathIsNotTakenOver) {
  const SocketGroupOptions options = Options();
  absl::StatusOr<UnixListener> other = UnixListener::Listen(options.path, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  const auto second = SocketGroup::Create(0, 2, options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("another process listens there"));
  EXPECT_TRUE(std::filesystem::exists(options.path));
}

TEST(SocketGroupTest, ACrashedRunsSocketFileIsReplaced) {
  const SocketGroupOptions options = Options();
  std::filesystem::create_directories(std::filesystem::path(options.path).parent_path());
  // A socket bound and closed without removing its file, as a killed
  // process leaves it.
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, options.path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
  ASSERT_TRUE(std::filesystem::exists(options.path));
  EXPECT_EQ(Join(2, options).size(), 2u);
}

TEST(SocketGroupTest, BadArgumentsAreRefused) {
  SocketGroupOptions options = Options();
  EXPECT_EQ(SocketGroup::Create(2, 2, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.path = std::string(200, 'x');
  const auto long_path = SocketGroup::Create(0, 2, options);
  EXPECT_EQ(long_path.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_path.status().message(), HasSubstr("is 200 bytes"));
}

}  // namespace
}  // namespace cserps
