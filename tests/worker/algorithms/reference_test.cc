// Every algorithm against a direct simulation of its rule in ALGORITHMS.md:
// all workers' states in one thread, written from the listings (not from
// worker/algorithms/), with the averages computed here (WeightedMean, in
// double like AVG) on the block sets of SelectBlocks. 3 workers with
// unequal weights (3, 5, 8), 12 steps (3 periods of H = 4), every worker's
// model compared after every step.
//
// Tolerance 1e-5, normwise relative (AllNear). The simulation does the
// float operations of the rules in the same order as any faithful
// implementation, and its averages round the same double to float as the
// servers, so the two agree to the bit or within an ulp or so where a
// double sum's order differs; the contracting dynamics keep that from
// growing over 12 steps, and 1e-5 is a hundred ulps. A wrong block set, a
// wrong weight, a lost error or a missed reset is off by 1e-3 or more.
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cserps/v1/parameter_server.pb.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"

namespace cserps {
namespace {

using testing::AllNear;
using testing::AllRanges;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::Models;
using testing::NumParams;
using testing::ReferenceDirection;
using testing::SelectedRanges;
using testing::SyntheticGradients;
using testing::WeightedMean;
using testing::Weights;

using Ranges = std::vector<std::pair<size_t, size_t>>;

constexpr int kSteps = 12;
constexpr double kTolerance = 1e-5;
const std::vector<uint32_t> kWeights = {3, 5, 8};

// The sync after every H-th step: t with (t + 1) % H == 0.
bool IsSync(uint64_t t, uint32_t h) { return (t + 1) % h == 0; }

// models[t][i]: worker i's model after step t under the rule of
// config.algorithm() (ALGORITHMS.md).
std::vector<Models> Simulate(const v1::JobConfig& config,
                             const SyntheticGradients& gradients,
                             const std::vector<float>& x0, int steps) {
  const v1::AlgorithmConfig& a = config.algorithm();
  const std::string& name = a.name();
  const std::vector<uint32_t> w = Weights(config);
  const size_t n = w.size();
  const size_t d = x0.size();
  const float lr = config.optimizer().lr();
  const Ranges all = AllRanges(config);

  Models x(n, x0);
  Models e(n, std::vector<float>(d, 0.0f));  // error / memory (EF-SGD, QSparse)
  std::vector<float> x_hat = x0;              // QSparse's common model
  std::vector<ReferenceDirection> direction(n,
                                            ReferenceDirection(config.optimizer(), d));

  // x_i[S] ← AVG(x[S]) on every worker.
  auto average_models = [&](const Ranges& s) {
    const std::vector<float> mean = WeightedMean(x, w, s);
    for (std::vector<float>& xi : x) {
      for (const auto& [begin, end] : s) {
        for (size_t j = begin; j < end; ++j) xi[j] = mean[j];
      }
    }
  };
  auto local_step = [&](const Models& p) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < d; ++j) x[i][j] -= lr * p[i][j];
    }
  };

  std::vector<Models> trajectory;
  for (int t = 0; t < steps; ++t) {
    // p_i = Direction(g_i), g_i at worker i's own model (EF-SGD: the shared
    // model, which every x_i equals).
    Models p(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = direction[i].Compute(gradients.At(static_cast<int>(i), t, x[i]), x[i]);
    }

    if (name == "ssgd") {
      // x ← x − η·AVG(p).
      const std::vector<float> mean = WeightedMean(p, w, all);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < d; ++j) x[i][j] -= lr * mean[j];
      }
    } else if (name == "ef-sgd") {
      // a_i = η·p_i + e_i; S = GRBS(GRAD, t, R); x[S] ← x[S] − AVG(a[S]);
      // e_i ← a_i with e_i[S] = 0.
      Models acc(n, std::vector<float>(d));
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < d; ++j) acc[i][j] = lr * p[i][j] + e[i][j];
      }
      const Ranges s = SelectedRanges(config, v1::GRAD, t, a.ratio());
      const std::vector<float> mean = WeightedMean(acc, w, s);
      for (size_t i = 0; i < n; ++i) {
        e[i] = acc[i];
        for (const auto& [begin, end] : s) {
          for (size_t j = begin; j < end; ++j) {
            x[i][j] -= mean[j];
            e[i][j] = 0.0f;
          }
        }
      }
    } else if (name == "local-sgd") {
      local_step(p);
      if (IsSync(t, a.period())) average_models(all);
    } else if (name == "qsparse-local-sgd") {
      local_step(p);
      if (IsSync(t, a.period())) {
        // u_i = e_i + (x̂ − x_i); x̂[S] ← x̂[S] − AVG(u[S]); e_i ← u_i with
        // e_i[S] = 0; x_i ← x̂. ALGORITHMS.md writes S = GRBS(MODEL, t, R),
        // but the servers keep x̂ only if this is a GRAD round (x −= 1·AVG);
        // a MODEL round would set x̂[S] to AVG(u[S]). And both sides derive
        // the blocks from the round's stream, so S is GRBS(GRAD, t, R), as
        // the catalog declares (reported: the listing should say GRAD).
        Models u(n, std::vector<float>(d));
        for (size_t i = 0; i < n; ++i) {
          for (size_t j = 0; j < d; ++j) u[i][j] = e[i][j] + (x_hat[j] - x[i][j]);
        }
        const Ranges s = SelectedRanges(config, v1::GRAD, t, a.ratio());
        const std::vector<float> mean = WeightedMean(u, w, s);
        for (size_t i = 0; i < n; ++i) {
          e[i] = u[i];
          for (const auto& [begin, end] : s) {
            for (size_t j = begin; j < end; ++j) e[i][j] = 0.0f;
          }
        }
        for (const auto& [begin, end] : s) {
          for (size_t j = begin; j < end; ++j) x_hat[j] -= mean[j];
        }
        for (size_t i = 0; i < n; ++i) x[i] = x_hat;
      }
    } else if (name == "cser" || name == "m-cser") {
      const bool sync = IsSync(t, a.period());
      if (a.cser_variant() == v1::AlgorithmConfig::GRADIENT_BLOCKS) {
        // 2: x_i[S2] ← x_i[S2] − η·AVG(p[S2]); x_i[~S2] ← x_i[~S2] − η·p_i[~S2].
        const Ranges s2 = SelectedRanges(config, v1::GRAD, t, a.ratio_c2());
        const std::vector<float> mean = WeightedMean(p, w, s2);
        std::vector<bool> in_s2(d, false);
        for (const auto& [begin, end] : s2) {
          for (size_t j = begin; j < end; ++j) in_s2[j] = true;
        }
        for (size_t i = 0; i < n; ++i) {
          for (size_t j = 0; j < d; ++j) x[i][j] -= lr * (in_s2[j] ? mean[j] : p[i][j]);
        }
        // 3: after every H-th step x_i[S1] ← AVG(x[S1]).
        if (sync) average_models(SelectedRanges(config, v1::MODEL, t, a.ratio_c1()));
      } else {
        // MODEL_BLOCKS: x_i ← x_i − η·p_i; x_i[S] ← AVG(x[S]) with
        // S = GRBS(MODEL, t, R_C1 after every H-th step, else R_C2).
        local_step(p);
        average_models(
            SelectedRanges(config, v1::MODEL, t, sync ? a.ratio_c1() : a.ratio_c2()));
      }
    } else if (name == "cser-pl") {
      local_step(p);
      if (IsSync(t, a.period())) {
        average_models(SelectedRanges(config, v1::MODEL, t, a.ratio_c1()));
      }
    } else if (name == "csea") {
      local_step(p);
      average_models(SelectedRanges(config, v1::MODEL, t, a.ratio_c1()));
    } else {
      ADD_FAILURE() << "no simulation of " << name;
    }
    trajectory.push_back(x);
  }
  return trajectory;
}

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class ReferenceTest : public ::testing::TestWithParam<Case> {};

// Runs `steps` steps of `config`'s job on a cluster and compares every
// worker's model after every step with the simulation's.
void ExpectEveryWorkerFollowsTheRule(const v1::JobConfig& config, uint64_t seed, int steps) {
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(seed, 3, d);
  const std::vector<float> x0 = InitialModel(seed, d);

  absl::StatusOr<ClusterRun> run = testing::RunOnCluster(config, gradients, x0, steps);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<Models> expected = Simulate(config, gradients, x0, steps);

  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AllNear(run->models[t][i], expected[t][i], kTolerance))
          << "worker " << i << " after step " << t;
    }
  }
}

TEST_P(ReferenceTest, EveryWorkerFollowsTheRule) {
  ExpectEveryWorkerFollowsTheRule(
      MakeJobConfig(GetParam().algorithm, GetParam().optimizer, kWeights), 44, kSteps);
}

// One block a step on 4 shards: a shard goes many steps without a round
// (its blocks unselected) while the job moves on, and then gets one far
// past its newest completed step (docs/protocol.md 7.8). The job trains on,
// by the rule.
TEST(StepWindowTest, ShardsThatGrbsMissesForManyStepsServeOn) {
  v1::JobConfig config = MakeJobConfig(R"(name: "ef-sgd" ratio: 64)",
                                       "lr: 0.05 momentum_kind: NONE", kWeights);
  config.mutable_cluster()->add_servers("127.0.0.1:0");
  config.mutable_cluster()->add_servers("127.0.0.1:0");
  ExpectEveryWorkerFollowsTheRule(config, 45, 120);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ReferenceTest,
    ::testing::Values(
        Case{"ssgd_nesterov", R"(name: "ssgd")",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"ef_sgd_nesterov", R"(name: "ef-sgd" ratio: 4)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9"},
        Case{"local_sgd_heavy_ball", R"(name: "local-sgd" period: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"qsparse_local_sgd", R"(name: "qsparse-local-sgd" period: 4 ratio: 4)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"cser_model_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: MODEL_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"cser_gradient_blocks",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"cser_gradient_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"m_cser", R"(name: "m-cser" period: 4 ratio_c1: 4 ratio_c2: 8)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_pl", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"csea_heavy_ball", R"(name: "csea" ratio_c1: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// The same with a model of 157,000 floats (SOFTMAX 784 -> 200) and the
// smallest message size (64 KiB, about 16,000 floats), so that a GRBS
// round's payload on a shard is cut into several chunks whose boundaries fall
// inside blocks: every float must still land where the rule puts it.
class ChunkedReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedReferenceTest, EveryWorkerFollowsTheRule) {
  constexpr int kChunkedSteps = 6;
  v1::JobConfig config = MakeJobConfig(GetParam().algorithm, GetParam().optimizer, kWeights);
  config.mutable_model()->set_input_dim(784);
  config.mutable_model()->set_num_classes(200);
  config.mutable_cluster()->set_max_message_bytes(65536);
  const size_t d = NumParams(config);
  ASSERT_EQ(d, 157000u);
  // Shard 0 holds the first ceil(B/2) of the B blocks; at ratio 2 it carries
  // about 39,000 floats, three chunks.
  const size_t num_blocks = (d + 31) / 32;
  const size_t half = (num_blocks + 1) / 2 * 32;
  size_t shard0_floats = 0;
  for (const auto& [begin, end] : SelectedRanges(config, v1::MODEL, 1, 2)) {
    if (begin < half) shard0_floats += end - begin;
  }
  ASSERT_GT(shard0_floats, 2 * 16384u);

  const SyntheticGradients gradients(66, 3, d);
  const std::vector<float> x0 = InitialModel(66, d);
  absl::StatusOr<ClusterRun> run =
      testing::RunOnCluster(config, gradients, x0, kChunkedSteps);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<Models> expected = Simulate(config, gradients, x0, kChunkedSteps);
  for (int t = 0; t < kChunkedSteps; ++t) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AllNear(run->models[t][i], expected[t][i], kTolerance))
          << "worker " << i << " after step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Chunked, ChunkedReferenceTest,
    ::testing::Values(
        Case{"cser_model_blocks",
             R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4 cser_variant: MODEL_BLOCKS)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"cser_gradient_blocks",
             R"(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"ef_sgd", R"(name: "ef-sgd" ratio: 2)", "lr: 0.05 momentum_kind: NONE"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace cserps
