// CoCoD-SGD (papers/cocod-sgd.txt, Algorithm 1; docs/algorithms.md). At
// t = 0, k, 2k, ...: snapshot s = x and START the average of s (weighted by
// batch size) without waiting; run k local steps meanwhile; then wait for
// x̂ = AVG(s) and set x ← x̂ + (x − s). Compute and communication overlap.
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class CocodSgd final : public Algorithm {
 public:
  explicit CocodSgd(const AlgorithmContext& context)
      : Algorithm(context, {&snapshot_, &average_}) {}

  // The correction of line 3 ends the step that completes a period, so that
  // the next gradient is taken at the corrected model.
  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    if (t == 0) RETURN_IF_ERROR(StartPeriod(0, x));
    // Line 2: a local step while the average is in flight.
    RETURN_IF_ERROR(ops().SgdStep(rule(), lr, g, momentum(), x));
    if (t + 1 != next_sync_) return absl::OkStatus();
    RETURN_IF_ERROR(EndPeriod(x));  // line 3
    return StartPeriod(t + 1, x);   // line 1 of the next period
  }

  // A period that began at `step` (the last step ended one) averages on
  // the final average's own round, (MODEL, step): as nothing was trained
  // since its snapshot, x = x̂ once it lands, the servers' model too, and a
  // second round of that key would only be answered as a retry of it.
  absl::Status Finish(uint64_t step, float* x) override {
    const bool began_at_finish = period_began_ == step;
    RETURN_IF_ERROR(EndPeriod(x));
    if (began_at_finish) return absl::OkStatus();
    return Algorithm::Finish(step, x);
  }

  // The period's average lands in x̂ now instead of at the period's end.
  absl::Status SettleForCheckpoint(const float*) override { return AwaitAverage(); }

  // The full average (a checkpoint's, an admission's) is an error reset:
  // the open period's line 3 then keeps only the progress since, s = x̂.
  absl::Status AdoptGlobalModel(const float*) override {
    if (!landed_) return absl::OkStatus();
    return ops().Copy(average_.data(), snapshot_.data());
  }

  // After t > 0 steps a period is open, its average landed: the one that
  // started at the last period boundary s <= t (0, then s + PeriodAt(s)).
  void AbandonInFlight() override { pending_.reset(); }

  absl::Status ResumeAfter(uint64_t steps) override {
    period_began_.reset();
    if (steps == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(next_sync_, BoundaryAfter(steps));
    landed_ = true;
    return absl::OkStatus();
  }

 private:
  uint64_t WarmupSteps() const {
    return uint64_t{algorithm().period_warmup_epochs()} * context().steps_per_epoch;
  }

  // k, or 1 during the first period_warmup_epochs epochs (the paper's
  // schedule).
  uint64_t PeriodAt(uint64_t t) const {
    return t < WarmupSteps() ? 1 : algorithm().period();
  }

  // The first period boundary after step t (PeriodAt's boundaries: every
  // step up to the warm-up's end W, then W + k, W + 2k, ...), in closed
  // form: a resumed step may be any number.
  absl::StatusOr<uint64_t> BoundaryAfter(uint64_t t) const {
    const uint64_t warmup = WarmupSteps();
    if (t < warmup) return t + 1;
    const uint64_t k = algorithm().period();
    const uint64_t periods = (t - warmup) / k + 1;
    if (periods > (std::numeric_limits<uint64_t>::max() - warmup) / k) {
      return absl::OutOfRangeError(
          absl::StrCat("step ", t, " has no period boundary after it below 2^64"));
    }
    return warmup + periods * k;
  }

  // Line 1: s = x, and START x̂ = AVG(s) on round t; do not wait.
  absl::Status StartPeriod(uint64_t t, const float* x) {
    RETURN_IF_ERROR(ops().Copy(x, snapshot_.data()));
    ASSIGN_OR_RETURN(pending_, StartModelAverage(t, snapshot_.data()));
    period_began_ = t;
    next_sync_ = t + PeriodAt(t);
    return absl::OkStatus();
  }

  // x̂ = AVG(s) of the open period, waited for once.
  absl::Status AwaitAverage() {
    if (!pending_.has_value()) return absl::OkStatus();
    const absl::Status done = pending_->Complete(average_.data());
    pending_.reset();
    RETURN_IF_ERROR(done);
    landed_ = true;
    return absl::OkStatus();
  }

  // Line 3: wait for x̂; x ← x̂ + (x − s).
  absl::Status EndPeriod(float* x) {
    RETURN_IF_ERROR(AwaitAverage());
    if (!landed_) return absl::OkStatus();  // no period open
    landed_ = false;
    return ops().AddDifference(average_.data(), x, snapshot_.data(), x);
  }

  DeviceVector snapshot_;  // s
  DeviceVector average_;   // x̂
  std::optional<PendingAverage> pending_;
  bool landed_ = false;  // x̂ holds the open period's average
  uint64_t next_sync_ = 0;
  // The step of the last StartPeriod of this process (none after a resume).
  std::optional<uint64_t> period_began_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeCocodSgd(const AlgorithmContext& context) {
  return std::make_unique<CocodSgd>(context);
}

}  // namespace cserps
