// Local SGD (ALGORITHMS.md): x_i ← x_i − η·Direction(g_i); every H steps
// x_i ← AVG(x), the full model: CSER-PL with R_C1 = 1. R_C = H.
#include "worker/algorithms/factories.h"

namespace cserps {

std::unique_ptr<Algorithm> MakeLocalSgd(const AlgorithmContext& context) {
  return MakePeriodicAverage(context, context.config->algorithm().period(), /*ratio=*/1);
}

}  // namespace cserps
