#include "common/algorithm_catalog.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(AlgorithmCatalogTest, KnowsSsgd) {
  absl::StatusOr<AlgorithmInfo> info = FindAlgorithm("ssgd");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "ssgd");
  EXPECT_FALSE(info->summary.empty());
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
  EXPECT_EQ(info.status().message(),
            "algorithm.name: unknown algorithm \"x\"; known: cser, cser-pl, csea, ef-sgd, "
            "local-sgd, m-cser, qsparse-local-sgd, ssgd");
}

TEST(AlgorithmCatalogTest, MatchIsExact) {
  EXPECT_FALSE(FindAlgorithm("SSGD").ok());
  EXPECT_FALSE(FindAlgorithm("ssgd ").ok());
  EXPECT_FALSE(FindAlgorithm("").ok());
}

}  // namespace
}  // namespace cserps
