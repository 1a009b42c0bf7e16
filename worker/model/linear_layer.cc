#include "worker/model/linear_layer.h"

#include <algorithm>

#include <cblas.h>

#include "common/status.h"

namespace cserps {
namespace {

blasint Dim(size_t n) { return static_cast<blasint>(n); }

void CheckShape(const LinearShape& s) {
  CSERPS_CHECK(s.rows > 0 && s.in > 0 && s.out > 0);
}

}  // namespace

void LinearForward(const LinearShape& shape, absl::Span<const float> x,
                   absl::Span<const float> w, absl::Span<const float> b,
                   absl::Span<float> y) {
  CheckShape(shape);
  const size_t rows = shape.rows, in = shape.in, out = shape.out;
  CSERPS_CHECK(x.size() == rows * in && w.size() == out * in &&
               b.size() == out && y.size() == rows * out);
  // Seeding y with the bias lets sgemm add X W^T onto it (beta = 1).
  for (size_t r = 0; r < rows; ++r) {
    std::copy(b.begin(), b.end(), y.begin() + r * out);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(out),
              Dim(in), 1.0f, x.data(), Dim(in), w.data(), Dim(in), 1.0f,
              y.data(), Dim(out));
}

void LinearBackward(const LinearShape& shape, absl::Span<const float> x,
                    absl::Span<const float> w, absl::Span<const float> dy,
                    absl::Span<float> dw, absl::Span<float> db,
                    absl::Span<float> dx) {
  CheckShape(shape);
  const size_t rows = shape.rows, in = shape.in, out = shape.out;
  CSERPS_CHECK(x.size() == rows * in && w.size() == out * in &&
               dy.size() == rows * out && dw.size() == out * in &&
               db.size() == out && (dx.empty() || dx.size() == rows * in));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(out), Dim(in),
              Dim(rows), 1.0f, dy.data(), Dim(out), x.data(), Dim(in), 0.0f,
              dw.data(), Dim(in));
  std::fill(db.begin(), db.end(), 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float* dy_row = dy.data() + r * out;
    for (size_t j = 0; j < out; ++j) db[j] += dy_row[j];
  }
  if (!dx.empty()) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(in),
                Dim(out), 1.0f, dy.data(), Dim(out), w.data(), Dim(in), 0.0f,
                dx.data(), Dim(in));
  }
}

}  // namespace cserps
