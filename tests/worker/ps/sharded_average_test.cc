// PsClient::BeginShardedAverage against AverageBlocks on a real in-process
// cluster: two identical clusters run the same round, one through each
// call, and must give bit-identical means. The payloads are gathered here
// from the documented layout (common/block_layout.h: shard s owns blocks
// [s*ceil(B/S), min(B, (s+1)*ceil(B/S)))), not through ShardPayload.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grbs.h"
#include "common/status.h"
#include "common/prng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using testing::InProcessCluster;
using testing::TestConfig;

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kShards = 3;
constexpr uint32_t kBlockSize = 64;
// SOFTMAX 9999 -> 10: d = 100000 = 1562 blocks of 64 and one of 32; with
// 3 shards of 521 blocks, a full shard payload spans 3 chunks of a 64 KiB
// message.
constexpr uint64_t kInputDim = 9999;
constexpr uint64_t kD = kInputDim * 10 + 10;

v1::JobConfig MakeConfig() {
  return TestConfig(absl::StrCat(R"pb(
    name: "sharded-average-test"
    seed: 77
    cluster {
      servers: "127.0.0.1:0" servers: "127.0.0.1:0" servers: "127.0.0.1:0"
      num_workers: )pb", kWorkers, R"pb(
      max_message_bytes: 65536
      round_timeout_s: 10
    }
    model { kind: SOFTMAX input_dim: )pb", kInputDim, R"pb( num_classes: 10 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 }
    algorithm {
      name: "cser" cser_variant: GRADIENT_BLOCKS period: 2 ratio_c1: 4 ratio_c2: 8
      block_size: )pb", kBlockSize, R"pb(
    }
    epochs: 1
  )pb"));
}

std::vector<float> RankValues(int rank, uint64_t step) {
  std::vector<float> v(kD);
  CounterRng rng(1000 * rank + step);
  for (float& x : v) x = rng.UniformFloat() * 4 - 2;
  return v;
}

// Global float ranges [begin, end) of the blocks of `shard` that `blocks`
// (ascending) selects.
std::vector<std::pair<uint64_t, uint64_t>> ShardRanges(const std::vector<uint64_t>& blocks,
                                                       uint32_t shard) {
  const uint64_t num_blocks = (kD + kBlockSize - 1) / kBlockSize;
  const uint64_t per_shard = (num_blocks + kShards - 1) / kShards;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t b : blocks) {
    if (b / per_shard != shard) continue;
    ranges.emplace_back(b * kBlockSize, std::min<uint64_t>(kD, (b + 1) * kBlockSize));
  }
  return ranges;
}

std::unique_ptr<InProcessCluster> StartCluster() {
  auto cluster = InProcessCluster::Start(MakeConfig(), kD);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return nullptr;
  EXPECT_TRUE((*cluster)->client(0).PushModel(std::vector<float>(kD, 0.0f)).ok());
  return std::move(*cluster);
}

// Each rank's result of the round (stream, step, ratio): weight rank + 1;
// `mean` starts at -7 everywhere, so untouched floats show.
TEST(ShardedAverageTest, GivesTheMeansOfAverageBlocksBitForBit) {
  std::unique_ptr<InProcessCluster> plain = StartCluster();
  std::unique_ptr<InProcessCluster> sharded = StartCluster();
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(sharded, nullptr);
  struct Round {
    v1::Stream stream;
    uint64_t step;
    uint32_t ratio;
  };
  const Round rounds[] = {{v1::MODEL, 0, 1}, {v1::MODEL, 1, 4}, {v1::GRAD, 2, 8}};
  for (const Round& round : rounds) {
    SCOPED_TRACE(absl::StrCat("step ", round.step, " ratio ", round.ratio));
    const std::vector<uint64_t> blocks = SelectBlocks(
        77, round.stream, round.step, round.ratio, (kD + kBlockSize - 1) / kBlockSize);
    std::vector<std::vector<float>> want(kWorkers, std::vector<float>(kD, -7.0f));
    std::vector<std::vector<float>> got = want;
    absl::Status plain_status = plain->OnEveryRank([&](int r) {
      return plain->client(r).AverageBlocks(round.stream, round.step, round.ratio,
                                            RankValues(r, round.step), r + 1.0f,
                                            /*lr=*/0.5f, absl::MakeSpan(want[r]));
    });
    ASSERT_TRUE(plain_status.ok()) << plain_status;
    absl::Status sharded_status = sharded->OnEveryRank([&](int r) -> absl::Status {
      const std::vector<float> values = RankValues(r, round.step);
      std::unique_ptr<ShardedAverage> avg = sharded->client(r).BeginShardedAverage(
          round.stream, round.step, round.ratio, r + 1.0f, /*lr=*/0.5f);
      std::vector<std::vector<float>> payloads(kShards);
      std::vector<uint32_t> expected_shards;
      for (uint32_t s = 0; s < kShards; ++s) {
        for (auto [b, e] : ShardRanges(blocks, s)) {
          payloads[s].insert(payloads[s].end(), values.begin() + b, values.begin() + e);
        }
        if (avg->payload_size(s) != payloads[s].size()) {
          return absl::InternalError(absl::StrCat("payload_size(", s, ") is ",
                                                  avg->payload_size(s), ", want ",
                                                  payloads[s].size()));
        }
        if (!payloads[s].empty()) expected_shards.push_back(s);
      }
      if (avg->shards() != expected_shards) return absl::InternalError("shards()");
      // Every shard started before the first is awaited; the mean written
      // over the payload's own buffer.
      for (uint32_t s : avg->shards()) {
        RETURN_IF_ERROR(avg->StartShard(s, payloads[s], absl::MakeSpan(payloads[s])));
      }
      for (uint32_t s : avg->shards()) {
        RETURN_IF_ERROR(avg->WaitShard(s));
        uint64_t at = 0;
        for (auto [b, e] : ShardRanges(blocks, s)) {
          std::copy(payloads[s].begin() + at, payloads[s].begin() + at + (e - b),
                    got[r].begin() + b);
          at += e - b;
        }
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(sharded_status.ok()) << sharded_status;
    for (uint32_t r = 0; r < kWorkers; ++r) {
      ASSERT_EQ(std::memcmp(got[r].data(), want[r].data(), kD * sizeof(float)), 0)
          << "rank " << r;
    }
    // The round really averaged: a selected float moved off -7.
    EXPECT_NE(got[0][blocks[0] * kBlockSize], -7.0f);
  }
  // Both clusters' servers hold the same model after the GRAD round.
  std::vector<float> a(kD), b(kD);
  ASSERT_TRUE(plain->client(0).PullModel(absl::MakeSpan(a), false).ok());
  ASSERT_TRUE(sharded->client(0).PullModel(absl::MakeSpan(b), false).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), kD * sizeof(float)), 0);
  // Traffic counts as AverageBlocks' does.
  EXPECT_EQ(plain->client(1).traffic(v1::MODEL).request_floats,
            sharded->client(1).traffic(v1::MODEL).request_floats);
  EXPECT_EQ(plain->client(1).traffic(v1::GRAD).request_bytes,
            sharded->client(1).traffic(v1::GRAD).request_bytes);
}

TEST(ShardedAverageTest, RefusesBadPayloadsAndOrder) {
  std::unique_ptr<InProcessCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<ShardedAverage> avg =
      cluster->client(0).BeginShardedAverage(v1::MODEL, 0, 1, 1.0f, 0.0f);
  const uint64_t size = avg->payload_size(1);
  ASSERT_GT(size, 0u);
  std::vector<float> short_payload(size - 1), payload(size);
  absl::Status status = avg->StartShard(1, short_payload, absl::MakeSpan(payload));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("shard 1"));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(size - 1)));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(size)));
  status = avg->StartShard(1, payload, absl::MakeSpan(short_payload));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(avg->StartShard(kShards, payload, absl::MakeSpan(payload)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(avg->WaitShard(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(avg->payload_size(kShards), 0u);
}

}  // namespace
}  // namespace cserps
