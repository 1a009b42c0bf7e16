// The factory of every algorithm, one file each (ALGORITHMS.md). Registered
// by name in registry.cc.
#ifndef CSERPS_WORKER_ALGORITHMS_FACTORIES_H_
#define CSERPS_WORKER_ALGORITHMS_FACTORIES_H_

#include "worker/algorithms/algorithm.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<Algorithm>> MakeSsgd(const AlgorithmContext& context);
// Needs context.comm to be a PsClient (AsyncPushPull).
absl::StatusOr<std::unique_ptr<Algorithm>> MakeAsyncSgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeEfSgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeLocalSgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeQsparseLocalSgd(const AlgorithmContext& context);
// cser and m-cser (m-cser's Nesterov direction comes from the optimizer).
absl::StatusOr<std::unique_ptr<Algorithm>> MakeCser(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeCserPl(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeCsea(const AlgorithmContext& context);
// gtopk-ssgd and topk-ssgd (gtopk_ssgd.cc).
absl::StatusOr<std::unique_ptr<Algorithm>> MakeGtopkSsgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeTopkSsgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakeCocodSgd(const AlgorithmContext& context);
absl::StatusOr<std::unique_ptr<Algorithm>> MakePipeSgd(const AlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_FACTORIES_H_
