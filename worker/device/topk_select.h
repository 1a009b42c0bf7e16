// Top-k selection by magnitude for the sparse methods (gtopk-ssgd,
// topk-ssgd): which entries a worker pushes.
#ifndef CSERPS_WORKER_DEVICE_TOPK_SELECT_H_
#define CSERPS_WORKER_DEVICE_TOPK_SELECT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace cserps {

// Writes into `*positions` the positions of the `k` entries of `values` with
// the largest |value|, ascending; every position when k >= values.size().
// Order: larger |value| first (a NaN counts as infinite), ties broken by the
// lower position, so the choice is deterministic. Expected O(n + k log k)
// time (std::nth_element, no full sort); `positions` is reused as scratch,
// so its capacity carries over between calls. values.size() < 2^32.
void SelectTopK(absl::Span<const float> values, uint64_t k,
                std::vector<uint32_t>* positions);

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_TOPK_SELECT_H_
