// The device algorithms on the local ranks of nodes (NodeStagedAverage in
// worker/staged_average.h, on HostDeviceOps and host staging devices with
// the node's ThreadGroup) against the host algorithms on the same nodes
// through HierarchicalCommunicator: every process's model after the last
// step and after Finish, and the servers' model, agree bit for bit. 2 nodes
// of 2 local ranks, 3 shards (so local rank 0 owns two), 8 steps.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_layout.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_cluster.h"
#include "tests/testing/node_support.h"
#include "tests/testing/test_support.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/device/device_algorithms.h"
#include "worker/device/host_device_ops.h"
#include "worker/ps/node_client.h"
#include "worker/ps/staged_average.h"

namespace cserps {
namespace {

constexpr uint32_t kNodes = 2;
constexpr uint32_t kLocal = 2;
constexpr uint32_t kProcesses = kNodes * kLocal;
constexpr int kSteps = 8;
constexpr uint64_t kSeed = 99;

v1::JobConfig Config(const std::string& algorithm, const std::string& optimizer) {
  return testing::TestConfig(absl::StrCat(
      "name: \"node-device-test\" seed: 31337 epochs: 1\n",
      "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" "
      "servers: \"127.0.0.1:0\" num_workers: ", kNodes, " local_size: ", kLocal,
      " round_timeout_s: 20 }\n",
      "model { kind: SOFTMAX input_dim: 99 num_classes: 10 }\n",
      "data { rank_batch_sizes: 3 rank_batch_sizes: 5 rank_batch_sizes: 8 "
      "rank_batch_sizes: 2 }\n",
      "optimizer { ", optimizer, " }\n",
      "algorithm { block_size: 16 ", algorithm, " }\n"));
}

struct NodeRun {
  std::vector<std::vector<float>> last_step;  // by process
  std::vector<std::vector<float>> finished;   // by process
  std::vector<float> server_model;
};

// Every process steps from x0 with the synthetic gradient of its process
// index, on the host algorithm or (`device`) on the host device.
absl::StatusOr<NodeRun> RunNodes(v1::JobConfig config, bool device) {
  const size_t d = testing::NumParams(config);
  const testing::SyntheticGradients gradients(kSeed, kProcesses, d);
  const std::vector<float> x0 = testing::InitialModel(kSeed, d);
  const std::vector<uint32_t> weights = testing::Weights(config);
  testing::ServerSet servers;
  RETURN_IF_ERROR(servers.Start(&config));
  NodeRun run;
  run.last_step.resize(kProcesses);
  run.finished.resize(kProcesses);
  const auto status = testing::OnEveryProcess(
      kNodes, kLocal, [&](uint32_t n, uint32_t j, LocalGroup& group) -> absl::Status {
        const uint32_t p = n * kLocal + j;
        ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                         testing::ConnectLocalRank(config, d, kLocal, j));
        ASSIGN_OR_RETURN(const uint32_t rank,
                         RegisterNode(group, *client, static_cast<int>(n),
                                      absl::StrCat("node-", n)));
        if (rank == 0) RETURN_IF_ERROR(PushNodeModel(group, *client, x0));
        std::vector<float> x(d);
        RETURN_IF_ERROR(PullNodeModel(group, *client, absl::MakeSpan(x), true));
        const float weight = static_cast<float>(weights[p]);
        const float lr = config.optimizer().lr();

        HostDeviceOps ops(d, config.algorithm().block_size());
        HierarchicalCommunicator comm(config, d, &group, client.get());
        Direction direction(config.optimizer(), d);
        std::unique_ptr<DeviceAlgorithm> on_device;
        std::unique_ptr<Algorithm> on_host;
        if (device) {
          DeviceAlgorithmContext context;
          context.config = &config;
          context.client = client.get();
          context.ops = &ops;
          context.group = &group;
          context.weight = weight;
          ASSIGN_OR_RETURN(on_device, MakeDeviceAlgorithm(context));
        } else {
          AlgorithmContext context;
          context.config = &config;
          context.comm = &comm;
          context.direction = &direction;
          context.layout = &client->layout();
          context.weight = weight;
          ASSIGN_OR_RETURN(on_host,
                           DefaultAlgorithms().Create(config.algorithm().name(), context));
        }
        for (int t = 0; t < kSteps; ++t) {
          const std::vector<float> g = gradients.At(static_cast<int>(p), t, x);
          RETURN_IF_ERROR(device ? on_device->Step(t, lr, g.data(), x.data())
                                 : on_host->Step(t, lr, g, absl::MakeSpan(x)));
        }
        run.last_step[p] = x;
        RETURN_IF_ERROR(device ? on_device->Finish(kSteps, x.data())
                               : on_host->Finish(kSteps, absl::MakeSpan(x)));
        run.finished[p] = x;
        // Node 0's local ranks read the servers' model together.
        if (n == 0) {
          std::vector<float> model(d);
          RETURN_IF_ERROR(PullNodeModel(group, *client, absl::MakeSpan(model), false));
          if (j == 0) run.server_model = std::move(model);
        }
        return absl::OkStatus();
      });
  for (uint32_t p = 0; p < kProcesses; ++p) {
    if (!status[p].ok()) {
      return absl::Status(status[p].code(),
                          absl::StrCat("process ", p, ": ", status[p].message()));
    }
  }
  return run;
}

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.label; }

class NodeDeviceAlgorithmsTest : public ::testing::TestWithParam<Case> {};

TEST_P(NodeDeviceAlgorithmsTest, EqualsTheHostAlgorithmOnTheSameNodes) {
  const v1::JobConfig config = Config(GetParam().algorithm, GetParam().optimizer);
  ASSERT_TRUE(HasDeviceAlgorithm(config.algorithm(), /*on_node=*/true));
  absl::StatusOr<NodeRun> host = RunNodes(config, /*device=*/false);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<NodeRun> device = RunNodes(config, /*device=*/true);
  ASSERT_TRUE(device.ok()) << device.status();
  for (uint32_t p = 0; p < kProcesses; ++p) {
    EXPECT_TRUE(testing::BitEqual(device->last_step[p], host->last_step[p])) << "process " << p;
    EXPECT_TRUE(testing::BitEqual(device->finished[p], host->finished[p])) << "process " << p;
  }
  EXPECT_TRUE(testing::BitEqual(device->server_model, host->server_model));
  // Not a run that stood still.
  EXPECT_FALSE(testing::BitEqual(
      host->finished[0], testing::InitialModel(kSeed, testing::NumParams(config))));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, NodeDeviceAlgorithmsTest,
    ::testing::Values(
        Case{"ssgd_nesterov", R"(name: "ssgd")",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_model_blocks",
             R"(name: "cser" period: 4 ratio_c1: 2 ratio_c2: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"cser_gradient_blocks",
             R"(name: "cser" period: 4 ratio_c1: 2 ratio_c2: 4 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"ef_sgd", R"(name: "ef-sgd" ratio: 4)", "lr: 0.05 momentum_kind: NONE"},
        Case{"qsparse_local_sgd", R"(name: "qsparse-local-sgd" period: 2 ratio: 4)",
             "lr: 0.05 momentum_kind: NONE"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

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
TEST(NodeStagedAverageTest, FailuresReachEveryLocalRank) {
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
  ASSERT_TRUE(servers.Start(&config).ok());
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
          return NodeStagedAverage(
              layout, config.seed(), v1::GRAD, step, ratio, group, 1.0f,
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

TEST(NodeDeviceAlgorithmsRefusalTest, SparseAndAsyncMethodsAreRefusedOnNodes) {
  for (const char* name : {"topk-ssgd", "gtopk-ssgd", "async-sgd"}) {
    v1::AlgorithmConfig algorithm;
    algorithm.set_name(name);
    EXPECT_TRUE(HasDeviceAlgorithm(algorithm)) << name;
    EXPECT_FALSE(HasDeviceAlgorithm(algorithm, /*on_node=*/true)) << name;
  }
}

}  // namespace
}  // namespace cserps
