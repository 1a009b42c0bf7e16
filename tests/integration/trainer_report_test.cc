// The trainer's final report on a real in-process cluster (2 shards, 3
// workers with unequal batch sizes) running CSER on a tiny in-memory
// dataset: the accuracies it reports are those of the models it names, and
// its achieved compression counts exactly the floats the training steps
// pushed.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;

constexpr size_t kDim = 60;
constexpr size_t kClasses = 5;
// SOFTMAX 60 -> 5: d = 305 floats, each its own block, so GRBS's rounding
// of the block count moves the ratio by well under 10%.
constexpr uint64_t kD = kDim * kClasses + kClasses;
constexpr uint32_t kPeriod = 8;
constexpr uint32_t kRatioC1 = 2;
constexpr uint32_t kRatioC2 = 16;
// One period: seven steps at R_C2 and one sync step at R_C1.
constexpr int kSteps = 8;
constexpr int kWorkers = 3;
// Batch sizes 4, 6, 8 split 180 examples 40/60/80: 10 steps per epoch.
constexpr size_t kTrainExamples = 180;
constexpr size_t kTestExamples = 300;

v1::JobConfig MakeConfig(v1::AlgorithmConfig::CserVariant variant) {
  return TestConfig(absl::StrCat(R"pb(
    name: "trainer-report-test"
    seed: 11
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: 3
      round_timeout_s: 10
    }
    model { kind: SOFTMAX input_dim: )pb", kDim, R"pb( num_classes: )pb", kClasses, R"pb( }
    data { rank_batch_sizes: 4 rank_batch_sizes: 6 rank_batch_sizes: 8 }
    optimizer { lr: 0.5 }
    algorithm {
      name: "cser"
      block_size: 1
      period: )pb", kPeriod, R"pb(
      ratio_c1: )pb", kRatioC1, R"pb(
      ratio_c2: )pb", kRatioC2, R"pb(
      cser_variant: )pb", v1::AlgorithmConfig::CserVariant_Name(variant), R"pb(
    }
    epochs: 1
  )pb"));
}

// Random features in [-1, 1) labelled by a fixed random linear teacher, so
// that a few steps of training change the accuracy.
Dataset MakeDataset(size_t examples, const std::vector<float>& teacher, uint64_t key) {
  Dataset data;
  data.size = examples;
  data.dim = kDim;
  data.num_classes = kClasses;
  CounterRng rng(key);
  for (size_t i = 0; i < examples; ++i) {
    const size_t row = data.features.size();
    for (size_t k = 0; k < kDim; ++k) data.features.push_back(2.0f * rng.UniformFloat() - 1.0f);
    size_t best = 0;
    double best_score = -INFINITY;
    for (size_t c = 0; c < kClasses; ++c) {
      double score = 0;
      for (size_t k = 0; k < kDim; ++k) score += double{teacher[c * kDim + k]} * data.features[row + k];
      if (score > best_score) {
        best_score = score;
        best = c;
      }
    }
    data.labels.push_back(static_cast<uint8_t>(best));
  }
  return data;
}

std::vector<float> MakeTeacher() {
  CounterRng rng(99);
  std::vector<float> w(kClasses * kDim);
  for (float& x : w) x = 2.0f * rng.UniformFloat() - 1.0f;
  return w;
}

// Floats one rank pushes in steps 0..kSteps-1 by the rules of each variant
// (config.proto, AlgorithmConfig): sync steps are t with (t + 1) % H == 0;
// MODEL_BLOCKS averages the model once per step at R_C1 on sync steps and
// R_C2 otherwise; GRADIENT_BLOCKS averages the update at R_C2 every step
// and the model at R_C1 on sync steps. Blocks are single floats here.
uint64_t ExpectedFloats(v1::AlgorithmConfig::CserVariant variant, uint64_t seed) {
  uint64_t floats = 0;
  for (uint64_t t = 0; t < kSteps; ++t) {
    const bool sync = (t + 1) % kPeriod == 0;
    if (variant == v1::AlgorithmConfig::GRADIENT_BLOCKS) {
      floats += SelectBlocks(seed, v1::GRAD, t, kRatioC2, kD).size();
      if (sync) floats += SelectBlocks(seed, v1::MODEL, t, kRatioC1, kD).size();
    } else {
      floats += SelectBlocks(seed, v1::MODEL, t, sync ? kRatioC1 : kRatioC2, kD).size();
    }
  }
  return floats;
}

class TrainerReportTest
    : public ::testing::TestWithParam<v1::AlgorithmConfig::CserVariant> {};

TEST_P(TrainerReportTest, ReportMeasuresTheModelsItNames) {
  const v1::JobConfig config = MakeConfig(GetParam());
  absl::StatusOr<std::unique_ptr<InProcessCluster>> started =
      InProcessCluster::Start(config, kD);
  ASSERT_TRUE(started.ok()) << started.status();
  InProcessCluster& cluster = **started;

  const std::vector<float> teacher = MakeTeacher();
  const Dataset train = MakeDataset(kTrainExamples, teacher, 1);
  const Dataset test = MakeDataset(kTestExamples, teacher, 2);

  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < kWorkers; ++r) {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(cluster.config(), &cluster.client(r), &train, &test);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_GE((*trainer)->steps_per_epoch(), static_cast<size_t>(kSteps));
    trainers.push_back(std::move(*trainer));
  }

  // FinishTraining overwrites the model with the global one, so each rank
  // keeps a copy of its local model from just before.
  std::vector<std::vector<float>> local(kWorkers);
  const absl::Status run = cluster.OnEveryRank([&](int r) -> absl::Status {
    Trainer& trainer = *trainers[r];
    RETURN_IF_ERROR(trainer.InitializeModel());
    for (int t = 0; t < kSteps; ++t) RETURN_IF_ERROR(trainer.Step().status());
    ASSIGN_OR_RETURN(local[r], trainer.Params());
    return trainer.FinishTraining();
  });
  ASSERT_TRUE(run.ok()) << run;

  std::vector<float> global(kD);
  ASSERT_TRUE(cluster.client(0).PullModel(absl::MakeSpan(global), false).ok());

  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config.model());
  ASSERT_TRUE(model.ok()) << model.status();
  const Batch whole_test{test.features, test.labels, test.size, test.dim};
  auto accuracy = [&](const std::vector<float>& params) {
    const EvalSums sums = (*model)->Evaluate(params, whole_test).value();
    EXPECT_EQ(sums.count, kTestExamples);
    return static_cast<double>(sums.correct) / static_cast<double>(sums.count);
  };
  const double global_accuracy = accuracy(global);

  // The checks below could tell the local models from the global one.
  bool some_local_accuracy_differs = false;
  for (int r = 0; r < kWorkers; ++r) {
    if (accuracy(local[r]) != global_accuracy) some_local_accuracy_differs = true;
  }
  ASSERT_TRUE(some_local_accuracy_differs)
      << "every local model scores like the global one; change the setup";

  const uint64_t floats = ExpectedFloats(GetParam(), config.seed());
  const double achieved = static_cast<double>(kSteps) * kD / static_cast<double>(floats);
  const double overall = OverallRatio(config.algorithm());
  ASSERT_GT(overall, 1.0);
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const FinalReport& report = trainers[r]->final_report();
    EXPECT_EQ(report.global_accuracy, global_accuracy);
    EXPECT_EQ(report.local_accuracy, accuracy(local[r]));
    // After the final average every worker holds the servers' model.
    const absl::StatusOr<std::vector<float>> params = trainers[r]->Params();
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_EQ(0, std::memcmp(params->data(), global.data(), kD * sizeof(float)));
    EXPECT_EQ(report.training_floats_pushed, floats);
    EXPECT_DOUBLE_EQ(report.achieved_compression, achieved);
    EXPECT_NEAR(report.achieved_compression, overall, 0.1 * overall);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, TrainerReportTest,
    ::testing::Values(v1::AlgorithmConfig::MODEL_BLOCKS,
                      v1::AlgorithmConfig::GRADIENT_BLOCKS),
    [](const ::testing::TestParamInfo<v1::AlgorithmConfig::CserVariant>& info) {
      return v1::AlgorithmConfig::CserVariant_Name(info.param);
    });

}  // namespace
}  // namespace cserps
