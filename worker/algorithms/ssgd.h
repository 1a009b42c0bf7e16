#ifndef CSERPS_WORKER_ALGORITHMS_SSGD_H_
#define CSERPS_WORKER_ALGORITHMS_SSGD_H_

#include "worker/algorithms/algorithm.h"

namespace cserps {

// S-SGD (ALGORITHMS.md, "Baselines"): every step the full update is averaged.
absl::StatusOr<std::unique_ptr<Algorithm>> MakeSsgd(const AlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_SSGD_H_
