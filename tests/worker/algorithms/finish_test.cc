// The end of training (Algorithm::Finish, called like the trainer does with
// the step count). For the local methods it is a full model average: after
// it every worker holds the servers' model (PullModel), bit for bit, and that
// model is the weighted mean of the local models before Finish. S-SGD and
// EF-SGD keep one shared model that the servers already hold: their Finish
// changes nothing.
//
// 3 workers with weights 3, 5, 8; 10 steps with H = 4, so training ends in
// the middle of a period with local models that differ.
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::AllRanges;
using testing::BitEqual;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::Models;
using testing::NumParams;
using testing::SyntheticGradients;
using testing::WeightedMean;

constexpr int kSteps = 10;
const std::vector<uint32_t> kWeights = {3, 5, 8};

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

absl::StatusOr<ClusterRun> RunWithFinish(const Case& c, v1::JobConfig* config) {
  *config = MakeJobConfig(c.algorithm, c.optimizer, kWeights);
  const size_t d = NumParams(*config);
  const SyntheticGradients gradients(55, 3, d);
  return testing::RunOnCluster(*config, gradients, InitialModel(55, d), kSteps,
                               /*finish=*/true);
}

class AveragingFinishTest : public ::testing::TestWithParam<Case> {};

// Tolerance of the mean: 1e-6, normwise relative. The servers and
// WeightedMean both sum w_i·x_i in double and round once to float; only the
// order of the double sum may differ, which moves the result by an ulp
// (~6e-8) at most.
TEST_P(AveragingFinishTest, EveryWorkerHoldsTheServersWeightedMean) {
  v1::JobConfig config;
  absl::StatusOr<ClusterRun> run = RunWithFinish(GetParam(), &config);
  ASSERT_TRUE(run.ok()) << run.status();
  const Models& before = run->models[kSteps - 1];
  // Otherwise the test could not tell an average from doing nothing.
  ASSERT_FALSE(BitEqual(before[1], before[0]) && BitEqual(before[2], before[0]))
      << "the local models were already equal before Finish";

  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(BitEqual(run->finished[r], run->server_model)) << "rank " << r;
  }
  EXPECT_TRUE(
      AllNear(run->server_model, WeightedMean(before, kWeights, AllRanges(config)), 1e-6));
}

INSTANTIATE_TEST_SUITE_P(
    LocalMethods, AveragingFinishTest,
    ::testing::Values(
        Case{"cser_model_blocks",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: MODEL_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"cser_gradient_blocks",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"m_cser", R"(name: "m-cser" period: 4 ratio_c1: 4 ratio_c2: 8)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9"},
        Case{"cser_pl", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"local_sgd", R"(name: "local-sgd" period: 4)", "lr: 0.05 momentum_kind: NONE"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

class SharedModelFinishTest : public ::testing::TestWithParam<Case> {};

TEST_P(SharedModelFinishTest, ChangesNothingAndServersAlreadyHoldTheModel) {
  v1::JobConfig config;
  absl::StatusOr<ClusterRun> run = RunWithFinish(GetParam(), &config);
  ASSERT_TRUE(run.ok()) << run.status();
  const Models& before = run->models[kSteps - 1];
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(BitEqual(run->finished[r], before[r])) << "rank " << r;
    // The servers applied the same x −= lr·mean as every worker.
    EXPECT_TRUE(BitEqual(before[r], run->server_model)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    SharedModel, SharedModelFinishTest,
    ::testing::Values(Case{"ssgd", R"(name: "ssgd")",
                           "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
                      Case{"ef_sgd", R"(name: "ef-sgd" ratio: 4)",
                           "lr: 0.05 momentum_kind: NONE"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace cserps
