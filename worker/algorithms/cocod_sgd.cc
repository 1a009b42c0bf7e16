// CoCoD-SGD (papers/cocod-sgd.txt, Algorithm 1; docs/algorithms.md). At
// t = 0, k, 2k, ...: snapshot s = x and START the average of s (weighted by
// batch size) without waiting; run k local steps meanwhile; then wait for
// x̂ = AVG(s) and set x ← x̂ + (x − s). Compute and communication overlap.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class CocodSgd final : public Algorithm {
 public:
  explicit CocodSgd(const AlgorithmContext& context)
      : Algorithm(context),
        p_(context.num_params()),
        snapshot_(context.num_params()),
        average_(context.num_params()) {}

  ~CocodSgd() override {
    // The average in flight writes into average_: wait before it goes.
    if (pending_ != nullptr) pending_->Wait().IgnoreError();
  }

  // The correction of line 3 ends the step that completes a period, so that
  // the next gradient is taken at the corrected model.
  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    if (t == 0) StartAverage(0, x);
    // Line 2: a local step while the average is in flight.
    context_.direction->Compute(g, x, absl::MakeSpan(p_));
    for (size_t j = 0; j < x.size(); ++j) x[j] -= lr * p_[j];
    if (t + 1 == next_sync_) {
      RETURN_IF_ERROR(CompleteAverage(x));  // line 3
      StartAverage(t + 1, x);               // line 1 of the next period
    }
    return absl::OkStatus();
  }

  absl::Status Finish(uint64_t step, absl::Span<float> x) override {
    RETURN_IF_ERROR(CompleteAverage(x));
    return Algorithm::Finish(step, x);
  }

 private:
  // k, or 1 during the first period_warmup_epochs epochs (the paper's
  // schedule).
  uint64_t PeriodAt(uint64_t t) const {
    const v1::AlgorithmConfig& a = context_.algorithm();
    const uint64_t warmup_steps =
        uint64_t{a.period_warmup_epochs()} * context_.steps_per_epoch;
    return t < warmup_steps ? 1 : a.period();
  }

  // Line 1: snapshot s = x and start AVG(s) on round `t`; do not wait.
  void StartAverage(uint64_t t, absl::Span<const float> x) {
    snapshot_.assign(x.begin(), x.end());
    pending_ = context_.comm->StartAverage(v1::MODEL, t, /*ratio=*/1, snapshot_,
                                           context_.weight, /*lr=*/0,
                                           absl::MakeSpan(average_));
    next_sync_ = t + PeriodAt(t);
  }

  // Line 3: x ← x̂ + (x − s).
  absl::Status CompleteAverage(absl::Span<float> x) {
    if (pending_ == nullptr) return absl::OkStatus();
    const absl::Status done = pending_->Wait();
    pending_.reset();
    RETURN_IF_ERROR(done);
    for (size_t j = 0; j < x.size(); ++j) x[j] = average_[j] + (x[j] - snapshot_[j]);
    return absl::OkStatus();
  }

  std::vector<float> p_;
  std::vector<float> snapshot_;
  std::vector<float> average_;
  std::unique_ptr<PendingAverage> pending_;
  uint64_t next_sync_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeCocodSgd(const AlgorithmContext& context) {
  return std::unique_ptr<Algorithm>(new CocodSgd(context));
}

}  // namespace cserps
