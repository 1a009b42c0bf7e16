#include "worker/model/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

// Summed cross-entropy with plain loops in double, via the log-sum-exp
// identity log sum_j e^{z_j} = m + log sum_j e^{z_j - m}.
double ReferenceLossSum(const std::vector<double>& logits,
                        const std::vector<uint8_t>& labels, size_t classes) {
  double sum = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    const double* z = logits.data() + r * classes;
    double m = z[0];
    for (size_t j = 1; j < classes; ++j) m = std::max(m, z[j]);
    double s = 0;
    for (size_t j = 0; j < classes; ++j) s += std::exp(z[j] - m);
    sum += m + std::log(s) - z[labels[r]];
  }
  return sum;
}

// Mean-loss gradient against central differences of the double reference.
// The differences are accurate to ~1e-9 (h = 1e-5, smooth function); the
// float gradient to ~1e-7, so 1e-6 absolute is a safe bound that still
// catches any wrong term (entries are O(1/rows)).
TEST(SoftmaxCrossEntropyTest, LossAndGradientMatchReference) {
  constexpr size_t kRows = 4, kClasses = 5;
  CounterRng rng(42);
  std::vector<float> logits(kRows * kClasses);
  for (float& z : logits) z = 6.0f * rng.UniformFloat() - 3.0f;
  const std::vector<uint8_t> labels = {0, 4, 2, 2};
  std::vector<float> dlogits(logits.size(), 99.0f);
  const double loss = SoftmaxCrossEntropy(logits, labels, kClasses,
                                          1.0f / kRows, absl::MakeSpan(dlogits));

  std::vector<double> zd(logits.begin(), logits.end());
  EXPECT_NEAR(loss, ReferenceLossSum(zd, labels, kClasses), 1e-5);
  constexpr double kH = 1e-5;
  for (size_t i = 0; i < zd.size(); ++i) {
    const double saved = zd[i];
    zd[i] = saved + kH;
    const double up = ReferenceLossSum(zd, labels, kClasses) / kRows;
    zd[i] = saved - kH;
    const double down = ReferenceLossSum(zd, labels, kClasses) / kRows;
    zd[i] = saved;
    EXPECT_NEAR(dlogits[i], (up - down) / (2 * kH), 1e-6) << "dz[" << i << "]";
  }
}

TEST(SoftmaxCrossEntropyTest, StableForHugeLogits) {
  // Row 0: label 1 of {1000, 0, -1000}: loss = 1000 + log(1 + e^-1000 +
  // e^-2000) = 1000 in double; softmax = (1, 0, 0). Row 1: label 0 of
  // {-1000, 1000, 1000}: loss = 2000 + log 2; softmax = (0, 1/2, 1/2).
  const std::vector<float> logits = {1000, 0, -1000, -1000, 1000, 1000};
  const std::vector<uint8_t> labels = {1, 0};
  std::vector<float> dlogits(6);
  const double loss =
      SoftmaxCrossEntropy(logits, labels, 3, 1.0f, absl::MakeSpan(dlogits));
  EXPECT_NEAR(loss, 3000.0 + std::log(2.0), 1e-9);
  const std::vector<float> expected = {1, -1, 0, -1, 0.5f, 0.5f};
  for (size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(dlogits[i], expected[i]) << i;
}

TEST(SoftmaxCrossEntropyTest, GradientIsOptional) {
  const std::vector<float> logits = {0, 0};
  const std::vector<uint8_t> labels = {1};
  EXPECT_NEAR(SoftmaxCrossEntropy(logits, labels, 2, 1.0f, absl::Span<float>()),
              std::log(2.0), 1e-12);
}

TEST(SoftmaxCrossEntropyTest, CountTop1CorrectBreaksTiesTowardLowestIndex) {
  const std::vector<float> logits = {
      1, 3, 2,  // argmax 1
      5, 5, 0,  // tie between 0 and 1: 0
      0, 1, 1,  // tie between 1 and 2: 1
      7, 1, 9,  // argmax 2
  };
  EXPECT_EQ(CountTop1Correct(logits, std::vector<uint8_t>{1, 0, 1, 2}, 3), 4u);
  EXPECT_EQ(CountTop1Correct(logits, std::vector<uint8_t>{1, 1, 2, 0}, 3), 1u);
}

}  // namespace
}  // namespace cserps
