// A single worker has no compression error (paper, section 3): with one
// member every average is the member's own values, so every CSER-family
// algorithm must produce, bit for bit, the model of plain SGD
// x ← x − η·Direction(g) with the same direction (m-cser: Nesterov SGD).
// The run crosses 15 sync steps (H = 4, 60 steps), so both the per-step and
// the reset rounds are exercised.
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::BitEqual;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::NumParams;
using testing::ReferenceDirection;
using testing::SyntheticGradients;

constexpr int kSteps = 60;

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class SingleWorkerTest : public ::testing::TestWithParam<Case> {};

TEST_P(SingleWorkerTest, BitIdenticalToPlainSgd) {
  // A weight that is not a power of two: the server's w·x / w must still
  // give x back exactly.
  const v1::JobConfig config = MakeJobConfig(GetParam().algorithm, GetParam().optimizer, {7});
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(11, 1, d);
  const std::vector<float> x0 = InitialModel(11, d);

  absl::StatusOr<ClusterRun> run = testing::RunOnCluster(config, gradients, x0, kSteps);
  ASSERT_TRUE(run.ok()) << run.status();

  ReferenceDirection direction(config.optimizer(), d);
  const float lr = config.optimizer().lr();
  std::vector<float> x = x0;
  for (int t = 0; t < kSteps; ++t) {
    const std::vector<float> p = direction.Compute(gradients.At(0, t, x), x);
    for (size_t j = 0; j < d; ++j) x[j] -= lr * p[j];
    ASSERT_TRUE(BitEqual(run->models[t][0], x)) << "after step " << t;
  }
  // The model moved: a run that ignored its updates would fail above, but a
  // reference that did nothing would not be a reference.
  EXPECT_FALSE(AllNear(x, x0, 1e-2));
}

INSTANTIATE_TEST_SUITE_P(
    CserFamily, SingleWorkerTest,
    ::testing::Values(
        Case{"cser_model_blocks_plain",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: MODEL_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"cser_model_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_gradient_blocks_plain",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"cser_gradient_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_pl_plain", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"cser_pl_heavy_ball", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"csea_plain", R"(name: "csea" ratio_c1: 4)", "lr: 0.05 momentum_kind: NONE"},
        Case{"csea_heavy_ball", R"(name: "csea" ratio_c1: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"m_cser_nesterov", R"(name: "m-cser" period: 4 ratio_c1: 4 ratio_c2: 8)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"m_cser_gradient_blocks_nesterov",
             R"(name: "m-cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace cserps
