#include "worker/optim/direction.h"

#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

constexpr size_t kParams = 13;
constexpr int kSteps = 6;
constexpr double kBeta = 0.9;
constexpr double kLambda = 0.01;

using Opt = v1::OptimizerConfig;

Opt Config(Opt::Momentum kind, double beta, double lambda) {
  Opt config;
  config.set_momentum_kind(kind);
  config.set_momentum(static_cast<float>(beta));
  config.set_weight_decay(static_cast<float>(lambda));
  return config;
}

std::vector<float> Random(CounterRng& rng) {
  std::vector<float> v(kParams);
  for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
  return v;
}

// Runs kSteps of Direction and of the ALGORITHMS.md rule written out in
// double, on the same random gradients and parameters; returns the final
// momentum of the hand-written loop.
std::vector<double> RunAndCompare(Opt::Momentum kind, double beta,
                                  double lambda, Direction& direction) {
  CounterRng rng(static_cast<uint64_t>(kind) * 1000 + 1);
  std::vector<double> m(kParams, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Random(rng);
    const std::vector<float> x = Random(rng);
    std::vector<float> p(kParams);
    direction.Compute(g, x, absl::MakeSpan(p));
    for (size_t i = 0; i < kParams; ++i) {
      const double d = g[i] + lambda * x[i];
      double expected;
      if (kind == Opt::HEAVY_BALL) {
        m[i] = beta * m[i] + d;
        expected = m[i];
      } else if (kind == Opt::NESTEROV) {
        m[i] = beta * m[i] + d;
        expected = d + beta * m[i];
      } else {
        expected = d;
      }
      EXPECT_NEAR(p[i], expected, 1e-5) << "step " << step << " i " << i;
    }
  }
  return m;
}

class DirectionTest : public ::testing::TestWithParam<Opt::Momentum> {};

TEST_P(DirectionTest, MatchesHandWrittenLoop) {
  for (double lambda : {0.0, kLambda}) {
    Direction direction(Config(GetParam(), kBeta, lambda), kParams);
    const std::vector<double> m =
        RunAndCompare(GetParam(), kBeta, lambda, direction);
    if (GetParam() == Opt::HEAVY_BALL || GetParam() == Opt::NESTEROV) {
      ASSERT_EQ(direction.momentum().size(), kParams);
      for (size_t i = 0; i < kParams; ++i) {
        EXPECT_NEAR(direction.momentum()[i], m[i], 1e-5) << i;
      }
    } else {
      EXPECT_TRUE(direction.momentum().empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, DirectionTest,
                         ::testing::Values(Opt::MOMENTUM_UNSPECIFIED, Opt::NONE,
                                           Opt::HEAVY_BALL, Opt::NESTEROV));

// Hand-computed: g = 1, x = 2, β = 0.5, λ = 0.25 → d = 1.5 every step.
// Heavy ball: m = 1.5, 2.25 → p = 1.5, 2.25.
// Nesterov:   m = 1.5, 2.25 → p = 1.5 + 0.75 = 2.25, 1.5 + 1.125 = 2.625.
TEST(DirectionTest, SmallHandComputedCase) {
  const std::vector<float> g = {1.0f}, x = {2.0f};
  std::vector<float> p(1);
  Direction heavy(Config(Opt::HEAVY_BALL, 0.5, 0.25), 1);
  heavy.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 1.5f);
  heavy.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 2.25f);

  Direction nesterov(Config(Opt::NESTEROV, 0.5, 0.25), 1);
  nesterov.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 2.25f);
  nesterov.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 2.625f);
  EXPECT_FLOAT_EQ(nesterov.momentum()[0], 2.25f);

  Direction plain(Config(Opt::NONE, 0.5, 0.25), 1);
  plain.Compute(g, x, absl::MakeSpan(p));
  plain.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 1.5f);
}

TEST(DirectionTest, DirectionMayAliasGradient) {
  CounterRng rng(77);
  Direction separate(Config(Opt::NESTEROV, kBeta, kLambda), kParams);
  Direction aliased(Config(Opt::NESTEROV, kBeta, kLambda), kParams);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Random(rng);
    const std::vector<float> x = Random(rng);
    std::vector<float> p(kParams);
    separate.Compute(g, x, absl::MakeSpan(p));
    std::vector<float> buffer = g;
    aliased.Compute(buffer, x, absl::MakeSpan(buffer));
    EXPECT_EQ(buffer, p) << "step " << step;
  }
}

TEST(DirectionTest, MutableMomentumFeedsTheNextStep) {
  Direction direction(Config(Opt::HEAVY_BALL, 0.5, 0.0), 2);
  direction.mutable_momentum()[0] = 4.0f;
  const std::vector<float> g = {1.0f, 1.0f}, x = {0.0f, 0.0f};
  std::vector<float> p(2);
  direction.Compute(g, x, absl::MakeSpan(p));
  EXPECT_FLOAT_EQ(p[0], 3.0f);  // 0.5 * 4 + 1
  EXPECT_FLOAT_EQ(p[1], 1.0f);
}

}  // namespace
}  // namespace cserps
