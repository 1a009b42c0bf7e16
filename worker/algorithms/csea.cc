// CSEA (ALGORITHMS.md): CSER-PL with H = 1: every step x_i ← x_i −
// η·Direction(g_i), then x_i[S] ← AVG(x[S]) with S = GRBS(MODEL, t, R_C1).
// R_C = R_C1.
#include "worker/algorithms/factories.h"

namespace cserps {

std::unique_ptr<Algorithm> MakeCsea(const AlgorithmContext& context) {
  return MakePeriodicAverage(context, /*period=*/1, context.config->algorithm().ratio_c1());
}

}  // namespace cserps
