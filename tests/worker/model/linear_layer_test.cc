#include "worker/model/linear_layer.h"

#include <cmath>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

constexpr size_t kRows = 3, kIn = 4, kOut = 2;

std::vector<float> Uniform(uint64_t key, size_t n) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
  return v;
}

// Y = X W^T + b with plain loops in double.
std::vector<double> ReferenceForward(const std::vector<double>& x,
                                     const std::vector<double>& w,
                                     const std::vector<double>& b) {
  std::vector<double> y(kRows * kOut);
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t j = 0; j < kOut; ++j) {
      double z = b[j];
      for (size_t k = 0; k < kIn; ++k) z += x[r * kIn + k] * w[j * kIn + k];
      y[r * kOut + j] = z;
    }
  }
  return y;
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

TEST(LinearLayerTest, ForwardMatchesPlainLoops) {
  const std::vector<float> x = Uniform(1, kRows * kIn);
  const std::vector<float> w = Uniform(2, kOut * kIn);
  const std::vector<float> b = Uniform(3, kOut);
  std::vector<float> y(kRows * kOut, 123.0f);
  LinearForward({kRows, kIn, kOut}, x, w, b, absl::MakeSpan(y));
  const std::vector<double> expected =
      ReferenceForward(ToDouble(x), ToDouble(w), ToDouble(b));
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], expected[i], 1e-5) << "y[" << i << "]";
  }
}

// Backward against central differences of L = sum(G ⊙ Y(X, W, b)) for a
// random G (the upstream gradient). L is linear in each argument, so the
// double-precision differences are exact up to rounding (~1e-10); the float
// analytic values carry ~1e-7 relative error, hence the 1e-5 tolerance.
TEST(LinearLayerTest, BackwardMatchesFiniteDifferences) {
  const std::vector<float> x = Uniform(4, kRows * kIn);
  const std::vector<float> w = Uniform(5, kOut * kIn);
  const std::vector<float> b = Uniform(6, kOut);
  const std::vector<float> g = Uniform(7, kRows * kOut);
  std::vector<float> dw(w.size(), 99.0f), db(b.size(), 99.0f),
      dx(x.size(), 99.0f);
  LinearBackward({kRows, kIn, kOut}, x, w, g, absl::MakeSpan(dw),
                 absl::MakeSpan(db), absl::MakeSpan(dx));

  std::vector<double> xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
  auto loss = [&] {
    const std::vector<double> y = ReferenceForward(xd, wd, bd);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
    return l;
  };
  constexpr double kH = 1e-4;
  auto check = [&](std::vector<double>& arg, const std::vector<float>& grad,
                   const char* name) {
    for (size_t i = 0; i < arg.size(); ++i) {
      const double saved = arg[i];
      arg[i] = saved + kH;
      const double up = loss();
      arg[i] = saved - kH;
      const double down = loss();
      arg[i] = saved;
      EXPECT_NEAR(grad[i], (up - down) / (2 * kH), 1e-5)
          << name << "[" << i << "]";
    }
  };
  check(wd, dw, "dW");
  check(bd, db, "db");
  check(xd, dx, "dX");
}

TEST(LinearLayerTest, EmptyInputGradientIsSkipped) {
  const std::vector<float> x = Uniform(8, kRows * kIn);
  const std::vector<float> w = Uniform(9, kOut * kIn);
  const std::vector<float> g = Uniform(10, kRows * kOut);
  std::vector<float> dw(w.size()), db(kOut), dw_full(w.size()), db_full(kOut),
      dx(x.size());
  LinearBackward({kRows, kIn, kOut}, x, w, g, absl::MakeSpan(dw),
                 absl::MakeSpan(db), absl::Span<float>());
  LinearBackward({kRows, kIn, kOut}, x, w, g, absl::MakeSpan(dw_full),
                 absl::MakeSpan(db_full), absl::MakeSpan(dx));
  EXPECT_EQ(dw, dw_full);
  EXPECT_EQ(db, db_full);
}

}  // namespace
}  // namespace cserps
