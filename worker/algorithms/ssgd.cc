// S-SGD (ALGORITHMS.md, "Baselines of the CSER paper"): every worker pushes
// its direction on every block and applies the average, as the servers do,
// so that all hold one model.
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class Ssgd final : public Algorithm {
 public:
  explicit Ssgd(const AlgorithmContext& context) : Algorithm(context, {}, {&p_}) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // p_i = Direction(g_i), with this worker's own momentum buffer.
    RETURN_IF_ERROR(ops().Direction(rule(), g, x, momentum(), p_.data()));
    // x ← x − η·AVG(p), on every worker and the servers.
    return DescendByAverage(t, /*ratio=*/1, lr, p_.data(), x);
  }

  // Every worker and the servers already hold the same model.
  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

 private:
  DeviceVector p_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeSsgd(const AlgorithmContext& context) {
  return std::make_unique<Ssgd>(context);
}

}  // namespace cserps
