// The bounded-staleness rule and the liveness rule of asynchronous SGD, on
// the gate alone (no gRPC); the service tests cover it over the wire.
#include "server/async_staleness_gate.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The outcome of one push: whether it was released and with what status.
struct Outcome {
  bool released = false;
  absl::Status status;
};

class GateTest : public ::testing::Test {
 protected:
  void Make(uint32_t world, uint64_t staleness) {
    gate_ = std::make_unique<StalenessGate>(StalenessGate::Options{
        .world_size = world, .staleness = staleness, .silence_timeout = kTimeout});
  }

  std::shared_ptr<Outcome> Push(uint32_t rank, uint64_t step, absl::Time now) {
    auto outcome = std::make_shared<Outcome>();
    gate_->Arrive(rank, step, now, [outcome](absl::Status s) {
      EXPECT_FALSE(outcome->released) << "released twice";
      outcome->released = true;
      outcome->status = std::move(s);
    });
    return outcome;
  }

  static constexpr absl::Duration kTimeout = absl::Seconds(10);
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<StalenessGate> gate_;
};

TEST_F(GateTest, ZeroStalenessAdmitsEveryPushAtOnce) {
  Make(3, 0);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  EXPECT_TRUE(Push(0, 100, t0_)->released);
  EXPECT_EQ(gate_->parked(), 0u);
}

TEST_F(GateTest, PushMoreThanSAheadOfTheSlowestWaitsForIt) {
  Make(3, 2);
  // Slowest m = -1 (nobody else heard from): steps 0 and 1 are within s = 2.
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  EXPECT_TRUE(Push(0, 1, t0_)->released);
  auto fast = Push(0, 2, t0_);
  EXPECT_FALSE(fast->released);
  EXPECT_EQ(gate_->parked(), 1u);
  // Rank 1 advancing is not enough: rank 2 is still the slowest.
  EXPECT_TRUE(Push(1, 0, t0_)->released);
  EXPECT_FALSE(fast->released);
  EXPECT_TRUE(Push(2, 0, t0_)->released);
  EXPECT_TRUE(fast->released);
  EXPECT_TRUE(fast->status.ok()) << fast->status;
  EXPECT_EQ(gate_->parked(), 0u);
  // Now m = 0: step 2 = m + s passes, step 3 waits.
  EXPECT_FALSE(Push(0, 3, t0_)->released);
}

TEST_F(GateTest, PushesOfEveryRankAtTheSameStepNeverDeadlock) {
  Make(2, 1);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  auto a = Push(0, 1, t0_);
  EXPECT_FALSE(a->released);
  // Rank 1's step 0 releases rank 0's step 1, and rank 1's own step 1 is
  // admitted since rank 0 has reached step 1.
  EXPECT_TRUE(Push(1, 0, t0_)->released);
  EXPECT_TRUE(a->released);
  EXPECT_TRUE(Push(1, 1, t0_)->released);
}

TEST_F(GateTest, SilentRankIsDeclaredDeadOnlyAfterTheTimeout) {
  Make(2, 1);
  EXPECT_TRUE(Push(1, 0, t0_)->released);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  EXPECT_TRUE(Push(0, 1, t0_)->released);
  auto fast = Push(0, 2, t0_ + absl::Seconds(3));
  EXPECT_FALSE(fast->released);

  EXPECT_EQ(gate_->ExpireSilentRanks(t0_ + kTimeout - absl::Seconds(1)), 0);
  EXPECT_FALSE(fast->released);
  // Rank 0 has a parked push: waiting is not silence, even past its timeout.
  EXPECT_EQ(gate_->ExpireSilentRanks(t0_ + kTimeout), 1);
  EXPECT_THAT(gate_->DeadRanks(), ElementsAre(1u));
  EXPECT_TRUE(fast->released);
  EXPECT_TRUE(fast->status.ok()) << fast->status;
  // The job goes on without rank 1.
  EXPECT_TRUE(Push(0, 3, t0_ + kTimeout)->released);
  EXPECT_TRUE(Push(0, 4, t0_ + kTimeout)->released);

  // Rank 1 comes back at step 1 and counts from rank 0's step 4: rank 0
  // goes on to 4 + s, then waits on rank 1's next step, not on its step 4.
  EXPECT_TRUE(Push(1, 1, t0_ + kTimeout)->released);
  EXPECT_THAT(gate_->DeadRanks(), ElementsAre());
  EXPECT_TRUE(Push(0, 5, t0_ + kTimeout)->released);
  auto again = Push(0, 6, t0_ + kTimeout);
  EXPECT_FALSE(again->released);
  EXPECT_TRUE(Push(1, 2, t0_ + kTimeout)->released);
  EXPECT_TRUE(again->released);
}

// A rank that starts long after the others, or stalls past its timeout,
// does not stop them for as long as they ran without it: back, it holds
// them back one of its steps at a time.
TEST_F(GateTest, ARankBackFromTheDeadHoldsTheOthersBackOneStepAtATime) {
  Make(2, 2);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  EXPECT_TRUE(Push(0, 1, t0_)->released);
  auto first = Push(0, 2, t0_);
  EXPECT_FALSE(first->released);
  EXPECT_EQ(gate_->ExpireSilentRanks(t0_ + kTimeout), 1);
  EXPECT_TRUE(first->released);
  for (uint64_t step = 3; step <= 100; ++step) {
    ASSERT_TRUE(Push(0, step, t0_ + kTimeout)->released) << step;
  }
  const absl::Time back = t0_ + 2 * kTimeout;
  EXPECT_TRUE(Push(1, 0, back)->released);
  // Rank 0 may be s = 2 steps ahead of rank 1's place (100), no further.
  EXPECT_TRUE(Push(0, 101, back)->released);
  EXPECT_TRUE(Push(0, 102, back)->released);
  auto parked = Push(0, 103, back);
  EXPECT_FALSE(parked->released);
  EXPECT_TRUE(Push(1, 1, back)->released);
  EXPECT_TRUE(parked->released);
  // Dead again, rank 0 having gone on to 104, and back again at its step
  // 2: it counts from 104 now.
  auto waits = Push(0, 104, back + kTimeout / 2);
  EXPECT_FALSE(waits->released);
  EXPECT_EQ(gate_->ExpireSilentRanks(back + kTimeout), 1);
  EXPECT_TRUE(waits->released);
  EXPECT_TRUE(Push(1, 2, back + 2 * kTimeout)->released);
  EXPECT_TRUE(Push(0, 106, back + 2 * kTimeout)->released);
  EXPECT_FALSE(Push(0, 107, back + 2 * kTimeout)->released);
}

TEST_F(GateTest, RankNeverHeardFromCountsFromTheFirstPush) {
  Make(2, 1);
  const absl::Time first = t0_ + absl::Hours(1);
  EXPECT_EQ(gate_->ExpireSilentRanks(first), 0) << "nothing to expire before any push";
  EXPECT_TRUE(Push(0, 0, first)->released);
  auto fast = Push(0, 1, first);
  EXPECT_FALSE(fast->released);
  EXPECT_EQ(gate_->ExpireSilentRanks(first + kTimeout - absl::Seconds(1)), 0);
  EXPECT_FALSE(fast->released);
  EXPECT_EQ(gate_->ExpireSilentRanks(first + kTimeout), 1);
  EXPECT_TRUE(fast->released);
}

TEST_F(GateTest, ReleasedRankIsNotSilentFromItsArrival) {
  Make(2, 1);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  auto fast = Push(0, 1, t0_);
  // Rank 1 releases it late; rank 0's silence starts at the release.
  EXPECT_TRUE(Push(1, 0, t0_ + absl::Seconds(30))->released);
  EXPECT_TRUE(fast->released);
  EXPECT_EQ(gate_->ExpireSilentRanks(t0_ + absl::Seconds(35)), 0);
  EXPECT_THAT(gate_->DeadRanks(), ElementsAre());
}

TEST_F(GateTest, FailAllAnswersParkedAndLaterPushes) {
  Make(2, 1);
  EXPECT_TRUE(Push(0, 0, t0_)->released);
  auto parked = Push(0, 1, t0_);
  gate_->FailAll(absl::UnavailableError("shard 0 is shutting down"));
  ASSERT_TRUE(parked->released);
  EXPECT_EQ(parked->status.code(), absl::StatusCode::kUnavailable);
  auto later = Push(1, 0, t0_);
  ASSERT_TRUE(later->released);
  EXPECT_THAT(later->status.message(), HasSubstr("shutting down"));
  EXPECT_EQ(gate_->parked(), 0u);
}

TEST_F(GateTest, WaitForParkedSeesAParkedPush) {
  Make(2, 1);
  EXPECT_FALSE(gate_->WaitForParked(1, absl::ZeroDuration()));
  Push(0, 5, t0_);
  EXPECT_TRUE(gate_->WaitForParked(1, absl::Seconds(5)));
}

}  // namespace
}  // namespace cserps
