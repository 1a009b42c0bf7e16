#include "worker/model/max_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

std::vector<float> Uniform(uint64_t key, size_t n) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
  return v;
}

// A 3 x 5 plane pools to 1 x 2: windows rows 0-1 x columns 0-1 and 2-3;
// row 2 and column 4 belong to no window (their 50s and 60s must not win).
TEST(MaxPoolTest, ForwardPicksWindowMaximaAndDropsOddEdges) {
  const std::vector<float> x = {
      1, -2, 7, 7, 50,  //
      3, 0,  7, 6, 50,  //
      60, 60, 60, 60, 60,
  };
  std::vector<float> y(2, 99.0f);
  std::vector<uint8_t> argmax(2, 9);
  MaxPoolForward({1, 1, 3, 5}, x, absl::MakeSpan(y), absl::MakeSpan(argmax));
  EXPECT_EQ(y, (std::vector<float>{3, 7}));
  // 3 is at (1, 0) in its window; the tie of three 7s goes to the first,
  // (0, 0).
  EXPECT_EQ(argmax, (std::vector<uint8_t>{2, 0}));
}

TEST(MaxPoolTest, ForwardMatchesPlainLoopsOnEveryPlane) {
  const MaxPoolShape s = {2, 3, 5, 4};
  const std::vector<float> x = Uniform(1, s.input_size());
  std::vector<float> y(s.output_size());
  std::vector<uint8_t> argmax(s.output_size());
  MaxPoolForward(s, x, absl::MakeSpan(y), absl::MakeSpan(argmax));
  size_t out = 0;
  for (size_t p = 0; p < s.images * s.channels; ++p) {
    for (size_t py = 0; py < 2; ++py) {
      for (size_t px = 0; px < 2; ++px, ++out) {
        float best = -INFINITY;
        for (size_t dy = 0; dy < 2; ++dy) {
          for (size_t dx = 0; dx < 2; ++dx) {
            best = std::max(best, x[(p * 5 + 2 * py + dy) * 4 + 2 * px + dx]);
          }
        }
        EXPECT_EQ(y[out], best) << "output " << out;
        const size_t k = argmax[out];
        ASSERT_LT(k, 4u);
        EXPECT_EQ(x[(p * 5 + 2 * py + k / 2) * 4 + 2 * px + k % 2], best)
            << "argmax of output " << out;
      }
    }
  }
}

// Backward against central differences of L = sum(G ⊙ pool(X)) in double.
// Away from ties pooling is linear in X, so a step of h small against the
// gap between a window's two largest values gives the exact derivative.
TEST(MaxPoolTest, BackwardMatchesFiniteDifferences) {
  const MaxPoolShape s = {2, 2, 5, 7};  // odd both ways
  const size_t ph = s.height / 2, pw = s.width / 2;
  const std::vector<float> x = Uniform(2, s.input_size());
  const std::vector<float> g = Uniform(3, s.output_size());
  std::vector<float> y(s.output_size());
  std::vector<uint8_t> argmax(s.output_size());
  MaxPoolForward(s, x, absl::MakeSpan(y), absl::MakeSpan(argmax));
  std::vector<float> dx(s.input_size(), 99.0f);
  MaxPoolBackward(s, g, argmax, absl::MakeSpan(dx));

  std::vector<double> xd(x.begin(), x.end());
  double min_gap = INFINITY;
  auto loss = [&](bool track_gap) {
    double l = 0;
    size_t out = 0;
    for (size_t p = 0; p < s.images * s.channels; ++p) {
      for (size_t py = 0; py < ph; ++py) {
        for (size_t px = 0; px < pw; ++px, ++out) {
          std::vector<double> window;
          for (size_t dy = 0; dy < 2; ++dy) {
            for (size_t dx = 0; dx < 2; ++dx) {
              window.push_back(
                  xd[(p * s.height + 2 * py + dy) * s.width + 2 * px + dx]);
            }
          }
          std::sort(window.begin(), window.end());
          if (track_gap) min_gap = std::min(min_gap, window[3] - window[2]);
          l += g[out] * window[3];
        }
      }
    }
    return l;
  };
  loss(true);
  ASSERT_GT(min_gap, 1e-3);
  constexpr double kH = 1e-5;
  for (size_t i = 0; i < xd.size(); ++i) {
    const double saved = xd[i];
    xd[i] = saved + kH;
    const double up = loss(false);
    xd[i] = saved - kH;
    const double down = loss(false);
    xd[i] = saved;
    EXPECT_NEAR(dx[i], (up - down) / (2 * kH), 1e-6) << "dX[" << i << "]";
  }
}

}  // namespace
}  // namespace cserps
