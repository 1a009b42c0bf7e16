#include "worker/data/partition.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace cserps {
namespace {

std::vector<Range> AllRanges(size_t n, const std::vector<uint32_t>& b) {
  std::vector<Range> ranges;
  for (size_t r = 0; r < b.size(); ++r) ranges.push_back(RankRange(n, b, r));
  return ranges;
}

// Ranges are contiguous, in rank order, disjoint, cover [0, n), and each
// size is within one example of n * b_r / sum(b).
void ExpectProportionalCover(size_t n, const std::vector<uint32_t>& b) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " ranks=" << b.size());
  unsigned __int128 total = 0;
  for (uint32_t x : b) total += x;
  const std::vector<Range> ranges = AllRanges(n, b);
  size_t expected_begin = 0;
  for (size_t r = 0; r < b.size(); ++r) {
    EXPECT_EQ(ranges[r].begin, expected_begin) << "rank " << r;
    ASSERT_GE(ranges[r].end, ranges[r].begin) << "rank " << r;
    expected_begin = ranges[r].end;
    // |size * total - n * b_r| < total, in exact integer arithmetic.
    const unsigned __int128 scaled =
        static_cast<unsigned __int128>(ranges[r].size()) * total;
    const unsigned __int128 exact = static_cast<unsigned __int128>(n) * b[r];
    const unsigned __int128 diff =
        scaled > exact ? scaled - exact : exact - scaled;
    EXPECT_TRUE(diff < total) << "rank " << r << " size " << ranges[r].size();
  }
  EXPECT_EQ(expected_begin, n);
}

TEST(RankRangeTest, CoversDisjointlyAndProportionally) {
  ExpectProportionalCover(60000, {32});
  ExpectProportionalCover(60000, {32, 32, 32, 32});
  ExpectProportionalCover(60000, {16, 32, 64, 128, 7});
  ExpectProportionalCover(10, {1, 1, 1});
  ExpectProportionalCover(3, {5, 5, 5, 5, 5, 5, 5});
  ExpectProportionalCover(0, {8, 8});
  ExpectProportionalCover(59999, {100, 1, 1000, 33});
}

TEST(RankRangeTest, NoOverflowOnHugeInputs) {
  ExpectProportionalCover(size_t{1} << 62, {0xffffffffu, 1, 0x80000000u});
}

TEST(RankRangeTest, LeftoverGoesToLargestRemainders) {
  // 10 * 1/3 each: floors 3, 3, 3; equal remainders, so rank 0 gets the one
  // left over.
  std::vector<Range> r = AllRanges(10, {1, 1, 1});
  EXPECT_EQ(r[0].size(), 4u);
  EXPECT_EQ(r[1].size(), 3u);
  EXPECT_EQ(r[2].size(), 3u);
  // 10 * 1/3 = 3.33 and 10 * 2/3 = 6.67: rank 1 has the larger remainder.
  r = AllRanges(10, {1, 2});
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, 3u);
  EXPECT_EQ(r[1].begin, 3u);
  EXPECT_EQ(r[1].end, 10u);
  // 7 * {0.1, 0.2, 0.3, 0.4} = 0.7, 1.4, 2.1, 2.8: floors 0,1,2,2 leave 2,
  // which go to ranks 3 (.8) and 0 (.7).
  r = AllRanges(7, {1, 2, 3, 4});
  EXPECT_EQ(r[0].size(), 1u);
  EXPECT_EQ(r[1].size(), 1u);
  EXPECT_EQ(r[2].size(), 2u);
  EXPECT_EQ(r[3].size(), 3u);
}

TEST(StepsPerEpochTest, MinimumOverRanks) {
  // Equal shares 20000 and 40000: 625 steps each.
  EXPECT_EQ(StepsPerEpoch(60000, {32, 64}), 625u);
  // 100 / 3 ranks of batch 10: sizes 34, 33, 33 -> 3 steps each.
  EXPECT_EQ(StepsPerEpoch(100, {10, 10, 10}), 3u);
  // One rank: floor(95 / 10).
  EXPECT_EQ(StepsPerEpoch(95, {10}), 9u);
  // Too few examples for a batch: zero steps.
  EXPECT_EQ(StepsPerEpoch(5, {4, 4}), 0u);
}

TEST(StepsPerEpochTest, EqualsTheDefinitionOverRankRanges) {
  const std::vector<std::vector<uint32_t>> cases = {
      {32}, {16, 32, 64}, {7, 7, 7, 7, 7}, {1, 100}, {50, 3, 9, 27}};
  for (size_t n : {0, 1, 99, 1000, 60000, 60001}) {
    for (const std::vector<uint32_t>& b : cases) {
      size_t expected = SIZE_MAX;
      for (size_t r = 0; r < b.size(); ++r) {
        const size_t steps = RankRange(n, b, r).size() / b[r];
        if (steps < expected) expected = steps;
      }
      EXPECT_EQ(StepsPerEpoch(n, b), expected) << "n=" << n;
      // Every rank really can do that many full batches.
      for (size_t r = 0; r < b.size(); ++r) {
        EXPECT_GE(RankRange(n, b, r).size(), expected * b[r]);
      }
    }
  }
}

}  // namespace
}  // namespace cserps
