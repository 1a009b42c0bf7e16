// The key identity of CSER (ALGORITHMS.md; paper section 3.3), on 3 workers
// with unequal weights (3, 5, 8), momentum NONE and no weight decay (so
// p_i = g_i(x_i)): after every step the weighted mean of the local models
// moves exactly like S-SGD's model,
//   mean_w(x^t) = mean_w(x^{t−1}) − η·mean_w(p^t),
// and resets preserve it. And after every step with a MODEL round, the
// blocks that round selects (GRBS(MODEL, t, R) from SelectBlocks) are
// bit-equal on every worker while some unselected block is not.
//
// Tolerance of the identity: 1e-5, normwise relative (AllNear). Each side is
// computed in double from the float models; the float roundings of one step
// (x − η·p, and the server's mean rounded to float) are ~1e-7 relative, and
// the identity is checked step by step from the actual previous mean, so
// nothing accumulates. A mean taken with the wrong weights, an update
// applied on the wrong blocks or twice, or a lost local residual moves the
// mean by 1e-3 or more.
#include <algorithm>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "cserps/v1/parameter_server.pb.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::BitEqual;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::Models;
using testing::NumParams;
using testing::SelectedRanges;
using testing::SyntheticGradients;
using testing::WeightedMeanExact;

constexpr int kSteps = 24;  // 6 periods of H = 4
constexpr double kTolerance = 1e-5;
const std::vector<uint32_t> kWeights = {3, 5, 8};

bool IsSync(uint64_t t, uint32_t h) { return (t + 1) % h == 0; }

struct Case {
  std::string label;
  std::string algorithm;
  // The ratio of the MODEL round after step t, or 0 when there is none
  // (ALGORITHMS.md, with the sync after every H-th step).
  std::function<uint32_t(uint64_t t)> model_round_ratio;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class MeanIdentityTest : public ::testing::TestWithParam<Case> {};

TEST_P(MeanIdentityTest, MeanMovesLikeSsgdAndResetsSyncSelectedBlocks) {
  const v1::JobConfig config =
      MakeJobConfig(GetParam().algorithm, "lr: 0.05 momentum_kind: NONE", kWeights);
  const size_t d = NumParams(config);
  const size_t block_size = config.algorithm().block_size();
  const double lr = config.optimizer().lr();
  const SyntheticGradients gradients(33, 3, d);
  const std::vector<float> x0 = InitialModel(33, d);

  absl::StatusOr<ClusterRun> run = testing::RunOnCluster(config, gradients, x0, kSteps);
  ASSERT_TRUE(run.ok()) << run.status();

  int resets_checked = 0;
  Models previous(3, x0);
  for (int t = 0; t < kSteps; ++t) {
    const Models& now = run->models[t];
    Models p(3);
    for (int i = 0; i < 3; ++i) p[i] = gradients.At(i, t, previous[i]);
    const std::vector<double> mean_before = WeightedMeanExact(previous, kWeights);
    const std::vector<double> mean_p = WeightedMeanExact(p, kWeights);
    std::vector<double> expected(d);
    for (size_t j = 0; j < d; ++j) expected[j] = mean_before[j] - lr * mean_p[j];
    ASSERT_TRUE(AllNear(WeightedMeanExact(now, kWeights), expected, kTolerance))
        << "weighted mean after step " << t;

    const uint32_t ratio = GetParam().model_round_ratio(t);
    if (ratio != 0) {
      const auto selected = SelectedRanges(config, v1::MODEL, t, ratio);
      std::vector<bool> is_selected((d + block_size - 1) / block_size, false);
      for (const auto& [begin, end] : selected) {
        is_selected[begin / block_size] = true;
        for (int i = 1; i < 3; ++i) {
          ASSERT_TRUE(BitEqual(absl::MakeConstSpan(now[i]).subspan(begin, end - begin),
                               absl::MakeConstSpan(now[0]).subspan(begin, end - begin)))
              << "rank " << i << " vs rank 0 on selected block " << begin / block_size
              << " after step " << t << " (MODEL round at ratio " << ratio << ")";
        }
      }
      bool unselected_differs = false;
      for (size_t b = 0; b < is_selected.size() && !unselected_differs; ++b) {
        if (is_selected[b]) continue;
        const size_t begin = b * block_size, len = std::min(d, begin + block_size) - begin;
        for (int i = 1; i < 3; ++i) {
          if (!BitEqual(absl::MakeConstSpan(now[i]).subspan(begin, len),
                        absl::MakeConstSpan(now[0]).subspan(begin, len))) {
            unselected_differs = true;
          }
        }
      }
      EXPECT_TRUE(unselected_differs)
          << "after step " << t << " every unselected block is equal on every worker: "
          << "a ratio-" << ratio << " round must leave the others local";
      ++resets_checked;
    }
    previous = now;
  }
  EXPECT_GT(resets_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(
    CserFamily, MeanIdentityTest,
    ::testing::Values(
        Case{"cser_model_blocks",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: MODEL_BLOCKS)",
             [](uint64_t t) -> uint32_t { return IsSync(t, 4) ? 4 : 8; }},
        Case{"cser_gradient_blocks",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             [](uint64_t t) -> uint32_t { return IsSync(t, 4) ? 4 : 0; }},
        Case{"cser_pl", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             [](uint64_t t) -> uint32_t { return IsSync(t, 4) ? 4 : 0; }},
        Case{"csea", R"(name: "csea" ratio_c1: 4)",
             [](uint64_t) -> uint32_t { return 4; }}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace cserps
