// S-SGD (ALGORITHMS.md, "Baselines of the CSER paper").
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class Ssgd final : public Algorithm {
 public:
  explicit Ssgd(const AlgorithmContext& context)
      : Algorithm(context), p_(context.num_params()), mean_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    // p_i = Direction(g_i), with this worker's own momentum buffer.
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    // Every worker (and the server) applies x ← x − η·AVG(p).
    RETURN_IF_ERROR(context_.comm->AverageBlocks(v1::GRAD, t, /*ratio=*/1, p_,
                                                 context_.weight, lr,
                                                 absl::MakeSpan(mean_)));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * mean_[j];
    return absl::OkStatus();
  }

  // Every worker and the servers already hold the same model.
  absl::Status Finish(uint64_t, absl::Span<float>) override { return absl::OkStatus(); }

 private:
  std::vector<float> p_;
  std::vector<float> mean_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeSsgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new Ssgd(context));
}

}  // namespace cserps
