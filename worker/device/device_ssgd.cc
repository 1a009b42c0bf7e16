// S-SGD and asynchronous SGD on the device (ALGORITHMS.md; the host twins
// are worker/algorithms/ssgd.cc and async_sgd.cc).
#include <vector>

#include "common/status.h"
#include "worker/device/device_algorithm_base.h"

namespace cserps {
namespace {

class DeviceSsgd final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  absl::Status Init() override {
    RETURN_IF_ERROR(DeviceAlgorithmBase::Init());
    return Allocate(&p_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    RETURN_IF_ERROR(ops().Direction(rule_, g, x, momentum_.data(), p_.data()));
    // x ← x − η·AVG(p), as every worker and the servers apply it.
    return Average(v1::GRAD, t, /*ratio=*/1, lr, p_.data(), ScatterKind::kAxpy, -lr, x);
  }

  // Every worker and the servers already hold the same model.
  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

 private:
  DeviceVector p_;
};

// The servers apply the direction; the worker sends its gradient and takes
// their model, so both cross to the host every step.
class DeviceAsyncSgd final : public DeviceAlgorithmBase {
 public:
  explicit DeviceAsyncSgd(const DeviceAlgorithmContext& context)
      : DeviceAlgorithmBase(context),
        grad_(context.ops->num_params()),
        model_(context.ops->num_params()) {}

  // The servers keep the momentum: no buffer here.
  absl::Status Init() override { return absl::OkStatus(); }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    RETURN_IF_ERROR(ops().Download(g, absl::MakeSpan(grad_)));
    RETURN_IF_ERROR(context_.client->AsyncPushPull(t, lr, grad_, absl::MakeSpan(model_)));
    return ops().Upload(model_, x);
  }

  // As the host algorithm: the servers' model, final once every worker is done.
  absl::Status Finish(uint64_t, float* x) override {
    RETURN_IF_ERROR(context_.client->PullModel(absl::MakeSpan(model_),
                                               /*wait_for_init=*/false));
    return ops().Upload(model_, x);
  }

 private:
  std::vector<float> grad_;
  std::vector<float> model_;
};

}  // namespace

std::unique_ptr<DeviceAlgorithmBase> MakeDeviceSsgd(const DeviceAlgorithmContext& context) {
  return std::make_unique<DeviceSsgd>(context);
}

std::unique_ptr<DeviceAlgorithmBase> MakeDeviceAsyncSgd(
    const DeviceAlgorithmContext& context) {
  return std::make_unique<DeviceAsyncSgd>(context);
}

}  // namespace cserps
