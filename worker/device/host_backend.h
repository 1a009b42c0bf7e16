// DeviceBackend on host memory: a host Model (the CPU model, or any other)
// with HostDeviceOps. The CPU worker's backend.
#ifndef CSERPS_WORKER_DEVICE_HOST_BACKEND_H_
#define CSERPS_WORKER_DEVICE_HOST_BACKEND_H_

#include <memory>
#include <utility>

#include "worker/device/device_backend.h"
#include "worker/device/host_device_ops.h"

namespace cserps {

class HostBackend final : public DeviceBackend {
 public:
  // `block_size` > 0: the job's algorithm.block_size.
  HostBackend(std::unique_ptr<Model> model, uint32_t block_size)
      : model_(std::move(model)), ops_(model_->spec().num_params, block_size) {}

  DeviceOps& ops() override { return ops_; }
  const ModelSpec& spec() const override { return model_->spec(); }
  void Initialize(uint64_t seed, absl::Span<float> params) override {
    model_->Initialize(seed, params);
  }
  absl::Status Reserve(size_t) override { return absl::OkStatus(); }
  absl::StatusOr<float> LossAndGradient(const float* params, const Batch& batch,
                                        float* grad) override;
  absl::StatusOr<EvalSums> Evaluate(const float* params, const Batch& batch) override;

 private:
  std::unique_ptr<Model> model_;
  HostDeviceOps ops_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_HOST_BACKEND_H_
