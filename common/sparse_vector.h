// A sparse vector of the model: what the sparse top-k exchange
// (docs/protocol.md, Section 14) carries between workers and servers.
#ifndef CSERPS_COMMON_SPARSE_VECTOR_H_
#define CSERPS_COMMON_SPARSE_VECTOR_H_

#include <cstdint>
#include <vector>

namespace cserps {

// Strictly ascending global float indices, one value each.
struct SparseVector {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

}  // namespace cserps

#endif  // CSERPS_COMMON_SPARSE_VECTOR_H_
