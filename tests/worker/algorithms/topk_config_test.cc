// The catalog entries of gtopk-ssgd and topk-ssgd: density validation, k and
// its split across shards, R_C and the rounds they may use.
#include <cmath>
#include <cstdint>
#include <string>

#include "common/algorithm_catalog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

v1::AlgorithmConfig Sparse(const std::string& name, float density) {
  v1::AlgorithmConfig a;
  a.set_name(name);
  a.set_block_size(32);
  a.set_density(density);
  return a;
}

TEST(TopkConfigTest, DensityMustBeInZeroOne) {
  v1::OptimizerConfig opt;
  opt.set_lr(0.1f);
  for (const char* name : {"gtopk-ssgd", "topk-ssgd"}) {
    EXPECT_TRUE(ValidateAlgorithm(Sparse(name, 1.0f), opt).ok());
    EXPECT_TRUE(ValidateAlgorithm(Sparse(name, 0.001f), opt).ok());
    for (float bad : {0.0f, -0.1f, 1.01f, std::nanf("")}) {
      const absl::Status s = ValidateAlgorithm(Sparse(name, bad), opt);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_THAT(std::string(s.message()), HasSubstr("algorithm.density: "));
      EXPECT_THAT(std::string(s.message()), HasSubstr("needs it in (0, 1]"));
    }
  }
  const absl::Status s = ValidateAlgorithm(Sparse("ssgd", 0.5f), opt);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("algorithm.density: only gtopk-ssgd and topk-ssgd use it"));
}

TEST(TopkConfigTest, KAndItsShardSplit) {
  EXPECT_EQ(SparseK(Sparse("gtopk-ssgd", 0.05f), 2000), 100u);
  EXPECT_EQ(SparseK(Sparse("gtopk-ssgd", 0.0001f), 2000), 1u);  // round(0.2) -> max 1
  EXPECT_EQ(SparseK(Sparse("gtopk-ssgd", 1.0f), 2000), 2000u);
  // k_s = round half up of k * size / d: 100 * 1024 / 2000 = 51.2 -> 51,
  // 100 * 976 / 2000 = 48.8 -> 49; 3 * 5 / 10 = 1.5 -> 2; at least 1.
  EXPECT_EQ(ShardSparseK(100, 1024, 2000), 51u);
  EXPECT_EQ(ShardSparseK(100, 976, 2000), 49u);
  EXPECT_EQ(ShardSparseK(3, 5, 10), 2u);
  EXPECT_EQ(ShardSparseK(1, 10, 1000), 1u);
  EXPECT_EQ(ShardSparseK(1000, 10, 1000), 10u);
  EXPECT_EQ(ShardSparseK(5, 0, 1000), 0u);
  // No overflow with large k and shards.
  EXPECT_EQ(ShardSparseK(uint64_t{1} << 32, uint64_t{1} << 31, uint64_t{1} << 32),
            uint64_t{1} << 31);
}

TEST(TopkConfigTest, RatioAndRounds) {
  EXPECT_DOUBLE_EQ(OverallRatio(Sparse("gtopk-ssgd", 0.25f)), 4.0);
  EXPECT_DOUBLE_EQ(OverallRatio(Sparse("topk-ssgd", 0.5f)), 2.0);
  // Only the final full MODEL average; no GRAD rounds.
  EXPECT_TRUE(CheckRoundRatio(Sparse("gtopk-ssgd", 0.1f), 2, 1).ok());
  const absl::Status s = CheckRoundRatio(Sparse("gtopk-ssgd", 0.1f), 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("uses no averaging rounds but the sparse exchange"));
}

}  // namespace
}  // namespace cserps
