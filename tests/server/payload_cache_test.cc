// PayloadCache gives, for every round, the payload the GRBS selection
// defines, whether drawn now or remembered, and after older rounds fell out.
#include "server/payload_cache.h"

#include <cstdint>

#include "common/block_layout.h"
#include "common/grbs.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

void ExpectSamePayload(const ShardPayload& got, const ShardPayload& want) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.segments().size(), want.segments().size());
  for (size_t i = 0; i < want.segments().size(); ++i) {
    EXPECT_EQ(got.segments()[i].model_offset, want.segments()[i].model_offset) << i;
    EXPECT_EQ(got.segments()[i].length, want.segments()[i].length) << i;
  }
}

TEST(PayloadCacheTest, EveryRoundGetsItsOwnSelectionWhetherDrawnOrRemembered) {
  constexpr uint64_t kSeed = 11;
  const BlockLayout layout(100000, 64, 3);
  PayloadCache cache(kSeed, layout, 1);
  // Twice over more rounds than the cache keeps, both streams, two ratios:
  // the second pass finds the oldest rounds gone and the newest kept.
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t step = 0; step < 40; ++step) {
      for (int stream : {1, 2}) {
        for (uint32_t ratio : {4u, 32u}) {
          const ShardPayload want = ShardPayload::SelectedBlocks(
              layout, 1, SelectBlocks(kSeed, stream, step, ratio, layout.num_blocks()));
          ExpectSamePayload(*cache.Get(stream, step, ratio), want);
          ExpectSamePayload(*cache.Get(stream, step, ratio), want);
        }
      }
    }
  }
  ExpectSamePayload(*cache.Get(1, 3, 1), ShardPayload::AllBlocks(layout, 1));
}

}  // namespace
}  // namespace cserps
