// CSER with R_C1 = R_C2 = 1 and H = 1 compresses nothing: every step every
// worker's model is averaged in full, so it is S-SGD. Run on 3 workers with
// unequal weights (3, 5, 8) next to ssgd on the same gradients and compare
// every worker's model after every step.
//
// Tolerance 1e-5, normwise relative (AllNear): the two compute the same
// model through different roundings (cser: AVG(x_i − η·p_i) rounded to
// float; ssgd: x − η·AVG(p)), a few float ulps (~1e-7) per step. The
// dynamics are contracting (x ← x − η·c⊙x with η·c <= 0.075, heavy ball
// with β = 0.9 stable), so those differences do not grow over the 60 steps
// beyond some tens of ulps; 1e-5 is a hundred ulps. A wrong weight, a
// missing or doubled update, or a partial average is off by 1e-3 or more.
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::NumParams;
using testing::SyntheticGradients;

constexpr int kSteps = 60;
constexpr double kTolerance = 1e-5;
const std::vector<uint32_t> kWeights = {3, 5, 8};

struct Case {
  std::string label;
  std::string variant;
  std::string optimizer;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class CserFullRatioTest : public ::testing::TestWithParam<Case> {};

TEST_P(CserFullRatioTest, MatchesSsgd) {
  const v1::JobConfig cser = MakeJobConfig(
      "name: \"cser\" period: 1 ratio_c1: 1 ratio_c2: 1 cser_variant: " + GetParam().variant,
      GetParam().optimizer, kWeights);
  const v1::JobConfig ssgd = MakeJobConfig("name: \"ssgd\"", GetParam().optimizer, kWeights);
  const size_t d = NumParams(cser);
  const SyntheticGradients gradients(22, 3, d);
  const std::vector<float> x0 = InitialModel(22, d);

  absl::StatusOr<ClusterRun> expected = testing::RunOnCluster(ssgd, gradients, x0, kSteps);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<ClusterRun> actual = testing::RunOnCluster(cser, gradients, x0, kSteps);
  ASSERT_TRUE(actual.ok()) << actual.status();

  for (int t = 0; t < kSteps; ++t) {
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(AllNear(actual->models[t][r], expected->models[t][0], kTolerance))
          << "rank " << r << " after step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CserFullRatioTest,
    ::testing::Values(
        Case{"model_blocks_plain", "MODEL_BLOCKS", "lr: 0.05 momentum_kind: NONE"},
        Case{"model_blocks_heavy_ball", "MODEL_BLOCKS",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"gradient_blocks_plain", "GRADIENT_BLOCKS", "lr: 0.05 momentum_kind: NONE"},
        Case{"gradient_blocks_heavy_ball", "GRADIENT_BLOCKS",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace cserps
