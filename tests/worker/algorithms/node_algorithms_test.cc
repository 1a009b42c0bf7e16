// The algorithms on the local ranks of nodes (a node's staged average,
// worker/ps/staged_average.h, on host staging devices with the node's
// ThreadGroup) against the same processes as members of a flat job: every
// process's model after the last step and after Finish, and the servers'
// model, agree within 1e-5 (normwise relative), the rounding of a node's
// float32 sum of its local ranks' weighted values. 2 nodes of 2 local
// ranks, 3 shards (so local rank 0 owns two), 8 steps.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "tests/testing/node_support.h"
#include "tests/testing/test_support.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/group/thread_group.h"
#include "worker/ps/node_client.h"

namespace cserps {
namespace {

constexpr uint32_t kNodes = 2;
constexpr uint32_t kLocal = 2;
constexpr uint32_t kProcesses = kNodes * kLocal;
constexpr int kSteps = 8;
constexpr uint64_t kSeed = 99;

v1::JobConfig Config(const std::string& algorithm, const std::string& optimizer) {
  return testing::TestConfig(absl::StrCat(
      "name: \"node-algorithms-test\" seed: 31337 epochs: 1\n",
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
// index.
absl::StatusOr<NodeRun> RunNodes(v1::JobConfig config) {
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
        ASSIGN_OR_RETURN(std::unique_ptr<testing::RankAlgorithm> algorithm,
                         testing::RankAlgorithm::Create(
                             config, client.get(), static_cast<float>(weights[p]), &group));
        for (int t = 0; t < kSteps; ++t) {
          RETURN_IF_ERROR(algorithm->Step(t, config.optimizer().lr(),
                                          gradients.At(static_cast<int>(p), t, x), &x));
        }
        run.last_step[p] = x;
        RETURN_IF_ERROR(algorithm->Finish(kSteps, &x));
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

// The same processes as the members of a flat job.
absl::StatusOr<testing::ClusterRun> RunFlat(v1::JobConfig config) {
  config.mutable_cluster()->set_num_workers(kProcesses);
  config.mutable_cluster()->set_local_size(1);
  const size_t d = testing::NumParams(config);
  return testing::RunOnCluster(config, testing::SyntheticGradients(kSeed, kProcesses, d),
                               testing::InitialModel(kSeed, d), kSteps, /*finish=*/true);
}

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.label; }

class NodeAlgorithmsTest : public ::testing::TestWithParam<Case> {};

TEST_P(NodeAlgorithmsTest, EqualsTheFlatJobOfItsProcesses) {
  constexpr double kTolerance = 1e-5;
  const v1::JobConfig config = Config(GetParam().algorithm, GetParam().optimizer);
  absl::StatusOr<NodeRun> nodes = RunNodes(config);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  absl::StatusOr<testing::ClusterRun> flat = RunFlat(config);
  ASSERT_TRUE(flat.ok()) << flat.status();
  for (uint32_t p = 0; p < kProcesses; ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    EXPECT_TRUE(testing::AllNear(nodes->last_step[p], flat->models.back()[p], kTolerance));
    EXPECT_TRUE(testing::AllNear(nodes->finished[p], flat->finished[p], kTolerance));
    // The local ranks of a node share every mean bit for bit.
    const uint32_t peer = p - p % kLocal;
    EXPECT_TRUE(testing::BitEqual(nodes->finished[p], nodes->finished[peer]));
  }
  EXPECT_TRUE(testing::AllNear(nodes->server_model, flat->server_model, kTolerance));
  // Not a run that stood still.
  EXPECT_FALSE(testing::AllNear(nodes->finished[0],
                                testing::InitialModel(kSeed, testing::NumParams(config)),
                                1e-3));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, NodeAlgorithmsTest,
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
             "lr: 0.05 momentum_kind: NONE"},
        Case{"local_sgd", R"(name: "local-sgd" period: 3)", "lr: 0.05 momentum_kind: NONE"},
        Case{"cocod_sgd", R"(name: "cocod-sgd" period: 3)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"pipe_sgd", R"(name: "pipe-sgd")", "lr: 0.05 momentum_kind: NONE"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// The sparse methods and async SGD have no intra-node form: MakeAlgorithm
// refuses them for a local rank of a node, naming cluster.local_size.
TEST(NodeAlgorithmsRefusalTest, SparseAndAsyncMethodsAreRefusedOnNodes) {
  for (const char* name : {"topk-ssgd", "gtopk-ssgd", "async-sgd"}) {
    SCOPED_TRACE(name);
    v1::JobConfig config = Config(absl::StrCat("name: \"", name, "\""), "lr: 0.05");
    // Refused before any call: the client needs no servers (the job's
    // config would not pass their validation).
    const size_t d = testing::NumParams(config);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        testing::ConnectLocalRank(config, d, kLocal, 0);
    ASSERT_TRUE(client.ok()) << client.status();
    std::vector<std::unique_ptr<ThreadGroup>> group = ThreadGroup::Create(kLocal);
    const absl::StatusOr<std::unique_ptr<testing::RankAlgorithm>> refused =
        testing::RankAlgorithm::Create(config, client->get(), 1.0f, group[0].get());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::HasSubstr("cluster.local_size"));
  }
}

}  // namespace
}  // namespace cserps
