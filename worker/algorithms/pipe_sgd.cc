// Pipe-SGD, the CoCoD paper's baseline (docs/algorithms.md): the average of
// step t's direction is started and left in flight while step t + 1
// computes; step t + 1 then applies the average of step t. Every worker
// applies the same averaged updates, one step late, so all hold the same
// model.
#include <optional>
#include <utility>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class PipeSgd final : public Algorithm {
 public:
  // Step t + 1 starts its average before step t's has landed.
  explicit PipeSgd(const AlgorithmContext& context)
      : Algorithm(context, {}, {&p_}, /*staging_devices=*/2) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // p_t = Direction(g_t).
    RETURN_IF_ERROR(ops().Direction(rule(), g, x, momentum(), p_.data()));
    // START AVG(p_t), left in flight during step t + 1.
    std::optional<PendingAverage> previous = std::move(pending_);
    pending_.reset();
    ASSIGN_OR_RETURN(pending_, StartGradientAverage(t, lr, p_.data()));
    // x ← x − η_{t−1}·AVG(p_{t−1}).
    if (!previous.has_value()) return absl::OkStatus();
    return previous->Complete(x);
  }

  absl::StatusOr<std::vector<float*>> StateBuffers() override {
    return absl::FailedPreconditionError(
        "pipe-sgd keeps each step's average in flight into the next step, so its state "
        "between two steps is not all on this worker");
  }

  // Applies the last average; the servers applied every round already, so
  // workers and servers then hold the same model.
  absl::Status Finish(uint64_t, float* x) override {
    if (!pending_.has_value()) return absl::OkStatus();
    const absl::Status done = pending_->Complete(x);
    pending_.reset();
    return done;
  }

 private:
  DeviceVector p_;
  std::optional<PendingAverage> pending_;
};

}  // namespace

std::unique_ptr<Algorithm> MakePipeSgd(const AlgorithmContext& context) {
  return std::make_unique<PipeSgd>(context);
}

}  // namespace cserps
