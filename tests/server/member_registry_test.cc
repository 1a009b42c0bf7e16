#include "server/member_registry.h"

#include <algorithm>
#include <cstdint>
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

TEST(MemberRegistryTest, RequestedRankIsGiven) {
  MemberRegistry registry(4);
  EXPECT_EQ(registry.world_size(), 4u);
  EXPECT_EQ(registry.registered(), 0u);
  absl::StatusOr<uint32_t> rank = registry.Register(2, "host:2");
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 2u);
  EXPECT_TRUE(registry.IsRegistered(2));
  EXPECT_FALSE(registry.IsRegistered(0));
  EXPECT_FALSE(registry.IsRegistered(4)) << "out of range is not registered";
  EXPECT_EQ(registry.registered(), 1u);
}

TEST(MemberRegistryTest, NoRequestGetsTheLowestFreeRank) {
  MemberRegistry registry(4);
  ASSERT_EQ(registry.Register(0, "a").value(), 0u);
  ASSERT_EQ(registry.Register(2, "c").value(), 2u);
  EXPECT_EQ(registry.Register(-1, "b").value(), 1u);
  EXPECT_EQ(registry.Register(-1, "d").value(), 3u);
  EXPECT_EQ(registry.registered(), 4u);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_TRUE(registry.IsRegistered(r)) << r;
}

TEST(MemberRegistryTest, SameWorkerGetsItsRankBack) {
  MemberRegistry registry(3);
  ASSERT_EQ(registry.Register(-1, "first").value(), 0u);
  ASSERT_EQ(registry.Register(2, "second").value(), 2u);
  // Retries, with and without the explicit request.
  EXPECT_EQ(registry.Register(-1, "second").value(), 2u);
  EXPECT_EQ(registry.Register(2, "second").value(), 2u);
  EXPECT_EQ(registry.Register(-1, "first").value(), 0u);
  EXPECT_EQ(registry.Register(0, "first").value(), 0u);
  EXPECT_EQ(registry.registered(), 2u) << "a retry must not take another rank";
  EXPECT_FALSE(registry.IsRegistered(1));
}

// A worker id holds one rank: asking for another, even a free one, is an
// error (docs/protocol.md 9), and its rank stays its own.
TEST(MemberRegistryTest, AWorkerCannotTakeASecondRank) {
  MemberRegistry registry(3);
  ASSERT_EQ(registry.Register(0, "first").value(), 0u);
  absl::StatusOr<uint32_t> rank = registry.Register(2, "first");
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(rank.status().message(),
              AllOf(HasSubstr("\"first\" already holds rank 0"), HasSubstr("rank 2")));
  EXPECT_FALSE(registry.IsRegistered(2));
  EXPECT_EQ(registry.registered(), 1u);
  EXPECT_EQ(registry.Register(-1, "first").value(), 0u);
}

TEST(MemberRegistryTest, TakenRankNamesTheHolder) {
  MemberRegistry registry(2);
  ASSERT_TRUE(registry.Register(1, "node-a:17").ok());
  absl::StatusOr<uint32_t> rank = registry.Register(1, "node-b:99");
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(rank.status().message(),
              AllOf(HasSubstr("rank 1"), HasSubstr("node-a:17")));
  EXPECT_EQ(registry.registered(), 1u);
}

TEST(MemberRegistryTest, RankOutOfRange) {
  MemberRegistry registry(3);
  for (int64_t requested : {3, 4, 1000}) {
    absl::StatusOr<uint32_t> rank = registry.Register(requested, "w");
    EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rank.status().message(),
                AllOf(HasSubstr(absl::StrCat(requested)), HasSubstr("3 workers")));
  }
  EXPECT_EQ(registry.registered(), 0u);
}

TEST(MemberRegistryTest, EmptyWorkerIdIsRefused) {
  MemberRegistry registry(2);
  absl::StatusOr<uint32_t> rank = registry.Register(-1, "");
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank.status().message(), HasSubstr("worker_id"));
  EXPECT_EQ(registry.registered(), 0u);
}

TEST(MemberRegistryTest, AllTaken) {
  MemberRegistry registry(2);
  ASSERT_TRUE(registry.Register(-1, "a").ok());
  ASSERT_TRUE(registry.Register(-1, "b").ok());
  absl::StatusOr<uint32_t> rank = registry.Register(-1, "c");
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(rank.status().message(), HasSubstr("2"));
  // A member already in still gets its rank back.
  EXPECT_EQ(registry.Register(-1, "b").value(), 1u);
}

// Elastic: a replacement takes a rank dropped since its holder registered,
// once: the next newcomer waits (UNAVAILABLE) until it is dropped again.
TEST(MemberRegistryTest, AReplacementTakesTheRankOfADroppedHolder) {
  MemberRegistry registry(3);
  std::vector<uint32_t> dropped = {0, 0, 0};
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(registry.Register(-1, id, &dropped).ok());
  const absl::StatusOr<uint32_t> full = registry.Register(-1, "d", &dropped);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(full.status().message(), HasSubstr("all 3 ranks of the job are registered"));
  const absl::StatusOr<uint32_t> held = registry.Register(1, "d", &dropped);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(held.status().message(),
              AllOf(HasSubstr("rank 1 is already registered by worker \"b\""),
                    HasSubstr("once the shard drops it")));

  dropped = {0, 1, 0};
  EXPECT_EQ(registry.Register(-1, "d", &dropped).value(), 1u) << "the dropped rank";
  EXPECT_EQ(registry.Register(-1, "e", &dropped).status().code(),
            absl::StatusCode::kUnavailable)
      << "taken already since its drop";
  EXPECT_EQ(registry.Register(-1, "d", &dropped).value(), 1u) << "a retry";
  EXPECT_EQ(registry.Register(1, "b", &dropped).status().code(), absl::StatusCode::kUnavailable)
      << "the old holder lost it";
  dropped = {0, 2, 0};
  EXPECT_EQ(registry.Register(1, "e", &dropped).value(), 1u) << "dropped again, asked for";
  EXPECT_EQ(registry.Register(-1, "f").status().code(), absl::StatusCode::kResourceExhausted)
      << "not elastic: every rank is taken";
}

TEST(MemberRegistryTest, ConcurrentRegistrationsGetDistinctRanks) {
  constexpr uint32_t kWorld = 16;
  MemberRegistry registry(kWorld);
  std::vector<uint32_t> ranks(kWorld, kWorld);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kWorld; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<uint32_t> r = registry.Register(-1, absl::StrCat("w", i));
      if (r.ok()) ranks[i] = *r;
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<uint32_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t r = 0; r < kWorld; ++r) EXPECT_EQ(sorted[r], r);
  EXPECT_EQ(registry.registered(), kWorld);
}

}  // namespace
}  // namespace cserps
