// The device trainer (worker/device/device_trainer.h) on HostBackend (the
// CPU model on host memory) against the host Trainer, each on its own
// in-process cluster with the same job and data (processes of unequal
// batch sizes, so that the weights matter): every step's loss, the
// final models, the final report and the learning curve agree bit for bit,
// for flat workers and for nodes of two local ranks (thread groups). On
// the GPU the same trainer runs on CudaBackend (tests/gpu).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_cluster.h"
#include "tests/testing/node_support.h"
#include "tests/testing/test_support.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/data/partition.h"
#include "worker/device/device_trainer.h"
#include "worker/device/host_backend.h"
#include "worker/ps/node_client.h"
#include "worker/trainer.h"

namespace cserps {
namespace {

using testing::BitEqual;

constexpr uint64_t kDim = 24;
constexpr int kSteps = 7;

v1::JobConfig MakeConfig(const std::string& algorithm, const std::string& optimizer,
                         uint32_t local_size, const std::string& output_dir) {
  return testing::TestConfig(absl::StrCat(R"pb(
    name: "device-trainer-host-test"
    seed: 11
    output_dir: ")pb", output_dir, R"pb("
    cluster { servers: "127.0.0.1:0" servers: "127.0.0.1:0" servers: "127.0.0.1:0"
              num_workers: 2 local_size: )pb", local_size, R"pb( round_timeout_s: 20 }
    model { kind: MLP input_dim: )pb", kDim, R"pb( hidden: 16 num_classes: 10 }
    data { )pb", local_size == 1 ? "rank_batch_sizes: 12 rank_batch_sizes: 20"
                                 : "rank_batch_sizes: 12 rank_batch_sizes: 20 "
                                   "rank_batch_sizes: 8 rank_batch_sizes: 16", R"pb( }
    optimizer { )pb", optimizer, R"pb( }
    algorithm { )pb", algorithm, R"pb( block_size: 8 }
    epochs: 1
  )pb"));
}

// What one process of a run saw.
struct ProcessRun {
  std::vector<float> losses;  // by step
  std::vector<float> params;  // after FinishTraining
  FinalReport report;
};

// Steps kSteps on `trainer` (Trainer or DeviceTrainer), then finishes.
template <typename AnyTrainer>
absl::Status Drive(AnyTrainer& trainer, ProcessRun* run) {
  RETURN_IF_ERROR(trainer.InitializeModel());
  for (int t = 0; t < kSteps; ++t) {
    ASSIGN_OR_RETURN(const float loss, trainer.Step());
    run->losses.push_back(loss);
  }
  RETURN_IF_ERROR(trainer.FinishTraining());
  run->report = trainer.final_report();
  return absl::OkStatus();
}

// The device trainer on HostBackend with the CPU model of `config`.
absl::StatusOr<std::unique_ptr<DeviceTrainer>> MakeHostDeviceTrainer(
    const v1::JobConfig& config, TrainerLink link, const Dataset& train,
    const Dataset& test) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeCpuModel(config.model()));
  return DeviceTrainer::Create(
      config, link, &train, &test,
      std::make_unique<HostBackend>(std::move(model), config.algorithm().block_size()));
}

// Makes and drives rank r's trainer over `link`, on the device (HostBackend)
// or the host.
absl::Status RunProcess(const v1::JobConfig& config, TrainerLink link, const Dataset& train,
                        const Dataset& test, bool device, ProcessRun* run) {
  if (!device) {
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(config, link, &train, &test));
    RETURN_IF_ERROR(Drive(*trainer, run));
    run->params.assign(trainer->params().begin(), trainer->params().end());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceTrainer> trainer,
                   MakeHostDeviceTrainer(config, link, train, test));
  RETURN_IF_ERROR(Drive(*trainer, run));
  ASSIGN_OR_RETURN(run->params, trainer->Params());
  return absl::OkStatus();
}

void ExpectSameRuns(const std::vector<ProcessRun>& device, const std::vector<ProcessRun>& host) {
  ASSERT_EQ(device.size(), host.size());
  for (size_t p = 0; p < host.size(); ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    ASSERT_EQ(device[p].losses.size(), host[p].losses.size());
    for (size_t t = 0; t < host[p].losses.size(); ++t) {
      EXPECT_EQ(device[p].losses[t], host[p].losses[t]) << "step " << t;
    }
    EXPECT_TRUE(BitEqual(device[p].params, host[p].params));
    EXPECT_EQ(device[p].report.local_accuracy, host[p].report.local_accuracy);
    EXPECT_EQ(device[p].report.global_accuracy, host[p].report.global_accuracy);
    EXPECT_EQ(device[p].report.training_floats_pushed, host[p].report.training_floats_pushed);
    EXPECT_EQ(device[p].report.achieved_compression, host[p].report.achieved_compression);
  }
  // The losses moved: a run that learned nothing would hide little.
  EXPECT_NE(host[0].losses.front(), host[0].losses.back());
}

const Dataset& TrainSet() {
  static const Dataset* const data = new Dataset(testing::RandomDataset(512, kDim, 10, 1));
  return *data;
}
const Dataset& TestSet() {
  static const Dataset* const data = new Dataset(testing::RandomDataset(200, kDim, 10, 2));
  return *data;
}

// Both trainers on flat workers, each on its own cluster: [device][rank].
absl::StatusOr<std::vector<std::vector<ProcessRun>>> RunFlat(const v1::JobConfig& config) {
  std::vector<std::vector<ProcessRun>> runs(2, std::vector<ProcessRun>(2));
  for (const bool device : {false, true}) {
    ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> cluster,
                     testing::InProcessCluster::Start(config, testing::NumParams(config)));
    RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) {
      return RunProcess(cluster->config(), {&cluster->client(r), nullptr}, TrainSet(), TestSet(),
                        device, &runs[device][r]);
    }));
  }
  return runs;
}

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.label; }

class DeviceTrainerOnHostTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceTrainerOnHostTest, FlatWorkersMatchTheHostTrainer) {
  absl::StatusOr<std::vector<std::vector<ProcessRun>>> runs = RunFlat(
      MakeConfig(GetParam().algorithm, GetParam().optimizer, 1, ::testing::TempDir()));
  ASSERT_TRUE(runs.ok()) << runs.status();
  ExpectSameRuns((*runs)[true], (*runs)[false]);
}

TEST_P(DeviceTrainerOnHostTest, NodesOfTwoLocalRanksMatchTheHostTrainer) {
  constexpr uint32_t kNodes = 2, kLocal = 2;
  v1::JobConfig config =
      MakeConfig(GetParam().algorithm, GetParam().optimizer, kLocal, ::testing::TempDir());
  const Dataset& train = TrainSet();
  const Dataset& test = TestSet();
  const uint64_t d = testing::NumParams(config);
  std::vector<std::vector<ProcessRun>> runs(2, std::vector<ProcessRun>(kNodes * kLocal));
  for (const bool device : {false, true}) {
    testing::ServerSet servers;
    ASSERT_TRUE(servers.Start(&config).ok());
    const auto status = testing::OnEveryProcess(
        kNodes, kLocal, [&](uint32_t n, uint32_t j, LocalGroup& group) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                           testing::ConnectLocalRank(config, d, kLocal, j));
          RETURN_IF_ERROR(
              RegisterNode(group, *client, static_cast<int>(n), absl::StrCat("node-", n))
                  .status());
          return RunProcess(config, {client.get(), &group}, train, test, device,
                            &runs[device][n * kLocal + j]);
        });
    for (uint32_t p = 0; p < kNodes * kLocal; ++p) {
      ASSERT_TRUE(status[p].ok()) << "process " << p << ": " << status[p];
    }
  }
  ExpectSameRuns(runs[true], runs[false]);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, DeviceTrainerOnHostTest,
    ::testing::Values(
        Case{"ssgd_nesterov", R"(name: "ssgd")",
             "lr: 0.05 momentum: 0.9 momentum_kind: NESTEROV weight_decay: 0.0001"},
        Case{"cser_heavy_ball", R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)",
             "lr: 0.05 momentum: 0.9 momentum_kind: HEAVY_BALL"},
        Case{"ef_sgd", R"(name: "ef-sgd" ratio: 4)", "lr: 0.05"},
        Case{"qsparse_local_sgd", R"(name: "qsparse-local-sgd" period: 2 ratio: 2)",
             "lr: 0.05"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// The sparse methods run flat only; their device top-k and sparse updates
// follow the host's through a whole trainer too.
TEST(DeviceTrainerOnHostSparseTest, GtopkMatchesTheHostTrainer) {
  absl::StatusOr<std::vector<std::vector<ProcessRun>>> runs =
      RunFlat(MakeConfig(R"(name: "gtopk-ssgd" density: 0.05)",
                         "lr: 0.05 momentum: 0.9 momentum_kind: NESTEROV", 1,
                         ::testing::TempDir()));
  ASSERT_TRUE(runs.ok()) << runs.status();
  ExpectSameRuns((*runs)[true], (*runs)[false]);
}

// One node of two local ranks whose local rank 1 diverges at its first
// step (its data partition holds NaN features): both local ranks fail with
// its error at once, on either trainer (without the shared verdict local
// rank 0 would wait for it in the first average until the group's timeout,
// and fail with DEADLINE_EXCEEDED).
TEST(NodeDivergenceTest, ADivergedLocalRankStopsItsNodeAtOnce) {
  constexpr uint32_t kLocal = 2;
  v1::JobConfig config = MakeConfig(R"(name: "ssgd")", "lr: 0.05", kLocal, ::testing::TempDir());
  // A linear model: NaN features reach the loss (an MLP's ReLU drops them).
  config.mutable_model()->set_kind(v1::ModelConfig::SOFTMAX);
  config.mutable_model()->clear_hidden();
  config.mutable_cluster()->set_num_workers(1);
  config.mutable_data()->clear_rank_batch_sizes();
  config.mutable_data()->add_rank_batch_sizes(12);
  config.mutable_data()->add_rank_batch_sizes(20);
  Dataset train = TrainSet();
  const Range poisoned = RankRange(train.size, {12, 20}, 1);
  for (size_t i = poisoned.begin * kDim; i < poisoned.end * kDim; ++i) {
    train.features[i] = std::nanf("");
  }
  const uint64_t d = testing::NumParams(config);
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device trainer" : "host trainer");
    testing::ServerSet servers;
    ASSERT_TRUE(servers.Start(&config).ok());
    std::vector<ProcessRun> runs(kLocal);
    const auto status = testing::OnEveryProcess(
        1, kLocal, [&](uint32_t, uint32_t j, LocalGroup& group) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                           testing::ConnectLocalRank(config, d, kLocal, j));
          RETURN_IF_ERROR(RegisterNode(group, *client, 0, "node").status());
          return RunProcess(config, {client.get(), &group}, train, TestSet(), device,
                            &runs[j]);
        });
    for (uint32_t j = 0; j < kLocal; ++j) {
      EXPECT_EQ(status[j].code(), absl::StatusCode::kInternal) << status[j];
      EXPECT_TRUE(runs[j].losses.empty()) << "local rank " << j;
    }
    EXPECT_THAT(std::string(status[1].message()), ::testing::HasSubstr("diverged"));
    EXPECT_THAT(std::string(status[0].message()), ::testing::HasSubstr("local rank 1 failed"));
  }
}

// Run() writes the summary files the host trainer writes, with the same
// learning curve.
TEST(DeviceTrainerOnHostRunTest, RunWritesTheHostTrainersCurve) {
  const Dataset& train = TrainSet();
  const Dataset& test = TestSet();
  std::vector<std::vector<CurvePoint>> curves(2);
  for (const bool device : {false, true}) {
    const std::string dir = ::testing::TempDir() + (device ? "/device_run" : "/host_run");
    const v1::JobConfig config = MakeConfig(R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)",
                                            "lr: 0.05", 1, dir);
    absl::StatusOr<std::unique_ptr<testing::InProcessCluster>> cluster =
        testing::InProcessCluster::Start(config, testing::NumParams(config));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<std::vector<CurvePoint>> by_rank(2);
    ASSERT_TRUE((*cluster)->OnEveryRank([&](int r) -> absl::Status {
      const TrainerLink link{&(*cluster)->client(r), nullptr};
      const v1::JobConfig& job = (*cluster)->config();
      if (!device) {
        ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                         Trainer::Create(job, link, &train, &test));
        RETURN_IF_ERROR(trainer->Run());
        by_rank[r] = trainer->curve();
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceTrainer> trainer,
                       MakeHostDeviceTrainer(job, link, train, test));
      RETURN_IF_ERROR(trainer->Run());
      by_rank[r] = trainer->curve();
      return absl::OkStatus();
    }).ok());
    curves[device] = by_rank[0];
    for (int r = 0; r < 2; ++r) {
      EXPECT_FALSE(testing::ReadFile(dir + absl::StrCat("/worker_", r, ".json")).empty());
      EXPECT_FALSE(testing::ReadFile(dir + absl::StrCat("/worker_", r, ".csv")).empty());
    }
  }
  ASSERT_EQ(curves[true].size(), curves[false].size());
  ASSERT_FALSE(curves[false].empty());
  for (size_t e = 0; e < curves[false].size(); ++e) {
    EXPECT_EQ(curves[true][e].step, curves[false][e].step);
    EXPECT_EQ(curves[true][e].train_loss, curves[false][e].train_loss);
    EXPECT_EQ(curves[true][e].test_loss, curves[false][e].test_loss);
    EXPECT_EQ(curves[true][e].test_accuracy, curves[false][e].test_accuracy);
  }
}

}  // namespace
}  // namespace cserps
