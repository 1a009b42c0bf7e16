// EF-SGD with GRBS (ALGORITHMS.md): one shared model x, gradients at x,
// a_i = η·Direction(g_i) + e_i; x[S] ← x[S] − AVG(a[S]); e_i ← a_i with
// e_i[S] = 0. The error buffer keeps what the selection left out.
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class EfSgd final : public Algorithm {
 public:
  explicit EfSgd(const AlgorithmContext& context) : Algorithm(context, {&e_}, {&p_, &a_}) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    const uint32_t r = algorithm().ratio();
    RETURN_IF_ERROR(ops().Direction(rule(), g, x, momentum(), p_.data()));
    // a = η·p + e.
    RETURN_IF_ERROR(ops().ScaleAdd(lr, p_.data(), e_.data(), a_.data()));
    // x[S] ← x[S] − AVG(a[S]): η 1, since a already carries the learning
    // rate, here as on the servers.
    RETURN_IF_ERROR(DescendByAverage(t, r, /*lr=*/1.0f, a_.data(), x));
    // e = a off S, 0 on S.
    RETURN_IF_ERROR(ops().Copy(a_.data(), e_.data()));
    return ops().FillBlocks(Blocks(v1::GRAD, t, r), 0.0f, e_.data());
  }

  // The shared model is the servers' model already.
  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

 private:
  DeviceVector p_, a_, e_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeEfSgd(const AlgorithmContext& context) {
  return std::make_unique<EfSgd>(context);
}

}  // namespace cserps
