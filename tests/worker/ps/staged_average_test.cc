// The staged average (worker/ps/staged_average.h) with a host StagingDevice
// that records the order of operations, on real in-process clusters: the
// result equals the client's plain average bit for bit, the pipeline
// overlaps (shard s+1's copy is queued before shard s's reply is awaited),
// and a started average has every payload on the wire before it is landed.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/device/host_device_ops.h"
#include "worker/ps/staged_average.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kShards = 3;
constexpr uint32_t kBlockSize = 32;
// SOFTMAX 1999 -> 10: d = 20000 = 625 blocks of 32; 3 shards of 209, 209
// and 207 blocks.
constexpr uint64_t kInputDim = 1999;
constexpr uint64_t kD = kInputDim * 10 + 10;
constexpr uint64_t kSeed = 91;

constexpr char kCser[] =
    R"pb(name: "cser" cser_variant: GRADIENT_BLOCKS period: 2 ratio_c1: 4 ratio_c2: 8)pb";
constexpr char kSsgd[] = R"pb(name: "ssgd")pb";

// `algorithm`: the rounds the servers accept.
v1::JobConfig MakeConfig(const std::string& algorithm) {
  return TestConfig(absl::StrCat(R"pb(
    name: "staged-average-test"
    seed: )pb", kSeed, R"pb(
    cluster {
      servers: "127.0.0.1:0" servers: "127.0.0.1:0" servers: "127.0.0.1:0"
      num_workers: )pb", kWorkers, R"pb(
      round_timeout_s: 10
    }
    model { kind: SOFTMAX input_dim: )pb", kInputDim, R"pb( num_classes: 10 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 }
    algorithm { )pb", algorithm, " block_size: ", kBlockSize, R"pb( }
    epochs: 1
  )pb"));
}

// The host StagingDevice, logging every operation into *log.
class RecordingDevice final : public StagingDevice {
 public:
  explicit RecordingDevice(std::vector<std::string>* log)
      : log_(log), device_(kD, kBlockSize, /*group=*/nullptr) {}

  uint64_t capacity() const override { return device_.capacity(); }
  absl::Span<float> host() override { return device_.host(); }
  absl::Status Gather(const float* model, absl::Span<const uint64_t> blocks) override {
    log_->push_back("gather");
    return device_.Gather(model, blocks);
  }
  absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) override {
    log_->push_back(absl::StrCat("to_host ", slot));
    return device_.CopyToHost(slot, offset, count);
  }
  absl::Status WaitCopied(uint32_t slot) override {
    log_->push_back(absl::StrCat("wait_copied ", slot));
    return device_.WaitCopied(slot);
  }
  absl::Status CopyToStaging(uint64_t offset, uint64_t count) override {
    log_->push_back(absl::StrCat("to_staging ", offset));
    return device_.CopyToStaging(offset, count);
  }
  absl::Status Scatter(ScatterKind kind, float alpha, float* model) override {
    log_->push_back("scatter");
    return device_.Scatter(kind, alpha, model);
  }
  // A flat worker's average uses none of the node operations.
  absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                            uint64_t count) override {
    log_->push_back("scale");
    return device_.ScaleStaging(op, factor, offset, count);
  }
  absl::Status AllReduceStaging(uint64_t count) override {
    log_->push_back("all_reduce");
    return device_.AllReduceStaging(count);
  }
  absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) override {
    log_->push_back("broadcast");
    return device_.BroadcastStaging(root, offset, count);
  }

 private:
  std::vector<std::string>* log_;
  HostStagingDevice device_;
};

// The client's round, logging when each shard is started and awaited.
class RecordingRound final : public ShardedAverage {
 public:
  RecordingRound(std::unique_ptr<ShardedAverage> round, std::vector<std::string>* log)
      : round_(std::move(round)), log_(log) {}
  const std::vector<uint32_t>& shards() const override { return round_->shards(); }
  uint64_t payload_size(uint32_t shard) const override {
    return round_->payload_size(shard);
  }
  absl::Status StartShard(uint32_t shard, absl::Span<const float> payload,
                          absl::Span<float> mean) override {
    log_->push_back(absl::StrCat("start ", shard));
    return round_->StartShard(shard, payload, mean);
  }
  absl::Status WaitShard(uint32_t shard) override {
    log_->push_back(absl::StrCat("await ", shard));
    return round_->WaitShard(shard);
  }

 private:
  std::unique_ptr<ShardedAverage> round_;
  std::vector<std::string>* log_;
};

std::vector<float> RankValues(int rank, uint64_t salt) {
  std::vector<float> v(kD);
  CounterRng rng(7919 * rank + salt);
  for (float& x : v) x = rng.UniformFloat() * 4 - 2;
  return v;
}

std::unique_ptr<InProcessCluster> StartCluster(const std::string& algorithm) {
  auto cluster = InProcessCluster::Start(MakeConfig(algorithm), kD);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return nullptr;
  EXPECT_TRUE((*cluster)->client(0).PushModel(std::vector<float>(kD, 0.0f)).ok());
  return std::move(*cluster);
}

size_t IndexOf(const std::vector<std::string>& log, const std::string& entry) {
  return std::find(log.begin(), log.end(), entry) - log.begin();
}

struct Case {
  const char* algorithm;
  v1::Stream stream;
  uint64_t step;
  uint32_t ratio;
  ScatterKind kind;
};

class StagedAverageTest : public ::testing::TestWithParam<Case> {};

// Model rounds assign x[S] = AVG(x[S]) in place (CSER); gradient rounds
// apply x[S] -= lr * AVG(p[S]) (S-SGD), each against the host rule on the
// plain average's mean.
TEST_P(StagedAverageTest, EqualsThePlainAverageAndOverlaps) {
  const Case c = GetParam();
  constexpr float kLr = 0.25f;
  std::unique_ptr<InProcessCluster> plain = StartCluster(c.algorithm);
  std::unique_ptr<InProcessCluster> staged = StartCluster(c.algorithm);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(staged, nullptr);
  const bool assign = c.kind == ScatterKind::kAssign;
  std::vector<std::vector<float>> want(kWorkers), got(kWorkers);
  std::vector<std::vector<std::string>> logs(kWorkers), started(kWorkers);
  absl::Status status = plain->OnEveryRank([&](int r) -> absl::Status {
    want[r] = RankValues(r, 1);
    if (assign) {
      return plain->client(r).AverageBlocks(c.stream, c.step, c.ratio, want[r], r + 1.0f,
                                            kLr, absl::MakeSpan(want[r]));
    }
    std::vector<float> mean(kD, 0.0f);
    RETURN_IF_ERROR(plain->client(r).AverageBlocks(c.stream, c.step, c.ratio,
                                                   RankValues(r, 2), r + 1.0f, kLr,
                                                   absl::MakeSpan(mean)));
    for (uint64_t b : SelectBlocks(kSeed, c.stream, c.step, c.ratio,
                                   (kD + kBlockSize - 1) / kBlockSize)) {
      for (uint64_t j = b * kBlockSize; j < std::min(kD, (b + 1) * kBlockSize); ++j) {
        want[r][j] -= kLr * mean[j];
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  const BlockLayout layout(kD, kBlockSize, kShards);
  status = staged->OnEveryRank([&](int r) -> absl::Status {
    got[r] = RankValues(r, 1);
    const std::vector<float> p = RankValues(r, 2);
    RecordingDevice device(&logs[r]);
    StagedAverageSpec spec;
    spec.layout = &layout;
    spec.job_seed = kSeed;
    spec.stream = c.stream;
    spec.step = c.step;
    spec.ratio = c.ratio;
    spec.weight = r + 1.0f;
    ASSIGN_OR_RETURN(std::unique_ptr<StagedRound> round,
                     StartStagedAverage(
                         spec,
                         [&](float weight) {
                           return std::make_unique<RecordingRound>(
                               staged->client(r).BeginShardedAverage(c.stream, c.step,
                                                                     c.ratio, weight, kLr),
                               &logs[r]);
                         },
                         device, assign ? got[r].data() : p.data()));
    started[r] = logs[r];
    return round->Land(c.kind, -kLr, got[r].data());
  });
  ASSERT_TRUE(status.ok()) << status;
  for (uint32_t r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(std::memcmp(got[r].data(), want[r].data(), kD * sizeof(float)), 0);
    const std::vector<std::string>& log = logs[r];
    EXPECT_EQ(log.front(), "gather");
    EXPECT_EQ(log.back(), "scatter");
    for (uint32_t s = 0; s < kShards; ++s) {
      const std::string shard = absl::StrCat(s);
      ASSERT_LT(IndexOf(log, "to_host " + shard), log.size()) << "shard " << s;
      EXPECT_LT(IndexOf(log, "wait_copied " + shard), IndexOf(log, "start " + shard));
      EXPECT_LT(IndexOf(log, "start " + shard), IndexOf(log, "await " + shard));
      if (s + 1 < kShards) {
        const std::string next = absl::StrCat(s + 1);
        // The overlap: shard s+1's copy is queued, and shard s+1 is pushed,
        // before shard s's reply is awaited.
        EXPECT_LT(IndexOf(log, "to_host " + next), IndexOf(log, "await " + shard));
        EXPECT_LT(IndexOf(log, "start " + next), IndexOf(log, "await " + shard));
      }
    }
    EXPECT_EQ(std::count_if(log.begin(), log.end(),
                            [](const std::string& e) { return e.rfind("to_staging", 0) == 0; }),
              kShards);
    // Started: every shard pushed, none awaited, nothing scattered yet.
    for (uint32_t s = 0; s < kShards; ++s) {
      EXPECT_LT(IndexOf(started[r], absl::StrCat("start ", s)), started[r].size());
    }
    EXPECT_EQ(IndexOf(started[r], "await 0"), started[r].size());
    EXPECT_EQ(IndexOf(started[r], "scatter"), started[r].size());
  }
  // The servers of both clusters hold the same model afterwards.
  std::vector<float> a(kD), b(kD);
  ASSERT_TRUE(plain->client(0).PullModel(absl::MakeSpan(a), false).ok());
  ASSERT_TRUE(staged->client(0).PullModel(absl::MakeSpan(b), false).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), kD * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Rounds, StagedAverageTest,
    ::testing::Values(Case{kCser, v1::MODEL, 0, 1, ScatterKind::kAssign},
                      Case{kCser, v1::MODEL, 3, 4, ScatterKind::kAssign},
                      Case{kCser, v1::GRAD, 5, 8, ScatterKind::kAxpy},
                      Case{kSsgd, v1::GRAD, 0, 1, ScatterKind::kAxpy}));

// A round whose payloads are not the layout's selection is refused before
// anything is gathered.
TEST(StagedAverageRefusalTest, RefusesAMismatchedRound) {
  std::unique_ptr<InProcessCluster> cluster = StartCluster(kCser);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::string> log;
  RecordingDevice device(&log);
  std::vector<float> x(kD);
  const BlockLayout layout(kD, kBlockSize, kShards);
  StagedAverageSpec spec;
  spec.layout = &layout;
  spec.job_seed = kSeed;
  spec.stream = v1::MODEL;
  spec.step = 3;
  spec.ratio = 1;
  const absl::Status status = StagedAverage(
      spec,
      [&](float weight) {
        return cluster->client(0).BeginShardedAverage(v1::MODEL, 3, 4, weight, 0.0f);
      },
      device, x.data(), ScatterKind::kAssign, 0, x.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("shard 0"));
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace cserps
