#include "worker/group/thread_group.h"

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/group/group_inputs.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

// Runs fn(local_rank) on one thread per member and joins them.
std::vector<absl::Status> OnEveryMember(
    const std::vector<std::unique_ptr<ThreadGroup>>& members,
    const std::function<absl::Status(ThreadGroup&)>& fn) {
  std::vector<absl::Status> status(members.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < members.size(); ++r) {
    threads.emplace_back([&, r] { status[r] = fn(*members[r]); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

class ThreadGroupSizes : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ThreadGroupSizes, AllReduceSumIsTheLocalRankOrderSumOnEveryMember) {
  const uint32_t size = GetParam();
  auto members = ThreadGroup::Create(size);
  ASSERT_EQ(members.size(), size);
  for (uint32_t r = 0; r < size; ++r) {
    EXPECT_EQ(members[r]->local_rank(), r);
    EXPECT_EQ(members[r]->size(), size);
  }
  // Back-to-back collectives of different lengths reuse the rendezvous.
  const std::vector<size_t> lengths = {0, 1, 2, 7, 1001, 3};
  std::vector<std::vector<std::vector<float>>> results(size);
  const auto status = OnEveryMember(members, [&](ThreadGroup& g) {
    for (uint32_t round = 0; round < lengths.size(); ++round) {
      std::vector<float> data = Input(g.local_rank(), lengths[round], round);
      absl::Status s = g.AllReduceSum(absl::MakeSpan(data));
      if (!s.ok()) return s;
      results[g.local_rank()].push_back(std::move(data));
    }
    return absl::OkStatus();
  });
  for (uint32_t r = 0; r < size; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (uint32_t round = 0; round < lengths.size(); ++round) {
    const size_t n = lengths[round];
    const std::vector<float> expected = OrderedSum(size, n, round);
    for (uint32_t r = 0; r < size; ++r) {
      EXPECT_TRUE(SameBits(results[r][round], expected))
          << "local rank " << r << ", round " << round << " (" << n << " floats)";
    }
  }
}

TEST_P(ThreadGroupSizes, BroadcastCopiesTheRootBitForBit) {
  const uint32_t size = GetParam();
  auto members = ThreadGroup::Create(size);
  const size_t n = 37;
  std::vector<std::vector<std::vector<float>>> results(size);
  const auto status = OnEveryMember(members, [&](ThreadGroup& g) {
    for (uint32_t root = 0; root < size; ++root) {
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
  for (uint32_t r = 0; r < size; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (uint32_t root = 0; root < size; ++root) {
    const std::vector<float> expected = Input(root, n, root);
    for (uint32_t r = 0; r < size; ++r) {
      EXPECT_TRUE(SameBits(results[r][root], expected)) << "local rank " << r << ", root " << root;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadGroupSizes, ::testing::Values(1u, 2u, 3u, 5u));

TEST(ThreadGroupTest, MissingPeerTimesOutNamingItThenTheGroupIsBroken) {
  auto members = ThreadGroup::Create(4, {.timeout = absl::Milliseconds(200)});
  // Local ranks 1 and 3 never join.
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
  // The latecomer and every later collective fail at once.
  std::vector<float> data(5, 1.0f);
  const absl::Status late = members[1]->AllReduceSum(absl::MakeSpan(data));
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(late.message(), HasSubstr("did not join"));
  EXPECT_EQ(members[0]->Broadcast(0, absl::MakeSpan(data)).code(),
            absl::StatusCode::kAborted);
}

TEST(ThreadGroupTest, DisagreeingMembersFailNamingBothCalls) {
  auto members = ThreadGroup::Create(2, {.timeout = absl::Seconds(30)});
  const auto status = OnEveryMember(members, [](ThreadGroup& g) {
    std::vector<float> data(g.local_rank() == 0 ? 3 : 4, 1.0f);
    return g.AllReduceSum(absl::MakeSpan(data));
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("AllReduceSum of 3 floats"));
    EXPECT_THAT(s.message(), HasSubstr("AllReduceSum of 4 floats"));
  }
}

TEST(ThreadGroupTest, BadRootIsRefusedWithoutBreakingTheGroup) {
  auto members = ThreadGroup::Create(2, {.timeout = absl::Seconds(30)});
  std::vector<float> data(2, 1.0f);
  const absl::Status bad = members[1]->Broadcast(2, absl::MakeSpan(data));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("root 2"));
  const auto status = OnEveryMember(members, [](ThreadGroup& g) {
    std::vector<float> v(2, 1.0f);
    return g.AllReduceSum(absl::MakeSpan(v));
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cserps
