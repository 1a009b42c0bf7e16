// The scalars a training step or an evaluation batch reads back from the
// device: the mean loss, and the summed loss with the correct count, each in
// a device slot the model's kernels write (CudaModel::LossAndGradientDevice,
// EvaluateDevice) and a pinned host copy. CudaBackend
// (worker/cuda/cuda_backend.h) reads through one.
#ifndef CSERPS_WORKER_CUDA_KERNELS_READ_BACK_H_
#define CSERPS_WORKER_CUDA_KERNELS_READ_BACK_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/statusor.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/model/model.h"

namespace cserps {

class ScalarReadBack {
 public:
  // Device and pinned memory on the current device; its CUDA error if not.
  static absl::StatusOr<ScalarReadBack> Allocate();

  // The device slots.
  float* loss() { return loss_.data(); }
  double* loss_sum() { return loss_sum_.data(); }
  unsigned long long* correct() { return correct_.data(); }

  // Queue the copies of the slots after the work queued on `stream`, wait
  // for the stream, and return them; Sums counts `count` examples.
  absl::StatusOr<float> Loss(cudaStream_t stream);
  absl::StatusOr<EvalSums> Sums(size_t count, cudaStream_t stream);

 private:
  DeviceBuffer<float> loss_;
  DeviceBuffer<double> loss_sum_;
  DeviceBuffer<unsigned long long> correct_;
  PinnedBuffer<float> host_loss_;
  PinnedBuffer<double> host_loss_sum_;
  PinnedBuffer<unsigned long long> host_correct_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_READ_BACK_H_
