#include "common/algorithm_catalog.h"

#include <algorithm>
#include <set>
#include <vector>
#include <string>

#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(AlgorithmCatalogTest, KnowsSsgd) {
  absl::StatusOr<AlgorithmInfo> info = FindAlgorithm("ssgd");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "ssgd");
}

TEST(AlgorithmCatalogTest, NamesAreUniqueAndFindable) {
  std::set<std::string> seen;
  for (const AlgorithmInfo& info : KnownAlgorithms()) {
    EXPECT_TRUE(seen.insert(info.name).second) << "duplicate " << info.name;
    absl::StatusOr<AlgorithmInfo> found = FindAlgorithm(info.name);
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(found->name, info.name);
  }
  EXPECT_EQ(seen.count("ssgd"), 1u);
}

TEST(AlgorithmCatalogTest, UnknownNameIsNotFoundListingKnownNames) {
  absl::StatusOr<AlgorithmInfo> info = FindAlgorithm("x");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  std::string known;
  for (const AlgorithmInfo& a : KnownAlgorithms()) {
    known += (known.empty() ? "" : ", ") + a.name;
  }
  EXPECT_EQ(info.status().message(),
            "algorithm.name: unknown algorithm \"x\"; known: " + known);
  // Sorted by name, and the CSER family among them.
  EXPECT_NE(known.find("csea, cser, cser-pl"), std::string::npos) << known;
  std::vector<std::string> names;
  for (const AlgorithmInfo& a : KnownAlgorithms()) names.push_back(a.name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end())) << known;
}

TEST(AlgorithmCatalogTest, MatchIsExact) {
  EXPECT_FALSE(FindAlgorithm("SSGD").ok());
  EXPECT_FALSE(FindAlgorithm("ssgd ").ok());
  EXPECT_FALSE(FindAlgorithm("").ok());
}

}  // namespace
}  // namespace cserps

namespace cserps {
namespace {

v1::AlgorithmConfig Algo(const std::string& name, uint32_t period, uint32_t r1,
                         uint32_t r2, uint32_t r) {
  v1::AlgorithmConfig a;
  a.set_name(name);
  a.set_block_size(32);
  a.set_period(period);
  a.set_ratio_c1(r1);
  a.set_ratio_c2(r2);
  a.set_ratio(r);
  return a;
}

v1::OptimizerConfig Momentum(v1::OptimizerConfig::Momentum kind) {
  v1::OptimizerConfig o;
  o.set_lr(0.1f);
  o.set_momentum_kind(kind);
  o.set_momentum(0.9f);
  return o;
}

TEST(AlgorithmCatalogTest, OverallRatioFollowsEachRule) {
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("ssgd", 0, 0, 0, 0)), 1.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("ef-sgd", 0, 0, 0, 32)), 32.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("local-sgd", 16, 0, 0, 0)), 16.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("qsparse-local-sgd", 4, 0, 0, 8)), 32.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("cser-pl", 4, 64, 0, 0)), 256.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("csea", 0, 1024, 0, 0)), 1024.0);
  // The paper's listing: 1 / (1/64 + 1/(4*16)) = 32 for the authors' setting.
  v1::AlgorithmConfig gradient = Algo("cser", 16, 4, 64, 0);
  gradient.set_cser_variant(v1::AlgorithmConfig::GRADIENT_BLOCKS);
  EXPECT_DOUBLE_EQ(OverallRatio(gradient), 32.0);
  // MODEL_BLOCKS: 15 rounds at 1/64 and one at 1/4 per 16 steps.
  const double model_blocks = 16.0 / (15.0 / 64.0 + 1.0 / 4.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("cser", 16, 4, 64, 0)), model_blocks);
  EXPECT_DOUBLE_EQ(OverallRatio(Algo("m-cser", 16, 4, 64, 0)), model_blocks);
  EXPECT_EQ(DescribeAlgorithm(gradient),
            "cser (GRADIENT_BLOCKS): H=16, R_C1=4, R_C2=64 -> overall R_C = 32");
}

TEST(AlgorithmCatalogTest, ValidationNamesTheField) {
  const auto none = Momentum(v1::OptimizerConfig::NONE);
  EXPECT_TRUE(ValidateAlgorithm(Algo("cser", 16, 4, 64, 0), none).ok());
  EXPECT_TRUE(ValidateAlgorithm(Algo("csea", 0, 8, 0, 0), none).ok());
  struct Case {
    v1::AlgorithmConfig algorithm;
    std::string message;
  };
  const Case cases[] = {
      {Algo("cser", 0, 4, 64, 0), "algorithm.period: cser needs it >= 1"},
      {Algo("cser", 16, 0, 64, 0), "algorithm.ratio_c1: cser needs it >= 1"},
      {Algo("cser", 16, 4, 0, 0), "algorithm.ratio_c2: cser needs it >= 1"},
      {Algo("ef-sgd", 0, 0, 0, 0), "algorithm.ratio: ef-sgd needs it >= 1"},
      {Algo("ssgd", 4, 0, 0, 0), "algorithm.period: ssgd does not use it (got 4)"},
      {Algo("csea", 2, 8, 0, 0), "algorithm.period: csea does not use it"},
      {Algo("cser-pl", 4, 8, 64, 0), "algorithm.ratio_c2: cser-pl does not use it"},
      {Algo("nope", 0, 0, 0, 0), "algorithm.name: unknown algorithm"},
  };
  for (const Case& c : cases) {
    const absl::Status status = ValidateAlgorithm(c.algorithm, none);
    EXPECT_FALSE(status.ok()) << c.message;
    EXPECT_EQ(std::string(status.message()).rfind(c.message, 0), 0u) << status;
  }
  v1::AlgorithmConfig variant = Algo("csea", 0, 8, 0, 0);
  variant.set_cser_variant(v1::AlgorithmConfig::GRADIENT_BLOCKS);
  EXPECT_EQ(std::string(ValidateAlgorithm(variant, none).message())
                .rfind("algorithm.cser_variant: only cser and m-cser", 0),
            0u);
  const absl::Status mcser = ValidateAlgorithm(Algo("m-cser", 16, 4, 64, 0),
                                               Momentum(v1::OptimizerConfig::HEAVY_BALL));
  EXPECT_EQ(std::string(mcser.message()).rfind("optimizer.momentum_kind: m-cser", 0), 0u)
      << mcser;
  EXPECT_TRUE(ValidateAlgorithm(Algo("m-cser", 16, 4, 64, 0),
                                Momentum(v1::OptimizerConfig::NESTEROV))
                  .ok());
}

TEST(AlgorithmCatalogTest, RoundRatiosPerStream) {
  constexpr int kGrad = 1, kModel = 2;
  const v1::AlgorithmConfig model_blocks = Algo("cser", 16, 4, 64, 0);
  EXPECT_TRUE(CheckRoundRatio(model_blocks, kModel, 4).ok());
  EXPECT_TRUE(CheckRoundRatio(model_blocks, kModel, 64).ok());
  EXPECT_TRUE(CheckRoundRatio(model_blocks, kModel, 1).ok());  // final average
  const absl::Status grad = CheckRoundRatio(model_blocks, kGrad, 64);
  EXPECT_EQ(grad.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(grad.message()).find("MODEL at ratio 4, MODEL at ratio 64"),
            std::string::npos)
      << grad;
  v1::AlgorithmConfig gradient_blocks = model_blocks;
  gradient_blocks.set_cser_variant(v1::AlgorithmConfig::GRADIENT_BLOCKS);
  EXPECT_TRUE(CheckRoundRatio(gradient_blocks, kGrad, 64).ok());
  EXPECT_TRUE(CheckRoundRatio(gradient_blocks, kModel, 4).ok());
  EXPECT_FALSE(CheckRoundRatio(gradient_blocks, kModel, 64).ok());
  EXPECT_TRUE(CheckRoundRatio(Algo("ssgd", 0, 0, 0, 0), kGrad, 1).ok());
  EXPECT_FALSE(CheckRoundRatio(Algo("ssgd", 0, 0, 0, 0), kGrad, 2).ok());
  EXPECT_TRUE(CheckRoundRatio(Algo("ef-sgd", 0, 0, 0, 32), kGrad, 32).ok());
  EXPECT_FALSE(CheckRoundRatio(Algo("ef-sgd", 0, 0, 0, 32), kGrad, 1).ok());
}

}  // namespace
}  // namespace cserps
