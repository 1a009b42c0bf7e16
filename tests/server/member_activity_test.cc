// The members-alive rule (server/member_activity.h) with explicit times:
// silence of round_timeout_s or more ends liveness, a call in progress
// keeps a rank alive however long it waits, and its answer restarts the
// silence.
#include "server/member_activity.h"

#include "gtest/gtest.h"

namespace cserps {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr uint32_t kMaxCalls = 3;
const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(MemberActivityTest, NobodyIsAliveBeforeBeingHeard) {
  MemberActivity activity(3, kTimeout, kMaxCalls);
  EXPECT_EQ(activity.Alive(kT0), 0u);
}

TEST(MemberActivityTest, SilenceOfTheTimeoutEndsLiveness) {
  MemberActivity activity(3, kTimeout, kMaxCalls);
  activity.Heard(0, kT0);
  EXPECT_EQ(activity.Alive(kT0), 1u);
  activity.Heard(2, kT0 + absl::Seconds(4));
  EXPECT_EQ(activity.Alive(kT0 + absl::Seconds(4)), 2u);
  // Rank 0 has been silent for just under the timeout, then exactly it.
  EXPECT_EQ(activity.Alive(kT0 + kTimeout - absl::Milliseconds(1)), 2u);
  EXPECT_EQ(activity.Alive(kT0 + kTimeout), 1u);
  EXPECT_EQ(activity.Alive(kT0 + absl::Seconds(4) + kTimeout), 0u);
  // A silent rank that calls again is alive again.
  activity.Heard(0, kT0 + absl::Seconds(30));
  EXPECT_EQ(activity.Alive(kT0 + absl::Seconds(30)), 1u);
}

TEST(MemberActivityTest, AnOlderReportDoesNotRewindTheLastCall) {
  MemberActivity activity(1, kTimeout, kMaxCalls);
  activity.Heard(0, kT0 + absl::Seconds(8));
  activity.Heard(0, kT0);  // reported late by another thread
  EXPECT_EQ(activity.Alive(kT0 + absl::Seconds(17)), 1u);
}

TEST(MemberActivityTest, ACallInProgressKeepsItsRankAlive) {
  MemberActivity activity(2, kTimeout, kMaxCalls);
  activity.Heard(1, kT0);
  ASSERT_TRUE(activity.CallStarted(0, kT0).ok());
  // Parked far beyond the timeout: waiting on the others is not silence.
  EXPECT_EQ(activity.Alive(kT0 + 5 * kTimeout), 1u);
  activity.CallEnded(0, kT0 + 5 * kTimeout);
  // Its silence starts at the answer.
  EXPECT_EQ(activity.Alive(kT0 + 6 * kTimeout - absl::Seconds(1)), 1u);
  EXPECT_EQ(activity.Alive(kT0 + 6 * kTimeout), 0u);
}

TEST(MemberActivityTest, EveryCallInProgressMustEndBeforeSilenceCounts) {
  MemberActivity activity(1, kTimeout, kMaxCalls);
  ASSERT_TRUE(activity.CallStarted(0, kT0).ok());
  ASSERT_TRUE(activity.CallStarted(0, kT0).ok());
  activity.CallEnded(0, kT0);
  EXPECT_EQ(activity.Alive(kT0 + 3 * kTimeout), 1u);
  activity.CallEnded(0, kT0);
  EXPECT_EQ(activity.Alive(kT0 + 3 * kTimeout), 0u);
}

TEST(MemberActivityTest, ARankMayKeepOnlySoManyCallsWaiting) {
  MemberActivity activity(2, kTimeout, kMaxCalls);
  for (uint32_t i = 0; i < kMaxCalls; ++i) ASSERT_TRUE(activity.CallStarted(0, kT0).ok());
  const absl::Status full = activity.CallStarted(0, kT0 + absl::Seconds(1));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("rank 0 already has 3 calls waiting"), absl::string_view::npos)
      << full;
  EXPECT_TRUE(activity.CallStarted(1, kT0).ok()) << "the bound is per rank";
  activity.CallEnded(0, kT0 + absl::Seconds(2));
  EXPECT_TRUE(activity.CallStarted(0, kT0 + absl::Seconds(2)).ok()) << "an answer frees a place";
}

TEST(MemberActivityTest, RanksOutOfRangeAreIgnored) {
  MemberActivity activity(2, kTimeout, kMaxCalls);
  activity.Heard(2, kT0);
  EXPECT_TRUE(activity.CallStarted(7, kT0).ok());
  activity.CallEnded(7, kT0);
  EXPECT_EQ(activity.Alive(kT0), 0u);
}

}  // namespace
}  // namespace cserps
