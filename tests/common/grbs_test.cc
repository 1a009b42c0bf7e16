#include "common/grbs.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/block_layout.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

// The vectors come from tools/grbs/grbs_vectors.py, an independent Python
// implementation of the specification in docs/protocol.md.
TEST(GrbsTest, MatchesCheckedInVectors) {
  std::ifstream in(std::string(CSERPS_SOURCE_DIR) + "/tests/common/grbs_vectors.txt");
  ASSERT_TRUE(in.is_open());
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    uint64_t seed, step, num_blocks;
    int stream;
    uint32_t ratio;
    std::string colon;
    fields >> seed >> stream >> step >> ratio >> num_blocks >> colon;
    ASSERT_EQ(colon, ":") << line;
    std::vector<uint64_t> expected;
    for (uint64_t b; fields >> b;) expected.push_back(b);
    EXPECT_EQ(SelectBlocks(seed, stream, step, ratio, num_blocks), expected) << line;
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

TEST(GrbsTest, CountFollowsRatio) {
  EXPECT_EQ(SelectedBlockCount(100, 1), 100u);
  EXPECT_EQ(SelectedBlockCount(100, 4), 25u);
  EXPECT_EQ(SelectedBlockCount(10, 4), 3u);    // 2.5 rounds up
  EXPECT_EQ(SelectedBlockCount(9, 4), 2u);     // 2.25 rounds down
  EXPECT_EQ(SelectedBlockCount(7, 1000), 1u);  // R > num_blocks: one block
  EXPECT_EQ(SelectedBlockCount(0, 4), 0u);
}

TEST(GrbsTest, SortedDistinctAndInRange) {
  for (uint64_t step = 0; step < 200; ++step) {
    const std::vector<uint64_t> blocks = SelectBlocks(3, 1, step, 5, 97);
    ASSERT_EQ(blocks.size(), SelectedBlockCount(97, 5));
    for (size_t i = 0; i < blocks.size(); ++i) {
      ASSERT_LT(blocks[i], 97u);
      if (i > 0) {
        ASSERT_LT(blocks[i - 1], blocks[i]);
      }
    }
  }
}

TEST(GrbsTest, RatioOneSelectsEveryBlock) {
  const std::vector<uint64_t> blocks = SelectBlocks(11, 2, 5, 1, 13);
  ASSERT_EQ(blocks.size(), 13u);
  for (uint64_t b = 0; b < 13; ++b) EXPECT_EQ(blocks[b], b);
}

TEST(GrbsTest, KeyedBySeedStreamAndStep) {
  const auto base = SelectBlocks(1, 1, 10, 8, 1000);
  EXPECT_EQ(base, SelectBlocks(1, 1, 10, 8, 1000));
  EXPECT_NE(base, SelectBlocks(2, 1, 10, 8, 1000));
  EXPECT_NE(base, SelectBlocks(1, 2, 10, 8, 1000));
  EXPECT_NE(base, SelectBlocks(1, 1, 11, 8, 1000));
}

// Each block is chosen in a fraction m/N of the steps: over T steps its count
// is Binomial(T, m/N); every count must lie within 5 standard deviations.
TEST(GrbsTest, EveryBlockChosenWithFrequencyOneOverR) {
  constexpr uint64_t kBlocks = 64;
  constexpr uint32_t kRatio = 8;
  constexpr int kSteps = 20000;
  std::vector<int> count(kBlocks, 0);
  for (int t = 0; t < kSteps; ++t) {
    for (uint64_t b : SelectBlocks(2024, 1, t, kRatio, kBlocks)) ++count[b];
  }
  const double p = 1.0 / kRatio;
  const double mean = kSteps * p;
  const double sd = std::sqrt(kSteps * p * (1 - p));
  double chi2 = 0;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    EXPECT_LT(std::abs(count[b] - mean), 5 * sd) << "block " << b;
    chi2 += (count[b] - mean) * (count[b] - mean) / mean;
  }
  // 63 degrees of freedom: the 99.99th percentile is about 117.
  EXPECT_LT(chi2, 117.0);
}

TEST(GrbsTest, LastShortBlockCarriesItsOwnLength) {
  // d = 10 floats in blocks of 4: blocks of 4, 4 and 2 floats.
  const BlockLayout layout(10, 4, 1);
  const ShardPayload payload = ShardPayload::SelectedBlocks(layout, 0, std::vector<uint64_t>{0, 2});
  EXPECT_EQ(payload.size(), 6u);
  ASSERT_EQ(payload.segments().size(), 2u);
  EXPECT_EQ(payload.segments()[1].model_offset, 8u);
  EXPECT_EQ(payload.segments()[1].length, 2u);
}

}  // namespace
}  // namespace cserps
