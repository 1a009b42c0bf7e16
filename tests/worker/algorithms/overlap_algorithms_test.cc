// CoCoD-SGD and Pipe-SGD against direct single-process simulations of their
// rules (papers/cocod-sgd.txt, Algorithm 1; docs/algorithms.md), with
// several workers of unequal batch sizes (the weights of the averages) on a
// real in-process cluster.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::Models;
using testing::NumParams;
using testing::ReferenceDirection;
using testing::SyntheticGradients;
using testing::WeightedMean;

const std::vector<uint32_t> kWeights = {2, 3, 5};
constexpr int kSteps = 14;  // k = 3: periods end after steps 2, 5, ..., 11
// Every average is one float rounding of a double sum whose order (arrival)
// differs from the simulation's (rank order).
constexpr double kTolerance = 1e-5;

TEST(CocodSgdTest, FollowsAlgorithm1WithWeightedAverages) {
  const v1::JobConfig config = MakeJobConfig(R"(name: "cocod-sgd" period: 3)",
                                             R"(lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9)",
                                             kWeights);
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(7, 3, d);
  const std::vector<float> x0 = InitialModel(7, d);
  absl::StatusOr<ClusterRun> run =
      testing::RunOnCluster(config, gradients, x0, kSteps, /*finish=*/true);
  ASSERT_TRUE(run.ok()) << run.status();

  const float lr = 0.05f;
  const auto all = testing::AllRanges(config);
  Models x(3, x0), snapshot;
  std::vector<ReferenceDirection> direction(3, ReferenceDirection(config.optimizer(), d));
  bool pending = false;
  auto complete = [&] {
    if (!pending) return;
    const std::vector<float> average = WeightedMean(snapshot, kWeights, all);
    for (int i = 0; i < 3; ++i) {
      for (size_t j = 0; j < d; ++j) x[i][j] = average[j] + (x[i][j] - snapshot[i][j]);
    }
    pending = false;
  };
  for (int t = 0; t < kSteps; ++t) {
    if (t == 0) {
      snapshot = x;
      pending = true;
    }
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> p = direction[i].Compute(gradients.At(i, t, x[i]), x[i]);
      for (size_t j = 0; j < d; ++j) x[i][j] -= lr * p[j];
    }
    if ((t + 1) % 3 == 0) {  // the period ends: line 3, then line 1
      complete();
      snapshot = x;
      pending = true;
    }
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AllNear(run->models[t][i], x[i], kTolerance))
          << "worker " << i << " after step " << t;
    }
  }
  // Finish: complete the last average, then the full weighted average.
  complete();
  const std::vector<float> final_model = WeightedMean(x, kWeights, all);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(AllNear(run->finished[i], final_model, kTolerance)) << "worker " << i;
  }
  EXPECT_TRUE(AllNear(run->server_model, final_model, kTolerance));
  // The local steps between averages must have moved the workers apart, or
  // the comparison would not test the correction x̂ + (x − s).
  EXPECT_FALSE(AllNear(run->models[kSteps - 2][0], run->models[kSteps - 2][1], 1e-3));
}

// Training that ends where a period begins: that period's average is the
// final one (every worker and the servers at the weighted mean of the
// snapshots), begun once, not again by Finish on the same round.
TEST(CocodSgdTest, APeriodBegunAtTheEndIsTheFinalAverage) {
  constexpr int kPeriodSteps = 12;  // k = 3: the last period begins at step 12
  const v1::JobConfig config = MakeJobConfig(R"(name: "cocod-sgd" period: 3)",
                                             R"(lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9)",
                                             kWeights);
  const size_t d = NumParams(config);
  class RoundsComm final : public ForwardingCommunicator {
   public:
    using ForwardingCommunicator::ForwardingCommunicator;
    std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream, uint64_t step,
                                                        uint32_t ratio, float weight,
                                                        float lr) override {
      rounds.emplace_back(stream, step);
      return ForwardingCommunicator::BeginShardedAverage(stream, step, ratio, weight, lr);
    }
    std::vector<std::pair<v1::Stream, uint64_t>> rounds;
  };
  std::vector<std::unique_ptr<RoundsComm>> comms(kWeights.size());
  absl::StatusOr<ClusterRun> run = testing::RunOnCluster(
      config, SyntheticGradients(7, 3, d), InitialModel(7, d), kPeriodSteps, /*finish=*/true,
      [&](int r, PsClient& client) {
        comms[r] = std::make_unique<RoundsComm>(&client);
        return comms[r].get();
      });
  ASSERT_TRUE(run.ok()) << run.status();
  for (size_t r = 0; r < comms.size(); ++r) {
    const auto& rounds = comms[r]->rounds;
    EXPECT_EQ(std::count(rounds.begin(), rounds.end(), std::make_pair(v1::MODEL, uint64_t{12})),
              1)
        << "rank " << r;
  }
  // The snapshots of step 12 are the models after step 11.
  const std::vector<float> final_model =
      WeightedMean(run->models[kPeriodSteps - 1], kWeights, testing::AllRanges(config));
  for (size_t r = 0; r < kWeights.size(); ++r) {
    EXPECT_TRUE(AllNear(run->finished[r], final_model, kTolerance)) << "worker " << r;
  }
  EXPECT_TRUE(AllNear(run->server_model, final_model, kTolerance));
}

// A checkpoint's full average is an error reset (docs/reliability.md): the
// open period's correction then starts from it, so that line 3 keeps only
// each worker's progress since (s = x̂ once x = AVG(x)). Taken here in the
// middle of a period (after step 3) and at a period's start (after step 8,
// whose period just began).
TEST(CocodSgdTest, ACheckpointsAverageResetsTheOpenPeriod) {
  v1::JobConfig config = MakeJobConfig(R"(name: "cocod-sgd" period: 3)",
                                       R"(lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9)",
                                       kWeights);
  // The servers take full averages only with checkpoints; they write theirs.
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / absl::StrCat("cocod_reset.", getpid());
  std::filesystem::remove_all(dir);
  config.mutable_checkpoint()->set_dir(dir.string());
  config.mutable_checkpoint()->set_every_steps(kSteps);
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(7, 3, d);
  const std::vector<float> x0 = InitialModel(7, d);
  const std::set<int> checkpoints = {3, 8};
  absl::StatusOr<ClusterRun> run = testing::RunOnCluster(config, gradients, x0, kSteps,
                                                         /*finish=*/false, nullptr, checkpoints);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(run.ok()) << run.status();

  const float lr = 0.05f;
  const auto all = testing::AllRanges(config);
  Models x(3, x0), snapshot;
  std::vector<ReferenceDirection> direction(3, ReferenceDirection(config.optimizer(), d));
  for (int t = 0; t < kSteps; ++t) {
    if (t == 0) snapshot = x;
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> p = direction[i].Compute(gradients.At(i, t, x[i]), x[i]);
      for (size_t j = 0; j < d; ++j) x[i][j] -= lr * p[j];
    }
    if ((t + 1) % 3 == 0) {
      const std::vector<float> average = WeightedMean(snapshot, kWeights, all);
      for (int i = 0; i < 3; ++i) {
        for (size_t j = 0; j < d; ++j) x[i][j] = average[j] + (x[i][j] - snapshot[i][j]);
      }
      snapshot = x;
    }
    if (checkpoints.count(t) != 0) {
      const std::vector<float> model = WeightedMean(x, kWeights, all);
      x.assign(3, model);
      snapshot.assign(3, WeightedMean(snapshot, kWeights, all));
    }
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AllNear(run->models[t][i], x[i], kTolerance))
          << "worker " << i << " after step " << t;
    }
  }
}

TEST(PipeSgdTest, AppliesEachAverageOneStepLate) {
  const v1::JobConfig config = MakeJobConfig(
      R"(name: "pipe-sgd")", R"(lr: 0.05 momentum_kind: NESTEROV momentum: 0.9)", kWeights);
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(8, 3, d);
  const std::vector<float> x0 = InitialModel(8, d);
  absl::StatusOr<ClusterRun> run =
      testing::RunOnCluster(config, gradients, x0, kSteps, /*finish=*/true);
  ASSERT_TRUE(run.ok()) << run.status();

  const float lr = 0.05f;
  const auto all = testing::AllRanges(config);
  std::vector<float> x = x0;  // every worker holds the same model
  std::vector<ReferenceDirection> direction(3, ReferenceDirection(config.optimizer(), d));
  std::vector<float> previous;
  for (int t = 0; t < kSteps; ++t) {
    Models p(3);
    for (int i = 0; i < 3; ++i) p[i] = direction[i].Compute(gradients.At(i, t, x), x);
    const std::vector<float> mean = WeightedMean(p, kWeights, all);
    if (!previous.empty()) {
      for (size_t j = 0; j < d; ++j) x[j] -= lr * previous[j];
    }
    previous = mean;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AllNear(run->models[t][i], x, kTolerance))
          << "worker " << i << " after step " << t;
    }
  }
  for (size_t j = 0; j < d; ++j) x[j] -= lr * previous[j];
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(AllNear(run->finished[i], x, kTolerance)) << "worker " << i;
  }
  // The servers applied every round as it completed.
  EXPECT_TRUE(AllNear(run->server_model, x, kTolerance));
}

}  // namespace
}  // namespace cserps
