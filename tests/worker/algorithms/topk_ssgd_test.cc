// gtopk-ssgd and topk-ssgd on a real in-process cluster (3 workers, 2
// shards), against S-SGD at density 1 and against a step-by-step replay of
// ALGORITHMS.md's rules computed here from every worker's recorded pushes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/block_layout.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/ps/communicator.h"

namespace cserps::testing {
namespace {

using ::testing::ElementsAreArray;

constexpr uint64_t kSeed = 77;

// Every ExchangeSparse of one worker, forwarded to the real client.
class RecordingComm final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  absl::Status ExchangeSparse(uint64_t step, const SparseVector& local,
                              SparseVector* result) override {
    RETURN_IF_ERROR(ForwardingCommunicator::ExchangeSparse(step, local, result));
    pushes.push_back(local);
    results.push_back(*result);
    return absl::OkStatus();
  }
  std::vector<SparseVector> pushes, results;
};

struct Recorded {
  ClusterRun run;
  std::vector<std::vector<SparseVector>> pushes, results;  // [rank][step]
};

absl::StatusOr<Recorded> RunRecorded(const v1::JobConfig& config,
                                     const SyntheticGradients& gradients,
                                     const std::vector<float>& x0, int steps, bool finish) {
  const int n = config.cluster().num_workers();
  std::vector<std::unique_ptr<RecordingComm>> comms(n);
  Recorded out;
  // Each rank makes only its own slot.
  ASSIGN_OR_RETURN(out.run, RunOnCluster(config, gradients, x0, steps, finish,
                                         [&](int r, PsClient& client) {
                                           comms[r] = std::make_unique<RecordingComm>(&client);
                                           return comms[r].get();
                                         }));
  for (int r = 0; r < n; ++r) {
    out.pushes.push_back(std::move(comms[r]->pushes));
    out.results.push_back(std::move(comms[r]->results));
  }
  return out;
}

// The k largest |v| in [first, end) by a full sort (ties: lower index),
// ascending.
std::vector<uint32_t> TopKBySort(const std::vector<float>& v, uint64_t first, uint64_t end,
                                 uint64_t k) {
  std::vector<uint32_t> idx;
  for (uint64_t j = first; j < end; ++j) idx.push_back(static_cast<uint32_t>(j));
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  idx.resize(std::min<uint64_t>(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Replays the rules for every rank and step and checks the recording bit
// for bit. Returns how many entries of G \ I_i with a nonzero residual were
// pushed again later (so the "keeps its residual" rule was observed).
int ReplayAndCheck(const v1::JobConfig& config, const SyntheticGradients& gradients,
                   const std::vector<float>& x0, int steps, const Recorded& rec) {
  const size_t d = NumParams(config);
  const int n = config.cluster().num_workers();
  const bool global_topk = config.algorithm().name() == "gtopk-ssgd";
  const float lr = config.optimizer().lr(), lambda = config.optimizer().weight_decay();
  const float beta = config.optimizer().momentum();
  const bool heavy_ball = config.optimizer().momentum_kind() == v1::OptimizerConfig::HEAVY_BALL;
  const bool nesterov = config.optimizer().momentum_kind() == v1::OptimizerConfig::NESTEROV;
  const BlockLayout layout(d, config.algorithm().block_size(), config.cluster().servers_size());
  const uint64_t k = SparseK(config.algorithm(), d);
  std::vector<std::vector<float>> eps(n, std::vector<float>(d, 0.0f));
  std::vector<float> x = x0, m(d, 0.0f);
  // kept[r][j]: j was in G \ I_r with a nonzero residual and not pushed since.
  std::vector<std::vector<bool>> kept(n, std::vector<bool>(d, false));
  int observed = 0;
  for (int t = 0; t < steps; ++t) {
    // Every worker's push: its top-k_s per shard of acc = ε + lr·(g + λx).
    std::vector<std::vector<float>> acc(n);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> g = gradients.At(r, t, x);
      acc[r].resize(d);
      for (size_t j = 0; j < d; ++j) {
        const float p = g[j] + lambda * x[j];
        acc[r][j] = eps[r][j] + lr * p;
      }
      std::vector<uint32_t> want;
      for (uint32_t s = 0; s < layout.num_shards(); ++s) {
        const uint64_t size = layout.ShardSize(s);
        for (uint32_t j : TopKBySort(acc[r], layout.ShardFirstFloat(s), layout.ShardEndFloat(s),
                                     ShardSparseK(k, size, d))) {
          want.push_back(j);
        }
      }
      const SparseVector& pushed = rec.pushes[r][t];
      EXPECT_THAT(pushed.indices, ElementsAreArray(want)) << "rank " << r << " step " << t;
      if (pushed.indices != want) return observed;
      for (size_t e = 0; e < want.size(); ++e) {
        EXPECT_EQ(pushed.values[e], acc[r][want[e]]) << "rank " << r << " step " << t;
        if (kept[r][want[e]]) ++observed;
        kept[r][want[e]] = false;
      }
    }
    // The servers: sums in double in rank order, per shard top-k_s of
    // |float sum| (ties: lower index), or the union.
    std::vector<double> sum(d, 0.0);
    std::vector<bool> touched(d, false);
    for (int r = 0; r < n; ++r) {
      for (size_t e = 0; e < rec.pushes[r][t].indices.size(); ++e) {
        sum[rec.pushes[r][t].indices[e]] += rec.pushes[r][t].values[e];
        touched[rec.pushes[r][t].indices[e]] = true;
      }
    }
    std::vector<float> fsum(d, 0.0f);
    for (size_t j = 0; j < d; ++j) fsum[j] = touched[j] ? static_cast<float>(sum[j]) : 0.0f;
    SparseVector want_g;
    for (uint32_t s = 0; s < layout.num_shards(); ++s) {
      std::vector<uint32_t> chosen;
      for (uint64_t j = layout.ShardFirstFloat(s); j < layout.ShardEndFloat(s); ++j) {
        if (touched[j]) chosen.push_back(static_cast<uint32_t>(j));
      }
      if (global_topk) {
        std::stable_sort(chosen.begin(), chosen.end(), [&](uint32_t a, uint32_t b) {
          return std::fabs(fsum[a]) > std::fabs(fsum[b]);
        });
        chosen.resize(std::min<uint64_t>(
            chosen.size(), ShardSparseK(k, layout.ShardSize(s), d)));
        std::sort(chosen.begin(), chosen.end());
      }
      for (uint32_t j : chosen) {
        want_g.indices.push_back(j);
        want_g.values.push_back(fsum[j]);
      }
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_THAT(rec.results[r][t].indices, ElementsAreArray(want_g.indices)) << "step " << t;
      EXPECT_THAT(rec.results[r][t].values, ElementsAreArray(want_g.values)) << "step " << t;
    }
    // Residuals: ε = acc with I ∩ G zeroed.
    std::vector<bool> in_g(d, false);
    for (uint32_t j : want_g.indices) in_g[j] = true;
    for (int r = 0; r < n; ++r) {
      std::vector<bool> in_i(d, false);
      for (uint32_t j : rec.pushes[r][t].indices) in_i[j] = true;
      for (size_t j = 0; j < d; ++j) {
        eps[r][j] = in_i[j] && in_g[j] ? 0.0f : acc[r][j];
        if (in_g[j] && !in_i[j] && eps[r][j] != 0.0f) kept[r][j] = true;
      }
    }
    // The model: v -= (1/P)·gsum on G (heavy ball: m = βm + u; v -= m;
    // Nesterov: m = βm + u; v -= u + βm).
    std::vector<float> u(d, 0.0f);
    for (size_t e = 0; e < want_g.indices.size(); ++e) {
      u[want_g.indices[e]] = want_g.values[e] / static_cast<float>(n);
    }
    for (size_t j = 0; j < d; ++j) {
      if (heavy_ball) {
        m[j] = beta * m[j] + u[j];
        x[j] -= m[j];
      } else if (nesterov) {
        m[j] = beta * m[j] + u[j];
        x[j] -= u[j] + beta * m[j];
      } else if (in_g[j]) {
        x[j] -= u[j];
      }
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(BitEqual(rec.run.models[t][r], x)) << "rank " << r << " step " << t;
    }
  }
  return observed;
}

class SparseTopkTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SparseTopkTest, DensityOneEqualsSsgd) {
  constexpr int kSteps = 30;
  const v1::JobConfig sparse = MakeJobConfig(
      absl::StrCat("name: \"", GetParam(), "\" density: 1"), "lr: 0.1", {4, 4, 4});
  const v1::JobConfig ssgd = MakeJobConfig("name: \"ssgd\"", "lr: 0.1", {4, 4, 4});
  const size_t d = NumParams(sparse);
  const SyntheticGradients gradients(kSeed, 3, d);
  const std::vector<float> x0 = InitialModel(kSeed, d);
  absl::StatusOr<ClusterRun> got = RunOnCluster(sparse, gradients, x0, kSteps, true);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<ClusterRun> want = RunOnCluster(ssgd, gradients, x0, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int t = 0; t < kSteps; ++t) {
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(AllNear(got->models[t][r], want->models[t][r], 1e-5))
          << "step " << t << " rank " << r;
    }
  }
  // The models moved: the comparison is not between two copies of x0.
  EXPECT_FALSE(AllNear(want->models.back()[0], x0, 1e-2));
  EXPECT_TRUE(BitEqual(got->server_model, got->models.back()[0]));
}

TEST_P(SparseTopkTest, EveryStepFollowsTheRulesBitForBit) {
  constexpr int kSteps = 25;
  const v1::JobConfig config = MakeJobConfig(
      absl::StrCat("name: \"", GetParam(), "\" density: 0.05"),
      "lr: 0.1 weight_decay: 0.01", {4, 4, 4});
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(kSeed, 3, d);
  const std::vector<float> x0 = InitialModel(kSeed, d);
  absl::StatusOr<Recorded> rec = RunRecorded(config, gradients, x0, kSteps, true);
  ASSERT_TRUE(rec.ok()) << rec.status();
  const int observed = ReplayAndCheck(config, gradients, x0, kSteps, *rec);
  if (std::string(GetParam()) == "gtopk-ssgd") {
    // Entries of G that a worker did not push kept their residual, which
    // its later pushes carried (checked bit for bit above).
    EXPECT_GT(observed, 20);
  }
  // Without momentum the servers hold the workers' model; Finish is a no-op.
  EXPECT_TRUE(BitEqual(rec->run.server_model, rec->run.models.back()[0]));
  EXPECT_TRUE(BitEqual(rec->run.finished[1], rec->run.models.back()[1]));
}

TEST_P(SparseTopkTest, MomentumAfterAggregationOnWorkersAndServers) {
  constexpr int kSteps = 15;
  for (const char* kind : {"HEAVY_BALL", "NESTEROV"}) {
    SCOPED_TRACE(kind);
    const v1::JobConfig config = MakeJobConfig(
        absl::StrCat("name: \"", GetParam(), "\" density: 0.1"),
        absl::StrCat("lr: 0.05 momentum: 0.9 momentum_kind: ", kind), {4, 4, 4});
    const size_t d = NumParams(config);
    const SyntheticGradients gradients(kSeed, 3, d);
    const std::vector<float> x0 = InitialModel(kSeed, d);
    absl::StatusOr<Recorded> rec = RunRecorded(config, gradients, x0, kSteps, true);
    ASSERT_TRUE(rec.ok()) << rec.status();
    ReplayAndCheck(config, gradients, x0, kSteps, *rec);
    // The servers took the same momentum steps: they hold the workers' model.
    EXPECT_TRUE(BitEqual(rec->run.server_model, rec->run.models.back()[0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, SparseTopkTest,
                         ::testing::Values("gtopk-ssgd", "topk-ssgd"),
                         [](const auto& info) {
                           return std::string(info.param) == "gtopk-ssgd" ? "gtopk" : "topk";
                         });

}  // namespace
}  // namespace cserps::testing
