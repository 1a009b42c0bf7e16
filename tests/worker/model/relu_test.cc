#include "worker/model/relu.h"

#include <vector>

#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(ReluTest, ClampsNegativesToZero) {
  std::vector<float> a = {-1.5f, 0.0f, 2.0f, -0.0f, 1e-30f};
  ReluInPlace(absl::MakeSpan(a));
  EXPECT_EQ(a, (std::vector<float>{0.0f, 0.0f, 2.0f, 0.0f, 1e-30f}));
}

TEST(ReluTest, BackwardPassesGradientOnlyWhereOutputIsPositive) {
  const std::vector<float> activation = {0.0f, 3.0f, 0.0f, 1e-30f};
  std::vector<float> grad = {5.0f, -2.0f, -7.0f, 4.0f};
  ReluBackwardInPlace(activation, absl::MakeSpan(grad));
  EXPECT_EQ(grad, (std::vector<float>{0.0f, -2.0f, 0.0f, 4.0f}));
}

}  // namespace
}  // namespace cserps
