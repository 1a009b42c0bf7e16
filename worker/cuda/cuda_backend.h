// DeviceBackend (worker/device/device_backend.h) on a GPU: CudaModel and
// CudaDeviceOps on one CUDA stream of their own, batches uploaded through
// pinned memory, and the loss and evaluation sums read back through a
// ScalarReadBack. The trainer's GPU backend.
//
// The device current at Create must be current on the calling thread.
// Not thread-safe.
#ifndef CSERPS_WORKER_CUDA_CUDA_BACKEND_H_
#define CSERPS_WORKER_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/cuda/cuda_device_ops.h"
#include "worker/cuda/kernels/cuda_model.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/read_back.h"
#include "worker/device/device_backend.h"

namespace cserps {

class CudaBackend final : public DeviceBackend {
 public:
  // `block_size` > 0: the job's algorithm.block_size. `node_group`: the
  // device side of this process's node group (it outlives the backend), or
  // null for a flat worker (CudaDeviceOps::Create). The CUDA errors of
  // creating the stream and the ops.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      std::unique_ptr<CudaModel> model, uint32_t block_size,
      DeviceGroup* node_group = nullptr);
  // The CUDA model of config.model on the current device, for the job's
  // algorithm.block_size; CudaModel::Create's errors too.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> ForJob(
      const v1::JobConfig& config, DeviceGroup* node_group = nullptr);
  // Waits for the stream, then releases everything.
  ~CudaBackend() override;

  DeviceOps& ops() override { return *ops_; }
  const ModelSpec& spec() const override { return model_->spec(); }
  void Initialize(uint64_t seed, absl::Span<float> params) override {
    model_->Initialize(seed, params);
  }
  // The batch buffers (pinned and device) and the model's workspace.
  absl::Status Reserve(size_t rows) override;
  absl::StatusOr<float> LossAndGradient(const float* params, const Batch& batch,
                                        float* grad) override;
  absl::StatusOr<EvalSums> Evaluate(const float* params, const Batch& batch) override;

 private:
  explicit CudaBackend(std::unique_ptr<CudaModel> model) : model_(std::move(model)) {}
  // Queues `batch` into features_ / labels_ through the pinned buffers.
  absl::Status Upload(const Batch& batch);

  std::unique_ptr<CudaModel> model_;
  cudaStream_t stream_ = nullptr;
  // Queue on stream_: released before it.
  std::unique_ptr<CudaDeviceOps> ops_;
  size_t max_rows_ = 0;  // of the batch buffers
  PinnedBuffer<float> host_features_;
  PinnedBuffer<uint8_t> host_labels_;
  DeviceBuffer<float> features_;
  DeviceBuffer<uint8_t> labels_;
  ScalarReadBack read_back_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_CUDA_BACKEND_H_
