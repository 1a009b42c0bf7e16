// EF-SGD with GRBS (ALGORITHMS.md): one shared model x, gradients at x,
// a_i = η·Direction(g_i) + e_i; x[S] ← x[S] − AVG(a[S]); e_i ← a_i, e_i[S] = 0.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class EfSgd final : public Algorithm {
 public:
  explicit EfSgd(const AlgorithmContext& context)
      : Algorithm(context),
        p_(context.num_params()),
        a_(context.num_params()),
        e_(context.num_params(), 0.0f),
        mean_(context.num_params()) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    const uint32_t r = context_.algorithm().ratio();
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    for (size_t j = 0; j < x.size(); ++j) a_[j] = lr * p_[j] + e_[j];
    // lr 1: a already carries η, and the servers apply x[S] -= AVG(a[S]).
    RETURN_IF_ERROR(context_.comm->AverageBlocks(v1::GRAD, t, r, a_, context_.weight,
                                                 /*lr=*/1.0f, absl::MakeSpan(mean_)));
    e_ = a_;
    ForEachSelectedRange(context_, v1::GRAD, t, r, [&](uint64_t begin, uint64_t end) {
      for (uint64_t j = begin; j < end; ++j) {
        x[j] -= mean_[j];
        e_[j] = 0.0f;
      }
    });
    return absl::OkStatus();
  }

  // The shared model is the servers' model already.
  absl::Status Finish(uint64_t, absl::Span<float>) override { return absl::OkStatus(); }

 private:
  std::vector<float> p_, a_, e_, mean_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeEfSgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new EfSgd(context));
}

}  // namespace cserps
