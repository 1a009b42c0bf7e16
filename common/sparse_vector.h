// A sparse vector of the model: what the sparse top-k exchange
// (docs/protocol.md, Section 14) carries between workers and servers.
#ifndef CSERPS_COMMON_SPARSE_VECTOR_H_
#define CSERPS_COMMON_SPARSE_VECTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace cserps {

// Strictly ascending global float indices, one value each.
struct SparseVector {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

// INVALID_ARGUMENT, naming the first bad index and its position, unless
// every index lies in [first, end) and each is greater than the one before.
absl::Status CheckSparseIndices(absl::Span<const uint32_t> indices, uint64_t first,
                                uint64_t end);

}  // namespace cserps

#endif  // CSERPS_COMMON_SPARSE_VECTOR_H_
