// Makes the algorithm a job names, from the registry of common/
// (common/algorithm_catalog.h): every entry's id maps to its factory here,
// and the compiler checks that none is missing.
#ifndef CSERPS_WORKER_ALGORITHMS_REGISTRY_H_
#define CSERPS_WORKER_ALGORITHMS_REGISTRY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/algorithms/algorithm.h"

namespace cserps {

// The algorithm context.config->algorithm().name() names, initialised.
// NOT_FOUND listing the known names for an unknown name;
// FAILED_PRECONDITION naming cluster.local_size for one that has no form
// for a node of several local ranks when context.group is set;
// INVALID_ARGUMENT for a sparse method on a model of over 2^32 floats; the
// device's error when a buffer cannot be made.
absl::StatusOr<std::unique_ptr<Algorithm>> MakeAlgorithm(const AlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_REGISTRY_H_
