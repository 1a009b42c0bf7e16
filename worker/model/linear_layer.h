// Forward and backward of a fully connected layer on row-major float
// matrices, with OpenBLAS sgemm. Shapes: X is rows x in, W is out x in (the
// ModelSpec layout), b is out, Y and dY are rows x out, dX is rows x in.
// Span sizes must match the shape exactly (checked: a mismatch is a
// programmer error); outputs must not alias inputs.
#ifndef CSERPS_WORKER_MODEL_LINEAR_LAYER_H_
#define CSERPS_WORKER_MODEL_LINEAR_LAYER_H_

#include <cstddef>

#include "absl/types/span.h"

namespace cserps {

struct LinearShape {
  size_t rows = 0;  // examples in the batch, > 0
  size_t in = 0;
  size_t out = 0;
};

// y = x w^T + b (y overwritten).
void LinearForward(const LinearShape& shape, absl::Span<const float> x,
                   absl::Span<const float> w, absl::Span<const float> b,
                   absl::Span<float> y);

// Given dy = dL/dy: dw = dy^T x and db = column sums of dy (both
// overwritten), and dx = dy w (overwritten) unless dx is empty, which skips
// it (the first layer needs no input gradient).
void LinearBackward(const LinearShape& shape, absl::Span<const float> x,
                    absl::Span<const float> w, absl::Span<const float> dy,
                    absl::Span<float> dw, absl::Span<float> db,
                    absl::Span<float> dx);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_LINEAR_LAYER_H_
