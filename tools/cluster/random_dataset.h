// Synthetic training data for tests and benchmarks, which need no data
// files.
#ifndef CSERPS_TOOLS_CLUSTER_RANDOM_DATASET_H_
#define CSERPS_TOOLS_CLUSTER_RANDOM_DATASET_H_

#include <cstddef>
#include <cstdint>

#include "worker/data/dataset.h"

namespace cserps::testing {

// `examples` random examples (features uniform in [-1, 1), labels uniform)
// from the counter PRNG keyed by `key`.
Dataset RandomDataset(size_t examples, size_t dim, uint32_t classes, uint64_t key);

}  // namespace cserps::testing

#endif  // CSERPS_TOOLS_CLUSTER_RANDOM_DATASET_H_
