// The Trainer (worker/trainer/trainer.h) on HostBackend (the CPU model on
// host memory) against the same process wired by hand from its parts (the
// data partition's batches, the CPU model, the schedule, the algorithm),
// each on its own in-process cluster with the same job and data (processes
// of unequal batch sizes, so that the weights matter): every step's loss
// and the final model agree bit for bit, for flat workers and for nodes of
// two local ranks (thread groups). On the GPU the same trainer runs on
// CudaBackend against HostBackend (tests/gpu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "tests/testing/node_support.h"
#include "tests/testing/test_support.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "common/config.h"
#include "worker/data/batcher.h"
#include "worker/data/partition.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps/node_client.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::BitEqual;

constexpr uint64_t kDim = 24;
constexpr int kSteps = 7;

v1::JobConfig MakeConfig(const std::string& algorithm, const std::string& optimizer,
                         uint32_t local_size, const std::string& output_dir) {
  return testing::TestConfig(absl::StrCat(R"pb(
    name: "trainer-test"
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
  std::vector<float> params;  // after the final average
  FinalReport report;         // the trainer's only
};

// The Trainer of `link`'s process: kSteps steps, then FinishTraining.
absl::Status RunTrainer(const v1::JobConfig& config, TrainerLink link, const Dataset& train,
                        const Dataset& test, ProcessRun* run) {
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(config, link, &train, &test));
  RETURN_IF_ERROR(trainer->InitializeModel());
  for (int t = 0; t < kSteps; ++t) {
    ASSIGN_OR_RETURN(const float loss, trainer->Step());
    run->losses.push_back(loss);
  }
  RETURN_IF_ERROR(trainer->FinishTraining());
  run->report = trainer->final_report();
  ASSIGN_OR_RETURN(run->params, trainer->Params());
  return absl::OkStatus();
}

// The same process wired by hand from the trainer's parts: its data
// partition's batches, the CPU model, the learning-rate schedule and the
// algorithm, started from the model rank 0 initialises.
absl::Status RunByHand(const v1::JobConfig& config, TrainerLink link, const Dataset& train,
                       ProcessRun* run) {
  const uint32_t local_size = config.cluster().local_size();
  const uint32_t local_rank = link.group != nullptr ? link.group->local_rank() : 0;
  const uint32_t partition = DataPartition(link.client->rank(), local_rank, local_size);
  const std::vector<uint32_t> batch_sizes = RankBatchSizes(config);
  const size_t steps_per_epoch = StepsPerEpoch(train.size, batch_sizes);
  EpochBatcher batcher(train, RankRange(train.size, batch_sizes, partition),
                       batch_sizes[partition], config.seed(), partition);
  const LrSchedule schedule(config.optimizer(), steps_per_epoch, config.epochs());
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeCpuModel(config.model()));
  const size_t d = model->spec().num_params;
  std::vector<float> x(d), g(d);
  if (link.client->rank() == 0) {
    model->Initialize(config.seed(), absl::MakeSpan(x));
    RETURN_IF_ERROR(PushModel(link, x));
  }
  RETURN_IF_ERROR(PullModel(link, absl::MakeSpan(x), /*wait_for_init=*/true));
  ASSIGN_OR_RETURN(std::unique_ptr<testing::RankAlgorithm> algorithm,
                   testing::RankAlgorithm::Create(config, link.client,
                                                  static_cast<float>(batch_sizes[partition]),
                                                  link.group, steps_per_epoch));
  for (int t = 0; t < kSteps; ++t) {
    if (t % steps_per_epoch == 0) batcher.StartEpoch(t / steps_per_epoch);
    ASSIGN_OR_RETURN(const float loss, model->LossAndGradient(
                                           x, batcher.Get(t % steps_per_epoch),
                                           absl::MakeSpan(g)));
    run->losses.push_back(loss);
    RETURN_IF_ERROR(algorithm->Step(t, schedule.At(t), g, &x));
  }
  RETURN_IF_ERROR(algorithm->Finish(kSteps, &x));
  run->params = x;
  return absl::OkStatus();
}

absl::Status RunProcess(const v1::JobConfig& config, TrainerLink link, const Dataset& train,
                        const Dataset& test, bool by_hand, ProcessRun* run) {
  return by_hand ? RunByHand(config, link, train, run)
                 : RunTrainer(config, link, train, test, run);
}

void ExpectSameRuns(const std::vector<ProcessRun>& trainer,
                    const std::vector<ProcessRun>& by_hand) {
  ASSERT_EQ(trainer.size(), by_hand.size());
  for (size_t p = 0; p < by_hand.size(); ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    ASSERT_EQ(trainer[p].losses.size(), by_hand[p].losses.size());
    for (size_t t = 0; t < by_hand[p].losses.size(); ++t) {
      EXPECT_EQ(trainer[p].losses[t], by_hand[p].losses[t]) << "step " << t;
    }
    EXPECT_TRUE(BitEqual(trainer[p].params, by_hand[p].params));
    EXPECT_GT(trainer[p].report.training_floats_pushed, 0u);
    EXPECT_GT(trainer[p].report.achieved_compression, 0.0);
  }
  // The losses moved: a run that learned nothing would hide little.
  EXPECT_NE(by_hand[0].losses.front(), by_hand[0].losses.back());
}

const Dataset& TrainSet() {
  static const Dataset* const data = new Dataset(testing::RandomDataset(512, kDim, 10, 1));
  return *data;
}
const Dataset& TestSet() {
  static const Dataset* const data = new Dataset(testing::RandomDataset(200, kDim, 10, 2));
  return *data;
}

// The trainer and the hand-wired loop on flat workers, each on its own
// cluster: [by_hand][rank].
absl::StatusOr<std::vector<std::vector<ProcessRun>>> RunFlat(const v1::JobConfig& config) {
  std::vector<std::vector<ProcessRun>> runs(2, std::vector<ProcessRun>(2));
  for (const bool by_hand : {false, true}) {
    ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> cluster,
                     testing::InProcessCluster::Start(config, testing::NumParams(config)));
    RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) {
      return RunProcess(cluster->config(), {&cluster->client(r), nullptr}, TrainSet(), TestSet(),
                        by_hand, &runs[by_hand][r]);
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

class TrainerTest : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerTest, FlatWorkersComputeWhatTheirPartsCompute) {
  absl::StatusOr<std::vector<std::vector<ProcessRun>>> runs = RunFlat(
      MakeConfig(GetParam().algorithm, GetParam().optimizer, 1, ::testing::TempDir()));
  ASSERT_TRUE(runs.ok()) << runs.status();
  ExpectSameRuns((*runs)[false], (*runs)[true]);
}

TEST_P(TrainerTest, NodesOfTwoLocalRanksComputeWhatTheirPartsCompute) {
  constexpr uint32_t kNodes = 2, kLocal = 2;
  v1::JobConfig config =
      MakeConfig(GetParam().algorithm, GetParam().optimizer, kLocal, ::testing::TempDir());
  const Dataset& train = TrainSet();
  const Dataset& test = TestSet();
  const uint64_t d = testing::NumParams(config);
  std::vector<std::vector<ProcessRun>> runs(2, std::vector<ProcessRun>(kNodes * kLocal));
  for (const bool by_hand : {false, true}) {
    testing::ServerSet servers;
    const absl::Status started = servers.Start(&config);
    ASSERT_TRUE(started.ok()) << started;
    const auto status = testing::OnEveryProcess(
        kNodes, kLocal, [&](uint32_t n, uint32_t j, LocalGroup& group) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                           testing::ConnectLocalRank(config, d, kLocal, j));
          RETURN_IF_ERROR(
              RegisterNode(group, *client, static_cast<int>(n), absl::StrCat("node-", n))
                  .status());
          return RunProcess(config, {client.get(), &group}, train, test, by_hand,
                            &runs[by_hand][n * kLocal + j]);
        });
    for (uint32_t p = 0; p < kNodes * kLocal; ++p) {
      ASSERT_TRUE(status[p].ok()) << "process " << p << ": " << status[p];
    }
  }
  ExpectSameRuns(runs[false], runs[true]);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, TrainerTest,
    ::testing::Values(
        Case{"ssgd_nesterov", R"(name: "ssgd")",
             "lr: 0.05 momentum: 0.9 momentum_kind: NESTEROV weight_decay: 0.0001"},
        Case{"cser_heavy_ball", R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)",
             "lr: 0.05 momentum: 0.9 momentum_kind: HEAVY_BALL"},
        Case{"ef_sgd", R"(name: "ef-sgd" ratio: 4)", "lr: 0.05"},
        Case{"qsparse_local_sgd", R"(name: "qsparse-local-sgd" period: 2 ratio: 2)",
             "lr: 0.05"},
        // The warm-up (k = 1 for the first epoch) covers every step: a
        // trainer that lost the steps per epoch would sync every third.
        Case{"cocod_sgd_warmup", R"(name: "cocod-sgd" period: 3 period_warmup_epochs: 1)",
             "lr: 0.05 momentum: 0.9 momentum_kind: HEAVY_BALL"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// The sparse methods run flat only.
TEST(TrainerSparseTest, GtopkComputesWhatItsPartsCompute) {
  absl::StatusOr<std::vector<std::vector<ProcessRun>>> runs =
      RunFlat(MakeConfig(R"(name: "gtopk-ssgd" density: 0.05)",
                         "lr: 0.05 momentum: 0.9 momentum_kind: NESTEROV", 1,
                         ::testing::TempDir()));
  ASSERT_TRUE(runs.ok()) << runs.status();
  ExpectSameRuns((*runs)[false], (*runs)[true]);
}

// One node of two local ranks whose local rank 1 diverges at its first
// step (its data partition holds NaN features): both local ranks fail with
// its error at once (without the shared verdict local rank 0 would wait for
// it in the first average until the group's timeout, and fail with
// DEADLINE_EXCEEDED).
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
  testing::ServerSet servers;
  const absl::Status started = servers.Start(&config);
  ASSERT_TRUE(started.ok()) << started;
  std::vector<ProcessRun> runs(kLocal);
  const auto status = testing::OnEveryProcess(
      1, kLocal, [&](uint32_t, uint32_t j, LocalGroup& group) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                         testing::ConnectLocalRank(config, d, kLocal, j));
        RETURN_IF_ERROR(RegisterNode(group, *client, 0, "node").status());
        return RunTrainer(config, {client.get(), &group}, train, TestSet(), &runs[j]);
      });
  for (uint32_t j = 0; j < kLocal; ++j) {
    EXPECT_EQ(status[j].code(), absl::StatusCode::kInternal) << status[j];
    EXPECT_TRUE(runs[j].losses.empty()) << "local rank " << j;
  }
  EXPECT_THAT(std::string(status[1].message()), ::testing::HasSubstr("diverged"));
  EXPECT_THAT(std::string(status[0].message()), ::testing::HasSubstr("local rank 1 failed"));
}

// Data that does not fit the job's model is refused by name, where the
// model's own checks aborted the worker (at its first step, or at its first
// evaluation for the test data).
TEST(TrainerCreateTest, DataThatDoesNotFitTheModelIsRefused) {
  v1::JobConfig config = MakeConfig(R"(name: "ssgd")", "lr: 0.05", 1, ::testing::TempDir());
  config.mutable_model()->set_num_classes(5);
  absl::StatusOr<std::unique_ptr<testing::InProcessCluster>> cluster =
      testing::InProcessCluster::Start(config, testing::NumParams(config));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create((*cluster)->config(), &(*cluster)->client(0), &TrainSet(), &TestSet());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trainer.status().message()),
              ::testing::HasSubstr("model.num_classes is 5 but the training data has label"));

  config.mutable_model()->set_num_classes(10);
  cluster = testing::InProcessCluster::Start(config, testing::NumParams(config));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Dataset wider = testing::RandomDataset(20, kDim + 1, 10, 3);
  trainer = Trainer::Create((*cluster)->config(), &(*cluster)->client(0), &TrainSet(), &wider);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trainer.status().message()),
              ::testing::HasSubstr(absl::StrCat("model.input_dim is ", kDim, " but the test data has ",
                                                kDim + 1, " features per example")));
}

// An output_dir the summary could not be written to is refused before the
// training, not found after it.
TEST(TrainerCreateTest, AnOutputDirThatCannotBeWrittenIsRefusedFirst) {
  const std::string file = ::testing::TempDir() + "/trainer_test_output_file";
  { std::ofstream(file) << "a file, not a folder"; }
  v1::JobConfig config =
      MakeConfig(R"(name: "ssgd")", "lr: 0.05", 1, file + "/out");
  absl::StatusOr<std::unique_ptr<testing::InProcessCluster>> cluster =
      testing::InProcessCluster::Start(config, testing::NumParams(config));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create((*cluster)->config(), &(*cluster)->client(0), &TrainSet(), &TestSet());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kFailedPrecondition) << trainer.status();
  EXPECT_THAT(std::string(trainer.status().message()),
              ::testing::HasSubstr(absl::StrCat("output_dir: cannot create ", file, "/out")));
  std::remove(file.c_str());
}

// What Run() left on each rank of a 2-worker in-process job.
struct RankRun {
  std::vector<CurvePoint> curve;
  uint64_t steps = 0;
  size_t steps_per_epoch = 0;
};

absl::StatusOr<std::vector<RankRun>> RunEveryRank(const v1::JobConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> cluster,
                   testing::InProcessCluster::Start(config, testing::NumParams(config)));
  std::vector<RankRun> runs(cluster->num_workers());
  RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(cluster->config(), &cluster->client(r), &TrainSet(),
                                     &TestSet()));
    RETURN_IF_ERROR(trainer->Run());
    runs[r] = {trainer->curve(), trainer->step(), trainer->steps_per_epoch()};
    return absl::OkStatus();
  }));
  return runs;
}

// Run() trains every epoch and writes the summary files, whose curve is the
// trainer's.
TEST(TrainerRunTest, RunWritesTheSummaryOfItsCurve) {
  const std::string dir = ::testing::TempDir() + "/trainer_run";
  const v1::JobConfig config =
      MakeConfig(R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)", "lr: 0.05", 1, dir);
  absl::StatusOr<std::vector<RankRun>> runs = RunEveryRank(config);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankRun& run = (*runs)[r];
    // One epoch: one curve row, after every step of the epoch.
    ASSERT_EQ(run.curve.size(), 1u);
    EXPECT_EQ(run.curve[0].step, run.steps);
    EXPECT_GT(run.steps, 0u);
    const std::string csv = testing::ReadFile(dir + absl::StrCat("/worker_", r, ".csv"));
    EXPECT_THAT(csv, ::testing::HasSubstr(absl::StrFormat("1,%d,%.6f,%.6f,%.6f,", run.steps,
                                                          run.curve[0].train_loss,
                                                          run.curve[0].test_loss,
                                                          run.curve[0].test_accuracy)));
    const std::string json = testing::ReadFile(dir + absl::StrCat("/worker_", r, ".json"));
    EXPECT_EQ(testing::JsonNumber(json, "steps"), static_cast<double>(run.steps));
  }
}

// evals_per_epoch E: E rows per epoch, evenly spaced by steps, the last at
// the epoch's end, each the test accuracy of the model at its step.
TEST(TrainerRunTest, SeveralEvaluationsPerEpochAreRowsOfTheCurve) {
  const std::string dir = ::testing::TempDir() + "/trainer_evals";
  v1::JobConfig config = MakeConfig(R"(name: "ssgd")", "lr: 0.05", 1, dir);
  config.set_epochs(2);
  config.set_evals_per_epoch(3);
  absl::StatusOr<std::vector<RankRun>> runs = RunEveryRank(config);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<CurvePoint>& curve = (*runs)[r].curve;
    const size_t spe = (*runs)[r].steps_per_epoch;
    ASSERT_GE(spe, 3u);
    ASSERT_EQ(curve.size(), 6u);
    for (size_t e = 0; e < 2; ++e) {
      for (size_t k = 1; k <= 3; ++k) {
        const CurvePoint& p = curve[e * 3 + k - 1];
        EXPECT_EQ(p.epoch, e + 1);
        EXPECT_EQ(p.step, e * spe + k * spe / 3);
        EXPECT_DOUBLE_EQ(p.epochs, static_cast<double>(p.step) / spe);
      }
    }
    // The model changes between evaluations, and so does what they measure.
    EXPECT_NE(curve[0].test_loss, curve[1].test_loss);
    const std::string csv = testing::ReadFile(dir + absl::StrCat("/worker_", r, ".csv"));
    EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7) << csv;  // header and 6 rows
    EXPECT_THAT(csv, ::testing::HasSubstr(absl::StrFormat(
                         "1,%d,%.6f,%.6f,%.6f,", curve[0].step, curve[0].train_loss,
                         curve[0].test_loss, curve[0].test_accuracy)));
  }
}

}  // namespace
}  // namespace cserps
