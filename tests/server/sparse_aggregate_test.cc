// The sparse round's arithmetic against an independent reference (a dense
// double accumulator and a full sort), and the round table's rules.
#include "server/sparse_aggregate.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sparse_round_table.h"

namespace cserps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// k distinct ascending indices from [first, end) and values from a coarse
// grid (multiples of 0.25 in [-2, 2]) so that sums tie often.
SparseVector RandomPush(std::mt19937& rng, uint32_t first, uint32_t end, size_t k) {
  std::vector<uint32_t> all(end - first);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = first + i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(k);
  std::sort(all.begin(), all.end());
  std::uniform_int_distribution<int> grid(-8, 8);
  SparseVector e;
  e.indices = all;
  for (size_t i = 0; i < k; ++i) e.values.push_back(0.25f * grid(rng));
  return e;
}

// Dense double sums over [first, end) in rank order; then every touched
// index ranked by (|float sum| descending, index ascending) with a full sort.
SparseVector Reference(const std::vector<SparseVector>& pushes, uint32_t first,
                        uint32_t end, size_t k, bool global_topk) {
  std::vector<double> sum(end - first, 0.0);
  std::vector<bool> touched(end - first, false);
  for (const SparseVector& p : pushes) {
    for (size_t i = 0; i < p.indices.size(); ++i) {
      sum[p.indices[i] - first] += p.values[i];
      touched[p.indices[i] - first] = true;
    }
  }
  std::vector<std::pair<float, uint32_t>> ranked;  // (-|sum|, index)
  for (uint32_t j = 0; j < sum.size(); ++j) {
    if (touched[j]) ranked.push_back({-std::fabs(static_cast<float>(sum[j])), first + j});
  }
  std::sort(ranked.begin(), ranked.end());
  if (global_topk && ranked.size() > k) ranked.resize(k);
  std::vector<uint32_t> chosen;
  for (const auto& [m, index] : ranked) chosen.push_back(index);
  std::sort(chosen.begin(), chosen.end());
  SparseVector out;
  for (uint32_t index : chosen) {
    out.indices.push_back(index);
    out.values.push_back(static_cast<float>(sum[index - first]));
  }
  return out;
}

TEST(AggregateSparseTest, MatchesReferenceOnRandomPushesFromOneToNineMembers) {
  std::mt19937 rng(12345);
  int ties_seen = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t first = 1000 * (trial % 3);
    const uint32_t end = first + 20 + trial % 50;
    const size_t k = 1 + trial % (end - first);
    std::vector<SparseVector> pushes;
    for (int r = 0; r < 1 + trial % 9; ++r) pushes.push_back(RandomPush(rng, first, end, k));
    for (bool global : {true, false}) {
      const SparseVector got = AggregateSparse(
          pushes, global ? SparseSelection::kGlobalTopK : SparseSelection::kUnion, k);
      const SparseVector want = Reference(pushes, first, end, k, global);
      ASSERT_THAT(got.indices, ElementsAreArray(want.indices)) << "trial " << trial;
      ASSERT_THAT(got.values, ElementsAreArray(want.values)) << "trial " << trial;
    }
    // Count the trials where the k-th and (k+1)-th magnitudes tie, so the
    // tie rule was actually exercised.
    const SparseVector all = Reference(pushes, first, end, 1u << 30, false);
    std::vector<float> mags;
    for (float v : all.values) mags.push_back(std::fabs(v));
    std::sort(mags.rbegin(), mags.rend());
    if (mags.size() > k && mags[k - 1] == mags[k]) ++ties_seen;
  }
  EXPECT_GT(ties_seen, 20);
}

// Values of every magnitude float holds (random exponents and mantissas,
// zeros of both signs, subnormals, sums that overflow to infinity), so that
// every digit of the magnitudes' bits decides the k-th largest somewhere.
TEST(AggregateSparseTest, MatchesReferenceOnValuesOfEveryMagnitude) {
  std::mt19937 rng(777);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7fffffu);  // finite, >= 0
  std::bernoulli_distribution negative(0.5);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t first = 500 * (trial % 4);
    const uint32_t end = first + 50 + trial % 300;
    const size_t k = 1 + trial % (end - first);
    std::vector<SparseVector> pushes;
    for (int r = 0; r < 1 + trial % 5; ++r) {
      SparseVector push = RandomPush(rng, first, end, k);
      for (float& v : push.values) {
        const uint32_t b = bits(rng) | (negative(rng) ? 0x80000000u : 0u);
        std::memcpy(&v, &b, sizeof(v));
        if (trial % 7 == 0) v = v < 0 ? -0.0f : 0.0f;  // signed zeros
      }
      pushes.push_back(push);
    }
    const SparseVector got = AggregateSparse(pushes, SparseSelection::kGlobalTopK, k);
    const SparseVector want = Reference(pushes, first, end, k, true);
    ASSERT_THAT(got.indices, ElementsAreArray(want.indices)) << "trial " << trial;
    ASSERT_EQ(got.values.size(), want.values.size()) << "trial " << trial;
    ASSERT_EQ(std::memcmp(got.values.data(), want.values.data(), 4 * got.values.size()), 0)
        << "trial " << trial;
  }
}

TEST(AggregateSparseTest, TiesGoToTheLowerIndexAndNanCountsAsInfinite) {
  // Sums: 5 -> 1, 7 -> -1, 9 -> 1, 11 -> NaN, 13 -> 0.5.
  std::vector<SparseVector> pushes = {
      {{5, 7, 11}, {0.5f, -0.5f, std::nanf("")}},
      {{5, 7, 9, 13}, {0.5f, -0.5f, 1.0f, 0.5f}},
  };
  const SparseVector got = AggregateSparse(pushes, SparseSelection::kGlobalTopK, 3);
  EXPECT_THAT(got.indices, ElementsAreArray({5u, 7u, 11u}));
  EXPECT_EQ(got.values[0], 1.0f);
  EXPECT_EQ(got.values[1], -1.0f);
  EXPECT_TRUE(std::isnan(got.values[2]));
}

TEST(AggregateSparseTest, SumsInDoubleInRankOrder) {
  // In float, 1e8 + 1 - 1e8 would lose the 1; in double it survives.
  std::vector<SparseVector> pushes = {{{3}, {1e8f}}, {{3}, {1.0f}}, {{3}, {-1e8f}}};
  const SparseVector got = AggregateSparse(pushes, SparseSelection::kUnion, 1);
  EXPECT_THAT(got.values, ElementsAreArray({1.0f}));
}

TEST(ParseSparsePushTest, RefusesEachBadInputNamingIt) {
  auto bytes = [](std::vector<uint32_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  auto floats = [](std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  struct Case {
    std::string indices, values;
    uint64_t k;
    std::string message;
  };
  const std::vector<Case> cases = {
      {bytes({10, 11}) + "x", floats({1, 2}), 2, "not a whole number of uint32"},
      {bytes({10, 11}), floats({1, 2}) + "xy", 2, "not a whole number of float32"},
      {bytes({10, 11}), floats({1}), 2, "indices has 2 entries but values has 1"},
      {bytes({10, 11}), floats({1, 2}), 3, "push has 2 entries; k is 3"},
      {bytes({10, 20}), floats({1, 2}), 2, "index 20 at position 1 (byte offset 4) is outside"},
      {bytes({9, 12}), floats({1, 2}), 2, "index 9 at position 0"},
      {bytes({12, 11}), floats({1, 2}), 2, "index 11 at position 1 (byte offset 4) is below"},
      {bytes({12, 12}), floats({1, 2}), 2, "index 12 at position 1 (byte offset 4) repeats"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<SparseVector> got =
        ParseSparsePush(c.indices, c.values, c.k, /*first=*/10, /*end=*/20);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message));
  }
  const absl::StatusOr<SparseVector> ok =
      ParseSparsePush(bytes({10, 19}), floats({1, -2}), 2, 10, 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(ok->indices, ElementsAreArray({10u, 19u}));
  EXPECT_THAT(ok->values, ElementsAreArray({1.0f, -2.0f}));
}

// The round table, with a `complete` that records its calls.
class SparseRoundTableTest : public ::testing::Test {
 protected:
  SparseRoundTable::Options Opts() {
    return SparseRoundTable::Options{
        .limits = {.world_size = 3,
                   .max_step_lag = 2,
                   .retained_rounds = 2,
                   .timeout = absl::Seconds(10)},
        .complete =
            [this](uint64_t step, std::vector<SparseVector> pushes) {
              ++completions_[step];
              return EncodeSparse(
                  AggregateSparse(pushes, SparseSelection::kUnion, 0));
            },
        .on_latency = [this](absl::Duration latency) { latencies_.push_back(latency); },
    };
  }
  // What `done` of one push got; `called` false while it is parked.
  struct Answer {
    bool called = false;
    absl::StatusOr<SparseRoundReply> reply = absl::UnknownError("unset");
  };
  void Push(SparseRoundTable& table, uint64_t step, uint32_t rank, float value,
            Answer* answer, absl::Time now = absl::UnixEpoch()) {
    // Pushes one entry (index 0, `value`).
    table.Push(step, rank, SparseVector{{0}, {value}}, now,
               [answer](absl::StatusOr<SparseRoundReply> r) {
                 answer->called = true;
                 answer->reply = std::move(r);
               });
  }
  static float Value(const Answer& a) {
    float v;
    std::memcpy(&v, (*a.reply)->values.data(), 4);
    return v;
  }
  std::map<uint64_t, int> completions_;
  std::vector<absl::Duration> latencies_;
};

TEST_F(SparseRoundTableTest, ReportsLatencyAndNewestStepOfCompletedRoundsOnly) {
  SparseRoundTable table(Opts());
  EXPECT_EQ(table.newest_step(), 0u);
  const absl::Time t0 = absl::UnixEpoch() + absl::Seconds(100);
  Answer a[3];
  Push(table, 1, 1, 1.0f, &a[1], t0);
  Push(table, 1, 0, 1.0f, &a[0], t0 + absl::Seconds(2));
  // A retry later than the first push changes nothing.
  Answer retry;
  Push(table, 1, 1, 1.0f, &retry, t0 + absl::Seconds(4));
  EXPECT_TRUE(latencies_.empty());
  Push(table, 1, 2, 1.0f, &a[2], t0 + absl::Seconds(7));
  ASSERT_TRUE(a[2].called && a[2].reply.ok());
  EXPECT_EQ(latencies_, std::vector<absl::Duration>{absl::Seconds(7)});
  EXPECT_EQ(table.newest_step(), 1u);

  // A failed round reports no latency; an older completed step does not
  // lower the newest.
  Answer lone;
  Push(table, 2, 0, 1.0f, &lone, t0 + absl::Seconds(8));
  EXPECT_EQ(table.ExpireOverdue(t0 + absl::Seconds(30)), 1);
  EXPECT_EQ(latencies_.size(), 1u);
  Answer b[3];
  for (uint32_t r = 0; r < 3; ++r) Push(table, 3, r, 1.0f, &b[r], t0 + absl::Seconds(40));
  Answer c[3];
  for (uint32_t r = 0; r < 3; ++r) Push(table, 2, r, 1.0f, &c[r], t0 + absl::Seconds(41));
  ASSERT_TRUE(c[2].called && c[2].reply.ok());
  EXPECT_EQ(table.newest_step(), 3u);
  EXPECT_EQ(latencies_.size(), 3u);
}

TEST_F(SparseRoundTableTest, CompletesOnceAndRetriesAreNotCountedTwice) {
  SparseRoundTable table(Opts());
  Answer a0, a0_retry, a1, a2, late_retry;
  Push(table, 0, 0, 1.0f, &a0);
  Push(table, 0, 0, 100.0f, &a0_retry);  // a retry with other values: ignored
  Push(table, 0, 1, 2.0f, &a1);
  EXPECT_FALSE(a0.called || a0_retry.called || a1.called);
  Push(table, 0, 2, 4.0f, &a2);
  for (const Answer* a : {&a0, &a0_retry, &a1, &a2}) {
    ASSERT_TRUE(a->called);
    ASSERT_TRUE(a->reply.ok()) << a->reply.status();
    EXPECT_EQ(Value(*a), 7.0f);
    EXPECT_EQ(*a->reply, *a0.reply);  // the same reply object for everyone
  }
  Push(table, 0, 1, 50.0f, &late_retry);  // answered from the retained round
  ASSERT_TRUE(late_retry.called && late_retry.reply.ok());
  EXPECT_EQ(Value(late_retry), 7.0f);
  EXPECT_EQ(completions_[0], 1);
  EXPECT_EQ(table.rounds_completed(), 1u);
}

TEST_F(SparseRoundTableTest, TimeoutNamesTheMissingRanks) {
  SparseRoundTable table(Opts());
  Answer a0, a2;
  Push(table, 2, 0, 1.0f, &a0, absl::UnixEpoch());
  Push(table, 2, 2, 1.0f, &a2, absl::UnixEpoch() + absl::Seconds(3));
  EXPECT_EQ(table.ExpireOverdue(absl::UnixEpoch() + absl::Seconds(9)), 0);
  EXPECT_EQ(table.ExpireOverdue(absl::UnixEpoch() + absl::Seconds(10)), 1);
  for (const Answer* a : {&a0, &a2}) {
    ASSERT_TRUE(a->called);
    EXPECT_EQ(a->reply.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(a->reply.status().message()),
                HasSubstr("sparse round of step 2 timed out after 10s: missing ranks 1 of world_size 3"));
  }
  EXPECT_EQ(table.open_rounds(), 0u);
  EXPECT_EQ(table.rounds_failed(), 1u);
}

TEST_F(SparseRoundTableTest, RetiresOldStepsAndBoundsTheWindow) {
  SparseRoundTable table(Opts());
  for (uint64_t step = 0; step < 4; ++step) {
    Answer a[3];
    for (uint32_t r = 0; r < 3; ++r) Push(table, step, r, 1.0f, &a[r]);
    ASSERT_TRUE(a[2].called && a[2].reply.ok());
  }
  // retained_rounds 2: steps 2 and 3 kept, 0 and 1 retired.
  Answer retry2, old1, ahead, inside;
  Push(table, 2, 0, 1.0f, &retry2);
  EXPECT_TRUE(retry2.called && retry2.reply.ok());
  Push(table, 1, 0, 1.0f, &old1);
  EXPECT_EQ(old1.reply.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(old1.reply.status().message()), HasSubstr("too far behind"));
  Push(table, 6, 0, 1.0f, &ahead);  // newest 3 + max_step_lag 2 = 5
  EXPECT_EQ(ahead.reply.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(ahead.reply.status().message()), HasSubstr("too far ahead"));
  Push(table, 5, 0, 1.0f, &inside);
  EXPECT_FALSE(inside.called);
  table.FailAll("stopping");
  ASSERT_TRUE(inside.called);
  EXPECT_EQ(inside.reply.status().code(), absl::StatusCode::kUnavailable);
  Answer after;
  Push(table, 5, 1, 1.0f, &after);
  EXPECT_EQ(after.reply.status().code(), absl::StatusCode::kUnavailable);
  for (const auto& [step, n] : completions_) EXPECT_EQ(n, 1) << "step " << step;
}

}  // namespace
}  // namespace cserps
