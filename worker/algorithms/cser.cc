// CSER and M-CSER with GRBS (ALGORITHMS.md; paper Algorithms 2 and 4). No
// error buffer: with a shared-mask compressor the residual lives in the
// local model (paper section 3.3 and A.4). M-CSER is the same rule with the
// Nesterov direction, whose momentum is added before C2 and stays local.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class Cser final : public Algorithm {
 public:
  explicit Cser(const AlgorithmContext& context)
      : Algorithm(context), p_(context.num_params()), update_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    const v1::AlgorithmConfig& a = context_.algorithm();
    const bool sync = IsSyncStep(t, a.period());
    // 1: p_i = Direction(g_i).
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    if (a.cser_variant() == v1::AlgorithmConfig::GRADIENT_BLOCKS) {
      // 2: x_i[S2] ← x_i[S2] − η·AVG(p[S2]); x_i[~S2] ← x_i[~S2] − η·p_i[~S2].
      update_ = p_;
      RETURN_IF_ERROR(context_.comm->AverageBlocks(v1::GRAD, t, a.ratio_c2(), p_,
                                                   context_.weight, lr,
                                                   absl::MakeSpan(update_)));
      for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * update_[j];
      // 3: every H steps x_i[S1] ← AVG(x[S1]).
      if (!sync) return absl::OkStatus();
      return context_.comm->AverageBlocks(v1::MODEL, t, a.ratio_c1(), x, context_.weight,
                                          /*lr=*/0, x);
    }
    // MODEL_BLOCKS: x_i ← x_i − η·p_i; x_i[S] ← AVG(x[S]) with
    // S = GRBS(MODEL, t, R_C1 on sync steps, else R_C2).
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * p_[j];
    return context_.comm->AverageBlocks(v1::MODEL, t, sync ? a.ratio_c1() : a.ratio_c2(),
                                        x, context_.weight, /*lr=*/0, x);
  }

 private:
  std::vector<float> p_;
  std::vector<float> update_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeCser(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new Cser(context));
}

}  // namespace cserps
