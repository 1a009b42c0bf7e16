// CSER and M-CSER with GRBS, and the periodic averages CSER-PL, CSEA and
// local SGD, on the device (ALGORITHMS.md; the host twins are
// worker/algorithms/cser.cc, cser_pl.cc and local_sgd.cc). As there, the
// residual lives in the local model: no error buffer.
#include "common/status.h"
#include "worker/algorithms/algorithm.h"
#include "worker/device/device_algorithm_base.h"

namespace cserps {
namespace {

class DeviceCser final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  absl::Status Init() override {
    RETURN_IF_ERROR(DeviceAlgorithmBase::Init());
    if (!GradientBlocks()) return absl::OkStatus();
    RETURN_IF_ERROR(Allocate(&p_));
    return Allocate(&update_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    const v1::AlgorithmConfig& a = algorithm();
    const bool sync = IsSyncStep(t, a.period());
    if (GradientBlocks()) {
      // 1: p_i = Direction(g_i).
      RETURN_IF_ERROR(ops().Direction(rule_, g, x, momentum_.data(), p_.data()));
      // 2: x_i[S2] ← x_i[S2] − η·AVG(p[S2]); x_i[~S2] ← x_i[~S2] − η·p_i[~S2].
      RETURN_IF_ERROR(ops().Copy(p_.data(), update_.data()));
      RETURN_IF_ERROR(Average(v1::GRAD, t, a.ratio_c2(), lr, p_.data(),
                              ScatterKind::kAssign, 0, update_.data()));
      RETURN_IF_ERROR(ops().Descend(lr, update_.data(), x));
      // 3: every H steps x_i[S1] ← AVG(x[S1]).
      if (!sync) return absl::OkStatus();
      return Average(v1::MODEL, t, a.ratio_c1(), /*lr=*/0, x, ScatterKind::kAssign, 0, x);
    }
    // MODEL_BLOCKS: x_i ← x_i − η·p_i; x_i[S] ← AVG(x[S]) with
    // S = GRBS(MODEL, t, R_C1 on sync steps, else R_C2).
    RETURN_IF_ERROR(ops().SgdStep(rule_, lr, g, momentum_.data(), x));
    return Average(v1::MODEL, t, sync ? a.ratio_c1() : a.ratio_c2(), /*lr=*/0, x,
                   ScatterKind::kAssign, 0, x);
  }

 private:
  bool GradientBlocks() const {
    return algorithm().cser_variant() == v1::AlgorithmConfig::GRADIENT_BLOCKS;
  }

  DeviceVector p_;       // GRADIENT_BLOCKS only
  DeviceVector update_;  // GRADIENT_BLOCKS only
};

class DevicePeriodicAverage final : public DeviceAlgorithmBase {
 public:
  DevicePeriodicAverage(const DeviceAlgorithmContext& context, uint32_t period,
                        uint32_t ratio)
      : DeviceAlgorithmBase(context), period_(period), ratio_(ratio) {}

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    RETURN_IF_ERROR(ops().SgdStep(rule_, lr, g, momentum_.data(), x));
    if (!IsSyncStep(t, period_)) return absl::OkStatus();
    return Average(v1::MODEL, t, ratio_, /*lr=*/0, x, ScatterKind::kAssign, 0, x);
  }

 private:
  const uint32_t period_;
  const uint32_t ratio_;
};

}  // namespace

std::unique_ptr<DeviceAlgorithmBase> MakeDeviceCser(const DeviceAlgorithmContext& context) {
  return std::make_unique<DeviceCser>(context);
}

std::unique_ptr<DeviceAlgorithmBase> MakeDevicePeriodicAverage(
    const DeviceAlgorithmContext& context, uint32_t period, uint32_t ratio) {
  return std::make_unique<DevicePeriodicAverage>(context, period, ratio);
}

}  // namespace cserps
