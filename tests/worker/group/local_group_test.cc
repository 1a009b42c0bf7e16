// The LocalGroup contract (worker/group/local_group.h), held against each
// implementation that runs without a GPU: ThreadGroup (local ranks as
// threads) and SocketGroup (local ranks as processes; here each member on
// a thread of its own, over real sockets). What only one of them does is in
// its own test file.
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/group/group_inputs.h"
#include "worker/group/socket_group.h"
#include "worker/group/thread_group.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using Members = std::vector<std::unique_ptr<LocalGroup>>;

struct Implementation {
  std::string name;
  // The `size` members of a new group whose collectives time out after
  // `timeout`, by local rank.
  std::function<Members(uint32_t size, absl::Duration timeout)> make;
  // What a member that joins after the others timed out gets: ThreadGroup
  // finds the group broken; SocketGroup receives the verdict itself.
  absl::StatusCode latecomer;
};

Members ThreadMembers(uint32_t size, absl::Duration timeout) {
  Members members;
  for (auto& m : ThreadGroup::Create(size, {.timeout = timeout})) members.push_back(std::move(m));
  return members;
}

Members SocketMembers(uint32_t size, absl::Duration timeout) {
  static int next = 0;
  SocketGroupOptions options;
  options.path = absl::StrCat(::testing::TempDir(), "local_group_", getpid(), "_", next++,
                              "/group.sock");
  options.setup_timeout = absl::Seconds(120);
  options.timeout = timeout;
  std::vector<absl::StatusOr<std::unique_ptr<SocketGroup>>> created(size);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { created[r] = SocketGroup::Create(r, size, options); });
  }
  for (std::thread& t : threads) t.join();
  Members members;
  for (auto& c : created) {
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) members.push_back(*std::move(c));
  }
  return members;
}

const Implementation kImplementations[] = {
    {"ThreadGroup", ThreadMembers, absl::StatusCode::kAborted},
    {"SocketGroup", SocketMembers, absl::StatusCode::kDeadlineExceeded},
};

// Runs fn on one thread per member and joins them.
std::vector<absl::Status> OnEveryMember(const Members& members,
                                        const std::function<absl::Status(LocalGroup&)>& fn) {
  std::vector<absl::Status> status(members.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < members.size(); ++r) {
    threads.emplace_back([&, r] { status[r] = fn(*members[r]); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

class LocalGroupSizes
    : public ::testing::TestWithParam<std::tuple<const Implementation*, uint32_t>> {
 protected:
  const Implementation& implementation() const { return *std::get<0>(GetParam()); }
  uint32_t size() const { return std::get<1>(GetParam()); }
};

TEST_P(LocalGroupSizes, AllReduceSumIsTheLocalRankOrderSumOnEveryMember) {
  const Members members = implementation().make(size(), absl::Seconds(120));
  ASSERT_EQ(members.size(), size());
  for (uint32_t r = 0; r < size(); ++r) {
    EXPECT_EQ(members[r]->local_rank(), r);
    EXPECT_EQ(members[r]->size(), size());
  }
  // Back-to-back collectives of different lengths; 300000 floats cross
  // SocketGroup's chunks.
  const std::vector<size_t> lengths = {0, 1, 2, 7, 300000, 3};
  std::vector<std::vector<std::vector<float>>> results(size());
  const auto status = OnEveryMember(members, [&](LocalGroup& g) {
    for (uint32_t round = 0; round < lengths.size(); ++round) {
      std::vector<float> data = Input(g.local_rank(), lengths[round], round);
      absl::Status s = g.AllReduceSum(absl::MakeSpan(data));
      if (!s.ok()) return s;
      results[g.local_rank()].push_back(std::move(data));
    }
    return absl::OkStatus();
  });
  for (uint32_t r = 0; r < size(); ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (uint32_t round = 0; round < lengths.size(); ++round) {
    const std::vector<float> expected = OrderedSum(size(), lengths[round], round);
    for (uint32_t r = 0; r < size(); ++r) {
      EXPECT_TRUE(SameBits(results[r][round], expected))
          << "local rank " << r << ", round " << round << " (" << lengths[round] << " floats)";
    }
  }
}

TEST_P(LocalGroupSizes, BroadcastCopiesTheRootBitForBit) {
  const Members members = implementation().make(size(), absl::Seconds(120));
  ASSERT_EQ(members.size(), size());
  const size_t n = 37;
  std::vector<std::vector<std::vector<float>>> results(size());
  const auto status = OnEveryMember(members, [&](LocalGroup& g) {
    for (uint32_t root = 0; root < size(); ++root) {
      std::vector<float> data = Input(g.local_rank(), n, root);
      absl::Status s = g.Broadcast(root, absl::MakeSpan(data));
      if (!s.ok()) return s;
      results[g.local_rank()].push_back(std::move(data));
      std::vector<float> empty;
      s = g.Broadcast(root, absl::MakeSpan(empty));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (uint32_t r = 0; r < size(); ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (uint32_t root = 0; root < size(); ++root) {
    for (uint32_t r = 0; r < size(); ++r) {
      EXPECT_TRUE(SameBits(results[r][root], Input(root, n, root)))
          << "local rank " << r << ", root " << root;
    }
  }
}

std::string SizeName(
    const ::testing::TestParamInfo<std::tuple<const Implementation*, uint32_t>>& info) {
  return absl::StrCat(std::get<0>(info.param)->name, "_", std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalGroupSizes,
                         ::testing::Combine(::testing::Values(&kImplementations[0],
                                                              &kImplementations[1]),
                                            ::testing::Values(1u, 2u, 3u, 5u)),
                         SizeName);

class LocalGroupTest : public ::testing::TestWithParam<const Implementation*> {};

TEST_P(LocalGroupTest, MissingMemberTimesOutNamingItThenTheGroupIsBroken) {
  // Each member's deadline runs from its own call: 2 s leaves rank 2's
  // thread time to start on a busy machine, where 200 ms did not always.
  const Members members = GetParam()->make(4, absl::Seconds(2));
  ASSERT_EQ(members.size(), 4u);
  // Local ranks 1 and 3 do not join this collective.
  std::vector<absl::Status> status(2);
  std::thread t0([&] {
    std::vector<float> data(5, 1.0f);
    status[0] = members[0]->AllReduceSum(absl::MakeSpan(data));
  });
  std::thread t2([&] {
    std::vector<float> data(5, 1.0f);
    status[1] = members[2]->AllReduceSum(absl::MakeSpan(data));
  });
  t0.join();
  t2.join();
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("local rank(s) 1, 3 did not join"));
  }
  // The latecomer and every later collective fail at once, saying why.
  std::vector<float> data(5, 1.0f);
  const absl::Status late = members[1]->AllReduceSum(absl::MakeSpan(data));
  EXPECT_EQ(late.code(), GetParam()->latecomer) << late;
  EXPECT_THAT(late.message(), HasSubstr("did not join"));
  for (uint32_t r : {0u, 2u}) {
    const absl::Status again = members[r]->Broadcast(0, absl::MakeSpan(data));
    EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
    EXPECT_THAT(again.message(), HasSubstr("did not join"));
  }
}

TEST_P(LocalGroupTest, DisagreeingMembersFailNamingBothCalls) {
  const Members members = GetParam()->make(2, absl::Seconds(30));
  ASSERT_EQ(members.size(), 2u);
  // Local rank 1's data is far longer than a socket's buffer, and nobody
  // reads it: it must learn of the failure rather than wait to send it all.
  const auto status = OnEveryMember(members, [](LocalGroup& g) {
    std::vector<float> data(g.local_rank() == 0 ? 3 : 2000000, 1.0f);
    return g.AllReduceSum(absl::MakeSpan(data));
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("AllReduceSum of 3 floats"));
    EXPECT_THAT(s.message(), HasSubstr("AllReduceSum of 2000000 floats"));
  }
}

TEST_P(LocalGroupTest, BadRootIsRefusedWithoutBreakingTheGroup) {
  const Members members = GetParam()->make(2, absl::Seconds(30));
  ASSERT_EQ(members.size(), 2u);
  std::vector<float> data(2, 1.0f);
  const absl::Status bad = members[1]->Broadcast(2, absl::MakeSpan(data));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("root 2"));
  const auto status = OnEveryMember(members, [](LocalGroup& g) {
    std::vector<float> v(2, 1.0f);
    return g.AllReduceSum(absl::MakeSpan(v));
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Implementations, LocalGroupTest,
                         ::testing::Values(&kImplementations[0], &kImplementations[1]),
                         [](const ::testing::TestParamInfo<const Implementation*>& info) {
                           return info.param->name;
                         });

}  // namespace
}  // namespace cserps
