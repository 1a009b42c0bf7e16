// What the device algorithms (device_algorithms.h) share: the context, the
// direction rule and its momentum buffer, buffer allocation, the GRBS block
// list and the staged average. Internal to worker/device/.
#ifndef CSERPS_WORKER_DEVICE_DEVICE_ALGORITHM_BASE_H_
#define CSERPS_WORKER_DEVICE_DEVICE_ALGORITHM_BASE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/device/device_algorithms.h"

namespace cserps {

class DeviceAlgorithmBase : public DeviceAlgorithm {
 public:
  explicit DeviceAlgorithmBase(const DeviceAlgorithmContext& context);

  // Creates the staging device and the momentum buffer (none for NONE).
  // Subclasses that allocate more extend it; those that never average
  // blocks (the sparse methods, async SGD) replace it.
  virtual absl::Status Init();

  // The final full MODEL average of Algorithm::Finish.
  absl::Status Finish(uint64_t step, float* x) override;

 protected:
  const v1::AlgorithmConfig& algorithm() const { return context_.config->algorithm(); }
  DeviceOps& ops() { return *context_.ops; }

  // A zeroed buffer, kept by `*buffer`.
  absl::Status Allocate(DeviceVector* buffer);

  // The staged average of `values` on (stream, step, ratio), landing in
  // `target` as `kind` and `alpha` say (StagedAverage).
  absl::Status Average(v1::Stream stream, uint64_t step, uint32_t ratio, float lr,
                       const float* values, ScatterKind kind, float alpha, float* target);

  // The blocks GRBS(stream, step, ratio) selects, ascending.
  std::vector<uint64_t> Blocks(v1::Stream stream, uint64_t step, uint32_t ratio) const;

  const DeviceAlgorithmContext context_;
  const DirectionRule rule_;
  DeviceVector momentum_;  // Direction's; empty for NONE

 private:
  std::unique_ptr<StagingDevice> staging_;
};

// The factories of the device algorithm files, for MakeDeviceAlgorithm.
// Each returns an algorithm that still needs Init().
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceSsgd(const DeviceAlgorithmContext& context);
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceAsyncSgd(const DeviceAlgorithmContext& context);
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceCser(const DeviceAlgorithmContext& context);
// cser-pl (period H), csea (period 1) and local-sgd (ratio 1): a local step,
// and every `period` steps x[S] ← AVG(x[S]) with S = GRBS(MODEL, t, ratio).
std::unique_ptr<DeviceAlgorithmBase> MakeDevicePeriodicAverage(
    const DeviceAlgorithmContext& context, uint32_t period, uint32_t ratio);
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceEfSgd(const DeviceAlgorithmContext& context);
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceQsparseLocalSgd(
    const DeviceAlgorithmContext& context);
// topk-ssgd and gtopk-ssgd: the worker's side is the same.
std::unique_ptr<DeviceAlgorithmBase> MakeDeviceSparseTopk(
    const DeviceAlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_DEVICE_ALGORITHM_BASE_H_
