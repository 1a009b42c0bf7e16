// async-sgd end to end: real shards in-process, one PsClient per rank, the
// registered algorithm driving AsyncPushPull over every shard and chunk.
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "tests/testing/test_support.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using testing::InProcessCluster;
using testing::RankAlgorithm;
using testing::TestConfig;

// SOFTMAX 3300 -> 10: d = 33010 floats over two shards; with 64 KiB messages
// shard 0 takes two chunks per push.
constexpr uint64_t kD = 3300 * 10 + 10;

v1::JobConfig AsyncConfig(uint32_t workers, uint32_t staleness) {
  return TestConfig(absl::StrCat(R"pb(
    seed: 3
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: )pb", workers, R"pb(
      max_message_bytes: 65536
      round_timeout_s: 10
    }
    model { kind: SOFTMAX input_dim: 3300 num_classes: 10 }
    data { batch_size: 4 }
    optimizer { lr: 0.25 }
    algorithm { name: "async-sgd" block_size: 1024 staleness: )pb", staleness, R"pb( }
    epochs: 1
  )pb"));
}

// Multiples of 1/8: every sum of the test is exact in float.
std::vector<float> Dyadic(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-32, 32);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(k(rng)) / 8.0f;
  return v;
}

TEST(AsyncSgdTest, EveryWorkersPushesLandAndFinishGivesTheServersModel) {
  constexpr uint32_t kWorkers = 3;
  constexpr uint64_t kSteps = 5;
  constexpr float kLr = 0.25f;
  const v1::JobConfig config = AsyncConfig(kWorkers, /*staleness=*/1);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> started =
      InProcessCluster::Start(config, kD);
  ASSERT_TRUE(started.ok()) << started.status();
  InProcessCluster& cluster = **started;
  std::mt19937 rng(5);
  const std::vector<float> x0 = Dyadic(kD, rng);
  std::vector<std::vector<float>> g;
  for (uint32_t r = 0; r < kWorkers; ++r) g.push_back(Dyadic(kD, rng));
  ASSERT_TRUE(cluster.client(0).PushModel(x0).ok());

  std::vector<std::vector<float>> final_x(kWorkers, std::vector<float>(kD));
  const absl::Status trained = cluster.OnEveryRank([&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<RankAlgorithm> algorithm,
                     RankAlgorithm::Create(cluster.config(), &cluster.client(rank), 1.0f));
    std::vector<float>& x = final_x[rank];
    RETURN_IF_ERROR(cluster.client(rank).PullModel(absl::MakeSpan(x), true));
    for (uint64_t t = 0; t < kSteps; ++t) {
      RETURN_IF_ERROR(algorithm->Step(t, kLr, g[rank], &x));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(trained.ok()) << trained;

  std::vector<float> expected = x0;
  for (size_t i = 0; i < kD; ++i) {
    float sum = 0;
    for (uint32_t r = 0; r < kWorkers; ++r) sum += g[r][i];
    expected[i] -= kLr * kSteps * sum;
  }
  // Finish after every worker is done: each ends with the servers' model.
  for (uint32_t r = 0; r < kWorkers; ++r) {
    absl::StatusOr<std::unique_ptr<RankAlgorithm>> algorithm =
        RankAlgorithm::Create(cluster.config(), &cluster.client(r), 1.0f);
    ASSERT_TRUE(algorithm.ok()) << algorithm.status();
    ASSERT_TRUE((*algorithm)->Finish(kSteps, &final_x[r]).ok());
    EXPECT_TRUE(final_x[r] == expected) << "rank " << r;
  }
  // Pushes are async traffic (the servers' stream "async" too): d floats per
  // step, none of them counted as PushPull's GRAD.
  EXPECT_EQ(cluster.client(1).async_traffic().request_floats, kSteps * kD);
  EXPECT_GT(cluster.client(1).async_traffic().reply_bytes, kSteps * kD * sizeof(float));
  EXPECT_EQ(cluster.client(1).traffic(v1::GRAD).request_bytes, 0u);
}

TEST(AsyncSgdTest, SingleWorkerStepIsPlainSgdWithServerMomentum) {
  v1::JobConfig config = AsyncConfig(1, /*staleness=*/0);
  config.mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::HEAVY_BALL);
  config.mutable_optimizer()->set_momentum(0.5f);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> started =
      InProcessCluster::Start(config, kD);
  ASSERT_TRUE(started.ok()) << started.status();
  InProcessCluster& cluster = **started;
  std::mt19937 rng(8);
  std::vector<float> x = Dyadic(kD, rng);
  ASSERT_TRUE(cluster.client(0).PushModel(x).ok());
  testing::ReferenceDirection server_side(cluster.config().optimizer(), kD);
  absl::StatusOr<std::unique_ptr<RankAlgorithm>> algorithm =
      RankAlgorithm::Create(cluster.config(), &cluster.client(0), 1.0f);
  ASSERT_TRUE(algorithm.ok()) << algorithm.status();
  std::vector<float> expected = x;
  std::vector<float> p(kD);
  for (uint64_t t = 0; t < 3; ++t) {
    const std::vector<float> g = Dyadic(kD, rng);
    p = server_side.Compute(g, expected);
    for (size_t i = 0; i < kD; ++i) expected[i] -= 0.25f * p[i];
    ASSERT_TRUE((*algorithm)->Step(t, 0.25f, g, &x).ok());
    EXPECT_TRUE(x == expected) << "step " << t;
  }
}

TEST(AsyncSgdTest, CatalogKnowsAsyncSgdAndItsStaleness) {
  v1::JobConfig config = AsyncConfig(2, 3);
  EXPECT_TRUE(ValidateAlgorithm(config.algorithm(), config.optimizer()).ok());
  EXPECT_THAT(DescribeAlgorithm(config.algorithm()), HasSubstr("s=3"));
  // Only the final full model average is a dense round of async-sgd.
  EXPECT_TRUE(CheckRoundRatio(config.algorithm(), v1::MODEL, 1).ok());
  EXPECT_FALSE(CheckRoundRatio(config.algorithm(), v1::GRAD, 1).ok());
  v1::AlgorithmConfig ssgd;
  ssgd.set_name("ssgd");
  ssgd.set_staleness(2);
  const absl::Status refused = ValidateAlgorithm(ssgd, config.optimizer());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("algorithm.staleness"));
}

}  // namespace
}  // namespace cserps
