#include "worker/model/conv2d_layer.h"

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

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

size_t InputSize(const Conv2dShape& s) {
  return s.images * s.in_channels * s.height * s.width;
}
size_t OutputSize(const Conv2dShape& s) {
  return s.images * s.out_channels * s.height * s.width;
}
size_t WeightSize(const Conv2dShape& s) {
  return s.out_channels * s.in_channels * s.kernel * s.kernel;
}

// The convolution straight from its definition, in double: every output
// pixel sums kernel x input over the in-range pixels of its window.
std::vector<double> NaiveConv(const Conv2dShape& s,
                              const std::vector<double>& x,
                              const std::vector<double>& w,
                              const std::vector<double>& b) {
  const long h = static_cast<long>(s.height), wd = static_cast<long>(s.width);
  const long k = static_cast<long>(s.kernel), pad = (k - 1) / 2;
  const long in_c = static_cast<long>(s.in_channels);
  const long out_c = static_cast<long>(s.out_channels);
  std::vector<double> y(OutputSize(s));
  for (long n = 0; n < static_cast<long>(s.images); ++n) {
    for (long o = 0; o < out_c; ++o) {
      for (long oy = 0; oy < h; ++oy) {
        for (long ox = 0; ox < wd; ++ox) {
          double z = b[o];
          for (long i = 0; i < in_c; ++i) {
            for (long ky = 0; ky < k; ++ky) {
              for (long kx = 0; kx < k; ++kx) {
                const long iy = oy + ky - pad, ix = ox + kx - pad;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                z += w[((o * in_c + i) * k + ky) * k + kx] *
                     x[((n * in_c + i) * h + iy) * wd + ix];
              }
            }
          }
          y[((n * out_c + o) * h + oy) * wd + ox] = z;
        }
      }
    }
  }
  return y;
}

// Shapes that reach every padding case: 1x1 kernels (no padding), kernels
// wider than the image (some kernel columns never see a pixel), non-square
// images, several channels and images.
const Conv2dShape kShapes[] = {
    {2, 3, 5, 6, 4, 3},  // images, in, height, width, out, kernel
    {3, 2, 4, 4, 3, 5},
    {1, 1, 7, 3, 2, 7},
    {2, 4, 3, 5, 3, 1},
    {1, 2, 1, 1, 2, 3},
    // Padding wider than the image: whole kernel columns and rows miss it.
    {1, 1, 2, 2, 1, 7},
    {2, 2, 3, 3, 2, 9},
};

TEST(Conv2dLayerTest, ForwardMatchesNaiveConvolution) {
  uint64_t key = 1;
  for (const Conv2dShape& s : kShapes) {
    const std::vector<float> x = Uniform(key++, InputSize(s));
    const std::vector<float> w = Uniform(key++, WeightSize(s));
    const std::vector<float> b = Uniform(key++, s.out_channels);
    std::vector<float> y(OutputSize(s), 123.0f);
    // Stale workspace contents must not leak into the result.
    std::vector<float> workspace(Conv2dWorkspaceSize(s), 77.0f);
    Conv2dForward(s, x, w, b, absl::MakeSpan(y), absl::MakeSpan(workspace));
    const std::vector<double> expected =
        NaiveConv(s, ToDouble(x), ToDouble(w), ToDouble(b));
    // Sums of at most 32 products of magnitude < 1 in float (the kernel's
    // pixels inside the image): rounding stays below ~1e-5.
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], expected[i], 2e-5)
          << "kernel " << s.kernel << " y[" << i << "]";
    }
  }
}

// Backward against central differences of L = sum(G ⊙ Y(X, W, b)) for a
// random G. L is linear in each argument, so the double differences are
// exact up to rounding (~1e-10); the float analytic values carry ~1e-6
// absolute error at most.
TEST(Conv2dLayerTest, BackwardMatchesFiniteDifferences) {
  uint64_t key = 100;
  for (const Conv2dShape& s : kShapes) {
    const std::vector<float> x = Uniform(key++, InputSize(s));
    const std::vector<float> w = Uniform(key++, WeightSize(s));
    const std::vector<float> b = Uniform(key++, s.out_channels);
    const std::vector<float> g = Uniform(key++, OutputSize(s));
    // dw and db accumulate; dx is overwritten.
    constexpr float kPrior = 0.5f;
    std::vector<float> dw(w.size(), kPrior), db(b.size(), kPrior),
        dx(x.size(), 99.0f);
    std::vector<float> workspace(Conv2dWorkspaceSize(s), -5.0f);
    Conv2dBackward(s, x, w, g, absl::MakeSpan(dw), absl::MakeSpan(db),
                   absl::MakeSpan(dx), absl::MakeSpan(workspace));

    std::vector<double> xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
    auto loss = [&] {
      const std::vector<double> y = NaiveConv(s, xd, wd, bd);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
      return l;
    };
    constexpr double kH = 1e-4;
    auto check = [&](std::vector<double>& arg, const std::vector<float>& grad,
                     double prior, const char* name) {
      for (size_t i = 0; i < arg.size(); ++i) {
        const double saved = arg[i];
        arg[i] = saved + kH;
        const double up = loss();
        arg[i] = saved - kH;
        const double down = loss();
        arg[i] = saved;
        ASSERT_NEAR(grad[i] - prior, (up - down) / (2 * kH), 1e-5)
            << name << "[" << i << "] shape kernel " << s.kernel;
      }
    };
    check(wd, dw, kPrior, "dW");
    check(bd, db, kPrior, "db");
    check(xd, dx, 0.0, "dX");
  }
}

// A batch processed in two calls accumulates the same dw and db as one call
// over all of it, and skipping dx leaves them unchanged.
TEST(Conv2dLayerTest, BackwardAccumulatesOverGroups) {
  const Conv2dShape all = {4, 2, 5, 5, 3, 3};
  const Conv2dShape half = {2, 2, 5, 5, 3, 3};
  const std::vector<float> x = Uniform(200, InputSize(all));
  const std::vector<float> w = Uniform(201, WeightSize(all));
  const std::vector<float> g = Uniform(202, OutputSize(all));
  std::vector<float> workspace(Conv2dWorkspaceSize(all));
  std::vector<float> dw_all(w.size()), db_all(3), dx(x.size());
  Conv2dBackward(all, x, w, g, absl::MakeSpan(dw_all), absl::MakeSpan(db_all),
                 absl::MakeSpan(dx), absl::MakeSpan(workspace));

  std::vector<float> dw(w.size()), db(3);
  const absl::Span<const float> xs(x), gs(g);
  for (size_t part = 0; part < 2; ++part) {
    Conv2dBackward(half, xs.subspan(part * InputSize(half), InputSize(half)),
                   w, gs.subspan(part * OutputSize(half), OutputSize(half)),
                   absl::MakeSpan(dw), absl::MakeSpan(db), absl::Span<float>(),
                   absl::MakeSpan(workspace));
  }
  for (size_t i = 0; i < dw.size(); ++i) {
    EXPECT_NEAR(dw[i], dw_all[i], 1e-5) << "dW[" << i << "]";
  }
  for (size_t i = 0; i < db.size(); ++i) {
    EXPECT_NEAR(db[i], db_all[i], 1e-5) << "db[" << i << "]";
  }
}

}  // namespace
}  // namespace cserps
