// The algorithm names a job config may choose (algorithm.name), known to both
// servers and workers so that each side can reject an unknown name at start-up
// instead of at the first push.
//
// Thread-safe: the catalog is immutable.
#ifndef CSERPS_COMMON_ALGORITHM_CATALOG_H_
#define CSERPS_COMMON_ALGORITHM_CATALOG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cserps {

struct AlgorithmInfo {
  std::string name;     // the value of algorithm.name, e.g. "ssgd"
  std::string summary;  // one line for users: update rule, streams, ratio
};

// Every known algorithm, sorted by name. The reference lives for the whole
// program.
const std::vector<AlgorithmInfo>& KnownAlgorithms();

// The entry named `name` (exact, case-sensitive match), or NOT_FOUND
// "algorithm.name: unknown algorithm "x"; known: ssgd" listing every known
// name.
absl::StatusOr<AlgorithmInfo> FindAlgorithm(absl::string_view name);

}  // namespace cserps

#endif  // CSERPS_COMMON_ALGORITHM_CATALOG_H_
