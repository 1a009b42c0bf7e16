// CSER-PL (ALGORITHMS.md): CSER with C2 = 0: local steps, and every H steps
// x_i[S1] ← AVG(x[S1]). R_C = H·R_C1. CSEA (csea.cc) is CSER-PL with
// H = 1, local SGD (local_sgd.cc) CSER-PL with R_C1 = 1.
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class PeriodicAverage final : public Algorithm {
 public:
  PeriodicAverage(const AlgorithmContext& context, uint32_t period, uint32_t ratio)
      : Algorithm(context, {}), period_(period), ratio_(ratio) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // x_i ← x_i − η·Direction(g_i).
    RETURN_IF_ERROR(ops().SgdStep(rule(), lr, g, momentum(), x));
    // Every H steps: x_i[S1] ← AVG(x[S1]).
    if (!IsSyncStep(t, period_)) return absl::OkStatus();
    return AverageModel(t, ratio_, x);
  }

 private:
  const uint32_t period_;
  const uint32_t ratio_;
};

}  // namespace

std::unique_ptr<Algorithm> MakePeriodicAverage(const AlgorithmContext& context,
                                               uint32_t period, uint32_t ratio) {
  return std::make_unique<PeriodicAverage>(context, period, ratio);
}

std::unique_ptr<Algorithm> MakeCserPl(const AlgorithmContext& context) {
  const v1::AlgorithmConfig& a = context.config->algorithm();
  return MakePeriodicAverage(context, a.period(), a.ratio_c1());
}

}  // namespace cserps
