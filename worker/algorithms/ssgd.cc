#include "worker/algorithms/ssgd.h"

#include <vector>

#include "common/status.h"

namespace cserps {
namespace {

class Ssgd final : public Algorithm {
 public:
  explicit Ssgd(const AlgorithmContext& context)
      : context_(context), p_(context.num_params), mean_(context.num_params) {}

  absl::Status Step(uint64_t step, float lr, absl::Span<const float> grad,
                    absl::Span<float> x) override {
    // p_i = Direction(g_i), with this worker's own momentum buffer.
    context_.direction->Compute(grad, x, absl::MakeSpan(p_));
    // Every worker (and the server) applies x ← x − η·AVG(p).
    RETURN_IF_ERROR(context_.comm->AverageBlocks(v1::GRAD, step, p_,
                                                 context_.weight, lr,
                                                 absl::MakeSpan(mean_)));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * mean_[j];
    return absl::OkStatus();
  }

 private:
  const AlgorithmContext context_;
  std::vector<float> p_;
  std::vector<float> mean_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeSsgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new Ssgd(context));
}

}  // namespace cserps
