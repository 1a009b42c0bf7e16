#include "worker/cuda/device_algorithms.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/algorithms/algorithm.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/update_kernels.h"

namespace cserps {
namespace {

class DeviceAlgorithmBase : public DeviceAlgorithm {
 public:
  explicit DeviceAlgorithmBase(const DeviceAlgorithmContext& context)
      : context_(context),
        rule_(cuda::MakeDirectionRule(context.config->optimizer())) {}

  absl::Status Init() {
    if (rule_.kind == v1::OptimizerConfig::NONE) return absl::OkStatus();
    const size_t n = context_.client->layout().num_params();
    ASSIGN_OR_RETURN(momentum_, DeviceBuffer<float>::Allocate(n));
    // The momentum buffer starts at zero, as Direction's.
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(momentum_.data(), 0, momentum_.bytes(), context_.stream));
    return absl::OkStatus();
  }

 protected:
  size_t num_params() const { return context_.client->layout().num_params(); }

  // The staged average of `values` into `target` on (stream, step, ratio).
  absl::Status Average(v1::Stream stream, uint64_t step, uint32_t ratio, float lr,
                       const float* values, ScatterKind kind, float alpha,
                       float* target) {
    std::unique_ptr<ShardedAverage> round = context_.client->BeginShardedAverage(
        stream, step, ratio, context_.weight, lr);
    return StagedAverage(context_.client->layout(), context_.config->seed(), stream,
                         step, ratio, *round, *context_.staging, values, kind, alpha,
                         target);
  }

  const DeviceAlgorithmContext context_;
  const cuda::DirectionRule rule_;
  DeviceBuffer<float> momentum_;  // empty for NONE
};

class DeviceSsgd final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  absl::Status Init() {
    RETURN_IF_ERROR(DeviceAlgorithmBase::Init());
    ASSIGN_OR_RETURN(p_, DeviceBuffer<float>::Allocate(num_params()));
    return absl::OkStatus();
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    RETURN_IF_ERROR(cuda::LaunchDirection(rule_, num_params(), g, x, momentum_.data(),
                                          p_.data(), context_.stream));
    // x ← x − η·AVG(p), as every worker and the servers apply it.
    return Average(v1::GRAD, t, /*ratio=*/1, lr, p_.data(), ScatterKind::kAxpy, -lr, x);
  }

  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

 private:
  DeviceBuffer<float> p_;
};

class DeviceCser final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  // MODEL_BLOCKS: x_i ← x_i − η·p_i; x_i[S] ← AVG(x[S]) with
  // S = GRBS(MODEL, t, R_C1 on sync steps, else R_C2).
  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    const v1::AlgorithmConfig& a = context_.config->algorithm();
    RETURN_IF_ERROR(cuda::LaunchSgdStep(rule_, num_params(), lr, g, momentum_.data(), x,
                                        context_.stream));
    const uint32_t ratio = IsSyncStep(t, a.period()) ? a.ratio_c1() : a.ratio_c2();
    return Average(v1::MODEL, t, ratio, /*lr=*/0, x, ScatterKind::kAssign, 0, x);
  }

  absl::Status Finish(uint64_t step, float* x) override {
    return Average(v1::MODEL, step, /*ratio=*/1, /*lr=*/0, x, ScatterKind::kAssign, 0, x);
  }
};

}  // namespace

bool HasDeviceAlgorithm(const v1::AlgorithmConfig& config) {
  if (config.name() == "ssgd") return true;
  return (config.name() == "cser" || config.name() == "m-cser") &&
         config.cser_variant() != v1::AlgorithmConfig::GRADIENT_BLOCKS;
}

absl::StatusOr<std::unique_ptr<DeviceAlgorithm>> MakeDeviceAlgorithm(
    const DeviceAlgorithmContext& context) {
  const v1::AlgorithmConfig& a = context.config->algorithm();
  if (a.name() == "ssgd") {
    auto algorithm = std::make_unique<DeviceSsgd>(context);
    RETURN_IF_ERROR(algorithm->Init());
    return algorithm;
  }
  if (a.name() == "cser" || a.name() == "m-cser") {
    if (a.cser_variant() == v1::AlgorithmConfig::GRADIENT_BLOCKS) {
      return absl::UnimplementedError(absl::StrCat(
          "algorithm.cser_variant: GRADIENT_BLOCKS of ", a.name(),
          " has no device implementation; use MODEL_BLOCKS (the default) or "
          "--backend=cpu"));
    }
    auto algorithm = std::make_unique<DeviceCser>(context);
    RETURN_IF_ERROR(algorithm->Init());
    return algorithm;
  }
  return absl::UnimplementedError(absl::StrCat(
      "algorithm.name: \"", a.name(),
      "\" has no device implementation (device algorithms: ssgd, cser, m-cser)"));
}

}  // namespace cserps
