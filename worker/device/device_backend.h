// A device as the trainer (worker/trainer/trainer.h) uses it: the vector
// operations of its algorithms (DeviceOps) and the model's loss, gradient
// and evaluation on batches handed over from the host. Two
// implementations: HostBackend (host_backend.h) runs a host Model on host
// memory (the CPU worker); CudaBackend (worker/cuda/cuda_backend.h) runs
// CudaModel on one CUDA stream.
#ifndef CSERPS_WORKER_DEVICE_DEVICE_BACKEND_H_
#define CSERPS_WORKER_DEVICE_DEVICE_BACKEND_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "worker/data/batch.h"
#include "worker/device/device_ops.h"
#include "worker/model/model.h"

namespace cserps {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // The operations on this device's model-sized buffers; params and grad
  // below are buffers of it.
  virtual DeviceOps& ops() = 0;
  virtual const ModelSpec& spec() const = 0;
  // The model's initial parameters from `seed`, in host memory
  // (Model::Initialize).
  virtual void Initialize(uint64_t seed, absl::Span<float> params) = 0;
  // Room for batches of up to `rows` examples, made ahead of the first.
  virtual absl::Status Reserve(size_t rows) = 0;
  // The mean training loss of `batch` at `params`, its gradient written to
  // `grad`; returns once the loss is known (the gradient may still be
  // queued on the ops' stream).
  virtual absl::StatusOr<float> LossAndGradient(const float* params, const Batch& batch,
                                                float* grad) = 0;
  // The summed loss and correct count of `batch` at `params`; waits.
  virtual absl::StatusOr<EvalSums> Evaluate(const float* params, const Batch& batch) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_DEVICE_BACKEND_H_
