#include "worker/device/topk_select.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cserps {

void SelectTopK(absl::Span<const float> values, uint64_t k,
                std::vector<uint32_t>* positions) {
  const uint32_t n = static_cast<uint32_t>(values.size());
  positions->resize(n);
  for (uint32_t i = 0; i < n; ++i) (*positions)[i] = i;
  if (k >= n) return;
  auto magnitude = [&](uint32_t i) {
    const float v = values[i];
    return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
  };
  // A strict total order (positions are distinct), as nth_element needs.
  auto larger = [&](uint32_t a, uint32_t b) {
    const float ma = magnitude(a), mb = magnitude(b);
    return ma != mb ? ma > mb : a < b;
  };
  std::nth_element(positions->begin(), positions->begin() + k, positions->end(), larger);
  positions->resize(k);
  std::sort(positions->begin(), positions->end());
}

}  // namespace cserps
