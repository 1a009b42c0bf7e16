#include "common/direction.h"

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

// Runs kSteps of ComputeDirection (advancing `momentum`) and of the
// ALGORITHMS.md rule written out in double, on the same random gradients
// and parameters; returns the final momentum of the hand-written loop.
std::vector<double> RunAndCompare(Opt::Momentum kind, double beta, double lambda,
                                  std::vector<float>& momentum) {
  const DirectionRule rule = MakeDirectionRule(Config(kind, beta, lambda));
  CounterRng rng(static_cast<uint64_t>(kind) * 1000 + 1);
  std::vector<double> m(kParams, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Random(rng);
    const std::vector<float> x = Random(rng);
    std::vector<float> p(kParams);
    ComputeDirection(rule, kParams, g.data(), x.data(), momentum.data(), p.data());
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
    std::vector<float> momentum(kParams, 0.0f);
    const std::vector<double> m = RunAndCompare(GetParam(), kBeta, lambda, momentum);
    for (size_t i = 0; i < kParams; ++i) {
      // NONE and MOMENTUM_UNSPECIFIED leave the buffer alone.
      EXPECT_NEAR(momentum[i], m[i], 1e-5) << i;
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
  const float g = 1.0f, x = 2.0f;
  float p = 0, m = 0;
  const DirectionRule heavy = MakeDirectionRule(Config(Opt::HEAVY_BALL, 0.5, 0.25));
  ComputeDirection(heavy, 1, &g, &x, &m, &p);
  EXPECT_FLOAT_EQ(p, 1.5f);
  ComputeDirection(heavy, 1, &g, &x, &m, &p);
  EXPECT_FLOAT_EQ(p, 2.25f);

  m = 0;
  const DirectionRule nesterov = MakeDirectionRule(Config(Opt::NESTEROV, 0.5, 0.25));
  ComputeDirection(nesterov, 1, &g, &x, &m, &p);
  EXPECT_FLOAT_EQ(p, 2.25f);
  ComputeDirection(nesterov, 1, &g, &x, &m, &p);
  EXPECT_FLOAT_EQ(p, 2.625f);
  EXPECT_FLOAT_EQ(m, 2.25f);

  const DirectionRule plain = MakeDirectionRule(Config(Opt::NONE, 0.5, 0.25));
  ComputeDirection(plain, 1, &g, &x, nullptr, &p);
  ComputeDirection(plain, 1, &g, &x, nullptr, &p);
  EXPECT_FLOAT_EQ(p, 1.5f);
}

TEST(DirectionTest, DirectionMayAliasGradient) {
  CounterRng rng(77);
  const DirectionRule rule = MakeDirectionRule(Config(Opt::NESTEROV, kBeta, kLambda));
  std::vector<float> separate_m(kParams, 0.0f), aliased_m(kParams, 0.0f);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Random(rng);
    const std::vector<float> x = Random(rng);
    std::vector<float> p(kParams);
    ComputeDirection(rule, kParams, g.data(), x.data(), separate_m.data(), p.data());
    std::vector<float> buffer = g;
    ComputeDirection(rule, kParams, buffer.data(), x.data(), aliased_m.data(), buffer.data());
    EXPECT_EQ(buffer, p) << "step " << step;
  }
}

// The momentum buffer is the caller's: what it holds feeds the next step.
TEST(DirectionTest, TheMomentumBufferFeedsTheNextStep) {
  const DirectionRule rule = MakeDirectionRule(Config(Opt::HEAVY_BALL, 0.5, 0.0));
  std::vector<float> m = {4.0f, 0.0f};
  const std::vector<float> g = {1.0f, 1.0f}, x = {0.0f, 0.0f};
  std::vector<float> p(2);
  ComputeDirection(rule, 2, g.data(), x.data(), m.data(), p.data());
  EXPECT_FLOAT_EQ(p[0], 3.0f);  // 0.5 * 4 + 1
  EXPECT_FLOAT_EQ(p[1], 1.0f);
}

}  // namespace
}  // namespace cserps
