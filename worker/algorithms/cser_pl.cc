// CSER-PL (ALGORITHMS.md): CSER with C2 = 0: local steps, and every H steps
// x_i[S1] ← AVG(x[S1]). CSEA is CSER-PL with H = 1.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class CserPl final : public Algorithm {
 public:
  CserPl(const AlgorithmContext& context, uint32_t period)
      : Algorithm(context), period_(period), p_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * p_[j];
    if (!IsSyncStep(t, period_)) return absl::OkStatus();
    return context_.comm->AverageBlocks(v1::MODEL, t, context_.algorithm().ratio_c1(), x,
                                        context_.weight, /*lr=*/0, x);
  }

 private:
  const uint32_t period_;
  std::vector<float> p_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeCserPl(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new CserPl(context, context.algorithm().period()));
}

absl::StatusOr<std::unique_ptr<Algorithm>> MakeCsea(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new CserPl(context, 1));
}

}  // namespace cserps
