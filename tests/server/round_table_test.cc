#include "server/round_table.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/prng.h"

namespace cserps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000);
constexpr float kLr = 0.25f;

// Captures the one answer a push gets, and how often it was called.
struct Answer {
  std::optional<absl::StatusOr<RoundMean>> result;
  int calls = 0;

  RoundCallback Callback() {
    return [this](absl::StatusOr<RoundMean> r) {
      ++calls;
      result = std::move(r);
    };
  }
  bool ok() const { return result.has_value() && result->ok(); }
  std::vector<float> mean() const {
    const RoundMean& m = result->value();
    return std::vector<float>(m->begin(), m->end());
  }
  absl::Status status() const { return result->status(); }
};

RoundTable::Options SmallOptions(uint32_t world_size) {
  RoundTable::Options o;
  o.limits.world_size = world_size;
  o.limits.max_step_lag = 8;
  o.limits.retained_rounds = 4;
  o.limits.timeout = absl::Seconds(60);
  return o;
}

// sum_r w_r v_r[i] / sum_r w_r, in double, then rounded to float.
std::vector<float> WeightedMean(const std::vector<std::vector<float>>& values,
                                const std::vector<float>& weights) {
  std::vector<float> out(values[0].size());
  double total = 0;
  for (float w : weights) total += w;
  for (size_t i = 0; i < out.size(); ++i) {
    double s = 0;
    for (size_t r = 0; r < values.size(); ++r) {
      s += static_cast<double>(weights[r]) * values[r][i];
    }
    out[i] = static_cast<float>(s / total);
  }
  return out;
}

TEST(RoundTableTest, WeightedMeanOfThreeRanks) {
  RoundTable table(SmallOptions(3));
  const std::vector<std::vector<float>> values = {
      {1.0f, -2.0f, 0.1f}, {4.0f, 8.0f, 0.7f}, {-3.0f, 0.5f, 100.0f}};
  const std::vector<float> weights = {1.0f, 2.5f, 0.25f};
  const RoundKey key{3, 1, 2};
  Answer a[3];
  for (uint32_t r = 0; r < 3; ++r) {
    table.Push(key, r, weights[r], kLr, values[r], kT0, a[r].Callback());
    if (r < 2) {
      EXPECT_EQ(a[0].calls, 0) << "answered before the last rank pushed";
      EXPECT_EQ(table.open_rounds(), 1u);
    }
  }
  const std::vector<float> expected = WeightedMean(values, weights);
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_EQ(a[r].calls, 1) << "rank " << r;
    ASSERT_TRUE(a[r].ok()) << a[r].status();
    EXPECT_THAT(a[r].mean(), ElementsAreArray(expected));
  }
  // One shared mean for every answer.
  EXPECT_EQ(a[0].result->value().get(), a[2].result->value().get());
  EXPECT_EQ(table.rounds_completed(), 1u);
  EXPECT_EQ(table.open_rounds(), 0u);
  EXPECT_EQ(table.newest_step(), 3u);
}

// The mean's bits, so that -0.0 and NaN compare too.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// A round's mean, pushed by one rank per weight; `kept`: each push's values
// kept for the round (as the bulk transport's are), which must not change
// a bit.
std::vector<float> RoundMeanOf(const std::vector<std::vector<float>>& values,
                               const std::vector<float>& weights, bool kept = false) {
  const uint32_t ranks = static_cast<uint32_t>(weights.size());
  RoundTable table(SmallOptions(ranks));
  std::vector<Answer> answers(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    table.Push({1, 0, 0}, r, weights[r], kLr, values[r], kT0, answers[r].Callback(),
               kept ? std::make_shared<int>(r) : nullptr);
  }
  return answers[0].ok() ? answers[0].mean() : std::vector<float>{};
}

TEST(RoundTableTest, TheMeanIsTheDoubleQuotientBitForBitForEveryWeightTotal) {
  CounterRng rng(11);
  const float specials[] = {-0.0f, 0.0f, 1e-40f, -3e38f, 3e38f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  // Totals that are powers of two (1, 128, 1 from one rank) and that are not
  // (65, 3.75).
  for (const std::vector<float>& weights : std::vector<std::vector<float>>{
           {0.5f, 0.25f, 0.25f}, {32.0f, 96.0f}, {1.0f}, {1.0f, 64.0f}, {0.5f, 3.0f, 0.25f}}) {
    std::vector<std::vector<float>> values(weights.size());
    for (std::vector<float>& v : values) {
      for (float s : specials) v.push_back(s);
      for (int i = 0; i < 4096; ++i) {
        const float scale = std::ldexp(1.0f, static_cast<int>(rng.Below(80)) - 40);
        v.push_back((rng.UniformFloat() - 0.5f) * scale);
      }
    }
    if (weights.size() == 2 && weights[1] == 64.0f) {
      // Where (v0 + 64 v1) * (1 / 65) rounds to another float than the
      // quotient does.
      values[0].insert(values[0].end(), {0x1.7ffffep-23f, -0x1.000004p-24f});
      values[1].insert(values[1].end(), {0x1.f8d2fep+0f, 0x1.fd93b2p+0f});
    }
    for (bool kept : {false, true}) {
      EXPECT_EQ(Bits(RoundMeanOf(values, weights, kept)), Bits(WeightedMean(values, weights)))
          << "weights " << ::testing::PrintToString(weights) << (kept ? ", kept" : "");
    }
  }
}

// A kept push is read when the round next needs it and released once the
// round is done with it: when the second push has read it, or at the mean.
TEST(RoundTableTest, AKeptPushIsReleasedOnceTheRoundHasReadIt) {
  for (uint32_t ranks : {2u, 3u}) {
    RoundTable table(SmallOptions(ranks));
    std::vector<std::shared_ptr<int>> keep;
    std::vector<Answer> answers(ranks);
    const std::vector<std::vector<float>> values = {{1.0f, -0.0f}, {2.0f, -0.0f}, {4.0f, 8.0f}};
    for (uint32_t r = 0; r < ranks; ++r) {
      keep.push_back(std::make_shared<int>(r));
      table.Push({1, 0, 0}, r, 1.0f, kLr, values[r], kT0, answers[r].Callback(), keep[r]);
      if (r + 1 < ranks) {
        EXPECT_EQ(keep[0].use_count(), r == 0 ? 2 : 1) << ranks << " ranks";
      }
    }
    ASSERT_TRUE(answers[0].ok()) << answers[0].status();
    for (uint32_t r = 0; r < ranks; ++r) EXPECT_EQ(keep[r].use_count(), 1) << "rank " << r;
    EXPECT_EQ(Bits(answers[0].mean()),
              Bits(WeightedMean({values.begin(), values.begin() + ranks},
                                std::vector<float>(ranks, 1.0f))));
  }
}

// An elastic round that completes with its one kept push: the mean of that
// push alone.
TEST(RoundTableTest, AnElasticRoundCompletesFromItsOneKeptPush) {
  RoundTable::Options o = SmallOptions(3);
  o.limits.timeout = absl::Seconds(10);
  o.limits.elastic = true;
  RoundTable table(o);
  const std::vector<float> values = {3.0f, -0.0f, 1e-40f};
  auto keep = std::make_shared<int>(0);
  Answer a;
  table.Push({4, 2, 0}, 0, 2.5f, kLr, values, kT0, a.Callback(), keep);
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Bits(a.mean()), Bits(WeightedMean({values}, {2.5f})));
  EXPECT_EQ(keep.use_count(), 1);
}

TEST(RoundTableTest, OnCompleteCalledOnceBeforeWaiters) {
  std::vector<std::string> events;
  std::vector<float> applied;
  RoundTable::Options o = SmallOptions(2);
  o.on_complete = [&](const RoundKey& key, float lr, absl::Span<const float> mean) {
    events.push_back("complete step " + std::to_string(key.step));
    EXPECT_EQ(lr, kLr);
    applied.assign(mean.begin(), mean.end());
  };
  RoundTable table(o);
  const RoundKey key{1, 0, 0};
  const std::vector<float> v0 = {2.0f, 4.0f}, v1 = {6.0f, 0.0f};
  auto record = [&](int rank) {
    return [&events, rank](absl::StatusOr<RoundMean> r) {
      EXPECT_TRUE(r.ok()) << r.status();
      events.push_back("answer " + std::to_string(rank));
    };
  };
  table.Push(key, 0, 1.0f, kLr, v0, kT0, record(0));
  EXPECT_TRUE(events.empty());
  table.Push(key, 1, 1.0f, kLr, v1, kT0, record(1));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], "complete step 1");
  EXPECT_THAT(std::vector<std::string>(events.begin() + 1, events.end()),
              ::testing::UnorderedElementsAre("answer 0", "answer 1"));
  EXPECT_THAT(applied, ElementsAreArray({4.0f, 2.0f}));
}

TEST(RoundTableTest, OnLatencyReportsFirstToCompletingPushOfCompletedRoundsOnly) {
  std::vector<std::string> events;
  std::vector<std::pair<RoundKey, absl::Duration>> latencies;
  RoundTable::Options o = SmallOptions(2);
  o.limits.timeout = absl::Seconds(10);
  o.on_complete = [&](const RoundKey&, float, absl::Span<const float>) {
    events.push_back("complete");
  };
  o.on_latency = [&](const RoundKey& key, absl::Duration latency) {
    events.push_back("latency");
    latencies.emplace_back(key, latency);
  };
  RoundTable table(o);
  const RoundKey key{1, 1, 0};
  Answer a0, retry, a1;
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0, a0.Callback());
  // A retry later than the first push does not move the round's start.
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0 + absl::Seconds(2),
             retry.Callback());
  EXPECT_TRUE(latencies.empty());
  table.Push(key, 1, 1.0f, kLr, std::vector<float>{1.0f}, kT0 + absl::Seconds(3),
             [&](absl::StatusOr<RoundMean> r) {
               events.push_back("answer");
               a1.Callback()(std::move(r));
             });
  ASSERT_TRUE(a1.ok()) << a1.status();
  ASSERT_EQ(latencies.size(), 1u);
  EXPECT_EQ(latencies[0].first, key);
  EXPECT_EQ(latencies[0].second, absl::Seconds(3));
  EXPECT_THAT(events, ElementsAreArray({"complete", "latency", "answer"}));

  // A round that times out reports none.
  Answer lone;
  table.Push(RoundKey{2, 1, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             lone.Callback());
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  EXPECT_EQ(latencies.size(), 1u);
}

TEST(RoundTableTest, RetryWhileOpenJoinsWaitersAndIsNotCountedTwice) {
  int completions = 0;
  RoundTable::Options o = SmallOptions(3);
  o.on_complete = [&](const RoundKey&, float, absl::Span<const float>) {
    ++completions;
  };
  RoundTable table(o);
  const RoundKey key{2, 0, 0};
  const std::vector<float> v0 = {3.0f}, v1 = {5.0f}, v2 = {10.0f};
  Answer first, retry, a1, a2;
  table.Push(key, 0, 1.0f, kLr, v0, kT0, first.Callback());
  table.Push(key, 1, 1.0f, kLr, v1, kT0, a1.Callback());
  // The retry carries other values: counted, it would both change the mean
  // and (counting pushes instead of ranks) complete the round.
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1000.0f}, kT0,
             retry.Callback());
  EXPECT_EQ(completions, 0);
  EXPECT_EQ(first.calls + retry.calls + a1.calls, 0);
  EXPECT_EQ(table.open_rounds(), 1u);

  table.Push(key, 2, 1.0f, kLr, v2, kT0, a2.Callback());
  EXPECT_EQ(completions, 1);
  const std::vector<float> expected =
      WeightedMean({v0, v1, v2}, {1.0f, 1.0f, 1.0f});
  for (Answer* a : {&first, &retry, &a1, &a2}) {
    ASSERT_EQ(a->calls, 1);
    ASSERT_TRUE(a->ok()) << a->status();
    EXPECT_THAT(a->mean(), ElementsAreArray(expected));
  }
}

TEST(RoundTableTest, RetryAfterCompletionIsAnsweredFromRetainedMean) {
  int completions = 0;
  RoundTable::Options o = SmallOptions(2);
  o.on_complete = [&](const RoundKey&, float, absl::Span<const float>) {
    ++completions;
  };
  RoundTable table(o);
  const RoundKey key{1, 0, 0};
  Answer a0, a1, retry;
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f, 2.0f}, kT0,
             a0.Callback());
  table.Push(key, 1, 3.0f, kLr, std::vector<float>{5.0f, 6.0f}, kT0,
             a1.Callback());
  ASSERT_TRUE(a1.ok());
  table.Push(key, 1, 3.0f, kLr, std::vector<float>{-7.0f, -7.0f}, kT0,
             retry.Callback());
  ASSERT_EQ(retry.calls, 1);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry.result->value().get(), a1.result->value().get());
  EXPECT_THAT(retry.mean(), ElementsAreArray(WeightedMean(
                                {{1.0f, 2.0f}, {5.0f, 6.0f}}, {1.0f, 3.0f})));
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(table.rounds_completed(), 1u);
  EXPECT_EQ(table.open_rounds(), 0u);
}

TEST(RoundTableTest, RetryDuringOnCompleteWaitsForItAndGetsTheSameMean) {
  std::vector<std::string> events;
  RoundTable* table_ptr = nullptr;
  Answer retry;
  const RoundKey key{1, 0, 0};
  RoundTable::Options o = SmallOptions(1);
  o.on_complete = [&](const RoundKey& k, float, absl::Span<const float>) {
    events.push_back("complete");
    // A retry arriving while the shard applies the mean: it must neither be
    // answered yet nor open a new round (and the table's lock is not held,
    // or this would deadlock).
    table_ptr->Push(k, 0, 1.0f, kLr, std::vector<float>{9.0f}, kT0,
                    retry.Callback());
    EXPECT_EQ(retry.calls, 0);
    EXPECT_EQ(table_ptr->open_rounds(), 0u);
  };
  RoundTable table(o);
  table_ptr = &table;
  Answer first;
  table.Push(key, 0, 2.0f, kLr, std::vector<float>{4.0f}, kT0, first.Callback());
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(first.calls, 1);
  ASSERT_EQ(retry.calls, 1);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry.result->value().get(), first.result->value().get());
  EXPECT_THAT(retry.mean(), ElementsAreArray({4.0f}));
  EXPECT_EQ(table.rounds_completed(), 1u);
}

TEST(RoundTableTest, CallbackMayPushAgainInline) {
  RoundTable table(SmallOptions(1));
  Answer second;
  table.Push(RoundKey{1, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             [&](absl::StatusOr<RoundMean> r) {
               ASSERT_TRUE(r.ok());
               table.Push(RoundKey{2, 0, 0}, 0, 1.0f, kLr,
                          std::vector<float>{(*r.value())[0] + 1.0f}, kT0,
                          second.Callback());
             });
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(second.mean(), ElementsAreArray({2.0f}));
  EXPECT_EQ(table.newest_step(), 2u);
}

TEST(RoundTableTest, RejectsRankOutOfRange) {
  RoundTable table(SmallOptions(3));
  Answer a;
  table.Push(RoundKey{1, 0, 0}, 3, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             a.Callback());
  ASSERT_EQ(a.calls, 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("rank 3"));
  EXPECT_THAT(a.status().message(), HasSubstr("world_size 3"));
  EXPECT_THAT(a.status().message(),
              HasSubstr("(step 1, stream STREAM_UNSPECIFIED, chunk 0)"));
  EXPECT_EQ(table.open_rounds(), 0u);
}

TEST(RoundTableTest, RejectsBadWeights) {
  RoundTable table(SmallOptions(2));
  const RoundKey key{1, 0, 0};
  for (float w : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    Answer a;
    table.Push(key, 0, w, kLr, std::vector<float>{1.0f}, kT0, a.Callback());
    ASSERT_EQ(a.calls, 1) << "weight " << w;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument)
        << "weight " << w;
    EXPECT_THAT(a.status().message(), HasSubstr("weight"));
    EXPECT_THAT(a.status().message(), HasSubstr("rank 0"));
  }
  // None of them joined the round: rank 0 still counts as missing.
  EXPECT_EQ(table.open_rounds(), 0u);
  Answer a0, a1;
  table.Push(key, 1, 1.0f, kLr, std::vector<float>{2.0f}, kT0, a1.Callback());
  EXPECT_EQ(a1.calls, 0);
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{4.0f}, kT0, a0.Callback());
  ASSERT_TRUE(a1.ok());
  EXPECT_THAT(a1.mean(), ElementsAreArray({3.0f}));
}

TEST(RoundTableTest, RejectsLengthMismatch) {
  RoundTable table(SmallOptions(2));
  const RoundKey key{1, 0, 0};
  Answer a0, bad, a1, bad_retry;
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f, 2.0f}, kT0,
             a0.Callback());
  table.Push(key, 1, 1.0f, kLr, std::vector<float>{1.0f, 2.0f, 3.0f}, kT0,
             bad.Callback());
  ASSERT_EQ(bad.calls, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("length 3"));
  EXPECT_THAT(bad.status().message(), HasSubstr("length 2"));
  EXPECT_THAT(bad.status().message(), HasSubstr("rank 1"));
  EXPECT_EQ(a0.calls, 0) << "a refused push must not complete the round";

  table.Push(key, 1, 1.0f, kLr, std::vector<float>{3.0f, 4.0f}, kT0,
             a1.Callback());
  ASSERT_TRUE(a1.ok());
  // A retry of the completed round with another length is refused too.
  table.Push(key, 1, 1.0f, kLr, std::vector<float>{3.0f}, kT0,
             bad_retry.Callback());
  ASSERT_EQ(bad_retry.calls, 1);
  EXPECT_EQ(bad_retry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_retry.status().message(), HasSubstr("length 1"));
}

TEST(RoundTableTest, RejectsStepTooFarAhead) {
  RoundTable::Options o = SmallOptions(1);
  o.limits.max_step_lag = 2;
  RoundTable table(o);
  Answer ahead;
  table.Push(RoundKey{3, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             ahead.Callback());
  ASSERT_EQ(ahead.calls, 1);
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(ahead.status().message(), HasSubstr("step 3 is too far ahead"));
  EXPECT_THAT(ahead.status().message(),
              HasSubstr("newest completed step is 0, max_step_lag 2"));

  Answer at_limit;
  table.Push(RoundKey{2, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             at_limit.Callback());
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  // The window moves with the newest completed step, over all streams.
  Answer now_ok, still_ahead;
  table.Push(RoundKey{4, 1, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             now_ok.Callback());
  EXPECT_TRUE(now_ok.ok()) << now_ok.status();
  table.Push(RoundKey{7, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             still_ahead.Callback());
  EXPECT_EQ(still_ahead.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(still_ahead.status().message(),
              HasSubstr("newest completed step is 4"));
}

TEST(RoundTableTest, RetirementKeepsOnlyRetainedStepsPerStream) {
  RoundTable::Options o = SmallOptions(1);
  o.limits.retained_rounds = 3;
  o.limits.max_step_lag = 1;
  RoundTable table(o);
  constexpr uint64_t kSteps = 100;
  // Every step has two chunks; the mean of step s chunk c is s * 10 + c.
  for (uint64_t s = 1; s <= kSteps; ++s) {
    for (uint32_t c = 0; c < 2; ++c) {
      Answer a;
      table.Push(RoundKey{s, 0, c}, 0, 1.0f, kLr,
                 std::vector<float>{static_cast<float>(s * 10 + c)}, kT0,
                 a.Callback());
      ASSERT_TRUE(a.ok()) << a.status();
    }
  }
  EXPECT_EQ(table.rounds_completed(), 2 * kSteps);

  // The newest three steps are answered from the retained mean (not from
  // the retry's values), all chunks of them.
  for (uint64_t s = kSteps - 2; s <= kSteps; ++s) {
    for (uint32_t c = 0; c < 2; ++c) {
      Answer retry;
      table.Push(RoundKey{s, 0, c}, 0, 1.0f, kLr, std::vector<float>{-1.0f}, kT0,
                 retry.Callback());
      ASSERT_TRUE(retry.ok()) << "step " << s << ": " << retry.status();
      EXPECT_THAT(retry.mean(),
                  ElementsAreArray({static_cast<float>(s * 10 + c)}));
    }
  }
  // Older ones are retired: a retry, or a new chunk of such a step, is
  // refused rather than starting a round that would never be answered.
  for (uint64_t s : {uint64_t{1}, uint64_t{50}, kSteps - 3}) {
    Answer retry;
    table.Push(RoundKey{s, 0, 0}, 0, 1.0f, kLr, std::vector<float>{-1.0f}, kT0,
               retry.Callback());
    ASSERT_EQ(retry.calls, 1);
    EXPECT_EQ(retry.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(retry.status().message(),
                HasSubstr("step " + std::to_string(s) +
                          " of stream STREAM_UNSPECIFIED is too far behind"));
    EXPECT_THAT(retry.status().message(),
                HasSubstr("rounds up to step " + std::to_string(kSteps - 3) +
                          " are retired"));
  }
  Answer new_chunk;
  table.Push(RoundKey{kSteps - 3, 0, 7}, 0, 1.0f, kLr, std::vector<float>{1.0f},
             kT0, new_chunk.Callback());
  EXPECT_EQ(new_chunk.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table.rounds_completed(), 2 * kSteps);
  EXPECT_EQ(table.open_rounds(), 0u);

  // Retirement is per stream: stream 1 has retired nothing, so an old step
  // there is only limited by the "ahead" side.
  Answer other_stream;
  table.Push(RoundKey{50, 1, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             other_stream.Callback());
  EXPECT_TRUE(other_stream.ok()) << other_stream.status();
}

TEST(RoundTableTest, ExpireOverdueNamesMissingRanks) {
  RoundTable::Options o = SmallOptions(3);
  o.limits.timeout = absl::Seconds(10);
  o.limits.max_step_lag = 16;
  int completions = 0;
  o.on_complete = [&](const RoundKey&, float, absl::Span<const float>) {
    ++completions;
  };
  RoundTable table(o);
  const RoundKey key{12, 1, 0};
  Answer a0, retry0;
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0, a0.Callback());
  // A retry later does not move the round's deadline.
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0 + absl::Seconds(5),
             retry0.Callback());
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(10));

  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(9)), 0);
  EXPECT_EQ(a0.calls, 0);
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  for (Answer* a : {&a0, &retry0}) {
    ASSERT_EQ(a->calls, 1);
    EXPECT_EQ(a->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(a->status().message(),
                HasSubstr("round (step 12, stream GRAD, chunk 0) timed out"));
    EXPECT_THAT(a->status().message(), HasSubstr("10s"));
    EXPECT_THAT(a->status().message(), HasSubstr("missing ranks 1, 2"));
  }
  EXPECT_EQ(table.rounds_failed(), 1u);
  EXPECT_EQ(table.open_rounds(), 0u);
  EXPECT_EQ(table.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(100)), 0);

  // The failed round is forgotten: rank 0's earlier push does not count.
  Answer b1, b2, b0;
  table.Push(key, 1, 1.0f, kLr, std::vector<float>{2.0f}, kT0 + absl::Seconds(20),
             b1.Callback());
  table.Push(key, 2, 1.0f, kLr, std::vector<float>{4.0f}, kT0 + absl::Seconds(20),
             b2.Callback());
  EXPECT_EQ(b1.calls, 0);
  EXPECT_EQ(completions, 0);
  table.Push(key, 0, 1.0f, kLr, std::vector<float>{6.0f}, kT0 + absl::Seconds(21),
             b0.Callback());
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_THAT(b1.mean(), ElementsAreArray({4.0f}));
  EXPECT_EQ(completions, 1);
}

// Elastic: the overdue round completes with the ranks that pushed,
// reweighted; the missing rank is dropped, which completes the rounds that
// waited only for it, refuses its pushes, and later rounds need only the
// others.
TEST(RoundTableTest, ElasticOverdueRoundCompletesWithoutTheMissingAndDropsThem) {
  RoundTable::Options o = SmallOptions(3);
  o.limits.timeout = absl::Seconds(10);
  o.limits.elastic = true;
  int completions = 0;
  o.on_complete = [&](const RoundKey&, float, absl::Span<const float>) { ++completions; };
  RoundTable table(o);
  std::vector<uint32_t> dropped;
  table.SetDropObserver([&](const std::vector<uint32_t>& ranks, const std::string& round) {
    dropped.insert(dropped.end(), ranks.begin(), ranks.end());
    EXPECT_THAT(round, HasSubstr("step 4"));
  });
  const RoundKey overdue{4, 2, 0}, waiting{4, 2, 1}, later{5, 2, 0};
  const std::vector<std::vector<float>> values = {{1.0f, -3.0f}, {7.0f, 0.5f}};
  const std::vector<float> weights = {1.0f, 3.0f};
  Answer a[2], w[2];
  for (uint32_t r = 0; r < 2; ++r) {
    table.Push(overdue, r, weights[r], kLr, values[r], kT0, a[r].Callback());
    table.Push(waiting, r, weights[r], kLr, values[r], kT0 + absl::Seconds(5), w[r].Callback());
  }
  EXPECT_EQ(table.members(), 3u);
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  EXPECT_THAT(dropped, ElementsAreArray({2u}));
  EXPECT_EQ(table.members(), 2u);
  EXPECT_THAT(table.dropped_ranks(), ElementsAreArray({2u}));
  const std::vector<float> expected = WeightedMean(values, weights);
  for (Answer* answer : {&a[0], &a[1], &w[0], &w[1]}) {
    ASSERT_TRUE(answer->ok()) << answer->status();
    EXPECT_THAT(answer->mean(), ElementsAreArray(expected));
  }
  EXPECT_EQ(completions, 2);
  EXPECT_EQ(table.rounds_failed(), 0u);
  EXPECT_EQ(table.open_rounds(), 0u);

  Answer late;
  table.Push(later, 2, 1.0f, kLr, values[0], kT0 + absl::Seconds(11), late.Callback());
  ASSERT_EQ(late.calls, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("rank 2 was dropped"));
  Answer next[2];
  for (uint32_t r = 0; r < 2; ++r) {
    table.Push(later, r, weights[r], kLr, values[r], kT0 + absl::Seconds(11), next[r].Callback());
  }
  ASSERT_TRUE(next[0].ok()) << next[0].status();
  EXPECT_THAT(next[0].mean(), ElementsAreArray(expected));
}

// Elastic: a dead rank misses every chunk of a step, so several rounds are
// overdue at once; the first drops it and the others complete with it
// gone, reported once.
TEST(RoundTableTest, ElasticOverdueChunksMissingOneRankReportOneDrop) {
  RoundTable::Options o = SmallOptions(3);
  o.limits.timeout = absl::Seconds(10);
  o.limits.elastic = true;
  RoundTable table(o);
  std::vector<std::vector<uint32_t>> drops;
  table.SetDropObserver([&](const std::vector<uint32_t>& ranks, const std::string&) {
    drops.push_back(ranks);
  });
  Answer a[2][2];
  for (uint32_t chunk = 0; chunk < 2; ++chunk) {
    for (uint32_t r = 0; r < 2; ++r) {
      table.Push({4, 1, chunk}, r, 1.0f, kLr, std::vector<float>{float(r)}, kT0,
                 a[chunk][r].Callback());
    }
  }
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_THAT(drops[0], ElementsAreArray({2u}));
  EXPECT_EQ(table.members(), 2u);
  for (auto& chunk : a) {
    for (Answer& answer : chunk) {
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_THAT(answer.mean(), ElementsAreArray({0.5f}));
    }
  }
  EXPECT_EQ(table.open_rounds(), 0u);
}

// A round no remaining member pushed to fails, elastic or not.
TEST(RoundTableTest, ElasticRoundOfDroppedRanksOnlyFails) {
  RoundTable::Options o = SmallOptions(2);
  o.limits.timeout = absl::Seconds(10);
  o.limits.elastic = true;
  RoundTable table(o);
  Answer first, second;
  // Rank 1 pushes chunk 1 only; chunk 0 drops it at its timeout.
  table.Push({6, 2, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0, first.Callback());
  table.Push({6, 2, 1}, 1, 1.0f, kLr, std::vector<float>{1.0f}, kT0 + absl::Seconds(1),
             second.Callback());
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(second.calls, 0);
  EXPECT_EQ(table.members(), 1u);
  // Chunk 1 holds rank 1's push alone, and rank 0 has not pushed it: it
  // fails at its own timeout, naming rank 0.
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(11)), 1);
  ASSERT_EQ(second.calls, 1);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(second.status().message(), HasSubstr("missing ranks 0"));
  EXPECT_EQ(table.members(), 1u);
}

// An elastic table of 3 ranks whose rounds time out after 10 s, for
// admissions up to 16 steps ahead.
RoundTable::Options AdmittingOptions() {
  RoundTable::Options o = SmallOptions(3);
  o.limits.timeout = absl::Seconds(10);
  o.limits.elastic = true;
  o.limits.max_step_lag = 16;
  return o;
}

// Elastic: a dropped rank admitted back from step 8 is not waited for in
// step 8's full average (stream 3), which the others complete alone and
// which refuses its push, but in every later round of step 8 and after.
TEST(RoundTableTest, ElasticAdmitTakesADroppedRankBackAfterTheStepsFullAverage) {
  RoundTable table(AdmittingOptions());
  constexpr int kGrad = 1, kFull = 3;
  auto push_all = [&](const RoundKey& key, const std::vector<uint32_t>& ranks,
                      absl::Time now, std::vector<Answer>* answers) {
    answers->resize(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      table.Push(key, ranks[i], 1.0f, kLr, std::vector<float>{float(ranks[i] + 1)}, now,
                 (*answers)[i].Callback());
    }
  };
  std::vector<Answer> dropping;
  push_all({4, kGrad, 0}, {0, 1}, kT0, &dropping);
  ASSERT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  EXPECT_EQ(table.members(), 2u);
  EXPECT_THAT(table.times_dropped(), ElementsAreArray({0u, 0u, 1u}));

  const absl::Status member = table.Admit(0, 8);
  EXPECT_EQ(member.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(member.message(), HasSubstr("rank 0 is still a member"));
  ASSERT_TRUE(table.Admit(2, 8).ok());
  EXPECT_TRUE(table.Admit(2, 8).ok()) << "the same admission again";
  const absl::Status other = table.Admit(2, 12);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("already admitted back from step 8"));
  EXPECT_EQ(table.members(), 3u);
  EXPECT_THAT(table.admitted_ranks(), ElementsAreArray({2u}));

  const absl::Time t = kT0 + absl::Seconds(11);
  std::vector<Answer> full;
  push_all({8, kFull, 0}, {0, 1}, t, &full);
  for (Answer& a : full) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(a.mean(), ElementsAreArray({1.5f})) << "the full average is the others'";
  }
  std::vector<Answer> early;
  push_all({8, kFull, 0}, {2}, t, &early);
  EXPECT_EQ(early[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early[0].status().message(), HasSubstr("admitted back from the rounds of step 8"));

  for (const RoundKey& key : {RoundKey{8, kGrad, 0}, RoundKey{9, kGrad, 0}}) {
    std::vector<Answer> two, third;
    push_all(key, {0, 1}, t, &two);
    EXPECT_EQ(two[0].calls, 0) << "waits for the admitted rank";
    push_all(key, {2}, t, &third);
    ASSERT_TRUE(third[0].ok()) << third[0].status();
    EXPECT_THAT(third[0].mean(), ElementsAreArray({2.0f}));
    EXPECT_TRUE(two[0].ok());
  }

  // Dropped again at step 10, it cannot come back at a step already done.
  std::vector<Answer> again;
  push_all({10, kGrad, 0}, {0, 1}, t, &again);
  ASSERT_EQ(table.ExpireOverdue(t + absl::Seconds(10)), 1);
  EXPECT_THAT(table.times_dropped(), ElementsAreArray({0u, 0u, 2u}));
  const absl::Status late = table.Admit(2, 10);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("rounds up to step 10 have completed"));
  EXPECT_TRUE(table.Admit(2, 12).ok());
  EXPECT_THAT(table.admitted_ranks(), ElementsAreArray({2u, 2u}));
}

// Elastic: a round that has begun counts the pushes of the members it
// began with, so a dropped rank is not admitted into it (its push would be
// left out of the mean), only from a step none of whose rounds it would
// join has begun; a full average under way does not stand in the way.
TEST(RoundTableTest, ElasticAdmitRefusesAStepWhoseRoundsHaveBegun) {
  RoundTable table(AdmittingOptions());
  constexpr int kGrad = 1, kFull = 3;
  Answer dropping[2];
  for (uint32_t r = 0; r < 2; ++r) {
    table.Push({4, kGrad, 0}, r, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
               dropping[r].Callback());
  }
  ASSERT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(10)), 1);
  const absl::Time t = kT0 + absl::Seconds(11);

  Answer begun[2];
  table.Push({8, kGrad, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, t, begun[0].Callback());
  const absl::Status refused = table.Admit(2, 8);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("cannot be admitted from step 8: round (step 8, stream GRAD, chunk 0) "
                        "has begun without it"));
  EXPECT_EQ(table.members(), 2u);
  table.Push({8, kGrad, 0}, 1, 1.0f, kLr, std::vector<float>{3.0f}, t, begun[1].Callback());
  for (Answer& a : begun) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(a.mean(), ElementsAreArray({2.0f}));
  }

  Answer full[2];
  table.Push({12, kFull, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, t, full[0].Callback());
  ASSERT_TRUE(table.Admit(2, 12).ok());
  EXPECT_EQ(table.members(), 3u);
  table.Push({12, kFull, 0}, 1, 1.0f, kLr, std::vector<float>{3.0f}, t, full[1].Callback());
  for (Answer& a : full) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(a.mean(), ElementsAreArray({2.0f}));
  }
}

TEST(RoundTableTest, AdmitRefusesOutsideAnElasticJob) {
  RoundTable fixed(SmallOptions(2));
  const absl::Status refused = fixed.Admit(1, 8);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("not elastic"));
  RoundTable::Options o = SmallOptions(2);
  o.limits.elastic = true;
  RoundTable elastic(o);
  EXPECT_EQ(elastic.Admit(2, 8).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RoundTableTest, NextDeadlineIsTheEarliestOpenRound) {
  RoundTable::Options o = SmallOptions(2);
  o.limits.timeout = absl::Seconds(30);
  // Before the table, whose destructor answers `a`'s open round.
  Answer a, b, c, d;
  RoundTable table(o);
  EXPECT_EQ(table.NextDeadline(), absl::InfiniteFuture());
  table.Push(RoundKey{2, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f},
             kT0 + absl::Seconds(7), a.Callback());
  table.Push(RoundKey{1, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f},
             kT0 + absl::Seconds(3), b.Callback());
  table.Push(RoundKey{1, 1, 0}, 1, 1.0f, kLr, std::vector<float>{1.0f},
             kT0 + absl::Seconds(5), c.Callback());
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(33));
  // Completing the earliest round moves the deadline to the next one.
  table.Push(RoundKey{1, 0, 0}, 1, 1.0f, kLr, std::vector<float>{1.0f},
             kT0 + absl::Seconds(8), d.Callback());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(35));
  EXPECT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(36)), 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(c.status().message(), HasSubstr("missing ranks 0"));
  EXPECT_EQ(a.calls, 0);
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(37));
}

TEST(RoundTableTest, FailAllAnswersWaitersAndLaterPushes) {
  RoundTable table(SmallOptions(2));
  Answer waiting, done0, done1;
  table.Push(RoundKey{1, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             done0.Callback());
  table.Push(RoundKey{1, 0, 0}, 1, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             done1.Callback());
  ASSERT_TRUE(done0.ok());
  table.Push(RoundKey{2, 0, 0}, 0, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             waiting.Callback());
  EXPECT_EQ(waiting.calls, 0);

  table.FailAll("server shutting down");
  ASSERT_EQ(waiting.calls, 1);
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(waiting.status().message(), HasSubstr("server shutting down"));
  EXPECT_THAT(waiting.status().message(),
              HasSubstr("(step 2, stream STREAM_UNSPECIFIED, chunk 0)"));
  EXPECT_EQ(table.open_rounds(), 0u);
  EXPECT_EQ(table.rounds_failed(), 1u);

  // New rounds and retries of completed ones are refused the same way.
  Answer fresh, retry;
  table.Push(RoundKey{2, 0, 0}, 1, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             fresh.Callback());
  table.Push(RoundKey{1, 0, 0}, 1, 1.0f, kLr, std::vector<float>{1.0f}, kT0,
             retry.Callback());
  for (Answer* a : {&fresh, &retry}) {
    ASSERT_EQ(a->calls, 1);
    EXPECT_EQ(a->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(a->status().message(), HasSubstr("server shutting down"));
    EXPECT_THAT(a->status().message(), HasSubstr("rank 1"));
  }
  EXPECT_EQ(table.open_rounds(), 0u);
}

TEST(RoundTableTest, ConcurrentPushesAnswerEveryCallbackOnceWithTheMean) {
  constexpr uint32_t kWorld = 4;
  constexpr uint64_t kSteps = 60;
  constexpr uint32_t kChunks = 3;
  constexpr size_t kLength = 5;
  constexpr size_t kRounds = kSteps * kChunks;
  // Integer values and weights make every partial sum exact in double, so
  // the mean does not depend on the order the ranks arrive in.
  auto value = [](uint32_t rank, uint64_t step, uint32_t chunk, size_t i) {
    return static_cast<float>((rank * 31 + step * 7 + chunk * 3 + i) % 97);
  };
  auto weight = [](uint32_t rank) { return static_cast<float>(rank + 1); };
  auto index = [](uint64_t step, uint32_t chunk) {
    return static_cast<size_t>((step - 1) * kChunks + chunk);
  };
  std::vector<std::vector<float>> expected(kRounds);
  for (uint64_t s = 1; s <= kSteps; ++s) {
    for (uint32_t c = 0; c < kChunks; ++c) {
      std::vector<std::vector<float>> values(kWorld);
      std::vector<float> weights(kWorld);
      for (uint32_t r = 0; r < kWorld; ++r) {
        weights[r] = weight(r);
        for (size_t i = 0; i < kLength; ++i) {
          values[r].push_back(value(r, s, c, i));
        }
      }
      expected[index(s, c)] = WeightedMean(values, weights);
    }
  }

  std::vector<std::atomic<int>> completions(kRounds);
  std::vector<std::atomic<int>> answers(kRounds * kWorld * 2);
  std::atomic<int> wrong{0};
  RoundTable::Options o;
  o.limits.world_size = kWorld;
  o.limits.max_step_lag = kSteps;
  o.limits.retained_rounds = kSteps;
  o.limits.timeout = absl::Hours(1);
  o.on_complete = [&](const RoundKey& key, float, absl::Span<const float> mean) {
    completions[index(key.step, key.chunk)].fetch_add(1);
    if (mean != absl::MakeConstSpan(expected[index(key.step, key.chunk)])) wrong.fetch_add(1);
  };
  RoundTable table(o);

  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (uint64_t s = 1; s <= kSteps; ++s) {
        for (uint32_t c = 0; c < kChunks; ++c) {
          std::vector<float> values(kLength);
          for (size_t i = 0; i < kLength; ++i) values[i] = value(r, s, c, i);
          // Every rank pushes each round twice (a retry).
          for (int attempt = 0; attempt < 2; ++attempt) {
            const size_t slot = (index(s, c) * kWorld + r) * 2 + attempt;
            table.Push(RoundKey{s, 0, c}, r, weight(r), kLr, values, kT0,
                       [&, s, c, slot](absl::StatusOr<RoundMean> mean) {
                         answers[slot].fetch_add(1);
                         if (!mean.ok() ||
                             absl::MakeConstSpan(**mean) !=
                                 absl::MakeConstSpan(expected[index(s, c)])) {
                           wrong.fetch_add(1);
                         }
                       });
          }
        }
      }
    });
  }
  // Polls the timers alongside; nothing is overdue within the hour.
  threads.emplace_back([&] {
    for (int i = 0; i < 2000; ++i) {
      if (table.ExpireOverdue(kT0 + absl::Minutes(1)) != 0) wrong.fetch_add(1);
      (void)table.NextDeadline();
    }
  });
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(wrong.load(), 0);
  for (size_t i = 0; i < kRounds; ++i) {
    EXPECT_EQ(completions[i].load(), 1) << "round " << i;
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    EXPECT_EQ(answers[i].load(), 1) << "callback " << i;
  }
  EXPECT_EQ(table.rounds_completed(), kRounds);
  EXPECT_EQ(table.rounds_failed(), 0u);
  EXPECT_EQ(table.open_rounds(), 0u);
  EXPECT_EQ(table.newest_step(), kSteps);
}

TEST(RoundTableTest, CountsRoundsByStream) {
  RoundTable table(SmallOptions(2));
  const std::vector<float> v = {1.0f, 2.0f};
  // Stream 1 (GRAD): two completed rounds; stream 2 (MODEL): one completed,
  // one timed out, one failed at shutdown.
  for (uint64_t step = 0; step < 2; ++step) {
    Answer a[2];
    for (uint32_t r = 0; r < 2; ++r) {
      table.Push(RoundKey{step, 1, 0}, r, 1.0f, kLr, v, kT0, a[r].Callback());
    }
    ASSERT_TRUE(a[1].ok()) << a[1].status();
  }
  Answer m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    table.Push(RoundKey{0, 2, 0}, r, 1.0f, kLr, v, kT0, m[r].Callback());
  }
  ASSERT_TRUE(m[1].ok()) << m[1].status();
  Answer overdue, at_shutdown;
  table.Push(RoundKey{1, 2, 0}, 0, 1.0f, kLr, v, kT0, overdue.Callback());
  ASSERT_EQ(table.ExpireOverdue(kT0 + absl::Seconds(60)), 1);
  table.Push(RoundKey{2, 2, 0}, 0, 1.0f, kLr, v, kT0, at_shutdown.Callback());
  table.FailAll("stopping");
  ASSERT_EQ(at_shutdown.calls, 1);

  EXPECT_EQ(table.rounds_completed(1), 2u);
  EXPECT_EQ(table.rounds_failed(1), 0u);
  EXPECT_EQ(table.rounds_completed(2), 1u);
  EXPECT_EQ(table.rounds_failed(2), 2u);
  EXPECT_EQ(table.rounds_completed(0), 0u);
  // The totals are the sums.
  EXPECT_EQ(table.rounds_completed(), 3u);
  EXPECT_EQ(table.rounds_failed(), 2u);
}

}  // namespace
}  // namespace cserps
