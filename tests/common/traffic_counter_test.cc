#include "common/traffic_counter.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(TrafficCounterTest, StartsAtZero) {
  const TrafficCounts c = TrafficCounter().Snapshot();
  EXPECT_EQ(c.request_bytes, 0u);
  EXPECT_EQ(c.reply_bytes, 0u);
  EXPECT_EQ(c.request_floats, 0u);
}

TEST(TrafficCounterTest, CountsRequestsRepliesAndFloatsApart) {
  TrafficCounter counter;
  counter.AddRequest(100, 20);
  counter.AddRequest(7);  // a request without payload floats
  counter.AddReply(40);
  counter.AddReply(2);
  const TrafficCounts c = counter.Snapshot();
  EXPECT_EQ(c.request_bytes, 107u);
  EXPECT_EQ(c.reply_bytes, 42u);
  EXPECT_EQ(c.request_floats, 20u);
}

TEST(TrafficCounterTest, ConcurrentAddsAreAllCounted) {
  constexpr int kThreads = 4;
  constexpr uint64_t kCalls = 10000;
  TrafficCounter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&counter] {
      for (uint64_t i = 0; i < kCalls; ++i) {
        counter.AddRequest(3, 1);
        counter.AddReply(5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const TrafficCounts c = counter.Snapshot();
  EXPECT_EQ(c.request_bytes, 3 * kThreads * kCalls);
  EXPECT_EQ(c.reply_bytes, 5 * kThreads * kCalls);
  EXPECT_EQ(c.request_floats, kThreads * kCalls);
}

}  // namespace
}  // namespace cserps
