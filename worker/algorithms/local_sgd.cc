// Local SGD (ALGORITHMS.md): x_i ← x_i − η·Direction(g_i); every H steps
// x_i ← AVG(x).
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class LocalSgd final : public Algorithm {
 public:
  explicit LocalSgd(const AlgorithmContext& context)
      : Algorithm(context), p_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * p_[j];
    if (!IsSyncStep(t, context_.algorithm().period())) return absl::OkStatus();
    return context_.comm->AverageBlocks(v1::MODEL, t, /*ratio=*/1, x, context_.weight,
                                        /*lr=*/0, x);
  }

 private:
  std::vector<float> p_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeLocalSgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new LocalSgd(context));
}

}  // namespace cserps
