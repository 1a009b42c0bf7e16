#include "worker/model/conv2d_layer.h"

#include <algorithm>
#include <cstddef>

#include <cblas.h>

#include "common/status.h"

namespace cserps {
namespace {

blasint Dim(size_t n) { return static_cast<blasint>(n); }

void CheckShape(const Conv2dShape& s) {
  CSERPS_CHECK(s.images > 0 && s.in_channels > 0 && s.height > 0 &&
               s.width > 0 && s.out_channels > 0 && s.kernel % 2 == 1);
}

size_t PatchSize(const Conv2dShape& s) {
  return s.in_channels * s.kernel * s.kernel;
}

size_t Columns(const Conv2dShape& s) {
  return s.images * s.height * s.width;
}

// For one kernel column kx, the output columns ox whose input column
// ox + kx - pad lies inside the image: [lo, hi) within [0, width), possibly
// empty (a padding wider than the image leaves whole columns outside).
struct ValidRange {
  ptrdiff_t lo;
  ptrdiff_t hi;
};
ValidRange ValidColumns(const Conv2dShape& s, size_t kx) {
  const ptrdiff_t shift =
      static_cast<ptrdiff_t>(kx) - static_cast<ptrdiff_t>(s.kernel / 2);
  const ptrdiff_t width = static_cast<ptrdiff_t>(s.width);
  const ptrdiff_t lo = std::min(width, std::max<ptrdiff_t>(0, -shift));
  const ptrdiff_t hi = std::min(width, width - shift);
  return {lo, std::max(lo, hi)};
}

// Stands for an input row outside the image ('same' padding).
constexpr size_t kPadding = static_cast<size_t>(-1);

// Visits every (cols row, image, output row) line of the im2col matrix:
// `visit(line, input_row, range, shift)` with `line` the line's offset in
// cols and `input_row` the offset in x of the input row it reads, or
// kPadding; input pixel ox + shift of that row feeds line[ox] for ox in
// range, and the rest of the line is padding. cols row r = (i * kernel + ky)
// * kernel + kx, column n * height * width + oy * width + ox.
template <typename Visit>
void ForEachLine(const Conv2dShape& s, Visit visit) {
  const size_t k = s.kernel, pad = k / 2, hw = s.height * s.width;
  const size_t ld = Columns(s);
  for (size_t i = 0; i < s.in_channels; ++i) {
    for (size_t ky = 0; ky < k; ++ky) {
      for (size_t kx = 0; kx < k; ++kx) {
        const size_t row = (i * k + ky) * k + kx;
        const ValidRange range = ValidColumns(s, kx);
        const ptrdiff_t shift =
            static_cast<ptrdiff_t>(kx) - static_cast<ptrdiff_t>(pad);
        for (size_t n = 0; n < s.images; ++n) {
          const size_t plane = (n * s.in_channels + i) * hw;
          for (size_t oy = 0; oy < s.height; ++oy) {
            const size_t line = row * ld + n * hw + oy * s.width;
            const ptrdiff_t iy = static_cast<ptrdiff_t>(oy + ky) -
                                 static_cast<ptrdiff_t>(pad);
            const bool inside =
                iy >= 0 && iy < static_cast<ptrdiff_t>(s.height);
            visit(line,
                  inside ? plane + static_cast<size_t>(iy) * s.width
                         : kPadding,
                  range, shift);
          }
        }
      }
    }
  }
}

void Im2Col(const Conv2dShape& s, const float* x, float* cols) {
  ForEachLine(s, [&](size_t line, size_t input_row, ValidRange range,
                     ptrdiff_t shift) {
    float* out = cols + line;
    if (input_row == kPadding) {
      std::fill(out, out + s.width, 0.0f);
      return;
    }
    std::fill(out, out + range.lo, 0.0f);
    const float* in = x + input_row;
    std::copy(in + (range.lo + shift), in + (range.hi + shift),
              out + range.lo);
    std::fill(out + range.hi, out + s.width, 0.0f);
  });
}

// The adjoint of Im2Col: dx (overwritten) accumulates every cols entry into
// the input pixel it was copied from.
void Col2Im(const Conv2dShape& s, const float* cols, float* dx) {
  std::fill(dx, dx + s.images * s.in_channels * s.height * s.width, 0.0f);
  ForEachLine(s, [&](size_t line, size_t input_row, ValidRange range,
                     ptrdiff_t shift) {
    if (input_row == kPadding) return;
    const float* in = cols + line;
    float* out = dx + input_row;
    for (ptrdiff_t ox = range.lo; ox < range.hi; ++ox) {
      out[ox + shift] += in[ox];
    }
  });
}

}  // namespace

size_t Conv2dWorkspaceSize(const Conv2dShape& shape) {
  return (PatchSize(shape) + shape.out_channels) * Columns(shape);
}

Conv2dShape StageShape(const ConvLayerSpec& conv, size_t images) {
  return {images, conv.in_channels, conv.height, conv.width, conv.out_channels, conv.kernel};
}

void Conv2dForward(const Conv2dShape& shape, absl::Span<const float> x,
                   absl::Span<const float> w, absl::Span<const float> b,
                   absl::Span<float> y, absl::Span<float> workspace) {
  CheckShape(shape);
  const size_t patch = PatchSize(shape), columns = Columns(shape);
  const size_t hw = shape.height * shape.width, out_c = shape.out_channels;
  CSERPS_CHECK(x.size() == shape.images * shape.in_channels * hw &&
               w.size() == out_c * patch && b.size() == out_c &&
               y.size() == shape.images * out_c * hw &&
               workspace.size() >= Conv2dWorkspaceSize(shape));
  float* cols = workspace.data();
  float* out = cols + patch * columns;  // out_c x columns
  Im2Col(shape, x.data(), cols);
  // One sgemm for all images: W (out_c x patch) times cols (patch x columns).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(out_c),
              Dim(columns), Dim(patch), 1.0f, w.data(), Dim(patch), cols,
              Dim(columns), 0.0f, out, Dim(columns));
  // The product is channel-major across images; NCHW wants image-major.
  for (size_t n = 0; n < shape.images; ++n) {
    for (size_t o = 0; o < out_c; ++o) {
      const float* src = out + o * columns + n * hw;
      float* dst = y.data() + (n * out_c + o) * hw;
      const float bias = b[o];
      for (size_t p = 0; p < hw; ++p) dst[p] = src[p] + bias;
    }
  }
}

void Conv2dBackward(const Conv2dShape& shape, absl::Span<const float> x,
                    absl::Span<const float> w, absl::Span<const float> dy,
                    absl::Span<float> dw, absl::Span<float> db,
                    absl::Span<float> dx, absl::Span<float> workspace) {
  CheckShape(shape);
  const size_t patch = PatchSize(shape), columns = Columns(shape);
  const size_t hw = shape.height * shape.width, out_c = shape.out_channels;
  CSERPS_CHECK(x.size() == shape.images * shape.in_channels * hw &&
               w.size() == out_c * patch && dy.size() == shape.images * out_c * hw &&
               dw.size() == out_c * patch && db.size() == out_c &&
               (dx.empty() || dx.size() == x.size()) &&
               workspace.size() >= Conv2dWorkspaceSize(shape));
  float* cols = workspace.data();
  float* dout = cols + patch * columns;  // dy channel-major, out_c x columns
  Im2Col(shape, x.data(), cols);
  for (size_t n = 0; n < shape.images; ++n) {
    for (size_t o = 0; o < out_c; ++o) {
      const float* src = dy.data() + (n * out_c + o) * hw;
      std::copy(src, src + hw, dout + o * columns + n * hw);
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(out_c), Dim(patch),
              Dim(columns), 1.0f, dout, Dim(columns), cols, Dim(columns), 1.0f,
              dw.data(), Dim(patch));
  for (size_t o = 0; o < out_c; ++o) {
    const float* row = dout + o * columns;
    double sum = 0.0;
    for (size_t j = 0; j < columns; ++j) sum += row[j];
    db[o] += static_cast<float>(sum);
  }
  if (dx.empty()) return;
  // cols has served dw; it now receives d(cols) = W^T dout.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(patch),
              Dim(columns), Dim(out_c), 1.0f, w.data(), Dim(patch), dout,
              Dim(columns), 0.0f, cols, Dim(columns));
  Col2Im(shape, cols, dx.data());
}

}  // namespace cserps
