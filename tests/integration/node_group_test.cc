// Nodes of several local ranks on a real cluster in one process: 2 server
// shards on 127.0.0.1 and 2 nodes of cluster.local_size 2 (4 local ranks,
// threads joined by a ThreadGroup per node, each with its own client and
// trainer, as cserps-worker runs a GPU-less node). Every local rank trains
// on its own data partition (node * 2 + local rank), so the job must follow
// the same trajectory as the flat job of 4 members on the same partitions;
// the servers must see 2 members; each local rank must write its own
// summary and push only its own shard.
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/block_layout.h"
#include "common/config.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "tests/testing/test_support.h"
#include "worker/data/partition.h"
#include "worker/group/thread_group.h"
#include "worker/ps/node_client.h"
#include "worker/model/model.h"
#include "worker/ps/ps_client.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using testing::JsonNumber;
using testing::ReadFile;
using testing::RelativeL2;

constexpr uint32_t kNodes = 2;
constexpr uint32_t kLocalSize = 2;
constexpr uint32_t kShards = 2;
constexpr size_t kDim = 20;
constexpr size_t kClasses = 4;
// One batch size per process (data.rank_batch_sizes reads per process):
// unequal, so that every process's weight and the node's summed weight
// matter. 240 examples split 40/53/67/80: 13 steps per epoch.
constexpr size_t kExamples = 240;
constexpr uint32_t kBatchSizes[] = {3, 4, 5, 6};

// MLP 20 -> 16 -> 4: d = 404 floats in blocks of 8, split over 2 shards.
// `algorithm` is an AlgorithmConfig body.
v1::JobConfig MakeConfig(uint32_t members, uint32_t local_size, const std::string& algorithm,
                         const std::string& output_dir) {
  return testing::TestConfig(absl::StrCat(
      "name: \"node-group-test\" seed: 17 epochs: 2 log_every_steps: 1000\n",
      "output_dir: \"", output_dir, "\"\n",
      "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" num_workers: ", members,
      " local_size: ", local_size, " round_timeout_s: 30 }\n",
      "model { kind: MLP hidden: 16 input_dim: ", kDim, " num_classes: ", kClasses, " }\n",
      "data { rank_batch_sizes: [", absl::StrJoin(kBatchSizes, ", "), "] }\n",
      "optimizer { lr: 0.1 momentum_kind: NESTEROV momentum: 0.9 }\n",
      "algorithm { block_size: 8 ", algorithm, " }\n"));
}

std::filesystem::path FreshDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return dir;
}

// What one process of a run ended with.
struct ProcessResult {
  absl::Status status;
  std::vector<float> params;
  uint32_t rank = 0;
  uint32_t partition = 0;
};

// The flat job: `members` members (one trainer each, threads), Run() to
// the end.
std::vector<ProcessResult> RunFlat(const v1::JobConfig& config, const Dataset& train,
                                   const Dataset& test, uint64_t d) {
  std::vector<ProcessResult> results(config.cluster().num_workers());
  absl::StatusOr<std::unique_ptr<testing::InProcessCluster>> cluster =
      testing::InProcessCluster::Start(config, d);
  if (!cluster.ok()) {
    results[0].status = cluster.status();
    return results;
  }
  const absl::Status run = (*cluster)->OnEveryRank([&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create((*cluster)->config(), &(*cluster)->client(r), &train, &test));
    RETURN_IF_ERROR(trainer->Run());
    ASSIGN_OR_RETURN(results[r].params, trainer->Params());
    results[r].rank = trainer->rank();
    results[r].partition = trainer->partition();
    return absl::OkStatus();
  });
  results[0].status.Update(run);
  for (int s = 0; s < (*cluster)->num_shards(); ++s) {
    absl::StatusOr<v1::GetStatusResponse> st = (*cluster)->client(0).GetStatus(s);
    results[0].status.Update(st.status());
    if (st.ok() && st->registered() != config.cluster().num_workers()) {
      results[0].status.Update(absl::InternalError(
          absl::StrCat("flat shard ", s, " has ", st->registered(), " members")));
    }
  }
  return results;
}

// One local rank of a node, set up as cserps-worker does: its client covers
// its shards, the node registers once, the trainer runs to the end.
absl::Status RunLocalRank(const v1::JobConfig& config, uint64_t d, uint32_t node,
                          LocalGroup& group, const Dataset& train, const Dataset& test,
                          ProcessResult* result, v1::GetStatusResponse* shard_status) {
  PsClientOptions options;
  options.shard_stride = group.size();
  options.shard_offset = group.local_rank();
  options.setup_timeout = absl::Seconds(30);
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(config, d, options));
  ASSIGN_OR_RETURN(const uint32_t rank, RegisterNode(group, *client, static_cast<int>(node),
                                                     absl::StrCat("node-", node)));
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(config, {client.get(), &group}, &train, &test));
  RETURN_IF_ERROR(trainer->Run());
  ASSIGN_OR_RETURN(result->params, trainer->Params());
  result->rank = rank;
  result->partition = trainer->partition();
  // After the run, each local rank asks its own shard (j) how many members
  // it has.
  ASSIGN_OR_RETURN(*shard_status, client->GetStatus(group.local_rank()));
  return absl::OkStatus();
}

struct NodeRun {
  std::vector<ProcessResult> processes;  // by node * kLocalSize + local rank
  std::vector<v1::GetStatusResponse> shard_status;  // by local rank of node 0
};

NodeRun RunNodes(v1::JobConfig config, const Dataset& train, const Dataset& test, uint64_t d,
                 testing::ServerSet* servers) {
  NodeRun run;
  run.processes.resize(kNodes * kLocalSize);
  run.shard_status.resize(kNodes * kLocalSize);
  const absl::Status started = servers->Start(&config);
  if (!started.ok()) {
    run.processes[0].status = started;
    return run;
  }
  std::vector<std::vector<std::unique_ptr<ThreadGroup>>> groups;
  for (uint32_t n = 0; n < kNodes; ++n) {
    groups.push_back(ThreadGroup::Create(kLocalSize, {.timeout = absl::Seconds(60)}));
  }
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < kNodes; ++n) {
    for (uint32_t j = 0; j < kLocalSize; ++j) {
      threads.emplace_back([&, n, j] {
        const uint32_t p = n * kLocalSize + j;
        run.processes[p].status = RunLocalRank(config, d, n, *groups[n][j], train, test,
                                               &run.processes[p], &run.shard_status[p]);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  return run;
}

class NodeGroupTest : public ::testing::TestWithParam<const char*> {};

TEST_P(NodeGroupTest, NodesOfTwoLocalRanksFollowTheFlatJobOfFourMembers) {
  const std::string algorithm = GetParam();
  const Dataset train = testing::RandomDataset(kExamples, kDim, kClasses, 1);
  const Dataset test = testing::RandomDataset(100, kDim, kClasses, 2);
  const std::filesystem::path node_out = FreshDir("node_group_test_nodes");
  const std::filesystem::path flat_out = FreshDir("node_group_test_flat");
  const v1::JobConfig node_config =
      MakeConfig(kNodes, kLocalSize, algorithm, node_out.string());
  const v1::JobConfig flat_config =
      MakeConfig(kNodes * kLocalSize, 1, algorithm, flat_out.string());
  ASSERT_TRUE(ValidateJobConfig(node_config, {.allow_port_zero = true}).ok());
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(node_config.model());
  ASSERT_TRUE(model.ok()) << model.status();
  const uint64_t d = (*model)->spec().num_params;

  testing::ServerSet servers;
  const NodeRun nodes = RunNodes(node_config, train, test, d, &servers);
  for (uint32_t p = 0; p < nodes.processes.size(); ++p) {
    ASSERT_TRUE(nodes.processes[p].status.ok())
        << "process " << p << ": " << nodes.processes[p].status;
  }
  const std::vector<ProcessResult> flat = RunFlat(flat_config, train, test, d);
  ASSERT_TRUE(flat[0].status.ok()) << flat[0].status;
  for (const ProcessResult& r : flat) ASSERT_EQ(r.params.size(), d);

  std::vector<float> x0(d);
  (*model)->Initialize(node_config.seed(), absl::MakeSpan(x0));
  for (uint32_t n = 0; n < kNodes; ++n) {
    for (uint32_t j = 0; j < kLocalSize; ++j) {
      const uint32_t p = n * kLocalSize + j;
      SCOPED_TRACE(absl::StrCat("node ", n, " local rank ", j));
      const ProcessResult& mine = nodes.processes[p];
      EXPECT_EQ(mine.rank, n);
      EXPECT_EQ(mine.partition, p);
      EXPECT_EQ(flat[p].partition, p);
      // Both algorithms end with every process holding the global model,
      // bit for bit the same everywhere.
      EXPECT_EQ(0, std::memcmp(mine.params.data(), nodes.processes[0].params.data(),
                               d * sizeof(float)));
      EXPECT_LT(RelativeL2(mine.params, flat[p].params), 1e-5);
    }
  }
  // The comparison means something only if training moved the model far
  // more than the tolerance.
  EXPECT_GT(RelativeL2(x0, flat[0].params), 1e-2);

  // To the servers the job has 2 members, not 4.
  for (uint32_t j = 0; j < kLocalSize; ++j) {
    EXPECT_EQ(nodes.shard_status[j].registered(), kNodes) << "shard " << j;
    EXPECT_EQ(nodes.shard_status[j].world_size(), kNodes) << "shard " << j;
    EXPECT_EQ(nodes.shard_status[j].rounds_failed(), 0u) << "shard " << j;
  }

  // One summary per local rank, under its own name, each counting only the
  // floats of its own shard (local rank j owns shard j here).
  const BlockLayout layout(d, node_config.algorithm().block_size(), kShards);
  const size_t steps =
      node_config.epochs() * StepsPerEpoch(kExamples, RankBatchSizes(node_config));
  for (uint32_t n = 0; n < kNodes; ++n) {
    for (uint32_t j = 0; j < kLocalSize; ++j) {
      SCOPED_TRACE(absl::StrCat("node ", n, " local rank ", j));
      const std::string json = ReadFile(node_out / absl::StrCat("worker_", n, "_", j, ".json"));
      ASSERT_FALSE(json.empty());
      EXPECT_EQ(JsonNumber(json, "rank"), n);
      EXPECT_EQ(JsonNumber(json, "local_rank"), j);
      EXPECT_EQ(JsonNumber(json, "steps"), steps);
      EXPECT_EQ(JsonNumber(json, "batch_size"), kBatchSizes[n * kLocalSize + j]);
      if (algorithm.find("ssgd") != std::string::npos) {
        // S-SGD pushes its shard's floats every step: compression exactly 1.
        EXPECT_EQ(JsonNumber(json, "training_floats_pushed"), steps * layout.ShardSize(j));
        EXPECT_EQ(JsonNumber(json, "achieved_compression"), 1.0);
      }
      EXPECT_FALSE(ReadFile(node_out / absl::StrCat("worker_", n, "_", j, ".csv")).empty());
    }
    EXPECT_FALSE(std::filesystem::exists(node_out / absl::StrCat("worker_", n, ".json")));
  }
  EXPECT_TRUE(std::filesystem::exists(flat_out / "worker_3.json"));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, NodeGroupTest,
    ::testing::Values("name: \"ssgd\"",
                      "name: \"cser\" period: 4 ratio_c1: 2 ratio_c2: 4"),
    [](const ::testing::TestParamInfo<const char*>& info) {
      return std::string(info.index == 0 ? "Ssgd" : "Cser");
    });

// A node of more local ranks than shards: local rank 1 talks to no shard,
// yet starts where shard 0 resumed, with its own checkpoint, whether the
// job resumes by checkpoint.resume or by checkpoint.restart_on_failure.
class NodeCheckpointTest : public ::testing::TestWithParam<bool> {};

TEST_P(NodeCheckpointTest, ALocalRankWithoutShardsResumesWithItsNode) {
  const bool restartable = GetParam();
  const Dataset train = testing::RandomDataset(kExamples, kDim, kClasses, 1);
  const Dataset test = testing::RandomDataset(100, kDim, kClasses, 2);
  const std::filesystem::path dir =
      FreshDir(absl::StrCat("node_group_test_checkpoints_", restartable));
  v1::JobConfig config = MakeConfig(1, kLocalSize, "name: \"ssgd\"", (dir / "out").string());
  config.mutable_cluster()->mutable_servers()->RemoveLast();
  config.mutable_data()->mutable_rank_batch_sizes()->Truncate(kLocalSize);
  config.mutable_checkpoint()->set_dir((dir / "checkpoints").string());
  config.mutable_checkpoint()->set_every_steps(4);
  config.mutable_checkpoint()->set_restart_on_failure(restartable);
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config.model());
  ASSERT_TRUE(model.ok()) << model.status();
  const uint64_t d = (*model)->spec().num_params;

  // Trains the node from where it starts until step `stop`; the steps its
  // local ranks started at.
  auto run = [&](bool resume, uint64_t stop) -> absl::StatusOr<std::vector<uint64_t>> {
    v1::JobConfig job = config;
    job.mutable_checkpoint()->set_resume(resume);
    testing::ServerSet servers;
    RETURN_IF_ERROR(servers.Start(&job));
    std::vector<std::unique_ptr<ThreadGroup>> group =
        ThreadGroup::Create(kLocalSize, {.timeout = absl::Seconds(60)});
    std::vector<uint64_t> started(kLocalSize);
    std::vector<absl::Status> status(kLocalSize);
    std::vector<std::thread> threads;
    for (uint32_t j = 0; j < kLocalSize; ++j) {
      threads.emplace_back([&, j] {
        status[j] = [&]() -> absl::Status {
          PsClientOptions options;
          options.shard_stride = kLocalSize;
          options.shard_offset = j;
          options.setup_timeout = absl::Seconds(30);
          ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                           PsClient::Connect(job, d, options));
          RETURN_IF_ERROR(RegisterNode(*group[j], *client, 0, "node").status());
          ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                           Trainer::Create(job, {client.get(), group[j].get()}, &train, &test));
          RETURN_IF_ERROR(trainer->InitializeModel());
          started[j] = trainer->step();
          while (trainer->step() < stop) {
            RETURN_IF_ERROR(trainer->Step().status());
            RETURN_IF_ERROR(trainer->FullAverageIfDue());
          }
          return absl::OkStatus();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) RETURN_IF_ERROR(s);
    return started;
  };

  absl::StatusOr<std::vector<uint64_t>> first = run(/*resume=*/false, 6);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, ::testing::Each(0u));
  absl::StatusOr<std::vector<uint64_t>> second = run(/*resume=*/!restartable, 8);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(*second, ::testing::Each(4u));
}

INSTANTIATE_TEST_SUITE_P(Starts, NodeCheckpointTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "RestartOnFailure" : "Resume");
                         });

// A flat trainer in a job of nodes, or a group of the wrong size, would
// take the wrong data partition and shards: refused before anything runs.
TEST(NodeGroupTrainerTest, GroupMustMatchLocalSize) {
  const Dataset data = testing::RandomDataset(kExamples, kDim, kClasses, 1);
  v1::JobConfig config = MakeConfig(kNodes, kLocalSize, "name: \"ssgd\"", "unused");
  // A client needs addresses, never used here: nothing is sent before
  // Register.
  config.mutable_cluster()->set_servers(0, "127.0.0.1:1");
  config.mutable_cluster()->set_servers(1, "127.0.0.1:2");
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config.model());
  ASSERT_TRUE(model.ok());
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(config, (*model)->spec().num_params);
  ASSERT_TRUE(client.ok()) << client.status();

  absl::StatusOr<std::unique_ptr<Trainer>> flat =
      Trainer::Create(config, client->get(), &data, &data);
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(flat.status().message(), HasSubstr("cluster.local_size is 2"));

  auto three = ThreadGroup::Create(3);
  absl::StatusOr<std::unique_ptr<Trainer>> wrong_size =
      Trainer::Create(config, {client->get(), three[0].get()}, &data, &data);
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_size.status().message(), HasSubstr("local group has 3 members"));
}

TEST(NodeGroupTrainerTest, PartitionIsNodeTimesLocalSizePlusLocalRank) {
  EXPECT_EQ(DataPartition(0, 0, 1), 0u);
  EXPECT_EQ(DataPartition(5, 0, 1), 5u);
  EXPECT_EQ(DataPartition(0, 1, 2), 1u);
  EXPECT_EQ(DataPartition(1, 0, 2), 2u);
  EXPECT_EQ(DataPartition(3, 2, 4), 14u);
}

}  // namespace
}  // namespace cserps
