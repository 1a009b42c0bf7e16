// QSparse-local-SGD with GRBS (ALGORITHMS.md): H local steps from the common
// model x̂; at the sync u_i = e_i + (x̂ − x_i); x̂[S] ← x̂[S] − AVG(u[S]);
// e_i ← u_i with e_i[S] = 0; every x_i ← x̂.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class QsparseLocalSgd final : public Algorithm {
 public:
  explicit QsparseLocalSgd(const AlgorithmContext& context)
      : Algorithm(context),
        p_(context.num_params()),
        u_(context.num_params()),
        e_(context.num_params(), 0.0f),
        mean_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    if (x_hat_.empty()) x_hat_.assign(x.begin(), x.end());  // the common start
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * p_[j];
    if (!IsSyncStep(t, context_.algorithm().period())) return absl::OkStatus();

    const uint32_t r = context_.algorithm().ratio();
    for (size_t j = 0; j < x.size(); ++j) u_[j] = e_[j] + (x_hat_[j] - x[j]);
    // lr 1: the servers hold x̂ and apply x̂[S] -= AVG(u[S]).
    RETURN_IF_ERROR(context_.comm->AverageBlocks(v1::GRAD, t, r, u_, context_.weight,
                                                 /*lr=*/1.0f, absl::MakeSpan(mean_)));
    e_ = u_;
    ForEachSelectedRange(context_, v1::GRAD, t, r, [&](uint64_t begin, uint64_t end) {
      for (uint64_t j = begin; j < end; ++j) {
        x_hat_[j] -= mean_[j];
        e_[j] = 0.0f;
      }
    });
    std::copy(x_hat_.begin(), x_hat_.end(), x.begin());
    return absl::OkStatus();
  }

 private:
  std::vector<float> p_, u_, e_, mean_;
  std::vector<float> x_hat_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeQsparseLocalSgd(
    const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new QsparseLocalSgd(context));
}

}  // namespace cserps
