// Pipe-SGD, the CoCoD paper's baseline (docs/algorithms.md): the average of
// step t's update is started and left in flight while step t + 1 computes;
// step t + 1 then applies the average of step t. Every worker applies the
// same averaged updates, one step late, so all hold the same model.
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class PipeSgd final : public Algorithm {
 public:
  explicit PipeSgd(const AlgorithmContext& context)
      : Algorithm(context),
        p_(context.num_params()),
        mean_(context.num_params()),
        previous_mean_(context.num_params()) {}

  ~PipeSgd() override {
    if (pending_ != nullptr) pending_->Wait().IgnoreError();
  }

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    // The previous round writes into previous_mean_, this one into mean_.
    std::swap(mean_, previous_mean_);
    std::unique_ptr<PendingAverage> previous = std::move(pending_);
    const float previous_lr = pending_lr_;
    pending_ = context_.comm->StartAverage(v1::GRAD, t, /*ratio=*/1, p_, context_.weight,
                                           lr, absl::MakeSpan(mean_));
    pending_lr_ = lr;
    if (previous == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(previous->Wait());
    for (size_t j = 0; j < x.size(); ++j) x[j] -= previous_lr * previous_mean_[j];
    return absl::OkStatus();
  }

  // Applies the last average; the servers applied every round already, so
  // workers and servers then hold the same model.
  absl::Status Finish(uint64_t, absl::Span<float> x) override {
    if (pending_ == nullptr) return absl::OkStatus();
    const absl::Status done = pending_->Wait();
    pending_.reset();
    RETURN_IF_ERROR(done);
    for (size_t j = 0; j < x.size(); ++j) x[j] -= pending_lr_ * mean_[j];
    return absl::OkStatus();
  }

 private:
  std::vector<float> p_;
  std::vector<float> mean_;
  std::vector<float> previous_mean_;
  std::unique_ptr<PendingAverage> pending_;
  float pending_lr_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakePipeSgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new PipeSgd(context));
}

}  // namespace cserps
