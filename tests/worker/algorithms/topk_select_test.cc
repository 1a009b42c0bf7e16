// SelectTopK against a sort-based reference.
#include "worker/device/topk_select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::ElementsAreArray;

// Sort every position by (|v| descending, NaN as infinite, position
// ascending), keep k, return ascending.
std::vector<uint32_t> Reference(const std::vector<float>& v, size_t k) {
  std::vector<std::pair<float, uint32_t>> ranked;
  for (uint32_t i = 0; i < v.size(); ++i) {
    const float m = std::isnan(v[i]) ? INFINITY : std::fabs(v[i]);
    ranked.push_back({-m, i});
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<uint32_t> out;
  for (size_t i = 0; i < std::min(k, ranked.size()); ++i) out.push_back(ranked[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SelectTopKTest, MatchesSortReferenceOnRandomDataWithTies) {
  std::mt19937 rng(99);
  std::vector<uint32_t> got;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + trial * 7 % 400;
    std::vector<float> v(n);
    // Half the trials on a coarse grid (many ties, both signs), half continuous.
    std::uniform_int_distribution<int> grid(-5, 5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : v) x = trial % 2 == 0 ? 0.5f * grid(rng) : normal(rng);
    if (trial % 10 == 3) v[trial % n] = std::nanf("");
    for (size_t k : {size_t{0}, size_t{1}, n / 3, n - 1, n, n + 5}) {
      SelectTopK(v, k, &got);
      ASSERT_THAT(got, ElementsAreArray(Reference(v, k)))
          << "trial " << trial << " n " << n << " k " << k;
    }
  }
}

TEST(SelectTopKTest, TiesGoToTheLowerPosition) {
  std::vector<uint32_t> got;
  SelectTopK(std::vector<float>{1.0f, -2.0f, 2.0f, -1.0f, 2.0f}, 2, &got);
  EXPECT_THAT(got, ElementsAreArray({1u, 2u}));
  SelectTopK(std::vector<float>{1.0f, -2.0f, 2.0f, -1.0f, 2.0f}, 4, &got);
  EXPECT_THAT(got, ElementsAreArray({0u, 1u, 2u, 4u}));
}

}  // namespace
}  // namespace cserps
