// The factory of every algorithm, one file each (ALGORITHMS.md), for the
// registry (registry.h). Each returns an algorithm that still needs Init().
#ifndef CSERPS_WORKER_ALGORITHMS_FACTORIES_H_
#define CSERPS_WORKER_ALGORITHMS_FACTORIES_H_

#include <cstdint>
#include <memory>

#include "worker/algorithms/algorithm.h"

namespace cserps {

std::unique_ptr<Algorithm> MakeSsgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeAsyncSgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeEfSgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeLocalSgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeQsparseLocalSgd(const AlgorithmContext& context);
// cser and m-cser (m-cser's Nesterov direction comes from the optimizer).
std::unique_ptr<Algorithm> MakeCser(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeCserPl(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeCsea(const AlgorithmContext& context);
// Local steps, and after every `period`-th step x[S] ← AVG(x[S]) with
// S = GRBS(MODEL, t, ratio): CSER-PL (cser_pl.cc), which CSEA (period 1)
// and local SGD (ratio 1) are instances of.
std::unique_ptr<Algorithm> MakePeriodicAverage(const AlgorithmContext& context,
                                               uint32_t period, uint32_t ratio);
// gtopk-ssgd and topk-ssgd: the worker's side is the same (gtopk_ssgd.cc).
std::unique_ptr<Algorithm> MakeGtopkSsgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeTopkSsgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakeCocodSgd(const AlgorithmContext& context);
std::unique_ptr<Algorithm> MakePipeSgd(const AlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_FACTORIES_H_
