// The step window of PushPull rounds (server/step_window.h) against the
// rule of docs/protocol.md 7.8, figured here by hand.
#include "server/step_window.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace cserps {
namespace {

v1::JobConfig Job(const std::string& algorithm, uint32_t ratio, uint32_t period) {
  v1::JobConfig config;
  config.mutable_cluster()->set_max_step_lag(8);
  config.mutable_algorithm()->set_name(algorithm);
  config.mutable_algorithm()->set_ratio(ratio);
  config.mutable_algorithm()->set_period(period);
  return config;
}

TEST(StepWindowTest, DenseRoundsReachEveryShardEveryStep) {
  const BlockLayout layout(8 * 1024, 1024, 2);
  EXPECT_EQ(PushPullStepWindow(Job("ssgd", 0, 0), layout, 0), 8u);
  // Sync periods of 4 steps.
  EXPECT_EQ(PushPullStepWindow(Job("local-sgd", 0, 4), layout, 1), 32u);
}

TEST(StepWindowTest, GrbsRoundsWidenItByTheStepsThatMayMissTheShard) {
  // 8 blocks, 4 a shard; ratio 8 selects 1 a step, which misses a shard
  // with probability 1/2: 2^-40 < 10^-12 < 2^-39, so 40 steps more.
  const BlockLayout two(8 * 1024, 1024, 2);
  EXPECT_EQ(PushPullStepWindow(Job("ef-sgd", 8, 0), two, 0), 48u);
  // With periods of 4 steps, in sync periods.
  EXPECT_EQ(PushPullStepWindow(Job("qsparse-local-sgd", 8, 4), two, 1), 4u * 48u);
  // One shard holds every block: every round reaches it.
  const BlockLayout one(8 * 1024, 1024, 1);
  EXPECT_EQ(PushPullStepWindow(Job("ef-sgd", 8, 0), one, 0), 8u);
  // Ratio 4 selects 2 of the 8: missed with probability at most 1/4, so
  // 20 steps more (4^-20 < 10^-12 < 4^-19).
  EXPECT_EQ(PushPullStepWindow(Job("ef-sgd", 4, 0), two, 0), 28u);
}

TEST(StepWindowTest, OtherExchangesLeaveItUnlimited) {
  const BlockLayout layout(8 * 1024, 1024, 2);
  EXPECT_EQ(PushPullStepWindow(Job("gtopk-ssgd", 0, 0), layout, 0),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(PushPullStepWindow(Job("async-sgd", 0, 0), layout, 0),
            std::numeric_limits<uint64_t>::max());
}

}  // namespace
}  // namespace cserps
