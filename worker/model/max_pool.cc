#include "worker/model/max_pool.h"

#include <algorithm>

#include "common/status.h"

namespace cserps {
namespace {

void CheckShape(const MaxPoolShape& s) {
  CSERPS_CHECK(s.images > 0 && s.channels > 0 && s.height >= 2 &&
               s.width >= 2);
}

}  // namespace

void MaxPoolForward(const MaxPoolShape& shape, absl::Span<const float> x,
                    absl::Span<float> y, absl::Span<uint8_t> argmax) {
  CheckShape(shape);
  CSERPS_CHECK(x.size() == shape.input_size() &&
               y.size() == shape.output_size() &&
               argmax.size() == shape.output_size());
  const size_t w = shape.width, ph = shape.height / 2, pw = shape.width / 2;
  const size_t planes = shape.images * shape.channels;
  size_t out = 0;
  for (size_t p = 0; p < planes; ++p) {
    const float* plane = x.data() + p * shape.height * w;
    for (size_t py = 0; py < ph; ++py) {
      const float* top = plane + 2 * py * w;
      const float* bottom = top + w;
      for (size_t px = 0; px < pw; ++px, ++out) {
        const float window[4] = {top[2 * px], top[2 * px + 1],
                                 bottom[2 * px], bottom[2 * px + 1]};
        uint8_t best = 0;
        for (uint8_t k = 1; k < 4; ++k) {
          if (window[k] > window[best]) best = k;
        }
        y[out] = window[best];
        argmax[out] = best;
      }
    }
  }
}

void MaxPoolBackward(const MaxPoolShape& shape, absl::Span<const float> dy,
                     absl::Span<const uint8_t> argmax, absl::Span<float> dx) {
  CheckShape(shape);
  CSERPS_CHECK(dx.size() == shape.input_size() &&
               dy.size() == shape.output_size() &&
               argmax.size() == shape.output_size());
  std::fill(dx.begin(), dx.end(), 0.0f);
  const size_t w = shape.width, ph = shape.height / 2, pw = shape.width / 2;
  const size_t planes = shape.images * shape.channels;
  size_t out = 0;
  for (size_t p = 0; p < planes; ++p) {
    float* plane = dx.data() + p * shape.height * w;
    for (size_t py = 0; py < ph; ++py) {
      for (size_t px = 0; px < pw; ++px, ++out) {
        const uint8_t k = argmax[out];
        CSERPS_CHECK(k < 4);
        plane[(2 * py + k / 2) * w + 2 * px + k % 2] = dy[out];
      }
    }
  }
}

}  // namespace cserps
