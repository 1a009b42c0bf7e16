// CSER and M-CSER with GRBS (ALGORITHMS.md; paper Algorithms 2 and 4). No
// error buffer: with a shared-mask compressor the residual lives in the
// local model (paper section 3.3 and A.4). M-CSER is the same rule with the
// Nesterov direction, whose momentum is added before C2 and stays local.
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class Cser final : public Algorithm {
 public:
  explicit Cser(const AlgorithmContext& context) : Algorithm(context, {}) {}

  // MODEL_BLOCKS steps the model in place; GRADIENT_BLOCKS keeps p and the
  // update apart.
  absl::Status Init() override {
    RETURN_IF_ERROR(Algorithm::Init());
    if (!GradientBlocks()) return absl::OkStatus();
    RETURN_IF_ERROR(Allocate(&p_));
    return Allocate(&update_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    const v1::AlgorithmConfig& a = algorithm();
    const bool sync = IsSyncStep(t, a.period());
    if (GradientBlocks()) {
      // 1: p_i = Direction(g_i).
      RETURN_IF_ERROR(ops().Direction(rule(), g, x, momentum(), p_.data()));
      // 2: x_i[S2] ← x_i[S2] − η·AVG(p[S2]); x_i[~S2] ← x_i[~S2] − η·p_i[~S2].
      RETURN_IF_ERROR(ops().Copy(p_.data(), update_.data()));
      RETURN_IF_ERROR(AverageGradient(t, a.ratio_c2(), lr, p_.data(), update_.data()));
      RETURN_IF_ERROR(ops().Descend(lr, update_.data(), x));
      // 3: every H steps x_i[S1] ← AVG(x[S1]).
      if (!sync) return absl::OkStatus();
      return AverageModel(t, a.ratio_c1(), x);
    }
    // MODEL_BLOCKS: x_i ← x_i − η·p_i; x_i[S] ← AVG(x[S]) with
    // S = GRBS(MODEL, t, R_C1 on sync steps, else R_C2).
    RETURN_IF_ERROR(ops().SgdStep(rule(), lr, g, momentum(), x));
    return AverageModel(t, sync ? a.ratio_c1() : a.ratio_c2(), x);
  }

 private:
  bool GradientBlocks() const {
    return algorithm().cser_variant() == v1::AlgorithmConfig::GRADIENT_BLOCKS;
  }

  DeviceVector p_;       // GRADIENT_BLOCKS only
  DeviceVector update_;  // GRADIENT_BLOCKS only
};

}  // namespace

std::unique_ptr<Algorithm> MakeCser(const AlgorithmContext& context) {
  return std::make_unique<Cser>(context);
}

}  // namespace cserps
