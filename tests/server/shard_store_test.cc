#include "server/shard_store.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<float> ReadFloats(const ShardStore& store, uint64_t offset,
                              uint64_t count) {
  std::string bytes;
  absl::Status s = store.Read(offset, count, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(bytes.size(), count * sizeof(float));
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

constexpr uint32_t kMaxWaiters = 8;

bool StaysWaiting() { return false; }

// Values first + i, so a read at the wrong offset shows.
std::vector<float> Ramp(uint64_t first, uint64_t count) {
  std::vector<float> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = static_cast<float>(first + i);
  return v;
}

TEST(ShardStoreTest, WriteThenReadRanges) {
  ShardStore store(100, 10, kMaxWaiters);
  EXPECT_EQ(store.first_float(), 100u);
  EXPECT_EQ(store.size(), 10u);
  EXPECT_THAT(ReadFloats(store, 100, 10), ElementsAreArray(std::vector<float>(10, 0.0f)));

  ASSERT_TRUE(store.Write(100, Ramp(100, 10)).ok());
  EXPECT_THAT(ReadFloats(store, 100, 10), ElementsAreArray(Ramp(100, 10)));
  EXPECT_THAT(ReadFloats(store, 103, 4), ElementsAreArray(Ramp(103, 4)));
  EXPECT_THAT(ReadFloats(store, 109, 1), ElementsAreArray({109.0f}));
  EXPECT_TRUE(ReadFloats(store, 110, 0).empty());

  ASSERT_TRUE(store.Write(104, std::vector<float>{-1.0f, -2.0f}).ok());
  std::vector<float> expected = Ramp(100, 10);
  expected[4] = -1.0f;
  expected[5] = -2.0f;
  EXPECT_THAT(ReadFloats(store, 100, 10), ElementsAreArray(expected));
}

TEST(ShardStoreTest, ReadAppendsToTheOutput) {
  ShardStore store(0, 4, kMaxWaiters);
  ASSERT_TRUE(store.Write(0, Ramp(0, 4)).ok());
  std::string out = "xy";
  ASSERT_TRUE(store.Read(1, 2, &out).ok());
  ASSERT_EQ(out.size(), 2 + 2 * sizeof(float));
  EXPECT_EQ(out.substr(0, 2), "xy");
  float got[2];
  std::memcpy(got, out.data() + 2, sizeof(got));
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 2.0f);
}

TEST(ShardStoreTest, RangesOutsideTheShardAreOutOfRange) {
  ShardStore store(100, 10, kMaxWaiters);
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  struct Range {
    uint64_t offset, count;
  };
  for (const Range r : {Range{99, 1}, Range{0, 5}, Range{105, 6},
                        Range{110, 1}, Range{111, 0}, Range{100, 11},
                        Range{101, kHuge}, Range{kHuge, 2}}) {
    SCOPED_TRACE(testing::Message() << "[" << r.offset << " + " << r.count << ")");
    std::string out;
    absl::Status read = store.Read(r.offset, r.count, &out);
    EXPECT_EQ(read.code(), absl::StatusCode::kOutOfRange) << read;
    EXPECT_THAT(read.message(), HasSubstr("[100, 110)"));
    EXPECT_TRUE(out.empty());
    if (r.count < 1000) {
      absl::StatusOr<bool> write =
          store.Write(r.offset, std::vector<float>(r.count, 5.0f));
      EXPECT_EQ(write.status().code(), absl::StatusCode::kOutOfRange);
    }
  }
  // A refused write changed nothing, not even the initialisation count.
  EXPECT_THAT(ReadFloats(store, 100, 10), ElementsAreArray(std::vector<float>(10, 0.0f)));
  EXPECT_FALSE(store.initialised());
}

TEST(ShardStoreTest, InitialisedOnlyWhenEveryFloatWasWritten) {
  ShardStore store(20, 10, kMaxWaiters);
  EXPECT_FALSE(store.initialised());
  // Overlapping partial writes: [20,24), [22,26), [20,26) again.
  EXPECT_EQ(store.Write(20, Ramp(20, 4)).value(), false);
  EXPECT_EQ(store.Write(22, Ramp(22, 4)).value(), false);
  EXPECT_EQ(store.Write(20, Ramp(20, 6)).value(), false);
  EXPECT_FALSE(store.initialised());
  // [27,30) leaves float 26 unwritten.
  EXPECT_EQ(store.Write(27, Ramp(27, 3)).value(), false);
  EXPECT_FALSE(store.initialised());
  EXPECT_EQ(store.Write(26, Ramp(26, 1)).value(), true);
  EXPECT_TRUE(store.initialised());
  // Later writes keep it initialised.
  EXPECT_EQ(store.Write(25, Ramp(25, 2)).value(), true);
  EXPECT_THAT(ReadFloats(store, 20, 10), ElementsAreArray(Ramp(20, 10)));
}

TEST(ShardStoreTest, EmptyShardIsInitialised) {
  ShardStore store(50, 0, kMaxWaiters);
  EXPECT_TRUE(store.initialised());
  int calls = 0;
  store.WhenInitialised([&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    ++calls;
  }, StaysWaiting);
  EXPECT_EQ(calls, 1);
}

TEST(ShardStoreTest, WhenInitialisedWaitsForTheCompletingWrite) {
  ShardStore store(0, 6, kMaxWaiters);
  std::optional<absl::Status> first, second;
  int calls = 0;
  store.WhenInitialised([&](absl::Status s) { first = s; ++calls; }, StaysWaiting);
  store.WhenInitialised([&](absl::Status s) { second = s; ++calls; }, StaysWaiting);
  ASSERT_TRUE(store.Write(0, Ramp(0, 3)).ok());
  EXPECT_EQ(calls, 0) << "answered before the shard was initialised";
  ASSERT_TRUE(store.Write(0, Ramp(0, 3)).ok());  // same floats again
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(store.Write(3, Ramp(3, 3)).ok());
  EXPECT_EQ(calls, 2);
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_TRUE(first->ok()) << *first;
  EXPECT_TRUE(second->ok()) << *second;
  // Not answered again by a later write.
  ASSERT_TRUE(store.Write(0, Ramp(0, 6)).ok());
  EXPECT_EQ(calls, 2);
}

TEST(ShardStoreTest, WhenInitialisedAfterInitAnswersAtOnce) {
  ShardStore store(0, 2, kMaxWaiters);
  ASSERT_TRUE(store.Write(0, Ramp(0, 2)).ok());
  int calls = 0;
  store.WhenInitialised([&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    ++calls;
  }, StaysWaiting);
  EXPECT_EQ(calls, 1);
}

TEST(ShardStoreTest, CallbacksRunWithoutTheLock) {
  // A waiter that reads the store would deadlock if it ran under the lock.
  ShardStore store(0, 3, kMaxWaiters);
  std::vector<float> seen;
  store.WhenInitialised([&](absl::Status s) {
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(store.initialised());
    seen = ReadFloats(store, 0, 3);
  }, StaysWaiting);
  ASSERT_TRUE(store.Write(0, Ramp(0, 3)).ok());
  EXPECT_THAT(seen, ElementsAreArray(Ramp(0, 3)));
}

TEST(ShardStoreTest, FailWaitersAnswersParkedAndLaterWaiters) {
  ShardStore store(0, 4, kMaxWaiters);
  std::optional<absl::Status> parked;
  store.WhenInitialised([&](absl::Status s) { parked = s; }, StaysWaiting);
  EXPECT_FALSE(parked.has_value());
  store.FailWaiters(absl::UnavailableError("shard 0 is shutting down"));
  ASSERT_TRUE(parked.has_value());
  EXPECT_EQ(parked->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(parked->message(), HasSubstr("shutting down"));

  std::optional<absl::Status> later;
  store.WhenInitialised([&](absl::Status s) { later = s; }, StaysWaiting);
  ASSERT_TRUE(later.has_value()) << "a waiter after FailWaiters must not park";
  EXPECT_EQ(later->code(), absl::StatusCode::kUnavailable);

  // The failed waiter is not answered a second time by initialisation.
  parked.reset();
  ASSERT_TRUE(store.Write(0, Ramp(0, 4)).ok());
  EXPECT_FALSE(parked.has_value());
}

TEST(ShardStoreTest, AtMostMaxWaitersWaitAndTheAbandonedMakeRoom) {
  ShardStore store(0, 4, kMaxWaiters);
  std::vector<std::optional<absl::Status>> answers(kMaxWaiters + 2);
  std::vector<bool> gave_up(kMaxWaiters, false);
  for (uint32_t i = 0; i < kMaxWaiters; ++i) {
    store.WhenInitialised([&answers, i](absl::Status s) { answers[i] = s; },
                          [&gave_up, i] { return static_cast<bool>(gave_up[i]); });
  }
  auto over = [&](uint32_t i) {
    store.WhenInitialised([&answers, i](absl::Status s) { answers[i] = s; }, StaysWaiting);
  };
  over(kMaxWaiters);
  ASSERT_TRUE(answers[kMaxWaiters].has_value()) << "one waiter too many was parked";
  EXPECT_EQ(answers[kMaxWaiters]->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(answers[kMaxWaiters]->message(),
              HasSubstr(absl::StrCat(kMaxWaiters, " calls already wait")));
  for (uint32_t i = 0; i < kMaxWaiters; ++i) EXPECT_FALSE(answers[i].has_value());

  // A waiter whose caller gave up is answered and its place taken.
  gave_up[3] = true;
  over(kMaxWaiters + 1);
  ASSERT_TRUE(answers[3].has_value());
  EXPECT_EQ(answers[3]->code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(answers[kMaxWaiters + 1].has_value());

  ASSERT_TRUE(store.Write(0, Ramp(0, 4)).ok());
  for (uint32_t i = 0; i < kMaxWaiters + 2; ++i) {
    if (i == 3 || i == kMaxWaiters) continue;
    ASSERT_TRUE(answers[i].has_value()) << "waiter " << i;
    EXPECT_TRUE(answers[i]->ok()) << *answers[i];
  }
  EXPECT_EQ(answers[3]->code(), absl::StatusCode::kCancelled) << "answered twice";
}

// Shard 1 of d=40, block 4, S=2 owns floats [20, 40). Selecting blocks 5, 7
// and 8 gives the payload segments [20,24) and [28,36): 12 floats.
struct TwoSegmentPayload {
  BlockLayout layout{40, 4, 2};
  ShardPayload payload =
      ShardPayload::SelectedBlocks(layout, 1, std::vector<uint64_t>{5, 7, 8});
  // Global float of each payload float, written out by hand.
  std::vector<uint64_t> model_index = {20, 21, 22, 23, 28, 29,
                                       30, 31, 32, 33, 34, 35};
};

TEST(ShardStoreTest, ApplyMeanOnModelStreamSetsTheCoveredFloats) {
  TwoSegmentPayload t;
  ASSERT_EQ(t.payload.segments().size(), 2u);
  ASSERT_EQ(t.payload.size(), t.model_index.size());
  ShardStore store(20, 20, kMaxWaiters);
  ASSERT_TRUE(store.Write(20, Ramp(20, 20)).ok());

  // Payload floats [2, 9): the end of the first segment and most of the second.
  const std::vector<float> mean = {-1, -2, -3, -4, -5, -6, -7};
  store.ApplyMean(/*is_model_stream=*/true, t.payload, 2, mean, /*lr=*/0.5f);

  std::vector<float> expected = Ramp(20, 20);
  for (size_t i = 0; i < mean.size(); ++i) {
    expected[t.model_index[2 + i] - 20] = mean[i];
  }
  EXPECT_THAT(ReadFloats(store, 20, 20), ElementsAreArray(expected));
}

TEST(ShardStoreTest, ApplyMeanOnGradStreamSubtractsLrTimesMean) {
  TwoSegmentPayload t;
  ShardStore store(20, 20, kMaxWaiters);
  ASSERT_TRUE(store.Write(20, Ramp(20, 20)).ok());
  // Multiples of 1/4 and lr 0.5: every product and difference is exact.
  std::vector<float> mean(t.payload.size());
  for (size_t i = 0; i < mean.size(); ++i) mean[i] = 0.25f * static_cast<float>(i) - 1.0f;
  const float lr = 0.5f;
  store.ApplyMean(/*is_model_stream=*/false, t.payload, 0, mean, lr);

  std::vector<float> expected = Ramp(20, 20);
  for (size_t i = 0; i < mean.size(); ++i) {
    const uint64_t m = t.model_index[i];
    expected[m - 20] = static_cast<float>(m) - lr * mean[i];
  }
  EXPECT_THAT(ReadFloats(store, 20, 20), ElementsAreArray(expected));

  // A second chunk-like range applies on top, at its own payload offset.
  const std::vector<float> tail = {2.0f, 4.0f};
  store.ApplyMean(false, t.payload, 10, tail, lr);
  expected[t.model_index[10] - 20] -= lr * tail[0];
  expected[t.model_index[11] - 20] -= lr * tail[1];
  EXPECT_THAT(ReadFloats(store, 20, 20), ElementsAreArray(expected));
}

TEST(ShardStoreTest, ReadIntoFloats) {
  ShardStore store(100, 10, kMaxWaiters);
  ASSERT_TRUE(store.Write(100, Ramp(100, 10)).ok());
  std::vector<float> out(3, -1.0f);
  ASSERT_TRUE(store.Read(104, absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAreArray(Ramp(104, 3)));
  EXPECT_TRUE(store.Read(110, absl::Span<float>()).ok());

  const absl::Status outside = store.Read(108, absl::MakeSpan(out));
  EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(outside.message(), HasSubstr("[108, 111)"));
}

TEST(ShardStoreTest, UpdateChangesTheWholeShardInPlace) {
  ShardStore store(100, 6, kMaxWaiters);
  ASSERT_TRUE(store.Write(100, Ramp(100, 6)).ok());
  std::vector<float> seen;
  store.Update([&](absl::Span<float> x) {
    seen.assign(x.begin(), x.end());
    for (size_t i = 0; i < x.size(); ++i) x[i] -= static_cast<float>(i);
  });
  EXPECT_THAT(seen, ElementsAreArray(Ramp(100, 6)));
  EXPECT_THAT(ReadFloats(store, 100, 6), ElementsAreArray({100.0f, 100.0f, 100.0f, 100.0f,
                                                           100.0f, 100.0f}));
}

TEST(ShardStoreTest, StepTakesTheDirectionAtTheModelAsItIsThenSubtractsLrTimesIt) {
  ShardStore store(100, 6, kMaxWaiters);
  ASSERT_TRUE(store.Write(100, Ramp(100, 6)).ok());
  std::vector<float> p = {1.0f, 2.0f, 4.0f};
  std::vector<float> seen;
  // p = g + x / 4 at x = 102, 103, 104: 26.5, 27.75, 30; x -= 0.5 p.
  ASSERT_TRUE(store
                  .Step(102, 0.5f, absl::MakeSpan(p),
                        [&](const float* x, absl::Span<float> g) {
                          seen.assign(x, x + g.size());
                          for (size_t i = 0; i < g.size(); ++i) g[i] += x[i] / 4;
                        })
                  .ok());
  EXPECT_THAT(seen, ElementsAreArray({102.0f, 103.0f, 104.0f}));
  EXPECT_THAT(p, ElementsAreArray({26.5f, 27.75f, 30.0f}));
  EXPECT_THAT(ReadFloats(store, 100, 6),
              ElementsAreArray({100.0f, 101.0f, 88.75f, 89.125f, 89.0f, 105.0f}));

  bool called = false;
  std::vector<float> outside_p = {1.0f, 1.0f};
  const absl::Status outside = store.Step(105, 0.5f, absl::MakeSpan(outside_p),
                                          [&](const float*, absl::Span<float>) { called = true; });
  EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(called);
  EXPECT_THAT(ReadFloats(store, 105, 1), ElementsAreArray({105.0f}));
}

TEST(ShardStoreTest, SubtractAtMovesTheIndexedFloatsOnly) {
  ShardStore store(100, 6, kMaxWaiters);
  ASSERT_TRUE(store.Write(100, Ramp(100, 6)).ok());
  const std::vector<uint32_t> indices = {105, 100, 103, 100};
  ASSERT_TRUE(store.SubtractAt(indices, std::vector<float>{1.0f, 2.0f, 0.25f, 3.0f}).ok());
  // Index 100 appears twice: both deltas are subtracted.
  EXPECT_THAT(ReadFloats(store, 100, 6),
              ElementsAreArray({95.0f, 101.0f, 102.0f, 102.75f, 104.0f, 104.0f}));
}

TEST(ShardStoreTest, SubtractAtRefusesBadInputWithoutChangingTheModel) {
  ShardStore store(100, 6, kMaxWaiters);
  ASSERT_TRUE(store.Write(100, Ramp(100, 6)).ok());
  const absl::Status outside =
      store.SubtractAt(std::vector<uint32_t>{101, 106}, std::vector<float>{1.0f, 1.0f});
  EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(outside.message(), HasSubstr("index 106 at position 1"));
  const absl::Status below =
      store.SubtractAt(std::vector<uint32_t>{99}, std::vector<float>{1.0f});
  EXPECT_EQ(below.code(), absl::StatusCode::kOutOfRange);
  const absl::Status lengths =
      store.SubtractAt(std::vector<uint32_t>{101, 102}, std::vector<float>{1.0f});
  EXPECT_EQ(lengths.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ReadFloats(store, 100, 6), ElementsAreArray(Ramp(100, 6)));
}

TEST(ShardStoreTest, UpdatesDoNotInitialise) {
  ShardStore store(0, 2, kMaxWaiters);
  ASSERT_TRUE(store.Write(0, std::vector<float>{1.0f}).ok());
  store.Update([](absl::Span<float> x) {
    for (float& v : x) v -= 1.0f;
  });
  ASSERT_TRUE(store.SubtractAt(std::vector<uint32_t>{1}, std::vector<float>{1.0f}).ok());
  EXPECT_FALSE(store.initialised());
  EXPECT_THAT(ReadFloats(store, 0, 2), ElementsAreArray({0.0f, -2.0f}));
}

}  // namespace
}  // namespace cserps
