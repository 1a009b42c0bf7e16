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
      : Algorithm(context, {&landed_}, {&p_}, /*staging_devices=*/2) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // p_t = Direction(g_t).
    RETURN_IF_ERROR(ops().Direction(rule(), g, x, momentum(), p_.data()));
    // START AVG(p_t), left in flight during step t + 1.
    std::optional<PendingAverage> previous = std::move(pending_);
    pending_.reset();
    ASSIGN_OR_RETURN(pending_, StartGradientAverage(t, lr, p_.data()));
    // x ← x − η_{t−1}·AVG(p_{t−1}).
    return Land(std::move(previous), x);
  }

  // Applies the last average, then the final average: the servers applied
  // every round, but a checkpoint's average set their model to the workers'
  // before its last update landed, one update behind from then on.
  absl::Status Finish(uint64_t step, float* x) override {
    RETURN_IF_ERROR(Land(std::move(pending_), x));
    return Algorithm::Finish(step, x);
  }

  // The last step's average lands in a copy of x, which the next step's
  // update then is: x is read by that step's direction before it changes.
  absl::Status SettleForCheckpoint(const float* x) override {
    if (!pending_.has_value()) return absl::OkStatus();
    RETURN_IF_ERROR(ops().Copy(x, landed_.data()));
    std::optional<PendingAverage> pending = std::move(pending_);
    pending_.reset();
    RETURN_IF_ERROR(pending->Complete(landed_.data()));
    has_landed_ = true;
    return absl::OkStatus();
  }

  void AbandonInFlight() override { pending_.reset(); }

  absl::Status ResumeAfter(uint64_t steps) override {
    has_landed_ = steps > 0;
    return absl::OkStatus();
  }

 private:
  // x ← x − η·AVG(p) of `average`'s step, or of a checkpoint's landed copy.
  absl::Status Land(std::optional<PendingAverage> average, float* x) {
    if (has_landed_) {
      has_landed_ = false;
      return ops().Copy(landed_.data(), x);
    }
    if (!average.has_value()) return absl::OkStatus();
    return average->Complete(x);
  }

  DeviceVector p_;
  DeviceVector landed_;  // with has_landed_: x after the last step's average
  std::optional<PendingAverage> pending_;
  bool has_landed_ = false;
};

}  // namespace

std::unique_ptr<Algorithm> MakePipeSgd(const AlgorithmContext& context) {
  return std::make_unique<PipeSgd>(context);
}

}  // namespace cserps
