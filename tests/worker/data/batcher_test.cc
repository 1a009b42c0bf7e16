#include "worker/data/batcher.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "common/prng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

constexpr size_t kDim = 3;

// Example i has features i*10 + j and label i % 10, so every row of a batch
// names the example it came from.
Dataset Numbered(size_t n) {
  Dataset data;
  data.size = n;
  data.dim = kDim;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < kDim; ++j) {
      data.features.push_back(static_cast<float>(i * 10 + j));
    }
    data.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return data;
}

// The example indices of a batch, after checking each row is intact.
std::vector<size_t> Indices(const Batch& batch) {
  std::vector<size_t> out;
  EXPECT_EQ(batch.dim, kDim);
  EXPECT_EQ(batch.features.size(), batch.size * kDim);
  EXPECT_EQ(batch.labels.size(), batch.size);
  for (size_t k = 0; k < batch.size; ++k) {
    const size_t i = static_cast<size_t>(batch.features[k * kDim]) / 10;
    for (size_t j = 0; j < kDim; ++j) {
      EXPECT_EQ(batch.features[k * kDim + j], static_cast<float>(i * 10 + j));
    }
    EXPECT_EQ(batch.labels[k], i % 10);
    out.push_back(i);
  }
  return out;
}

// Every example index served in the current epoch, in order.
std::vector<size_t> EpochOrder(EpochBatcher& batcher) {
  std::vector<size_t> order;
  for (size_t b = 0; b < batcher.batches_per_epoch(); ++b) {
    const std::vector<size_t> ids = Indices(batcher.Get(b));
    order.insert(order.end(), ids.begin(), ids.end());
  }
  return order;
}

TEST(EpochBatcherTest, EpochIsAPermutationOfTheRange) {
  const Dataset data = Numbered(60);
  const Range range{20, 44};  // 24 examples, 4 batches of 6
  EpochBatcher batcher(data, range, 6, /*job_seed=*/7, /*rank=*/1);
  ASSERT_EQ(batcher.batches_per_epoch(), 4u);
  for (uint64_t epoch : {0, 1, 5}) {
    batcher.StartEpoch(epoch);
    std::vector<size_t> order = EpochOrder(batcher);
    ASSERT_EQ(order.size(), 24u);
    std::sort(order.begin(), order.end());
    std::vector<size_t> expected(24);
    std::iota(expected.begin(), expected.end(), size_t{20});
    EXPECT_EQ(order, expected) << "epoch " << epoch;
  }
}

TEST(EpochBatcherTest, OnlyExamplesFromTheRange) {
  const Dataset data = Numbered(40);
  const Range range{5, 18};  // 13 examples: 3 batches of 4, one left out
  EpochBatcher batcher(data, range, 4, 11, 0);
  ASSERT_EQ(batcher.batches_per_epoch(), 3u);
  std::set<size_t> left_out_over_epochs;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    batcher.StartEpoch(epoch);
    const std::vector<size_t> order = EpochOrder(batcher);
    std::set<size_t> distinct(order.begin(), order.end());
    EXPECT_EQ(distinct.size(), 12u) << "no example twice in an epoch";
    for (size_t i : order) {
      EXPECT_GE(i, range.begin);
      EXPECT_LT(i, range.end);
    }
    for (size_t i = range.begin; i < range.end; ++i) {
      if (distinct.count(i) == 0) left_out_over_epochs.insert(i);
    }
  }
  // Reshuffling means the skipped example is not always the same one.
  EXPECT_GT(left_out_over_epochs.size(), 1u);
}

TEST(EpochBatcherTest, SameKeySameOrder) {
  const Dataset data = Numbered(50);
  EpochBatcher a(data, {0, 50}, 5, 1234, 3);
  EpochBatcher b(data, {0, 50}, 5, 1234, 3);
  a.StartEpoch(2);
  b.StartEpoch(2);
  EXPECT_EQ(EpochOrder(a), EpochOrder(b));
}

TEST(EpochBatcherTest, OrderDependsOnlyOnTheEpochNotOnHistory) {
  const Dataset data = Numbered(50);
  EpochBatcher a(data, {0, 50}, 5, 99, 0);
  EpochBatcher b(data, {0, 50}, 5, 99, 0);
  a.StartEpoch(1);
  a.StartEpoch(2);
  a.StartEpoch(3);
  b.StartEpoch(3);
  EXPECT_EQ(EpochOrder(a), EpochOrder(b));
}

TEST(EpochBatcherTest, EpochRankAndSeedChangeTheOrder) {
  const Dataset data = Numbered(50);
  EpochBatcher base(data, {0, 50}, 5, 1234, 3);
  base.StartEpoch(2);
  const std::vector<size_t> order = EpochOrder(base);

  std::vector<size_t> identity(50);
  std::iota(identity.begin(), identity.end(), size_t{0});
  EXPECT_NE(order, identity);

  base.StartEpoch(3);
  EXPECT_NE(EpochOrder(base), order) << "different epoch";

  EpochBatcher other_rank(data, {0, 50}, 5, 1234, 4);
  other_rank.StartEpoch(2);
  EXPECT_NE(EpochOrder(other_rank), order) << "different rank";

  EpochBatcher other_seed(data, {0, 50}, 5, 1235, 3);
  other_seed.StartEpoch(2);
  EXPECT_NE(EpochOrder(other_seed), order) << "different seed";
}

TEST(EpochBatcherTest, MatchesTheDocumentedFisherYates) {
  // The order must be reproducible by any implementation that follows the
  // header's contract, independently of this C++ library.
  const Dataset data = Numbered(30);
  const Range range{4, 28};
  const uint64_t seed = 0x0123456789abcdefULL;
  const uint32_t rank = 2;
  const uint64_t epoch = 6;
  std::vector<size_t> expected(range.size());
  std::iota(expected.begin(), expected.end(), range.begin);
  CounterRng rng(DeriveKey(DeriveKey(seed, rank), epoch));
  for (size_t i = expected.size() - 1; i >= 1; --i) {
    const size_t j = rng.Below(i + 1);
    std::swap(expected[i], expected[j]);
  }
  EpochBatcher batcher(data, range, 8, seed, rank);
  batcher.StartEpoch(epoch);
  EXPECT_EQ(EpochOrder(batcher), expected);
}

TEST(EpochBatcherTest, ViewHasTheBatchShape) {
  const Dataset data = Numbered(20);
  EpochBatcher batcher(data, {0, 20}, 7, 5, 0);
  ASSERT_EQ(batcher.batches_per_epoch(), 2u);
  const Batch batch = batcher.Get(1);
  EXPECT_EQ(batch.size, 7u);
  EXPECT_EQ(batch.dim, kDim);
  EXPECT_EQ(batch.features.size(), 7 * kDim);
  EXPECT_EQ(batch.labels.size(), 7u);
}

TEST(SequentialBatchesTest, CoversTheDatasetInOrderWithAShortLastBatch) {
  const Dataset data = Numbered(10);
  SequentialBatches batches(data, 4);
  ASSERT_EQ(batches.count(), 3u);
  std::vector<size_t> seen;
  for (size_t b = 0; b < batches.count(); ++b) {
    const Batch batch = batches.Get(b);
    EXPECT_EQ(batch.size, b < 2 ? 4u : 2u) << "batch " << b;
    const std::vector<size_t> ids = Indices(batch);
    seen.insert(seen.end(), ids.begin(), ids.end());
  }
  std::vector<size_t> expected(10);
  std::iota(expected.begin(), expected.end(), size_t{0});
  EXPECT_EQ(seen, expected);
}

TEST(SequentialBatchesTest, ExactMultipleHasNoShortBatch) {
  const Dataset data = Numbered(8);
  SequentialBatches batches(data, 4);
  ASSERT_EQ(batches.count(), 2u);
  EXPECT_EQ(batches.Get(1).size, 4u);
  EXPECT_THAT(Indices(batches.Get(1)), ::testing::ElementsAre(4, 5, 6, 7));
}

}  // namespace
}  // namespace cserps
