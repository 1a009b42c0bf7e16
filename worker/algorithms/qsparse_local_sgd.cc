// QSparse-local-SGD with GRBS (ALGORITHMS.md): H local steps from the common
// model x̂; at the sync u_i = e_i + (x̂ − x_i); x̂[S] ← x̂[S] − AVG(u[S]);
// e_i ← u_i with e_i[S] = 0; every x_i ← x̂.
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class QsparseLocalSgd final : public Algorithm {
 public:
  explicit QsparseLocalSgd(const AlgorithmContext& context)
      : Algorithm(context, {&e_, &x_hat_}, {&u_}) {}

  // The servers' model is x̂ (they apply every sync's AVG(u) to it).
  absl::Status AdoptGlobalModel(const float* x) override {
    return ops().Copy(x, x_hat_.data());
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // x̂ starts at the common start.
    if (t == 0) RETURN_IF_ERROR(ops().Copy(x, x_hat_.data()));
    RETURN_IF_ERROR(ops().SgdStep(rule(), lr, g, momentum(), x));
    if (!IsSyncStep(t, algorithm().period())) return absl::OkStatus();

    const uint32_t r = algorithm().ratio();
    // u = e + (x̂ − x).
    RETURN_IF_ERROR(ops().AddDifference(e_.data(), x_hat_.data(), x, u_.data()));
    // x̂[S] ← x̂[S] − AVG(u[S]) (η 1), as the servers do to the x̂ they hold.
    RETURN_IF_ERROR(DescendByAverage(t, r, /*lr=*/1.0f, u_.data(), x_hat_.data()));
    // e = u off S, 0 on S; the local model restarts from x̂.
    RETURN_IF_ERROR(ops().Copy(u_.data(), e_.data()));
    RETURN_IF_ERROR(ops().FillBlocks(Blocks(v1::GRAD, t, r), 0.0f, e_.data()));
    return ops().Copy(x_hat_.data(), x);
  }

 private:
  DeviceVector u_, e_, x_hat_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeQsparseLocalSgd(const AlgorithmContext& context) {
  return std::make_unique<QsparseLocalSgd>(context);
}

}  // namespace cserps
