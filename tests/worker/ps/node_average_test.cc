// A node's average (worker/ps/staged_average.h with the node's group, on host
// staging devices and ThreadGroups) against the same processes as separate
// members of a flat job, and the node's client calls (worker/ps/
// node_client.h): registration, the model's push and pull, each local
// rank's shards.
#include "worker/ps/node_client.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/algorithm_catalog.h"
#include "common/block_layout.h"
#include "common/prng.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tools/cluster/in_process_cluster.h"
#include "tests/testing/node_support.h"
#include "tests/testing/test_support.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/device/host_device_ops.h"
#include "worker/group/thread_group.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/staged_average.h"

namespace cserps {
namespace {

using testing::ConnectLocalRank;
using testing::OnEveryProcess;

using ::testing::HasSubstr;
using Ranges = std::vector<std::pair<size_t, size_t>>;

constexpr uint32_t kNodes = 2;
constexpr float kLr = 0.1f;

// A job of d = 1000 floats (softmax 99 -> 10) in blocks of 16 (63 blocks,
// the last 8 floats), ef-sgd with GRBS ratio 4 on GRAD and ratio 1 on MODEL.
v1::JobConfig Config(uint32_t shards, uint32_t members, uint32_t local_size) {
  std::string servers;
  for (uint32_t s = 0; s < shards; ++s) absl::StrAppend(&servers, "servers: \"127.0.0.1:0\" ");
  return testing::TestConfig(absl::StrCat(
      "name: \"group-test\" seed: 4242 epochs: 1\n",
      "cluster { ", servers, "num_workers: ", members, " local_size: ", local_size,
      " round_timeout_s: 20 }\n",
      "model { kind: SOFTMAX input_dim: 99 num_classes: 10 }\n",
      "data { batch_size: 1 }\n",
      "optimizer { lr: 0.1 }\n",
      "algorithm { name: \"ef-sgd\" ratio: 4 block_size: 16 }\n"));
}


struct Round {
  v1::Stream stream;
  uint64_t step;
  uint32_t ratio;
};
const std::vector<Round>& Rounds() {
  static const auto* rounds = new std::vector<Round>{
      {v1::GRAD, 0, 4}, {v1::MODEL, 0, 1}, {v1::GRAD, 1, 4}};
  return *rounds;
}

// values[k][m]: member m's values for round k, in [-1, 1).
std::vector<testing::Models> Values(uint32_t members, size_t d) {
  std::vector<testing::Models> values(Rounds().size());
  for (size_t k = 0; k < values.size(); ++k) {
    for (uint32_t m = 0; m < members; ++m) {
      CounterRng rng(DeriveKey(DeriveKey(99, k), m));
      std::vector<float> v(d);
      for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
      values[k].push_back(std::move(v));
    }
  }
  return values;
}

std::vector<uint32_t> Weights(uint32_t members) {
  std::vector<uint32_t> w;
  for (uint32_t m = 0; m < members; ++m) w.push_back(1 + (7 * m + 3) % 5);
  return w;
}

// What Wait leaves in floats it does not write.
float Sentinel(size_t i) { return 1000.0f + static_cast<float>(i); }

// The floats of `v` inside `ranges`, concatenated.
std::vector<float> Selected(const std::vector<float>& v, const Ranges& ranges) {
  std::vector<float> out;
  for (const auto& [begin, end] : ranges) out.insert(out.end(), v.begin() + begin, v.begin() + end);
  return out;
}

::testing::AssertionResult OnlySelectedWritten(const std::vector<float>& mean,
                                               const Ranges& ranges) {
  std::vector<bool> selected(mean.size(), false);
  for (const auto& [begin, end] : ranges) std::fill(selected.begin() + begin, selected.begin() + end, true);
  for (size_t i = 0; i < mean.size(); ++i) {
    if (!selected[i] && mean[i] != Sentinel(i)) {
      return ::testing::AssertionFailure() << "float " << i << " was written but is not selected";
    }
  }
  return ::testing::AssertionSuccess();
}

// Floats of shard s (BlockLayout's rule from docs/protocol.md, written out
// here): blocks [s*ceil(B/S), (s+1)*ceil(B/S)) of B = ceil(d/bs).
std::pair<size_t, size_t> ShardFloats(size_t d, size_t bs, size_t shards, size_t s) {
  const size_t blocks = (d + bs - 1) / bs;
  const size_t per = (blocks + shards - 1) / shards;
  return {std::min(d, std::min(blocks, s * per) * bs), std::min(d, std::min(blocks, (s + 1) * per) * bs)};
}

size_t Overlap(const Ranges& ranges, std::pair<size_t, size_t> shard) {
  size_t n = 0;
  for (const auto& [begin, end] : ranges) {
    const size_t lo = std::max(begin, shard.first);
    const size_t hi = std::min(end, shard.second);
    if (hi > lo) n += hi - lo;
  }
  return n;
}

struct Shape {
  uint32_t local_size;
  uint32_t shards;
};

class NodeAverageShapes : public ::testing::TestWithParam<Shape> {};

// Every process of two nodes averages three rounds (two GRAD at ratio 4 and
// one MODEL at ratio 1, the three in flight together) through its node's
// group; the same processes as separate members of a flat cluster are the
// reference.
TEST_P(NodeAverageShapes, MatchesTheFlatAverageOverEveryProcess) {
  // Not a structured binding: C++17 lambdas cannot capture those.
  const uint32_t local_size = GetParam().local_size;
  const uint32_t shards = GetParam().shards;
  const uint32_t members = kNodes * local_size;
  v1::JobConfig config = Config(shards, kNodes, local_size);
  const size_t d = testing::NumParams(config);
  ASSERT_EQ(d, 1000u);
  testing::ServerSet servers;
  const absl::Status started = servers.Start(&config);
  ASSERT_TRUE(started.ok()) << started;
  const std::vector<testing::Models> values = Values(members, d);
  const std::vector<uint32_t> weights = Weights(members);
  std::vector<float> x0(d);
  for (size_t i = 0; i < d; ++i) x0[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;

  std::vector<uint32_t> ranks(members);
  std::vector<std::vector<float>> pulled(members);
  std::vector<std::vector<std::vector<float>>> means(members);
  std::vector<TrafficCounts> grad_traffic(members), model_traffic(members);
  const auto status = OnEveryProcess(kNodes, local_size, [&](uint32_t n, uint32_t j,
                                                             LocalGroup& group) -> absl::Status {
    const uint32_t m = n * local_size + j;
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                     ConnectLocalRank(config, d, local_size, j));
    ASSIGN_OR_RETURN(ranks[m], RegisterNode(group, *client, -1, absl::StrCat("node-", n)));
    if (ranks[m] == 0) {
      // Only local rank 0's model counts.
      std::vector<float> model = j == 0 ? x0 : std::vector<float>(d, std::nanf(""));
      RETURN_IF_ERROR(PushNodeModel(group, *client, model));
    }
    pulled[m].assign(d, -1.0f);
    RETURN_IF_ERROR(PullNodeModel(group, *client, absl::MakeSpan(pulled[m]), true));

    HostDeviceOps ops(d, config.algorithm().block_size());
    means[m].resize(Rounds().size());
    std::vector<std::unique_ptr<StagingDevice>> staging;
    std::vector<std::unique_ptr<StagedRound>> pending;
    for (size_t k = 0; k < Rounds().size(); ++k) {
      const Round& r = Rounds()[k];
      means[m][k].resize(d);
      for (size_t i = 0; i < d; ++i) means[m][k][i] = Sentinel(i);
      ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> device, ops.MakeStaging(&group));
      StagedAverageSpec spec;
      spec.layout = &client->layout();
      spec.job_seed = config.seed();
      spec.stream = r.stream;
      spec.step = r.step;
      spec.ratio = r.ratio;
      spec.weight = static_cast<float>(weights[m]);
      spec.group = &group;
      ASSIGN_OR_RETURN(
          std::unique_ptr<StagedRound> round,
          StartStagedAverage(
              spec,
              [&](float w) {
                return client->BeginShardedAverage(r.stream, r.step, r.ratio, w, kLr);
              },
              *device, values[k][m].data()));
      staging.push_back(std::move(device));
      pending.push_back(std::move(round));
    }
    // All three in flight together, landed in the order they started.
    for (size_t k = 0; k < pending.size(); ++k) {
      RETURN_IF_ERROR(pending[k]->Land(ScatterKind::kAssign, 0, means[m][k].data()));
    }
    grad_traffic[m] = client->traffic(v1::GRAD);
    model_traffic[m] = client->traffic(v1::MODEL);
    return absl::OkStatus();
  });
  for (uint32_t m = 0; m < members; ++m) ASSERT_TRUE(status[m].ok()) << "member " << m << ": " << status[m];

  // The same processes, each a member of its own.
  v1::JobConfig flat_config = Config(shards, members, 1);
  auto cluster = testing::InProcessCluster::Start(flat_config, d);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::vector<std::vector<float>>> flat(members);
  ASSERT_TRUE((*cluster)->OnEveryRank([&](int m) -> absl::Status {
    flat[m].resize(Rounds().size());
    for (size_t k = 0; k < Rounds().size(); ++k) {
      const Round& r = Rounds()[k];
      flat[m][k].assign(d, 0.0f);
      RETURN_IF_ERROR((*cluster)->client(m).AverageBlocks(
          r.stream, r.step, r.ratio, values[k][m], static_cast<float>(weights[m]), kLr,
          absl::MakeSpan(flat[m][k])));
    }
    return absl::OkStatus();
  }).ok());

  // One member per node, under one rank on every shard.
  for (uint32_t n = 0; n < kNodes; ++n) {
    for (uint32_t j = 0; j < local_size; ++j) EXPECT_EQ(ranks[n * local_size + j], ranks[n * local_size]);
  }
  EXPECT_NE(ranks[0], ranks[local_size]);
  EXPECT_LT(std::max(ranks[0], ranks[local_size]), kNodes);
  for (uint32_t s = 0; s < shards; ++s) {
    EXPECT_EQ(servers.shard(s).service().counters().registered, kNodes) << "shard " << s;
  }
  for (uint32_t m = 0; m < members; ++m) {
    EXPECT_TRUE(testing::BitEqual(pulled[m], x0)) << "member " << m;
  }

  for (size_t k = 0; k < Rounds().size(); ++k) {
    const Round& r = Rounds()[k];
    SCOPED_TRACE(absl::StrCat("round ", k, ": ", v1::Stream_Name(r.stream), " step ", r.step,
                              " ratio ", r.ratio));
    const Ranges ranges = testing::SelectedRanges(config, r.stream, r.step, r.ratio);
    const std::vector<float> expected =
        Selected(testing::WeightedMean(values[k], weights, ranges), ranges);
    const std::vector<float> reference = Selected(flat[0][k], ranges);
    EXPECT_TRUE(testing::AllNear(reference, expected, 1e-6));
    for (uint32_t m = 0; m < members; ++m) {
      EXPECT_TRUE(testing::BitEqual(means[m][k], means[0][k])) << "member " << m;
      EXPECT_TRUE(OnlySelectedWritten(means[m][k], ranges)) << "member " << m;
    }
    EXPECT_TRUE(testing::AllNear(Selected(means[0][k], ranges), reference, 1e-6));
    EXPECT_TRUE(testing::AllNear(Selected(means[0][k], ranges), expected, 1e-6));
  }

  // Local rank j pushed exactly the selected floats of its shards.
  for (uint32_t m = 0; m < members; ++m) {
    const uint32_t j = m % local_size;
    uint64_t grad = 0, model = 0;
    for (const Round& r : Rounds()) {
      const Ranges ranges = testing::SelectedRanges(config, r.stream, r.step, r.ratio);
      for (uint32_t s = j; s < shards; s += local_size) {
        const size_t n = Overlap(ranges, ShardFloats(d, 16, shards, s));
        (r.stream == v1::GRAD ? grad : model) += n;
      }
    }
    EXPECT_EQ(grad_traffic[m].request_floats, grad) << "member " << m;
    EXPECT_EQ(model_traffic[m].request_floats, model) << "member " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NodeAverageShapes,
                         ::testing::Values(Shape{2, 2}, Shape{2, 3}, Shape{3, 2},
                                           Shape{3, 3}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("L", info.param.local_size, "_S",
                                               info.param.shards);
                         });

TEST(GroupShardsTest, LocalRankJTakesTheShardsCongruentToJ) {
  EXPECT_EQ(GroupShards(5, 2, 0), (std::vector<uint32_t>{0, 2, 4}));
  EXPECT_EQ(GroupShards(5, 2, 1), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(GroupShards(2, 3, 2), (std::vector<uint32_t>{}));
  EXPECT_EQ(GroupShards(3, 1, 0), (std::vector<uint32_t>{0, 1, 2}));
}

// A host staging device whose Gather fails, standing for a device error on
// one local rank before the group's sum.
class FailingGather final : public StagingDevice {
 public:
  explicit FailingGather(std::unique_ptr<StagingDevice> device) : device_(std::move(device)) {}
  uint64_t capacity() const override { return device_->capacity(); }
  absl::Span<float> host() override { return device_->host(); }
  absl::Status Gather(const float*, absl::Span<const uint64_t>) override {
    return absl::DataLossError("injected device failure");
  }
  absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) override {
    return device_->CopyToHost(slot, offset, count);
  }
  absl::Status WaitCopied(uint32_t slot) override { return device_->WaitCopied(slot); }
  absl::Status CopyToStaging(uint64_t offset, uint64_t count) override {
    return device_->CopyToStaging(offset, count);
  }
  absl::Status Scatter(ScatterKind kind, float alpha, float* model) override {
    return device_->Scatter(kind, alpha, model);
  }
  absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                            uint64_t count) override {
    return device_->ScaleStaging(op, factor, offset, count);
  }
  absl::Status AllReduceStaging(uint64_t count) override {
    return device_->AllReduceStaging(count);
  }
  absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) override {
    return device_->BroadcastStaging(root, offset, count);
  }

 private:
  std::unique_ptr<StagingDevice> device_;
};

// One node of 3 local ranks over 2 shards (local rank 2 owns none): a
// server's refusal, and a device failure on one local rank, reach every
// local rank with the failing one's code at once (not after the group's
// timeout), and the group still averages afterwards.
TEST(NodeAverageTest, FailuresReachEveryLocalRank) {
  constexpr uint32_t kRanks = 3;
  v1::JobConfig config = testing::TestConfig(
      "name: \"node-errors\" seed: 5 epochs: 1\n"
      "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" num_workers: 1 "
      "local_size: 3 round_timeout_s: 20 }\n"
      "model { kind: SOFTMAX input_dim: 99 num_classes: 10 }\n"
      "data { batch_size: 4 }\n"
      "optimizer { lr: 0.1 }\n"
      "algorithm { name: \"ef-sgd\" ratio: 4 block_size: 16 }\n");
  const size_t d = testing::NumParams(config);
  testing::ServerSet servers;
  const absl::Status started = servers.Start(&config);
  ASSERT_TRUE(started.ok()) << started;
  const BlockLayout layout(d, 16, 2);
  std::vector<absl::Status> refused(kRanks), injected(kRanks);
  const auto status = testing::OnEveryProcess(
      1, kRanks, [&](uint32_t, uint32_t j, LocalGroup& group) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                         testing::ConnectLocalRank(config, d, kRanks, j));
        RETURN_IF_ERROR(RegisterNode(group, *client, 0, "node").status());
        HostDeviceOps ops(d, 16);
        ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> device, ops.MakeStaging(&group));
        std::vector<float> x(d, 1.0f + static_cast<float>(j));
        auto average = [&](StagingDevice& staging, uint64_t step, uint32_t ratio) {
          StagedAverageSpec spec;
          spec.layout = &layout;
          spec.job_seed = config.seed();
          spec.stream = v1::GRAD;
          spec.step = step;
          spec.ratio = ratio;
          spec.group = &group;
          return StagedAverage(
              spec,
              [&](float w) {
                return client->BeginShardedAverage(v1::GRAD, step, ratio, w, 0.1f);
              },
              staging, x.data(), ScatterKind::kAssign, 0, x.data());
        };
        // ef-sgd averages GRAD at ratio 4 only: the servers refuse ratio 2.
        refused[j] = average(*device, 0, 2);
        if (j == 1) {
          ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> other, ops.MakeStaging(&group));
          FailingGather failing(std::move(other));
          injected[j] = average(failing, 1, 4);
        } else {
          injected[j] = average(*device, 1, 4);
        }
        return average(*device, 2, 4);
      });
  for (uint32_t j = 0; j < kRanks; ++j) {
    ASSERT_TRUE(status[j].ok()) << "local rank " << j << ": " << status[j];
    EXPECT_EQ(refused[j].code(), absl::StatusCode::kFailedPrecondition) << refused[j];
    EXPECT_EQ(injected[j].code(), absl::StatusCode::kDataLoss) << injected[j];
  }
  EXPECT_THAT(std::string(refused[2].message()), ::testing::HasSubstr("local rank 0 failed"));
  EXPECT_THAT(std::string(injected[1].message()), ::testing::HasSubstr("injected"));
  EXPECT_THAT(std::string(injected[0].message()), ::testing::HasSubstr("local rank 1 failed"));
}

// PsClient restricted to the shards of one local rank (PsClientOptions
// shard_stride / shard_offset), beyond what the tests above use.
TEST(RestrictedPsClientTest, RefusesBadOptionsAndCallsOutsideItsShards) {
  v1::JobConfig config = Config(2, 1, 3);
  const size_t d = testing::NumParams(config);
  PsClientOptions bad;
  bad.shard_stride = 2;
  bad.shard_offset = 2;
  const auto refused = PsClient::Connect(config, d, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("shard_offset 2"));

  // Local rank 2 of 3 has no shard of 2: it needs its rank given.
  auto none = ConnectLocalRank(config, d, 3, 2);
  ASSERT_TRUE(none.ok()) << none.status();
  const auto unranked = (*none)->Register(-1, "node");
  EXPECT_EQ(unranked.status().code(), absl::StatusCode::kInvalidArgument);
  const auto given = (*none)->Register(0, "node");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(*given, 0u);

  auto second = ConnectLocalRank(config, d, 3, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->GetStatus(0).status().code(), absl::StatusCode::kInvalidArgument);
}

// topk-ssgd with one member: the servers answer every pushed entry, so each
// restricted client must get back exactly the entries of its own shard.
// The clients are restricted by their options alone: the config keeps
// local_size 1, which topk-ssgd requires (it has no intra-node form).
TEST(RestrictedPsClientTest, SparseExchangeCoversOnlyItsShards) {
  v1::JobConfig config = testing::TestConfig(
      "name: \"group-sparse\" seed: 5 epochs: 1\n"
      "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" num_workers: 1 "
      "round_timeout_s: 20 }\n"
      "model { kind: SOFTMAX input_dim: 99 num_classes: 10 }\n"
      "data { batch_size: 1 }\n"
      "optimizer { lr: 0.1 }\n"
      "algorithm { name: \"topk-ssgd\" density: 0.01 block_size: 16 }\n");
  const size_t d = testing::NumParams(config);
  testing::ServerSet servers;
  const absl::Status started = servers.Start(&config);
  ASSERT_TRUE(started.ok()) << started;
  const uint64_t k = SparseK(config.algorithm(), d);
  SparseVector local;
  std::vector<SparseVector> own(2);
  for (uint32_t s = 0; s < 2; ++s) {
    const auto [begin, end] = ShardFloats(d, 16, 2, s);
    for (uint64_t i = 0; i < ShardSparseK(k, end - begin, d); ++i) {
      const uint32_t index = static_cast<uint32_t>(begin + 3 * i);
      const float value = 0.5f + static_cast<float>(i) + 10.0f * static_cast<float>(s);
      local.indices.push_back(index);
      local.values.push_back(value);
      own[s].indices.push_back(index);
      own[s].values.push_back(value);
    }
  }
  for (uint32_t j = 0; j < 2; ++j) {
    auto client = ConnectLocalRank(config, d, 2, j);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->Register(0, "node").ok());
    SparseVector result;
    const absl::Status exchanged = (*client)->ExchangeSparse(0, local, &result);
    ASSERT_TRUE(exchanged.ok()) << "local rank " << j << ": " << exchanged;
    EXPECT_EQ(result.indices, own[j].indices) << "local rank " << j;
    EXPECT_EQ(result.values, own[j].values) << "local rank " << j;
    EXPECT_EQ((*client)->sparse_traffic().request_floats, own[j].values.size());
  }
}

}  // namespace
}  // namespace cserps
