// 2x2 max-pooling with stride 2 on NCHW float images. The output of an
// H x W plane is floor(H / 2) x floor(W / 2): window (py, px) covers input
// rows 2py, 2py + 1 and columns 2px, 2px + 1, so an odd last row or column
// belongs to no window. Span sizes must match the shape exactly (checked: a
// mismatch is a programmer error).
#ifndef CSERPS_WORKER_MODEL_MAX_POOL_H_
#define CSERPS_WORKER_MODEL_MAX_POOL_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace cserps {

// The input's shape; images * channels planes of height x width, each >= 2.
struct MaxPoolShape {
  size_t images = 0;
  size_t channels = 0;
  size_t height = 0;
  size_t width = 0;

  size_t input_size() const { return images * channels * height * width; }
  size_t output_size() const {
    return images * channels * (height / 2) * (width / 2);
  }
};

// y = the maximum of each window (overwritten); argmax (output_size(), one
// per output) records which of the window's four pixels it came from, as
// 2 * dy + dx for the offset (dy, dx) in the window: the first maximum in
// the order (0,0), (0,1), (1,0), (1,1) wins ties.
void MaxPoolForward(const MaxPoolShape& shape, absl::Span<const float> x,
                    absl::Span<float> y, absl::Span<uint8_t> argmax);

// dx (input_size(), overwritten) = dy routed to each window's recorded
// maximum; every other input pixel, the dropped odd row and column included,
// gets 0.
void MaxPoolBackward(const MaxPoolShape& shape, absl::Span<const float> dy,
                     absl::Span<const uint8_t> argmax, absl::Span<float> dx);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_MAX_POOL_H_
